"""The kernel family table (qwen38gen/plan/families.py) covers every family a plan emits, and each
row is right: its header is in the program and defines the kernel, its emulator method exists,
its kind is one bench splits by, and the GEMV families are the timing model's."""

import re

import pytest

from qwen38gen.config import PRESETS
from qwen38gen.emu.schedule import Emu
from qwen38gen.matrix import matrix_lanes
from qwen38gen.perf import perfmodel, timing
from qwen38gen.plan.families import FAMILIES, KINDS, family
from qwen38gen.plan.program import plan_program
from qwen38gen.resources import kernels_dir


def emitted_families() -> dict[str, set]:
    """family -> {(header list, kernel function)} over the lane matrix (both models)."""
    seen: dict[str, set] = {}
    for model, lanes in matrix_lanes():
        plan = plan_program(PRESETS[model], lanes)
        for e in plan.entries:
            fn = re.match(r"q38::(\w+)", e.call).group(1)
            seen.setdefault(e.family, set()).add((tuple(plan.headers), fn))
    return seen


def test_every_emitted_family_has_a_row():
    seen = emitted_families()
    assert "" not in seen, "an entry without a family"
    assert set(seen) <= set(FAMILIES), sorted(set(seen) - set(FAMILIES))
    # and no row is stale: every family of the table is emitted by some lane
    assert set(FAMILIES) == set(seen)
    for name, uses in seen.items():
        row = FAMILIES[name]
        src = (kernels_dir() / row.header).read_text()
        for headers, fn in uses:
            assert row.header in headers, (name, row.header)
            assert re.search(rf"\b{fn}\s*\(", src), (name, fn, row.header)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_row(name):
    row = FAMILIES[name]
    assert callable(getattr(Emu, "k_" + row.emu, None)), row.emu
    assert row.kind in KINDS
    assert (row.gemv is not None) == (row.kind == "gemv")
    assert (name in perfmodel.GEMV_FAMILIES) == (row.gemv is not None)
    assert timing.kind_of({"kernels": {"k": {"family": name}}}, {"k": "k"}) == row.kind


def test_unknown_family_is_an_error():
    with pytest.raises(ValueError, match="kernel family 'nope' is not in"):
        family("nope")
    with pytest.raises(ValueError, match="'nope'"):
        timing.kind_of({"kernels": {"k": {"family": "nope"}}}, {"k": "k"})
