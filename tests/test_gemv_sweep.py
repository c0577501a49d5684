"""scripts/gemv_sweep.py, the per-launch GEMV measurements: every mode's instances are named and
emitted, and the 16- to 32-row wgmma_sk_q4 sweep (GEMV_SWEEP=sk16) compiles with each instance's
ptxas verdict recorded, so that a config ptxas serialized (version 18's CW 4, PP 1 at 16 and 24
rows, C7512) is marked in its results and the CW 3, PP 1 configs added in version 22 are clean."""

import importlib
import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))


def _sweep(monkeypatch, mode: str):
    monkeypatch.setenv("GEMV_SWEEP", mode)
    for k in ("GEMV_CFG", "GEMV_SHAPES", "GEMV_EPI", "GEMV_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    import gemv_sweep
    return importlib.reload(gemv_sweep)


def test_every_mode_emits_its_instances(monkeypatch):
    import gemv_sweep
    for mode in gemv_sweep.MODES:
        gs = _sweep(monkeypatch, mode)
        names = [gs.name(k, nt, cfg) for k, nt, cfg in gs.instances()]
        assert names and len(names) == len(set(names))
        src = gs.source()
        assert all(f" {n}(" in src for n in names), mode


def _built_regs(monkeypatch, tmp_path, mode: str) -> dict:
    """A mode's instances built with nvcc: the register lines its .regs.json records by name."""
    out = tmp_path / f"{mode}.cubin"
    _sweep(monkeypatch, mode).build(str(out))
    return json.loads(Path(str(out) + ".regs.json").read_text())


def test_sk16_has_the_cw3_pp1_configs(monkeypatch):
    gs = _sweep(monkeypatch, "sk16")
    for nt in (2, 3, 4):
        assert ("s", 3, 6, 0, 1) in gs.SWEEP[nt][1]
    assert ("s", 4, 6, 0, 1) in gs.SWEEP[2][1]   # kept: the serialized build version 18 timed


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_sk16_build_marks_serialized_instances(monkeypatch, tmp_path):
    regs = _built_regs(monkeypatch, tmp_path, "sk16")
    assert "SERIALIZED C7512" in regs["sw_k5120_sk4_n2_x6_p1"]
    for n in ("sw_k5120_sk3_n2_x6_p1", "sw_k5120_sk3_n3_x6_p1", "sw_k5120_sk3_n2_x4_p1"):
        assert "SERIALIZED" not in regs[n] and "SPILL" not in regs[n], (n, regs[n])


def test_zs_configs_keep_their_fields(monkeypatch):
    """A "b" config is (MT, ST, XS, AS[, ZS[, MB]]): ZS = 2 gives a cluster of two blocks of half
    the warps, MS stays 0, and the instance keeps the name its results were recorded under."""
    gs = _sweep(monkeypatch, "zs")
    src = gs.source()
    line = next(s for s in src.splitlines() if " sw_k5120_m1_n1_s2_x1_a0_z2(" in s)
    assert "__launch_bounds__(128, 1) __cluster_dims__(2, 1, 1)" in line
    assert "q38::gemv_q4<5120, 1, 1, 8, 0, 2, 1, 0, 0, 2>(" in line
    g1 = _sweep(monkeypatch, "g1")
    assert g1.name(5120, 1, ("b", 1, 2, 0, 0, 1, 5)) == "sw_k5120_m1_n1_s2_x0_a0_b5"
    assert "__launch_bounds__(256, 5) sw_k5120_m1_n1_s2_x0_a0_b5(" in g1.source()


def test_cv_mode_times_gemv_cv_beside_gemv_q4(monkeypatch):
    """GEMV_SWEEP=cv: at 1 and 16 rows, gemv_q4's program schedules first (its bitwise reference)
    and gemv_cv's configs, each family compared with its own first config; a gemv_cv instance is
    named by its template arguments, launched with the threads and grid its config says."""
    gs = _sweep(monkeypatch, "cv")
    assert {nt: r for nt, (r, _) in gs.SWEEP.items()} == {1: 1, 2: 16}
    for _, cfgs in gs.SWEEP.values():
        fams = [gs.family(c) for c in cfgs]
        assert fams[0] == "q4" and "cv" in fams
    src = gs.source()
    assert '#include "gemv_cv.cuh"' in src
    line = next(s for s in src.splitlines() if " sw_k17408_cv_n2_s2_w1_k0_x0_m4(" in s)
    assert "__launch_bounds__(288, 1)" in line
    assert "q38::gemv_cv<17408, 2, 8, 0, 2, 1, 0, 0, 4, 0, 0>(qw, sc, x, ldx, y, ldy, N, R);" in line
    # LB: the bulk-copy loader, named and passed as the last template argument
    line = next(s for s in src.splitlines() if " sw_k5120_cv_n1_s8_w1_k0_x0_lb(" in s)
    assert "q38::gemv_cv<5120, 1, 8, 0, 8, 1, 0, 0, 1, 1, 0>(qw, sc, x, ldx, y, ldy, N, R);" in line
    # AR = 1: gemv_q4's arithmetic, so the q4 family (compared bit for bit with gemv_q4)
    assert gs.family(("c", 4, 1, 0, 2, 0, 1, 1, 1)) == "q4" and gs.family(("c", 4, 1, 0, 2)) == "cv"
    assert " sw_k5120_cv_n1_s4_w1_k0_x0_lb_ar(" in src
    # MI m-tiles per consumer warp: a block's round covers WM·MI m-tiles
    assert gs.shape_of(34816, 1, 1, 5120, ("c", 2, 1, 0, 0, 0, 4))[0] == (544, 1, 1)
    assert gs.smem_of(5120, 2, ("c", 2, 1, 0, 0, 0, 4)) <= 227 * 1024
    # gate_up (2176 m-tiles): one block per m-tile, or two per SM; WM = 2: one per SM
    assert gs.shape_of(34816, 1, 1, 5120, ("c", 4, 1, 0, 0))[:2] == ((2176, 1, 1), (288, 1, 1))
    assert gs.shape_of(34816, 16, 2, 5120, ("c", 8, 1, 0, 2))[0] == (264, 1, 1)
    assert gs.shape_of(34816, 16, 2, 5120, ("c", 6, 2, 0, 1))[0] == (132, 1, 1)
    assert gs.smem_of(5120, 2, ("c", 6, 2, 0, 1)) <= 227 * 1024
    assert '#include "gemv_cv.cuh"' not in _sweep(monkeypatch, "sk16").source()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_cv_build_is_clean(monkeypatch, tmp_path):
    regs = _built_regs(monkeypatch, tmp_path, "cv")
    cv = [n for n in regs if "_cv_" in n]
    # NT 1, 2; ten instances (GB is a launch choice: ST 4, MI 2, MI 4, the three LB ones and the
    # four AR ones); K 5120, 6144, 17408
    assert len(cv) == 2 * 10 * 3
    assert not [n for n in regs if "SPILL" in regs[n] or "SERIALIZED" in regs[n]]
