"""A persistent plan for a phase's tasks (docs/PERSISTENT.md §2): per-SM static task lists, the
counters the tasks wait on, and each SM's loader walk packed into a ring of 16 KiB pages. It is
data for the checker (emu/persistent_check.py); nothing here runs a task.

* **Lists** are dealt round robin from one topological order of the tasks' conflicts (by
  default the reference order), as ``taskgraph.lists_from_order`` deals launches.
* **Counters.** Consumer c needs every task it conflicts with (``tasks.Reference.pairs``, over
  all measured steps). They are grouped by producer launch: one counter per distinct (launch,
  producer set), its target the set's size (each producer increments each of its counters once
  a step). With MPK's rule that an edge exists only where footprints overlap, this is §2's
  table: a norm row waits on one counter per (GEMV launch, batch tile); GDN (sequence, key head)
  on the in-projection's row blocks that meet its head's rows. A wait already implied by the
  list order and the waits taken (happens-before, nearest producer launch first) is dropped.
* **Walks.** An SM's walk is the concatenation, in list order, of its tasks' walked runs, each
  run aligned to its element size (so no element crosses a page), packed back to back without
  page alignment. A streaming task (a GEMV) holds 1 page at a time; any other task needs all
  pages its bytes touch at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .taskgraph import lists_from_order
from .tasks import StepFootprints, Task, elem_bytes

PAGE = 16384


@dataclass(frozen=True)
class Counter:
    launch: int                    # the producers' launch
    producers: tuple[int, ...]     # tasks that increment it, once each per step


@dataclass
class Plan:
    sms: int
    ring_pages: int
    lists: list[list[int]]
    counters: list[Counter]
    waits: list[list[tuple[int, int]]]      # per task: (counter, target per step)
    page_bytes: int = PAGE

    def increments(self, n: int) -> list[list[int]]:
        """Per task, the counters it increments when it finishes."""
        inc: list[list[int]] = [[] for _ in range(n)]
        for k, c in enumerate(self.counters):
            for p in c.producers:
                inc[p].append(k)
        return inc

    def sm_of(self) -> dict[int, int]:
        return {t: s for s, lst in enumerate(self.lists) for t in lst}


def build_plan(tasks: list[Task], pairs: list[dict], sms: int, ring_pages: int,
               order: list[int] | None = None, page_bytes: int = PAGE) -> Plan:
    """Lists dealt from ``order`` (default: the reference order), and the waits each task needs
    on the conflicts ``pairs`` (one dict per step, as ``Reference.pairs``)."""
    n = len(tasks)
    deps: list[set[int]] = [set() for _ in range(n)]
    for d in pairs:
        for p, c in d:
            deps[c].add(p)
    order = list(range(n)) if order is None else order
    at = {t: i for i, t in enumerate(order)}
    assert all(at[p] < at[c] for c in range(n) for p in deps[c]), "order is not topological"
    lists = lists_from_order(order, sms)
    prev: dict[int, int] = {}
    for lst in lists:
        prev.update(zip(lst[1:], lst[:-1]))
    anc = [0] * n                  # bitsets: what is known to happen before each task
    counters: list[Counter] = []
    index: dict[tuple, int] = {}
    cover: list[int] = []
    waits: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    for c in order:
        a = anc[prev[c]] | (1 << prev[c]) if c in prev else 0
        groups: dict[int, list[int]] = {}
        for p in sorted(deps[c]):
            groups.setdefault(tasks[p].launch, []).append(p)
        for launch in sorted(groups, reverse=True):
            S = tuple(groups[launch])
            bits = 0
            for p in S:
                bits |= 1 << p
            if not bits & ~a:
                continue
            key = (launch, S)
            if key not in index:
                index[key] = len(counters)
                counters.append(Counter(launch, S))
                cv = 0
                for p in S:
                    cv |= anc[p] | (1 << p)
                cover.append(cv)
            k = index[key]
            waits[c].append((k, len(S)))
            a |= cover[k]
        anc[c] = a
    return Plan(sms, ring_pages, lists, counters, waits, page_bytes)


@dataclass
class Item:
    """A piece of a task's walked run that lies in one page."""
    task: int
    name: str
    start: int                     # element run [start, stop) of buffer or pseudo-buffer name
    stop: int
    page: int
    exp: int                       # offset into the task's expected versions of name (walk order)


@dataclass
class Walk:
    """One SM's loader walk for one step."""
    items: list[Item]
    pages: int
    page_items: list[list[int]]
    task_pages: dict[int, list[int]] = field(default_factory=dict)
    need: dict[int, int] = field(default_factory=dict)


def walks(plan: Plan, tasks: list[Task], fp: StepFootprints, man: dict) -> list[Walk]:
    """Each SM's walk for one step's footprints, packed into pages, with each task's pages and
    its page need (streaming: 1; otherwise the pages its bytes touch)."""
    pb = plan.page_bytes
    out = []
    for lst in plan.lists:
        items: list[Item] = []
        off = 0
        for t in lst:
            seen: dict[str, int] = {}
            for name, a, b in fp.walk[t]:
                eb = elem_bytes(man, name)
                assert pb % eb == 0, (name, eb)
                off = -(-off // eb) * eb
                e0 = seen.get(name, 0)
                seen[name] = e0 + (b - a)
                while a < b:
                    k = min(b - a, ((off // pb + 1) * pb - off) // eb)
                    items.append(Item(t, name, a, a + k, off // pb, e0))
                    a, off, e0 = a + k, off + k * eb, e0 + k
        npages = -(-off // pb)
        w = Walk(items, npages, [[] for _ in range(npages)])
        for i, it in enumerate(items):
            w.page_items[it.page].append(i)
            pages = w.task_pages.setdefault(it.task, [])
            if not pages or pages[-1] != it.page:
                pages.append(it.page)
        for t in lst:
            pages = w.task_pages.get(t, [])
            w.need[t] = min(1, len(pages)) if tasks[t].stream else len(pages)
        out.append(w)
    return out
