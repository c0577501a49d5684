"""The launch-level task graph (qwen38gen/emu/taskgraph.py): footprints found by the emulator,
the dependencies they give, and the phase executed in random legal orders, which must leave every
buffer bit for bit as the program order does; breaking one read-after-write edge must not."""

from __future__ import annotations

import numpy as np
import pytest

from qwen38gen.config import PRESETS
from qwen38gen.emit import emit_program
from qwen38gen.emu.taskgraph import (TracingEmu, dependencies, equal_state, footprints,
                                     launch_footprint, random_order, run_order)
from qwen38gen.inputs import put_chunk
from qwen38gen.lanes import Lanes
from qwen38gen.weights import default_tensors

from tests._blas_threads import single_threaded  # noqa: F401  (autouse: 1 BLAS thread)


def prepared(B, pt, step):
    """The emulator before a packed prefill chunk (prompts of 9, 1 and 5 tokens: slot 1 ends in
    it) or, after two chunks, before a decode step; the phase's name."""
    cfg = PRESETS["tiny"]
    man = emit_program(cfg, Lanes.make(B, pt=pt)).manifest
    emu = TracingEmu(man, cfg, default_tensors(cfg), tmax=32)
    rng = np.random.default_rng(B)
    prompts = [list(map(int, rng.integers(0, cfg.vocab_size, (9, 1, 5)[b % 3])))
               for b in range(B)]
    if step == "prefill":
        return emu, put_chunk(emu.put, man["schedule"], [p[:pt] for p in prompts])
    for c in range(2):
        emu.run(put_chunk(emu.put, man["schedule"], [p[c * pt:(c + 1) * pt] for p in prompts]))
    emu.put("tokens", rng.integers(0, cfg.vocab_size, B))
    emu.put("ntok", np.ones(B, np.int64))
    return emu, "decode"


@pytest.mark.parametrize("B,pt,step", [(3, 4, "prefill"), (3, 4, "decode"), (2, 8, "prefill")])
def test_random_legal_orders_leave_the_same_state(B, pt, step):
    emu, phase = prepared(B, pt, step)
    start = emu.snapshot()
    fp = footprints(emu, phase)
    want = emu.snapshot()
    deps = dependencies(fp)
    moved = 0
    for seed in range(12):
        emu.restore(start)
        order = random_order(deps, np.random.default_rng(seed))
        assert sorted(order) == list(range(len(deps)))
        moved += sum(a != b for a, b in zip(order, range(len(deps))))
        run_order(emu, phase, order)
        assert equal_state(want, emu.snapshot()) == [], (seed, order)
    assert moved > 0          # the graph leaves freedom: the check is not program order again


def test_breaking_a_read_after_write_edge_is_caught():
    """For launches j that read what their latest writer i wrote, running j before i changes the
    phase's result: the comparison the legal orders pass has teeth."""
    emu, phase = prepared(3, 4, "prefill")
    start = emu.snapshot()
    fp = footprints(emu, phase)
    want = emu.snapshot()
    n = len(fp)
    raw = []
    for j in range(1, n):
        writers = [i for i in range(j) if any(
            name in fp[j].reads and (m & fp[j].reads[name]).any()
            for name, m in fp[i].writes.items())]
        if writers:
            raw.append((writers[-1], j))
    assert len(raw) > n // 2
    for i, j in raw[::max(1, len(raw) // 8)]:
        emu.restore(start)
        order = [k for k in range(n) if k != j]
        order.insert(order.index(i), j)      # j just before its writer
        run_order(emu, phase, order)
        assert equal_state(want, emu.snapshot()) != [], (i, j)


def test_static_lists_run_without_deadlock_and_a_bad_list_is_caught():
    """Lists dealt from one topological order over 4 'SMs' never deadlock under random progress,
    and what they run is a legal order (the same state); a list that puts a task before one it
    depends on, on the same SM, is reported as a deadlock naming where each SM waits."""
    from qwen38gen.emu.taskgraph import lists_from_order, simulate

    emu, phase = prepared(3, 4, "decode")
    start = emu.snapshot()
    fp = footprints(emu, phase)
    want = emu.snapshot()
    deps = dependencies(fp)
    for seed in range(6):
        rng = np.random.default_rng(seed)
        lists = lists_from_order(random_order(deps, rng), 4)
        ran, stuck = simulate(lists, deps, rng)
        assert stuck is None and sorted(ran) == list(range(len(deps)))
        emu.restore(start)
        run_order(emu, phase, ran)
        assert equal_state(want, emu.snapshot()) == []
    # one SM's list with a reader ahead of its writer
    j = next(j for j in range(len(deps)) if deps[j])
    i = max(deps[j])
    bad = [[j, i] + [k for k in range(len(deps)) if k not in (i, j)]]
    ran, stuck = simulate(bad, deps, np.random.default_rng(0))
    assert stuck == [(0, j)] and ran == []


@pytest.mark.parametrize("step", ["prefill", "decode"])
def test_launches_change_no_buffer_outside_their_arguments(step):
    """launch_footprint compares only a launch's argument buffers (for speed): that is all it
    may change. Every other buffer, compared whole around each launch, stays bit for bit."""
    emu, phase = prepared(3, 4, step)
    for L in emu.man["schedule"][phase]:
        args = {a[1] for a in L["args"] if a[0] == "buf"}
        before = emu.snapshot()
        launch_footprint(emu, L)
        after = emu.snapshot()
        moved = [n for n in before if n not in args
                 and not np.array_equal(before[n], after[n], equal_nan=True)]
        assert moved == [], (L.get("kernel"), moved)
