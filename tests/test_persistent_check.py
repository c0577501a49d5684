"""The task-level CPU check of the persistent decode step (docs/PERSISTENT.md §4): tasks cut from
the tiny model's decode launches (qwen38gen/emu/tasks.py), a plan of per-SM lists, counters and
loader walks (emu/persistent.py), and its checker (emu/persistent_check.py): the plan passes the
static checks and random and adversarial interleavings over three decode steps, and each broken
plan is caught with the report that names what broke."""

from __future__ import annotations

import copy
import functools
from types import SimpleNamespace

import numpy as np
import pytest

from qwen38gen.config import PRESETS
from qwen38gen.emu.persistent import build_plan, walks
from qwen38gen.emu.persistent_check import check_static, simulate
from qwen38gen.emu.tasks import cut_errors, cut_step, reference

from tests._blas_threads import single_threaded  # noqa: F401  (autouse: 1 BLAS thread)
from tests.test_taskgraph import prepared

STEPS, SMS, RING = 3, 4, 12


@functools.lru_cache(maxsize=None)
def decode(B: int) -> SimpleNamespace:
    """Three decode steps of the tiny model at batch B (after two packed prefill chunks), cut
    into tasks; the emulator's state before the first, the reference order, a 4-SM plan."""
    emu, phase = prepared(B, 4, "decode")
    start = emu.snapshot()
    steps, cuts = [], []
    for _ in range(STEPS):
        tasks, fp = cut_step(emu, phase)
        assert not cuts or tasks == cuts[0], "the cut changed from step to step"
        cuts.append(tasks)
        steps.append(fp)
        emu.put("tokens", emu.get("next"))
    sizes = {n: a.size for n, a in emu.snapshot().items()}
    refs = reference(steps, sizes)
    plan = build_plan(tasks, [r.pairs for r in refs], SMS, RING)
    return SimpleNamespace(emu=emu, phase=phase, start=start, tasks=tasks, steps=steps,
                           sizes=sizes, refs=refs, plan=plan, man=emu.man)


def static(d, plan=None, steps=None, refs=None):
    return check_static(plan or d.plan, d.tasks, steps or d.steps, refs or d.refs, d.man)


def dynamic(d, policy, plan=None, steps=None, refs=None, **kw):
    return simulate(plan or d.plan, d.tasks, steps or d.steps, refs or d.refs, d.man, d.sizes,
                    policy, **kw)


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


@pytest.mark.parametrize("B", [1, 3])
def test_the_plan_passes_static_and_dynamic_checks(B):
    """Lists dealt over 4 SMs, counters from the conflicts, a 12-page ring: no static finding,
    and three steps under random interleavings and the adversarial policies see every
    element at the reference's version and never deadlock."""
    d = decode(B)
    assert static(d) == []
    # §2's counters: a GDN (sequence, key head) waits on the in-projection row blocks that meet
    # its head's rows (q 8, k 8, v 24, z 24, b 1, a 1: dk = dv = 128, 3 value heads a key head);
    # a norm row after the MLP on every row block of the down projection (512 rows / 16)
    on = {(d.tasks[c].family, d.tasks[d.plan.counters[k].producers[0]].label.split()[0],
           len(d.plan.counters[k].producers)) for c in range(len(d.tasks))
          for k, _ in d.plan.waits[c]}
    assert {n for f, w, n in on if f == "gdn" and w.endswith(".in")} == {66}
    assert {n for f, w, n in on if f == "rmsnorm" and w.endswith(".down")} == {32}
    assert all(len(lst) > 100 for lst in d.plan.lists)
    for seed in range(2):
        assert dynamic(d, "random", seed=seed) == [], seed
    for policy in ("loader", "consumer"):
        assert dynamic(d, policy) == [], policy
    assert dynamic(d, "starve", starve=1) == []


def test_the_plan_on_132_sms():
    """The same tasks dealt over 132 SMs: no static finding; one step of random progress."""
    d = decode(3)
    plan = build_plan(d.tasks, [r.pairs for r in d.refs], 132, RING)
    assert static(d, plan) == []
    assert dynamic(d, "random", plan, d.steps[:1], d.refs[:1]) == []


def _norm_wait(d):
    """The norm row c, its wait's index i and counter k, with the most producers on SMs other
    than c's (a norm after a down projection)."""
    sm = d.plan.sm_of()
    best = max(((len({sm[p] for p in d.plan.counters[k].producers} - {sm[c]}),
                 len(d.plan.counters[k].producers), -c, i, k)
                for c in of(d.tasks, "rmsnorm") for i, (k, _) in enumerate(d.plan.waits[c])))
    assert best[0] > 0
    return -best[2], best[3], best[4]


def _caught_at(d, reports, c, k):
    """The order reports for c name producers of k; starving the SM of one of them, the
    dynamic check reports c reading before one of k's producers wrote."""
    prods = set(d.plan.counters[k].producers)
    order = [r for r in reports if r.kind == "order" and r.task == c]
    assert order and all(r.other in prods for r in order)
    victim = d.plan.sm_of()[order[0].other]
    return victim, prods


@pytest.mark.parametrize("mutation", ["dropped wait", "target one low"])
def test_a_missing_wait_is_caught(mutation):
    d = decode(3)
    c, i, k = _norm_wait(d)
    plan = copy.deepcopy(d.plan)
    if mutation == "dropped wait":
        plan.waits[c].pop(i)
    else:
        plan.waits[c][i] = (k, plan.waits[c][i][1] - 1)
    reports = static(d, plan)
    kinds = {r.kind for r in reports}
    if mutation == "target one low":
        assert [r.task for r in reports if r.kind == "target"] == [c]
        assert kinds == {"target", "order"}
    else:
        assert kinds == {"order"}
    victim, prods = _caught_at(d, reports, c, k)
    got = dynamic(d, "starve", plan, starve=victim)
    assert got and all(r.kind == "RAW" and r.task == c and r.other in prods for r in got), got


def test_two_dependent_tasks_swapped_in_a_list_are_caught():
    """A norm row moved ahead of its producer on the same SM: D has a cycle through both, and
    the run deadlocks with that SM blocked at the norm row on the producer's counter."""
    d = decode(3)
    c, _, k = _norm_wait(d)
    sm = d.plan.sm_of()[c]
    plan = copy.deepcopy(d.plan)
    lst = plan.lists[sm]
    a = next(t for t in lst if t in d.plan.counters[k].producers)
    i, j = lst.index(a), lst.index(c)
    lst[i], lst[j] = lst[j], lst[i]
    reports = static(d, plan)
    assert [r.kind for r in reports] == ["cycle"]
    assert {a, c} <= set(reports[0].cycle)
    got = dynamic(d, "random", plan)
    blocked = [r for r in got if r.kind == "deadlock" and r.sm == sm]
    assert {r.kind for r in got} == {"deadlock"} and len(blocked) == 1
    assert blocked[0].task == c and blocked[0].counter == k and blocked[0].step == 0


def test_the_kv_slot_at_pos_in_a_walk_is_caught():
    """An attention task whose walk also brings the K slot at pos (written by attn_prep this
    step): the loader rule names the slot and its writer, and with the loader running ahead
    the attention task reads the slot's previous version."""
    d = decode(3)
    t = of(d.tasks, "attn_tc")[0]                     # sequence 0, kv head 0
    prep = of(d.tasks, "attn_prep")[0]                # row 0, kv head 0
    steps = []
    for fp in d.steps:
        fp = copy.copy(fp)
        fp.mem, fp.walk = list(fp.mem), list(fp.walk)
        mem = dict(fp.mem[t])
        fp.walk[t] = fp.walk[t] + [("kc", int(a), int(b)) for a, b in mem.pop("kc")]
        fp.mem[t] = mem
        steps.append(fp)
    refs = reference(steps, d.sizes)
    pos0 = int(d.start["pos"][0])
    slot = [(pos0 + s) * 256 for s in range(STEPS)]   # kc[0, 0, pos] of layer 3, D = 256
    reports = static(d, None, steps, refs)
    assert [(r.kind, r.task, r.other, r.buffer, r.element) for r in reports] == \
        [("loader", t, prep, "kc", e) for e in slot]
    got = dynamic(d, "loader", None, steps, refs)
    assert [(r.kind, r.task, r.other, r.buffer, r.element) for r in got] == \
        [("RAW", t, prep, "kc", e) for e in slot]


def test_a_ring_smaller_than_a_task_needs_is_caught():
    """A ring one page short of the largest page need: the static check names every task that
    needs more, and the run deadlocks with an SM waiting for pages the ring cannot hold."""
    d = decode(3)
    need = max(max(w.need.values()) for w in walks(d.plan, d.tasks, d.steps[0], d.man))
    assert need >= 2
    plan = copy.deepcopy(d.plan)
    plan.ring_pages = need - 1
    reports = static(d, plan)
    assert reports and {r.kind for r in reports} == {"ring"}
    got = dynamic(d, "random", plan)
    assert {r.kind for r in got} == {"deadlock"}
    short = [r for r in got if "needs pages" in r.detail]
    assert short and all(f"of {need - 1} ring pages" in r.detail for r in short), got
    assert {r.task for r in short} <= {r.task for r in reports if r.step == 0}


def test_a_reader_moved_after_its_overwriter_is_caught():
    """A GDN task moved to the end of its SM's list, nobody waiting on it: the legality rule
    names it before the next in-projection (WAR on proj), and the run reports it reading proj
    that a later launch overwrote, the out-projection reading o before it wrote it, and o
    ending at its version instead of the reference's last writer's."""
    d = decode(3)
    g = of(d.tasks, "gdn")[0]
    plan = copy.deepcopy(d.plan)
    lst = plan.lists[plan.sm_of()[g]]
    lst.remove(g)
    lst.append(g)
    mine = {k for k, c in enumerate(plan.counters) if g in c.producers}
    plan.waits = [[w for w in ws if w[0] not in mine] for ws in plan.waits]
    reports = static(d, plan)
    assert {r.kind for r in reports} == {"order"}
    assert any(r.other == g and r.detail.endswith("(WAR on proj)") for r in reports)
    got = dynamic(d, "random", plan, d.steps[:1], d.refs[:1])
    war = [r for r in got if r.kind == "WAR" and r.buffer == "proj"]
    assert war and all(r.task == g and d.tasks[r.other].launch > d.tasks[g].launch for r in war)
    assert any(r.kind == "RAW" and r.other == g and r.buffer == "o" for r in got)
    assert any(r.kind == "WAW" and r.task == g and r.buffer == "o" for r in got)
