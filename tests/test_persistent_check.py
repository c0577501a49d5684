"""The task-level CPU check of the persistent decode step (docs/PERSISTENT.md §4): tasks cut from
the tiny model's decode launches (qwen38gen/emu/tasks.py) partition their launches, and a wrong
cut is caught."""

from __future__ import annotations

import copy
import functools
from types import SimpleNamespace

import numpy as np
import pytest

from qwen38gen.config import PRESETS
from qwen38gen.emu.tasks import cut_errors, cut_step

from tests._blas_threads import single_threaded  # noqa: F401  (autouse: 1 BLAS thread)
from tests.test_taskgraph import prepared

STEPS = 3


@functools.lru_cache(maxsize=None)
def decode(B: int) -> SimpleNamespace:
    """Three decode steps of the tiny model at batch B (after two packed prefill chunks), cut
    into tasks; the emulator's state before the first."""
    emu, phase = prepared(B, 4, "decode")
    start = emu.snapshot()
    steps = []
    for _ in range(STEPS):
        tasks, fp = cut_step(emu, phase)
        assert not steps or tasks == first, "the cut changed from step to step"
        first = tasks
        steps.append(fp)
        emu.put("tokens", emu.get("next"))
    return SimpleNamespace(emu=emu, phase=phase, start=start, tasks=tasks, steps=steps,
                           man=emu.man)


def of(tasks, family):
    return [i for i, t in enumerate(tasks) if t.family == family]


@pytest.mark.parametrize("B", [1, 3])
def test_tasks_partition_their_launches(B):
    """The cut: each launch's task writes partition its measured writes, task reads lie within
    its reads, and each sampled task's cells do not change when everything else the launch
    reads is poisoned; the loader walk lies within R(t); the GEMV row blocks stream every row
    tile of their weight once per batch tile."""
    d = decode(B)
    c = PRESETS["tiny"]
    d.emu.restore(d.start)
    assert cut_errors(d.emu, d.phase, d.tasks, d.steps[0]) == []
    fp = d.steps[0]
    assert len(of(d.tasks, "gdn")) == 6 * B * c.linear_num_key_heads
    assert len(of(d.tasks, "attn_tc")) == 2 * B * c.num_key_value_heads
    assert len(of(d.tasks, "attn_prep")) == 2 * B * c.num_key_value_heads
    assert {d.tasks[t].label.split(" (")[0] for t in range(len(d.tasks))
            if "whole launch" in d.tasks[t].label} == {"advance"}
    for t in range(len(d.tasks)):
        for name, a, b in fp.walk[t]:
            if ":" in name:
                assert any(x <= a and b <= y for x, y in fp.const[t][name]), (t, name)
            else:
                assert not any(x < b and a < y for x, y in fp.mem[t].get(name, ())), (t, name)
    walked = [t for t in of(d.tasks, "attn_tc") if any(":" not in w[0] for w in fp.walk[t])]
    assert len(walked) == len(of(d.tasks, "attn_tc"))      # K/V below pos, every sequence
    for j, L in enumerate(d.man["schedule"][d.phase]):
        if d.tasks[[t.launch for t in d.tasks].index(j)].family != "gemv_q4":
            continue
        spec = d.man["weights"][L["weight"]]
        units = np.zeros(-(-spec["rows"] // 16) * spec["k"] // 64, int)
        for t in (i for i, x in enumerate(d.tasks) if x.launch == j):
            for x, y in fp.const[t][f"w:{L['weight']}.qweight"]:
                units[x:y] += 1
        assert (units == -(-B // L["btg"])).all(), L["weight"]


def test_a_wrong_cut_is_caught():
    """Two GDN tasks of one sequence given each other's projection columns: poisoning what
    each does not read changes its outputs, and both are named."""
    d = decode(3)
    fp = copy.copy(d.steps[0])
    fp.mem = [dict(m) for m in fp.mem]
    g0, g1 = [t for t in of(d.tasks, "gdn") if d.tasks[t].label.startswith("gdn seq 1 ")][:2]
    fp.mem[g0]["proj"], fp.mem[g1]["proj"] = fp.mem[g1]["proj"], fp.mem[g0]["proj"]
    d.emu.restore(d.start)
    errors = cut_errors(d.emu, d.phase, d.tasks, fp, sample=0, also=(g0, g1))
    assert {e.split(" (")[0] for e in errors} == {f"task {g0}", f"task {g1}"}, errors
