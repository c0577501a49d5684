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


def test_sk16_has_the_cw3_pp1_configs(monkeypatch):
    gs = _sweep(monkeypatch, "sk16")
    for nt in (2, 3, 4):
        assert ("s", 3, 6, 0, 1) in gs.SWEEP[nt][1]
    assert ("s", 4, 6, 0, 1) in gs.SWEEP[2][1]   # kept: the serialized build version 18 timed


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_sk16_build_marks_serialized_instances(monkeypatch, tmp_path):
    gs = _sweep(monkeypatch, "sk16")
    out = tmp_path / "sk16.cubin"
    gs.build(str(out))
    regs = json.loads(Path(str(out) + ".regs.json").read_text())
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
