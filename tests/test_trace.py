"""bench --trace on the CPU: the trace variant's source, and the timeline's arithmetic on
made-up records (the GPU side is tests/gpu/test_trace.py)."""

import shutil

import numpy as np
import pytest

from qwen38gen.config import PRESETS
from qwen38gen.emit import emit_program
from qwen38gen.lanes import Lanes
from qwen38gen.perf import trace as T


def test_trace_variant_wraps_every_entry_and_nothing_else_changes():
    cfg, lanes = PRESETS["tiny"], Lanes.make(3)
    plain, traced = emit_program(cfg, lanes), emit_program(cfg, lanes, trace=True)
    assert "==== kernels/trace.cuh" not in plain.source and "#define Q38_TRACE" not in plain.source
    assert "#define Q38_TRACE 1" in traced.source and "==== kernels/trace.cuh" in traced.source
    assert "TraceScope" not in plain.source.split("// ==== entry points ====")[1]
    names = traced.manifest.pop("trace")
    assert sorted(names) == sorted(plain.manifest["kernels"])
    assert traced.manifest == plain.manifest     # same schedule, buffers, kernels
    for kid, name in enumerate(names):
        line = next(l for l in traced.source.splitlines() if l.startswith(f"{name}("))
        assert f"q38::TraceScope q38_trace_scope({kid}); " in line, name


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_trace_variant_compiles(tmp_path, monkeypatch):
    from qwen38gen.gate import compile_source

    monkeypatch.setenv("QWEN38_CACHE", str(tmp_path / "cache"))
    prog = emit_program(PRESETS["tiny"], Lanes.make(3), trace=True)
    res = compile_source(prog.source, prog.name + ".cu", arch="sm_90a", manifest=prog.manifest)
    assert {k.name for k in res.kernels} == set(prog.manifest["trace"])


def _manifest():
    sched = [
        {"k": "q38_rmsnorm_h512", "grid": [1, 1, 1], "args": [["buf", "x", 0, 0]]},
        {"k": "q38_gemv_a", "grid": [2, 1, 1], "args": [["w", "L0.gate_up", "qweight"]],
         "role": "gate_up", "weight": "L0.gate_up"},
        {"k": "q38_gemv_a", "grid": [2, 1, 1], "args": [["w", "L1.in", "qweight"]],
         "role": "in", "weight": "L1.in"},
    ]
    weights = {"L0.gate_up": {"rows": 256, "k": 512}, "L1.in": {"rows": 128, "k": 512}}
    kernels = {"q38_gemv_a": {"family": "gemv_q4"}, "q38_rmsnorm_h512": {"family": "rmsnorm"}}
    return {"schedule": {"decode": sched}, "trace": ["q38_gemv_a", "q38_rmsnorm_h512"],
            "weights": weights, "kernels": kernels}


class _Cfg:
    linear_layers = [1]


def _recs(rows):
    return np.array([tuple(r) for r in rows], dtype=T.REC)


# (grid, t0, tw, t1, kid, smid) in ns; launch 0 the norm, 1 and 2 the GEMVs.
ROWS = [
    (7, 1000, 1500, 3000, 1, 0),
    (9, 2000, 4000, 9000, 0, 1), (9, 2500, 4200, 7000, 0, 2),
    (12, 8000, 9500, 12000, 0, 3), (12, 8100, 0, 11000, 0, 4),
]


def test_timeline_spans_and_sums():
    tl = T.timeline(_recs(ROWS), _manifest(), _Cfg())
    a, b, c = tl.launches
    assert [s.label for s in tl.launches] == ["rest", "gate_up", "gdn.in"]
    assert (a.start, a.release, a.end) == (0.0, 0.5, 2.0)
    assert (b.start, b.release, b.end, b.mid) == (1.0, 3.0, 8.0, 7.0)
    assert b.handover == pytest.approx(1.0) and b.advance == pytest.approx(6.0)
    assert b.run == pytest.approx(5.0)
    assert c.release == 8.5 and c.handover == pytest.approx(0.5) and c.advance == pytest.approx(3.0)
    assert tl.step_us == pytest.approx(sum(s.advance for s in tl.launches)) == pytest.approx(11.0)
    assert tl.resolution_ns == 100
    g = tl.by_kind["gemv"]
    assert g["n"] == 2 and g["advance"] == pytest.approx(9.0) and g["handover"] == pytest.approx(1.5)
    assert g["tail"] == pytest.approx(1.0 + 0.5)
    gu = tl.by_label["gate_up"]
    assert gu["bytes"] == 256 * 512 // 2 + 256 * 4 * 2
    assert gu["gbs_run"] == pytest.approx(gu["bytes"] / 5e3)


def test_timeline_orders_by_first_block_when_grid_ids_do_not():
    rows = [(99 if r[0] == 7 else r[0], *r[1:]) for r in ROWS]   # the norm's id now last
    tl = T.timeline(_recs(rows), _manifest(), _Cfg())
    assert [s.kernel for s in tl.launches] == ["q38_rmsnorm_h512", "q38_gemv_a", "q38_gemv_a"]


def test_timeline_refuses_records_that_miss_a_launch():
    with pytest.raises(T.TraceError, match="recorded 2 launches, the schedule has 3"):
        T.timeline(_recs(ROWS[:3]), _manifest(), _Cfg())
    rows = ROWS[:4] + [(13, 8100, 0, 11000, 0, 4)]      # launch 2 split over two grid ids
    with pytest.raises(T.TraceError):
        T.timeline(_recs(rows), _manifest(), _Cfg())


def test_bench_trace_prints_the_timeline(monkeypatch, tmp_path, capsys):
    """`bench --trace` prints each B's timeline by kind and by weight, and writes it to the JSON."""
    import json
    import subprocess

    import cli
    from qwen38gen.perf import bench as Bm

    tr = T.timeline(_recs(ROWS), _manifest(), _Cfg()).to_json()
    tr["variant_ms"] = 0.012
    row = Bm.BenchRow(batch=1, lane="b1", step_ms=0.011, step_ms_spread=(0.011, 0.011),
                      tok_s=9e4, floor_ms=0.005, floor_bytes=2e7, gbs=1800.0, ratio=2.2,
                      share={"gemv": 0.8, "rest": 0.2}, kernel_ms={"gemv": 0.01, "rest": 0.002},
                      trace=tr)
    seen = {}

    def fake(cfg, bs, ctx, reps, progress, trace, tuning, btg):
        seen["trace"], seen["tuning"] = trace, tuning
        return 4e12, [row]

    monkeypatch.setattr(Bm, "bench", fake)
    monkeypatch.setattr(cli.out, "width", 250)   # the tables whole, whatever the terminal
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, ""))
    out = tmp_path / "b.json"
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--model", "tiny", "--batch", "1", "--trace", "--json", str(out)])
    assert e.value.code == 0 and seen["trace"] is True and seen["tuning"].is_default
    text = capsys.readouterr().out
    assert "B = 1: one replay of the trace variant" in text
    assert "gate_up" in text and "gdn.in" in text and "handover" in text
    d = json.loads(out.read_text())
    assert d["rows"][0]["trace"]["step_us"] == pytest.approx(11.0)


@pytest.mark.parametrize("arch", ["sm_90a", "sm_90"])
def test_kinds_come_from_the_kernel_family(arch):
    """bench's and trace's split of a step by kind reads each kernel's family from the manifest:
    the GEMVs (every launch with a weight role: gemv_q4, gemm_q4, wgmma_q4, wgmma_sk_q4), the
    delta rule (gdn), attention (attn_prep, attn_tc), and the rest."""
    from qwen38gen.perf.timing import kind_of

    man = emit_program(PRESETS["tiny"], Lanes.make(64, mtp=1, arch=arch)).manifest
    fams = {}
    for ph, sched in man["schedule"].items():
        for L in sched if isinstance(sched, list) else []:
            k = kind_of(man, L)
            assert (k == "gemv") == ("role" in L), L["k"]
            fams.setdefault(k, set()).add(man["kernels"][L["k"]]["family"])
    assert fams["delta rule"] == {"gdn"} and fams["attention"] == {"attn_prep", "attn_tc"}
    assert fams["gemv"] == ({"gemm_q4", "wgmma_q4", "wgmma_sk_q4"} if arch == "sm_90a"
                            else {"gemv_q4", "gemm_q4"})
    assert {"rmsnorm", "rmsnorm_ld", "embed", "argmax", "spec_accept", "topk"} <= fams["rest"]


def test_timeline_of_another_phase():
    """timeline(..., phase=P) reads the launches of schedule P (the verify phase of an mtp
    program under `bench --mtp K --trace`)."""
    man = _manifest()
    man["schedule"] = {"decode": man["schedule"]["decode"][:1], "verify": man["schedule"]["decode"]}
    tl = T.timeline(_recs(ROWS), man, _Cfg(), phase="verify")
    assert [s.label for s in tl.launches] == ["rest", "gate_up", "gdn.in"]
    with pytest.raises(T.TraceError, match="recorded 3 launches, the schedule has 1"):
        T.timeline(_recs(ROWS), man, _Cfg())


def test_bench_mtp_trace_prints_both_steps(monkeypatch, tmp_path, capsys):
    """`bench --mtp 1 --trace` prints, per B, the plain step's timeline and the speculative
    step's, and writes both to the JSON."""
    import json
    import subprocess

    import cli
    from qwen38gen.perf import bench_mtp as Mm

    tr = T.timeline(_recs(ROWS), _manifest(), _Cfg()).to_json()
    tr["variant_ms"] = 0.012
    row = Mm.MtpRow(batch=16, k=1, lane="b16", plain_ms=0.011, spec_ms=0.02, ratio=1.8,
                    emitted=1.0, plain_tok_s=1.4e6, spec_tok_s=8e5,
                    implied_tok_s={a: 1e6 for a in Mm.ALPHAS},
                    trace=tr, plain_trace=tr)
    seen = {}

    def fake(cfg, bs, ctx, k, reps, progress, tuning, btg, trace):
        seen["trace"] = trace
        return [row]

    monkeypatch.setattr(Mm, "bench_mtp", fake)
    monkeypatch.setattr(cli.out, "width", 250)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, ""))
    out = tmp_path / "m.json"
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--model", "tiny", "--batch", "16", "--mtp", "1", "--trace",
                  "--json", str(out)])
    assert e.value.code == 0 and seen["trace"] is True
    text = capsys.readouterr().out
    assert "B = 16, plain step: one replay of the trace variant" in text
    assert "B = 16, speculative step (verify, mtp 1): one replay of the trace variant" in text
    d = json.loads(out.read_text())["mtp_rows"][0]
    assert d["trace"]["step_us"] == pytest.approx(11.0) and d["plain_trace"] is not None


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_mtp_trace_variant_compiles(tmp_path, monkeypatch):
    from qwen38gen.gate import compile_source

    monkeypatch.setenv("QWEN38_CACHE", str(tmp_path / "cache"))
    prog = emit_program(PRESETS["tiny"], Lanes.make(3, pt=2, mtp=1), trace=True)
    res = compile_source(prog.source, prog.name + ".cu", arch="sm_90a", manifest=prog.manifest)
    assert {k.name for k in res.kernels} == set(prog.manifest["trace"])
