"""`bench --peers` without a GPU: the step's linear shapes, tinygemm's int4 format on torch's CPU
ops, and the one line a run without torch + CUDA prints. The timing itself needs the H200."""

import json
import sys

import pytest

from qwen38gen.config import load_config
from qwen38gen.perf import peers as P
from qwen38gen.plan.entries import fused_weights


@pytest.mark.parametrize("model", ["qwen3.8-27b", "tiny"])
def test_shapes_are_the_fused_weights_in_step_order(model):
    cfg = load_config(model)
    fw = fused_weights(cfg)
    shapes = P.linear_shapes(cfg)
    L = cfg.num_hidden_layers
    assert len(shapes) == len(fw) == 4 * L + 1
    want = [f"L{i}.{p}" for i in range(L) for p in ("in", "out", "gate_up", "down")] + ["lm_head"]
    assert [n for n, _, _ in shapes] == want
    assert [(n, r, k) for n, r, k in shapes] == [(n, w["rows"], w["k"]) for n, w in fw.items()]
    # the parts, unpadded, are exactly the config's linear parameters (lm_head included)
    parts = cfg.tensor_shapes(mtp=False)
    unpadded = sum(parts[p][0] * k for n, _, k in shapes for p, _, _ in fw[n]["parts"])
    assert unpadded == cfg.linear_params
    assert all(r % 16 == 0 and k % (P.INNER_K_TILES * 16) == 0 for _, r, k in shapes)


def test_27b_step_is_the_perf_md_weights():
    cfg = load_config("qwen3.8-27b")
    params = sum(r * k for _, r, k in P.linear_shapes(cfg))
    assert params == cfg.linear_params == 25_621_954_560     # docs/PERFORMANCE.md: 25.622 B, no padding
    assert abs(cfg.int4_weight_bytes() / 1e9 - 13.21) < 0.005


def _cpu_torch():
    torch = pytest.importorskip("torch", reason="torch (the CPU test oracle) is not installed")
    for op in ("_convert_weight_to_int4pack_for_cpu", "_weight_int4pack_mm_for_cpu"):
        if not hasattr(torch.ops.aten, op):
            pytest.skip(f"torch {torch.__version__} has no aten.{op}")
    return torch


def test_int4_format_round_trips_on_cpu():
    """Our uint8 nibble pairs + scales_and_zeros, through torch's CPU int4 g128 matmul, equal
    x @ dequant(W).T: the scale/zero layout [k/128, n, 2] and w = (q - 8)·s + z are right."""
    torch = _cpu_torch()
    g = torch.Generator().manual_seed(0)
    n, k, B = 48, 512, 5
    u8, sz = P.random_int4(n, k, g, "cpu")
    assert u8.shape == (n, k // 2) and sz.shape == (k // 128, n, 2)
    q = P.unpack_u8(u8)
    assert q.shape == (n, k) and int(q.min()) == 0 and int(q.max()) == 15
    assert torch.equal(q[:, 0::2], (u8 >> 4).int()) and torch.equal(q[:, 1::2], (u8 & 15).int())
    wp = torch._convert_weight_to_int4pack_for_cpu(q, P.INNER_K_TILES)
    x = torch.randn(B, k, dtype=torch.bfloat16, generator=g)
    y = torch._weight_int4pack_mm_for_cpu(x, wp, P.GROUP, sz)
    assert y.shape == (B, n) and y.dtype == torch.bfloat16
    ref = x.float() @ P.dequant(q, sz).float().t()
    assert P.rel_err(y, ref) < P.CHECK_TOL
    # and the check would catch the mistakes it is there for
    swapped = P.dequant(P.unpack_u8(((u8 & 15) << 4) | (u8 >> 4)), sz)
    assert P.rel_err(y, x.float() @ swapped.float().t()) > 10 * P.CHECK_TOL
    no_offset = P.dequant(q + 8, sz)                           # w = q·s + z, no -8
    assert P.rel_err(y, x.float() @ no_offset.float().t()) > 10 * P.CHECK_TOL


def test_cublas_peer_check_on_cpu():
    torch = _cpu_torch()
    g = torch.Generator().manual_seed(1)
    err, hint = P.check_peer("cublas_bf16", 64, 256, 3, g, "cpu")
    assert err < P.CHECK_TOL and hint == ""


def test_run_without_cuda_says_so(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    res = P.run(load_config("tiny"), [1, 16], bw=4e12)
    assert res == {"available": False, "reason": f"torch {torch.__version__} has no CUDA device"}
    assert P.summary(res) == [f"peers: not run: torch {torch.__version__} has no CUDA device"]


def test_run_without_torch_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)          # import torch -> ImportError
    res = P.run(load_config("tiny"), [1], bw=4e12)
    assert res["available"] is False and res["reason"].startswith("torch is not importable")
    assert len(P.summary(res)) == 1


def test_bench_peers_cli_without_cuda(monkeypatch, tmp_path, capsys):
    """`bench --peers` prints our table, then the one line, and writes "peers" to the JSON."""
    torch = pytest.importorskip("torch")
    import subprocess

    import cli
    from qwen38gen.perf import bench as Bm

    row = Bm.BenchRow(batch=1, lane="b1", step_ms=4.0, step_ms_spread=(3.9, 4.1), tok_s=250.0,
                      floor_ms=3.3, floor_bytes=13.6e9, gbs=3400.0, ratio=1.2,
                      share={"gemv": 0.8, "rest": 0.2}, kernel_ms={"gemv": 3.2, "rest": 0.8})
    monkeypatch.setattr(Bm, "bench", lambda cfg, bs, ctx, reps, progress, trace, tuning, btg: (4e12, [row]))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, ""))
    out = tmp_path / "b.json"
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--model", "tiny", "--batch", "1", "--peers", "--json", str(out)])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "decode step" in text
    assert f"peers: not run: torch {torch.__version__} has no CUDA device" in text
    d = json.loads(out.read_text())
    assert d["peers"]["available"] is False and d["rows"][0]["batch"] == 1


def test_fla_peer_reference_is_the_models_delta_rule():
    """The float32 recurrence the fla peer is checked against (perf/peers_gdn.reference) equals
    the numpy reference's gdn_recurrent (the model's definition, checked against HF) on one
    token with GVA (value heads reading key head ⌊h / r⌋): a wrong peer cannot pass its check."""
    import numpy as np
    import torch

    from qwen38gen.perf.peers_gdn import reference
    from qwen38gen.reference import gdn_recurrent, l2n

    B, H, HV, dk, dv = 2, 2, 6, 16, 8
    g_ = torch.Generator().manual_seed(3)
    q, k = torch.randn(B, H, dk, generator=g_), torch.randn(B, H, dk, generator=g_)
    v = torch.randn(B, HV, dv, generator=g_)
    g = -torch.rand(B, HV, generator=g_) * 0.5
    beta = torch.rand(B, HV, generator=g_)
    h0 = torch.randn(B, HV, dk, dv, generator=g_) * 0.1
    o, h = reference(q, k, v, g, beta, h0)
    for b in range(B):
        qn = l2n(q[b].double().numpy(), eps=0.0) / np.sqrt(dk)
        kn = l2n(k[b].double().numpy(), eps=0.0)
        ro, rh = gdn_recurrent(qn[None], kn[None], v[b].double().numpy()[None],
                               g[b].double().numpy()[None], beta[b].double().numpy()[None],
                               h0[b].double().numpy())
        np.testing.assert_allclose(o[b].numpy(), ro[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(h[b].numpy(), rh, rtol=1e-5, atol=1e-6)


def test_fla_peer_without_cuda_is_reported():
    from qwen38gen.config import PRESETS
    from qwen38gen.perf import peers_gdn

    r = peers_gdn.run(PRESETS["tiny"], [1])
    assert r["ok"] is False and "CUDA" in r["error"]
    assert peers_gdn.lines(r, []) == [f"peers: {peers_gdn.LABEL} failed: {r['error']}"]
