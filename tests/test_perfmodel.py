"""The timing model (qwen38gen/perf/perfmodel.py): its bytes against the floor model, its fit on the
committed measurements within the stated tolerance, sanity of its predictions, and `perf`'s
one-line errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from qwen38gen.config import INT4_GROUP, load_config
from qwen38gen.emit import emit_program
from qwen38gen.errors import UserError
from qwen38gen.lanes import Lanes
from qwen38gen.perf import perfmodel as pm

ROOT = Path(__file__).resolve().parents[1]
MEASURED = ROOT / "bench" / "2026-12-04-h200-v20.json"
# the tolerance docs/TIMING_MODEL.md states: the step within 5 % on the calibration batches and
# within 10 % on the held-out ones
TOL_CALIBRATION, TOL_HELD_OUT = 0.05, 0.10


@pytest.fixture(scope="module")
def fit():
    return pm.calibrate(pm.load_measured(MEASURED))


@pytest.fixture(scope="module")
def big():
    return load_config("qwen3.8-27b")


@pytest.mark.parametrize("B,T", [(1, 1024), (3, 17), (16, 1024), (64, 1024), (64, 1)])
def test_bytes_equal_the_floor_27b(big, B, T):
    """The 27B's fused weights have no padding rows: the launches' HBM bytes are the floor's."""
    costs = pm.program_costs(big, B, T)
    assert pm.hbm_parts(costs) == big.floor_parts(B, T)
    assert sum(c.hbm for c in costs) == big.floor_bytes(B, T)


@pytest.mark.parametrize("B", [1, 5, 17])
def test_bytes_of_the_tiny_model_differ_by_padding_rows_only(B):
    """Where a fused part is padded to 16 rows, the GEMV reads the padding too: the weights
    differ from the floor by exactly those rows' bytes; the state and KV are equal."""
    cfg = load_config("tiny")
    man = emit_program(cfg, Lanes.make(B, pt=1)).manifest
    parts = pm.hbm_parts(pm.launch_costs(cfg, man, 40))
    floor = cfg.floor_parts(B, 40)
    pad = sum((w["rows"] - sum(p[2] for p in w["parts"])) * w["k"] * (0.5 + 2.0 / INT4_GROUP)
              for w in man["weights"].values())
    assert parts["weights"] - floor["weights"] == pytest.approx(pad, abs=1e-6)
    assert (parts["state"], parts["kv"]) == (floor["state"], floor["kv"])


def test_activations_are_kept_apart_and_small(big):
    """Activation bytes are counted, never in the HBM total, and small beside it."""
    costs = pm.program_costs(big, 64, 1024)
    act = sum(c.act for c in costs)
    assert 0 < act < 0.05 * sum(c.hbm for c in costs)


def test_the_fit_on_the_committed_run(fit):
    meas = json.loads(MEASURED.read_text())
    by_b = {r["batch"]: r for r in meas["rows"]}
    assert [r["batch"] for r in fit.rows] == sorted(by_b)
    held = {r["batch"] for r in fit.rows if r["held_out"]}
    assert held == set(by_b) - set(pm.CALIBRATION_BATCHES) and len(held) >= 2
    for r in fit.rows:
        assert r["measured_ms"] == by_b[r["batch"]]["step_ms"]
        assert r["error"] == pytest.approx(r["predicted_ms"] / r["measured_ms"] - 1)
    assert fit.max_error(False) <= TOL_CALIBRATION, fit.rows
    assert fit.max_error(True) <= TOL_HELD_OUT, fit.rows


def test_the_exactly_determined_gemv_points_reproduce_their_figures(fit):
    """e_G and P(gemv_q4) are solved on B = 1 and 16: the model gives back those graph times."""
    for r in fit.rows:
        if r["batch"] in (1, 16):
            assert r["kinds_ms"]["gemv"] == pytest.approx(r["measured_kinds_ms"]["gemv"])


def test_fitted_parameters_are_physical(fit):
    p = fit.params
    assert 0 < p.e_G <= 1 and 0 < p.e_g <= 1 and 0 < p.e_a <= 1
    assert p.P_w < pm.CHAIN_TFLOPS * 1e12 * 1.05      # below the measured chain ceiling
    assert p.R > p.R_copy                               # reading alone beats the copy


def test_calibration_needs_the_tiles(fit):
    with pytest.raises(UserError, match=r"^the calibration batches must include two gemv_q4 "
                                        r"tiles \(e\.g\. B = 1 and 16\)"):
        pm.calibrate(pm.load_measured(MEASURED), (1, 2, 32, 64))
    with pytest.raises(UserError, match=r"^calibration batch 3 is not in the measurements"):
        pm.calibrate(pm.load_measured(MEASURED), (1, 3, 16, 32, 64))


BS = (1, 2, 3, 4, 8, 16, 17, 24, 32, 64)


def test_more_batch_more_time(fit, big):
    today, pers = [], []
    for b in BS:
        costs = pm.program_costs(big, b, 1024)
        today.append(pm.step_today(costs, fit.params)["step"])
        pers.append(pm.persistent(costs, fit.params)["step"])
    assert today == sorted(today) and pers == sorted(pers)


def test_more_context_more_time(fit, big):
    ts = [pm.step_today(pm.program_costs(big, 16, t), fit.params)["step"] for t in (1, 512, 4096)]
    assert ts == sorted(ts) and ts[0] < ts[-1]


@pytest.mark.parametrize("B", [1, 16, 64])
def test_the_walk_lies_between_its_bounds(fit, big, B):
    d = pm.persistent(pm.program_costs(big, B, 1024), fit.params)
    assert d["bound"] == max(d["stream"], d["chain"], d["tensor"])
    assert d["bound"] <= d["step"] <= d["serial"]
    assert sum(d["share"].values()) == pytest.approx(1.0)
    assert d["binds"] == max(d["share"], key=d["share"].get)


def test_item1_only_ever_helps(fit, big):
    costs = pm.program_costs(big, 64, 1024)
    now = pm.step_today(costs, fit.params)["step"]
    i1 = pm.item1_today(costs, fit.params)
    assert i1["rate_and_overlap"] <= i1["rate_only"] < now
    assert pm.persistent(costs, fit.params, pm.PLAIN_TFLOPS)["step"] <= \
        pm.persistent(costs, fit.params)["step"]


def test_bad_measurements(tmp_path):
    with pytest.raises(UserError, match=r"^cannot read measurements '/nonexistent.json'"):
        pm.load_measured("/nonexistent.json")
    p = tmp_path / "m.json"
    p.write_text(json.dumps({"rows": []}))
    with pytest.raises(UserError, match=r"is not a `qwen38gen bench --json` file: it needs"):
        pm.load_measured(p)


def test_predict_refuses_a_measured_run_of_another_context(fit, big):
    meas = pm.load_measured(MEASURED)
    with pytest.raises(UserError, match=r"^the measurements are of qwen3\.8-27b at T = 1024, "
                                        r"not qwen3\.8-27b at T = 512"):
        pm.predict(big, [1], 512, fit, "today", meas)


# ------------------------------------------------------------------------------------ the CLI
def run(*args):
    p = subprocess.run([sys.executable, "-m", "cli", "perf", *args], capture_output=True,
                       text=True, cwd=ROOT, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize("args,message", [
    (("--batch", "0"), "error: --batch '0': batch sizes must be 1..256, e.g. 1,16,64"),
    (("--batch", "1,x"), "error: --batch '1,x' is not a comma-separated list of integers, "
                         "e.g. 1,16,64"),
    (("--design", "fused"), "error: --design 'fused' is unknown; choose one of today, "
                            "persistent, both"),
    (("--ctx", "0"), "error: --ctx 0 must be at least 1 cached token"),
    (("--calibration", "/nonexistent.json"), "error: cannot read measurements "
     "'/nonexistent.json': No such file or directory; give a `qwen38gen bench --json` file"),
])
def test_perf_bad_input(args, message):
    rc, out, err = run(*args)
    assert rc == 2 and "Traceback" not in err + out
    assert err.strip() == message


def test_perf_prints_and_writes_json(tmp_path):
    j = tmp_path / "perf.json"
    rc, out, err = run("--batch", "1,64", "--measured", str(MEASURED), "--json", str(j))
    assert rc == 0, err
    assert "model predictions (not measurements)" in out and "held out" in out
    d = json.loads(j.read_text())
    assert d["prediction_unit"] == "s" and d["fit"]["max_error_held_out"] <= TOL_HELD_OUT
    assert [p["batch"] for p in d["predictions"]] == [1, 64]
    p64 = d["predictions"][1]
    assert p64["measured"] == pytest.approx(
        next(r["step_ms"] for r in json.loads(MEASURED.read_text())["rows"]
             if r["batch"] == 64) * 1e-3)
    assert p64["persistent"]["binds"] in ("stream", "chain", "tensor")
    assert f"{p64['today'] * 1e3:.3f}" in out
