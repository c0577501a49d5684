"""The launch-level task graph of an emitted phase, found by the emulator, and the phase executed
in random legal orders (docs/PERSISTENT.md §4 at launch granularity: the first layer of the
persistent step's CPU check; its tasks will be finer).

Footprints come from running the phase once, launch by launch, on a prepared state:

* what a launch **reads** is every buffer interval it takes through ``Emu.view`` (a superset:
  a view may be wider than what the op uses), and the whole buffer where an op indexes a buffer
  directly (the tile-order paths);
* what it **writes** is every element whose value it changed.

Launch j depends on an earlier launch i where i writes what j reads or writes, or reads what j
writes. A legal order is a topological order of those edges; ``run_order`` executes one from the
same starting state. Equal buffers, bit for bit, for every legal order say that the edges hold
everything a launch needs (a read the footprint missed would let a reader run before its
writer); orders that break one edge must be caught by the same comparison (tests).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..plan.families import family
from .schedule import Emu


class _Buffers(dict):
    """The emulator's buffers, noting those indexed directly (outside ``view``)."""

    def __init__(self, d):
        super().__init__(d)
        self.touched: set[str] | None = None
        self.quiet = 0

    def __getitem__(self, name):
        if self.touched is not None and not self.quiet:
            self.touched.add(name)
        return super().__getitem__(name)


class TracingEmu(Emu):
    """``Emu`` that records what each launch reads while ``trace`` is a list."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.buf = _Buffers(self.buf)
        self.trace: list | None = None

    def view(self, arg, shape):
        if self.trace is not None:
            _, name, off, per = arg
            o = off + per * self.tmax
            self.trace.append((name, o, o + int(np.prod(shape))))
        self.buf.quiet += 1
        try:
            return super().view(arg, shape)
        finally:
            self.buf.quiet -= 1

    @contextmanager
    def tracing(self):
        self.trace, self.buf.touched = [], set()
        try:
            yield
        finally:
            self.trace, self.buf.touched = None, None

    def snapshot(self) -> dict[str, np.ndarray]:
        return {n: dict.__getitem__(self.buf, n).copy() for n in self.buf}

    def restore(self, snap: dict[str, np.ndarray]) -> None:
        for n, a in snap.items():
            dict.__getitem__(self.buf, n)[:] = a


@dataclass
class Footprint:
    reads: dict[str, np.ndarray]      # buffer -> bool mask of elements read
    writes: dict[str, np.ndarray]     # buffer -> bool mask of elements changed


def run_launch(emu: Emu, L: dict) -> None:
    """Run one launch of the manifest's schedule in the emulator."""
    k = emu.kernel(L)
    getattr(emu, "k_" + family(k["family"]).emu)(L, k.get("pt", 1))


def launch_footprint(emu: TracingEmu, L: dict) -> Footprint:
    """Run one launch from the emulator's current state, recording what it reads and changes;
    the state is left as the launch leaves it. Only the buffers among the launch's arguments are
    compared (the emulator's kernels reach buffers through their arguments alone)."""
    args = {a[1] for a in L["args"] if a[0] == "buf"}
    before = {n: dict.__getitem__(emu.buf, n).copy() for n in emu.buf if n in args}
    with emu.tracing():
        run_launch(emu, L)
        trace, touched = list(emu.trace), set(emu.buf.touched)
    reads: dict[str, np.ndarray] = {}
    for name, a, b in trace:
        m = reads.setdefault(name, np.zeros(before[name].size, bool))
        m[a:b] = True
    for name in touched:
        reads[name] = np.ones(before[name].size, bool)
    writes = {}
    for name, old in before.items():
        new = dict.__getitem__(emu.buf, name)
        changed = ~((old == new) | (np.isnan(old) & np.isnan(new)))
        if changed.any():
            writes[name] = changed
    return Footprint(reads, writes)


def footprints(emu: TracingEmu, phase: str) -> list[Footprint]:
    """Run ``phase`` once from the emulator's current state, launch by launch, recording each
    launch's footprint; the state is left as the phase leaves it."""
    return [launch_footprint(emu, L) for L in emu.man["schedule"][phase]]


def _meets(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return any(n in b and bool((m & b[n]).any()) for n, m in a.items())


def dependencies(fp: list[Footprint]) -> list[set[int]]:
    """deps[j]: the earlier launches j must follow (RAW, WAR and WAW on any element)."""
    deps = []
    for j, fj in enumerate(fp):
        deps.append({i for i in range(j)
                     if _meets(fp[i].writes, fj.reads) or _meets(fp[i].writes, fj.writes)
                     or _meets(fp[i].reads, fj.writes)})
    return deps


def random_order(deps: list[set[int]], rng: np.random.Generator) -> list[int]:
    """A topological order of the launches, the next picked uniformly among the ready ones."""
    done: set[int] = set()
    order = []
    while len(order) < len(deps):
        ready = [j for j in range(len(deps)) if j not in done and deps[j] <= done]
        j = ready[int(rng.integers(len(ready)))]
        order.append(j)
        done.add(j)
    return order


def run_order(emu: Emu, phase: str, order: list[int]) -> None:
    sched = emu.man["schedule"][phase]
    for j in order:
        run_launch(emu, sched[j])


def equal_state(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> list[str]:
    """The buffers that differ; one holding a NaN or an infinity on either side counts as
    differing (a comparison that meets them must not pass)."""
    return [n for n in a if not (np.isfinite(a[n]).all() and np.isfinite(b[n]).all()
                                 and np.array_equal(a[n], b[n]))]


def lists_from_order(order: list[int], sms: int) -> list[list[int]]:
    """Per-SM static task lists: a topological order dealt round robin (each list is then a
    subsequence of one topological order, as the persistent step's lists are)."""
    return [order[s::sms] for s in range(sms)]


def simulate(lists: list[list[int]], deps: list[set[int]],
             rng: np.random.Generator) -> tuple[list[int], list[tuple[int, int]] | None]:
    """Each SM runs its list in order; a task starts once every task it depends on has finished
    (the counters' wait). SMs advance in a random order. Returns (the order tasks ran in, None),
    or (what ran, [(SM, the task it waits at)]) where no SM can advance: a deadlock."""
    pos = [0] * len(lists)
    done: set[int] = set()
    ran: list[int] = []
    total = sum(len(x) for x in lists)
    while len(ran) < total:
        ready = [s for s, lst in enumerate(lists) if pos[s] < len(lst) and deps[lst[pos[s]]] <= done]
        if not ready:
            return ran, [(s, lst[pos[s]]) for s, lst in enumerate(lists) if pos[s] < len(lst)]
        s = ready[int(rng.integers(len(ready)))]
        t = lists[s][pos[s]]
        pos[s] += 1
        done.add(t)
        ran.append(t)
    return ran, None
