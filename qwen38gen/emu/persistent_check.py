"""The CPU check of a persistent plan (docs/PERSISTENT.md §4): static checks, and a dynamic
simulation of the SMs' consumers and loaders over element versions.

Inputs: the tasks and per-step footprints of emu/tasks.py, their reference order
(``tasks.reference``), and a plan of emu/persistent.py. Every finding is a ``Report``.

**Static** (``check_static``):

* ``lists``: every task is on exactly one list;
* ``cycle``: graph D (tasks; edges: list order and producer -> waiter) is acyclic;
* ``ring``: no task's page need exceeds the ring;
* ``target``: every wait's target equals its counter's producer increments (one each a step);
* ``order`` (legality): for every generating conflict (p, c) of a step, p happens-before c. HB
  is the transitive closure of list order and counter edges; a counter gives edges only to
  waits whose target equals its producers' increments. The generating pairs (RAW and WAW with
  the last writer, WAR with the next writer) imply every conflicting pair by transitivity;
* ``launch``: no two tasks of one launch conflict (an emitter error: no merge chains are
  declared);
* ``loader``: L(t) meets W(u) for no task u ≠ t of the step.

**Dynamic** (``simulate``): per SM a consumer (list position, running task, its next page) and
a loader (cursor, pages in flight, landed pages with snapshots of the versions of their bytes);
counters that carry over from step to step, a wait being met when its counter reaches
target × (step + 1), as §2's targets n · epoch. The actions are ISSUE (a page slot is free),
LAND (snapshot the versions of the page's elements now), START (waits met; a non-streaming
task's pages all landed: its memory reads and, non-streaming, its walked reads happen now),
CONSUME (a streaming task reads its next landed page), FINISH (writes set versions, pages are
freed, counters incremented). A policy picks among the enabled actions: ``random``,
``loader`` (loader actions first), ``consumer`` (consumer actions first), ``starve`` (SM
``starve`` acts only when nothing else can). Every read compares the versions it sees with the
reference's: older is ``RAW`` (read before written), newer than the reader is ``WAR``
(overwritten before read). After each step every element's version must be the reference's
(else ``WAW``, a lost write). No enabled action with a list unfinished is a ``deadlock``, one
report per blocked SM. Steps are separate launches: a step starts when the last one has ended.

Not modelled: the arithmetic (versions only, no values), split-K partials and merges inside
one task, the loader's own byte order inside a page, the residency of one block per SM.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .persistent import Plan, Walk, walks
from .tasks import Reference, StepFootprints, Task, gather, version, writer_of


@dataclass(frozen=True)
class Report:
    kind: str
    detail: str
    step: int | None = None
    task: int | None = None
    other: int | None = None       # the writer, producer or conflicting task
    buffer: str | None = None
    element: int | None = None
    counter: int | None = None
    sm: int | None = None
    cycle: tuple[int, ...] = ()    # a cycle of graph D, in edge order

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


def _name(tasks: list[Task], t: int | None) -> str:
    return "—" if t is None else f"task {t} ({tasks[t].label}, launch {tasks[t].launch})"


# -- static checks

def _graph(plan: Plan, n: int) -> list[set[int]]:
    """Predecessors in D: the list predecessor and every producer of each waited counter."""
    pred: list[set[int]] = [set() for _ in range(n)]
    for lst in plan.lists:
        for a, b in zip(lst, lst[1:]):
            pred[b].add(a)
    for c in range(n):
        for k, _ in plan.waits[c]:
            pred[c].update(plan.counters[k].producers)
    return pred


def _topo(pred: list[set[int]]) -> tuple[list[int], list[int]]:
    """(a topological order of D, the tasks left on a cycle or behind one)."""
    n = len(pred)
    succ: list[list[int]] = [[] for _ in range(n)]
    deg = [len(p) for p in pred]
    for c, ps in enumerate(pred):
        for p in ps:
            succ[p].append(c)
    ready = [t for t in range(n) if not deg[t]]
    order = []
    while ready:
        t = ready.pop()
        order.append(t)
        for c in succ[t]:
            deg[c] -= 1
            if not deg[c]:
                ready.append(c)
    return order, [t for t in range(n) if deg[t]]


def _cycle(pred: list[set[int]], left: list[int]) -> list[int]:
    """One cycle among the tasks ``left`` by ``_topo`` (each has a predecessor left)."""
    rest = set(left)
    t, seen = left[0], {}
    while t not in seen:
        seen[t] = len(seen)
        t = min(p for p in pred[t] if p in rest)
    cyc = [u for u, i in sorted(seen.items(), key=lambda x: x[1]) if i >= seen[t]]
    return cyc[::-1]


def happens_before(plan: Plan, n: int, order: list[int]) -> list[int]:
    """Bitsets: bit p of hb[c] when p happens before c (list order, and counters whose waits'
    targets equal their producers' increments)."""
    hb = [0] * n
    prev: dict[int, int] = {}
    for lst in plan.lists:
        prev.update(zip(lst[1:], lst[:-1]))
    cover: dict[int, int] = {}
    for c in order:
        a = hb[prev[c]] | (1 << prev[c]) if c in prev else 0
        for k, target in plan.waits[c]:
            prods = plan.counters[k].producers
            if target != len(prods):
                continue
            if k not in cover:
                cv = 0
                for p in prods:
                    cv |= hb[p] | (1 << p)
                cover[k] = cv
            a |= cover[k]
        hb[c] = a
    return hb


def check_static(plan: Plan, tasks: list[Task], steps: list[StepFootprints],
                 refs: list[Reference], man: dict) -> list[Report]:
    """The static checks of §4 for every step; see the module docstring."""
    n = len(tasks)
    out: list[Report] = []
    placed = sorted(t for lst in plan.lists for t in lst)
    if placed != list(range(n)):
        out.append(Report("lists", f"{len(placed)} list entries for {n} tasks; missing "
                          f"{sorted(set(range(n)) - set(placed))[:5]}"))
        return out
    pred = _graph(plan, n)
    order, left = _topo(pred)
    if left:
        cyc = _cycle(pred, left)
        out.append(Report("cycle", "graph D has a cycle: "
                          + " -> ".join(map(str, cyc + cyc[:1])), cycle=tuple(cyc)))
    for step, fp in enumerate(steps):
        for s, w in enumerate(walks(plan, tasks, fp, man)):
            for t, need in w.need.items():
                if need > plan.ring_pages:
                    out.append(Report("ring", f"step {step}: {_name(tasks, t)} on SM {s} needs "
                                      f"{need} pages, the ring has {plan.ring_pages}",
                                      step=step, task=t, sm=s))
    for c in range(n):
        for k, target in plan.waits[c]:
            m = len(plan.counters[k].producers)
            if target != m:
                out.append(Report("target", f"{_name(tasks, c)} waits on counter {k} for "
                                  f"{target}; its producers increment it {m} times",
                                  task=c, counter=k))
    if not left:
        hb = happens_before(plan, n, order)
        for step, ref in enumerate(refs):
            for (p, c), (kind, name) in ref.pairs.items():
                if tasks[p].launch == tasks[c].launch:
                    out.append(Report("launch", f"step {step}: {_name(tasks, p)} and "
                                      f"{_name(tasks, c)} conflict ({kind} on {name}) inside "
                                      "one launch", step=step, task=c, other=p, buffer=name))
                if not hb[c] >> p & 1:
                    out.append(Report("order", f"step {step}: {_name(tasks, p)} must happen "
                                      f"before {_name(tasks, c)} ({kind} on {name})",
                                      step=step, task=c, other=p, buffer=name))
    for step, fp in enumerate(steps):
        out += _loader_rule(tasks, fp, step)
    return out


def _loader_rule(tasks: list[Task], fp: StepFootprints, step: int) -> list[Report]:
    """L(t) meets W(u) for no u ≠ t (and a pseudo-buffer is never written)."""
    out = []
    sizes: dict[str, int] = {}
    for w in fp.writes:
        for name, runs in w.items():
            assert ":" not in name, name
            sizes[name] = max(sizes.get(name, 0), int(runs[:, 1].max()))
    cnt = {}
    for name, size in sizes.items():
        d = np.zeros(size + 1, np.int64)
        for w in fp.writes:
            if name in w:
                np.add.at(d, w[name][:, 0], 1)
                np.add.at(d, w[name][:, 1], -1)
        cnt[name] = np.cumsum(d)
    for t, walk in enumerate(fp.walk):
        for name, a, b in walk:
            if name not in cnt:
                continue
            c = cnt[name][a:min(b, len(cnt[name]))].copy()
            for x, y in fp.writes[t].get(name, ()):
                lo, hi = max(a, x), min(b, y)
                if lo < hi:
                    c[lo - a:hi - a] -= 1
            hit = np.flatnonzero(c > 0)
            if len(hit):
                e = a + int(hit[0])
                u = next(u for u, w in enumerate(fp.writes) if u != t and name in w
                         and any(x <= e < y for x, y in w[name]))
                out.append(Report("loader", f"step {step}: {_name(tasks, t)} walks {name}[{e}], "
                                  f"which {_name(tasks, u)} writes", step=step, task=t, other=u,
                                  buffer=name, element=e))
    return out


# -- the dynamic simulation

ISSUE, LAND, START, CONSUME, FINISH = range(5)       # loader actions first

class _Sim:
    def __init__(self, plan, tasks, steps, refs, man, sizes, policy, rng, starve, limit):
        self.plan, self.tasks, self.steps, self.refs, self.man = plan, tasks, steps, refs, man
        self.n = len(tasks)
        self.ver = {name: np.zeros(size, np.int64) for name, size in sizes.items()}
        self.ctr = np.zeros(len(plan.counters), np.int64)
        self.inc = plan.increments(self.n)
        self.policy, self.rng, self.starve, self.limit = policy, rng, starve, limit
        self.reports: list[Report] = []
        self.seen: set[tuple] = set()

    def report(self, r: Report, key: tuple) -> None:
        if key not in self.seen and len(self.reports) < self.limit:
            self.seen.add(key)
            self.reports.append(r)

    def compare(self, step: int, t: int, name: str, seen: np.ndarray, exp: np.ndarray,
                runs: np.ndarray) -> None:
        bad = np.flatnonzero(seen != exp)
        if not len(bad):
            return
        i = int(bad[0])
        lens = runs[:, 1] - runs[:, 0]
        j = int(np.searchsorted(np.cumsum(lens), i, side="right"))
        e = int(runs[j, 0] + i - (lens[:j].sum() if j else 0))
        v, x, g = int(seen[i]), int(exp[i]), version(step, t, self.n)
        if v > g:
            kind, w, what = "WAR", v, "overwritten before read by"
        else:
            kind, w, what = "RAW", x, "read before written by"
        ws = writer_of(w, self.n)
        wt = None if ws is None else ws[1]
        self.report(Report(kind, f"step {step}: {_name(self.tasks, t)} reads {name}[{e}] "
                           f"{what} {_name(self.tasks, wt)} (sees version {v}, expects {x})",
                           step=step, task=t, other=wt, buffer=name, element=e),
                    (kind, step, t, name))

    def run_step(self, step: int) -> bool:
        plan, tasks, fp, ref = self.plan, self.tasks, self.steps[step], self.refs[step]
        W: list[Walk] = walks(plan, tasks, fp, self.man)
        S, P = plan.sms, plan.ring_pages
        pos = [0] * S
        running: list[int | None] = [None] * S
        rpage = [0] * S
        cursor = [0] * S
        inflight: list[list[int]] = [[] for _ in range(S)]
        landed = [np.zeros(w.pages, bool) for w in W]
        occupied = [0] * S
        left = []
        for w in W:
            lp = [len({w.items[i].task for i in items}) for items in w.page_items]
            left.append(lp)
        snaps: list[dict[int, np.ndarray]] = [{} for _ in range(S)]
        lists = plan.lists

        def met(t):
            return all(self.ctr[k] >= target * (step + 1) for k, target in plan.waits[t])

        def consume(s, t, page):
            left[s][page] -= 1
            if not left[s][page]:
                occupied[s] -= 1
                landed[s][page] = False

        def read_items(s, t, page=None):
            w = W[s]
            pages = w.task_pages.get(t, []) if page is None else [page]
            for p in pages:
                for i in w.page_items[p]:
                    it = w.items[i]
                    if it.task != t or ":" in it.name:
                        continue
                    exp = ref.exp_walk[t][it.name][it.exp:it.exp + it.stop - it.start]
                    self.compare(step, t, it.name, snaps[s].pop(i), exp,
                                 np.array([[it.start, it.stop]]))

        while True:
            acts = []
            for s in range(S):
                w = W[s]
                if cursor[s] < w.pages and occupied[s] < P:
                    acts.append((s, ISSUE, None))
                for p in inflight[s]:
                    acts.append((s, LAND, p))
                t = running[s]
                if t is None:
                    if pos[s] < len(lists[s]):
                        t = lists[s][pos[s]]
                        pages = w.task_pages.get(t, [])
                        if met(t) and (tasks[t].stream or all(landed[s][p] for p in pages)):
                            acts.append((s, START, t))
                elif tasks[t].stream and rpage[s] < len(w.task_pages.get(t, [])):
                    if landed[s][w.task_pages[t][rpage[s]]]:
                        acts.append((s, CONSUME, t))
                else:
                    acts.append((s, FINISH, t))
            if not acts:
                break
            s, kind, arg = self.pick(acts)
            w = W[s]
            if kind == ISSUE:
                inflight[s].append(cursor[s])
                cursor[s] += 1
                occupied[s] += 1
            elif kind == LAND:
                inflight[s].remove(arg)
                landed[s][arg] = True
                for i in w.page_items[arg]:
                    it = w.items[i]
                    if ":" not in it.name:
                        snaps[s][i] = self.ver[it.name][it.start:it.stop].copy()
            elif kind == START:
                t = arg
                running[s], rpage[s] = t, 0
                for name, runs in fp.mem[t].items():
                    self.compare(step, t, name, gather(self.ver[name], runs),
                                 ref.exp_mem[t][name], runs)
                if not tasks[t].stream:
                    read_items(s, t)
            elif kind == CONSUME:
                t, page = arg, w.task_pages[arg][rpage[s]]
                read_items(s, t, page)
                consume(s, t, page)
                rpage[s] += 1
            else:                                          # FINISH
                t = arg
                v = version(step, t, self.n)
                for name, runs in fp.writes[t].items():
                    for a, b in runs:
                        self.ver[name][a:b] = v
                for k in self.inc[t]:
                    self.ctr[k] += 1
                if not tasks[t].stream:
                    for p in w.task_pages.get(t, []):
                        consume(s, t, p)
                running[s] = None
                pos[s] += 1
        blocked = [s for s in range(S) if pos[s] < len(lists[s])]
        for s in blocked:
            t = lists[s][pos[s]]
            page = None if running[s] is None else W[s].task_pages[t][rpage[s]]
            self.deadlock(step, s, t, page, W[s], landed[s], occupied[s], pos)
        if blocked:
            return False
        for name, v in self.ver.items():
            bad = np.flatnonzero(v != ref.final[name])
            if len(bad):
                e = int(bad[0])
                ws = writer_of(int(ref.final[name][e]), self.n)
                got = writer_of(int(v[e]), self.n)
                self.report(Report("WAW", f"step {step}: {name}[{e}] ends at the version of "
                                   f"{_name(self.tasks, None if got is None else got[1])}, "
                                   "the reference's last writer is "
                                   f"{_name(self.tasks, None if ws is None else ws[1])}",
                                   step=step, buffer=name, element=e,
                                   task=None if got is None else got[1],
                                   other=None if ws is None else ws[1]), ("WAW", step, name))
        return True

    def deadlock(self, step, s, t, page, w, landed, occupied, pos):
        """Report SM s blocked at task t: its unmet waits with their unfinished producers, or
        the pages it waits for (``page``: the next page of a running streaming task)."""
        plan, tasks = self.plan, self.tasks
        sm = plan.sm_of()
        why, ctr = [], None
        if page is None:
            for k, target in plan.waits[t]:
                if self.ctr[k] < target * (step + 1):
                    undone = [(p, sm[p]) for p in plan.counters[k].producers
                              if plan.lists[sm[p]].index(p) >= pos[sm[p]]]
                    why.append(f"counter {k} at {self.ctr[k]} of target {target * (step + 1)}, "
                               f"unfinished producers (task, SM) {undone[:6]}")
                    ctr = k
            pages = w.task_pages.get(t, [])
            if not tasks[t].stream and not all(landed[p] for p in pages):
                why.append(f"needs pages {pages[0]}..{pages[-1]} landed: {int(landed.sum())} "
                           f"held, {occupied} of {plan.ring_pages} ring pages in use")
        else:
            why.append(f"waits for page {page}: {occupied} of {plan.ring_pages} ring pages in use")
        self.report(Report("deadlock", f"step {step}: SM {s} blocked at {_name(tasks, t)}: "
                           + "; ".join(why), step=step, task=t, sm=s,
                           counter=ctr), ("deadlock", step, s))

    def pick(self, acts):
        if self.policy == "loader":
            acts = [a for a in acts if a[1] <= LAND] or acts
        elif self.policy == "consumer":
            acts = [a for a in acts if a[1] >= START] or acts
        elif self.policy == "starve":
            acts = [a for a in acts if a[0] != self.starve] or acts
        elif self.policy != "random":
            raise ValueError(f"policy {self.policy!r}: random, loader, consumer or starve")
        return acts[int(self.rng.integers(len(acts)))]


def simulate(plan: Plan, tasks: list[Task], steps: list[StepFootprints], refs: list[Reference],
             man: dict, sizes: dict[str, int], policy: str = "random", seed: int = 0,
             starve: int | None = None, limit: int = 50) -> list[Report]:
    """Run the plan's steps in order under ``policy`` (seeded); the reports of what went wrong
    (at most ``limit``), empty when every read saw the reference's versions, every step ended
    at the reference's versions and nothing deadlocked. A deadlock ends the run."""
    sim = _Sim(plan, tasks, steps, refs, man, sizes, policy, np.random.default_rng(seed),
               starve, limit)
    for step in range(len(steps)):
        if not sim.run_step(step):
            break
    return sim.reports
