"""The numpy reference (fp64) against HF transformers ``Qwen3_5ForCausalLM``.

For the ``tiny`` and ``toy`` configs: seeded non-trivial synthetic weights are written with
``checkpoint.save_checkpoint`` and loaded by HF (eager attention). Prompts of 1, 2, 67 and 70 tokens
(67 and 70 take HF's >64-token chunked delta-rule path) are prefilled, then 8 greedy decode steps
run with HF's cache. Every step's logits are compared (every row of the prefill, the one row of
each decode step), and the GDN conv / recurrent states and the attention KV caches are compared with
HF's cache after the prefill and at the end.

HF runs twice:

* ``fp32`` — HF as shipped, ``from_pretrained(dtype=torch.float32)``. Error metric
  ``rel(a, b) = ‖a − b‖ / ‖b‖`` per row. ``tiny``: ≤ 1e-5 (measured ≤ 3.3e-6 over seeds 1-3).
  ``toy``: ≤ 1e-4, because fp32 itself is that far from fp64 on some rows of ``toy``: with dk = 16 a
  few rows have GDN q/k vectors of small norm before the l2-norm, which amplifies rounding; our own
  fp32 reference is up to 2.6e-5 from the fp64 one on such rows, HF fp32 up to 5.8e-5 (seeds 1-3;
  seed 1: 1.3e-5). A real bug (a transposed head, a wrong pairing, an off-by-one position) gives
  1e-2 … 1.
* ``fp64`` — HF loaded in float64 with its fp32 islands (``.float()``, ``.to(torch.float32)``, the
  fp32 RoPE angles, the fp32 softmax, the fp32 delta rule) promoted to float64 by ``hf_float64()``
  below. Then HF and the reference compute the same math in the same precision and must agree to
  1e-10 (measured ~1e-14): the sharp version of this oracle (it would catch e.g. a wrong eps).

Also here: the fp32 reference against the fp64 one, and the MTP row (which HF does not have)
against a hand composition of the reference's pieces.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch
import transformers.models.qwen3_5.modeling_qwen3_5 as hf_qwen3_5
from transformers import Qwen3_5ForCausalLM

from qwen38gen.config import DECODER, MTP, PRESETS
from qwen38gen.reference import Reference, rms1p, rope, sigmoid, silu
from qwen38gen.checkpoint import save_checkpoint
from qwen38gen.weights import synthetic_weights

from tests._blas_threads import single_threaded  # noqa: F401  (autouse: 1 BLAS / torch thread)

SEED = 1
PROMPT_LENGTHS = (1, 2, 67, 70)
DECODE_STEPS = 8
# (config, HF precision) -> (logits tolerance per row, state tolerance); see the docstring.
TOL = {
    ("tiny", "fp32"): (1e-5, 1e-5),
    ("toy", "fp32"): (1e-4, 1e-5),
    ("tiny", "fp64"): (1e-10, 1e-10),
    ("toy", "fp64"): (1e-10, 1e-10),
}


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def row_rel(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b, axis=-1) / np.linalg.norm(b, axis=-1)


class _TorchFloat64:
    """``torch`` as seen by modeling_qwen3_5 under ``hf_float64``: float32 means float64."""

    float32 = torch.float64
    float = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


@contextlib.contextmanager
def hf_float64(on: bool = True):
    """Promote HF Qwen3.5's explicit fp32 computations to fp64 while active (diagnostic oracle).

    modeling_qwen3_5 forces fp32 via ``torch.float32`` / ``torch.float`` (module global ``torch``)
    and ``Tensor.float()``; both are redirected to float64 and restored on exit. Build the model
    (the RoPE ``inv_freq`` buffer is made at init) and run it inside.
    """
    if not on:
        yield
        return
    old_torch, old_float = hf_qwen3_5.torch, torch.Tensor.float
    hf_qwen3_5.torch = _TorchFloat64()
    torch.Tensor.float = lambda self, *a, **k: self.double()
    try:
        yield
    finally:
        hf_qwen3_5.torch, torch.Tensor.float = old_torch, old_float


def check_rows(ref_logits, hf_logits, tol: float, what: str) -> float:
    er = row_rel(ref_logits, hf_logits)
    assert er.max() <= tol, f"{what}: row {er.argmax()} logits rel error {er.max():.3g} > {tol}"
    return float(er.max())


def check_cache(cfg, st, pkv, tol: float, what: str) -> float:
    """Reference State (one sequence) against HF's DynamicCache, layer by layer; returns max error."""
    T = int(st.pos[0])
    worst = 0.0
    for i in cfg.linear_layers:
        layer = pkv.layers[i]
        conv = layer.conv_states[0][0].double().numpy()              # HF [C, K]: K columns, oldest first
        assert conv.shape == (cfg.conv_dim, cfg.linear_conv_kernel_dim)
        e = rel(st.conv[i][0], conv[:, 1:].T)                        # ours [K-1, C]; HF's oldest column is never read
        assert e <= tol, f"{what}: layer {i} conv state rel error {e:.3g}"
        rec = layer.recurrent_states[0][0].double().numpy()          # HF [Hv, dk, dv]
        assert rec.shape == st.rec[i][0].shape
        e2 = rel(st.rec[i][0], rec)
        assert e2 <= tol, f"{what}: layer {i} recurrent state rel error {e2:.3g}"
        worst = max(worst, e, e2)
    for i in cfg.full_layers:
        layer = pkv.layers[i]
        k, v = layer.keys[0].double().numpy(), layer.values[0].double().numpy()   # [Hkv, T, D]
        assert k.shape == st.k[i][0].shape == (cfg.num_key_value_heads, T, cfg.head_dim)
        e = max(rel(st.k[i][0], k), rel(st.v[i][0], v))
        assert e <= tol, f"{what}: layer {i} KV cache rel error {e:.3g}"
        worst = max(worst, e)
    return worst


@pytest.fixture(scope="module", params=list(TOL), ids=lambda p: "-".join(p))
def model(request, tmp_path_factory):
    """(cfg, precision, HF model, fp64 reference), built once per (config, precision)."""
    name, prec = request.param
    cfg = PRESETS[name]
    w = synthetic_weights(cfg, SEED)
    ckpt = tmp_path_factory.mktemp(f"{name}-{prec}") / "checkpoint"
    save_checkpoint(cfg, w, ckpt)
    tdt = torch.float64 if prec == "fp64" else torch.float32
    with hf_float64(prec == "fp64"):
        hf, info = Qwen3_5ForCausalLM.from_pretrained(
            ckpt, dtype=tdt, attn_implementation="eager", output_loading_info=True)
    hf.eval()
    assert not info["missing_keys"], info["missing_keys"]
    assert not info["mismatched_keys"], info["mismatched_keys"]
    # HF must hold exactly our weights (a silently re-initialised tensor would pass unnoticed).
    sd = hf.state_dict()
    for n, a in w.items():
        if n.startswith(MTP):
            continue
        hf_name = "model." + n[len(DECODER):] if n.startswith(DECODER) else n
        assert np.array_equal(sd[hf_name].numpy(), a.astype(np.float64).astype(sd[hf_name].numpy().dtype)), n
    return cfg, prec, hf, Reference(cfg, w, dtype=np.float64)


@pytest.mark.parametrize("T", PROMPT_LENGTHS)
def test_prefill_then_decode_matches_hf(model, T):
    cfg, prec, hf, ref = model
    row_tol, state_tol = TOL[(cfg.name, prec)]
    ids = np.random.default_rng([SEED, T]).integers(0, cfg.vocab_size, T).tolist()

    def run(x, pkv=None):
        with torch.no_grad(), hf_float64(prec == "fp64"):
            return hf(input_ids=torch.tensor(x), past_key_values=pkv, use_cache=True)

    out = run([ids])
    pkv = out.past_key_values
    st = ref.new_state(1)
    logits, hiddens = ref.forward(st, [ids])
    assert logits[0].shape == (T, cfg.vocab_size) and hiddens[0].shape == (T, cfg.hidden_size)
    check_rows(logits[0], out.logits[0].numpy(), row_tol, f"{cfg.name}/{prec} prefill T={T}")
    check_cache(cfg, st, pkv, state_tol, f"{cfg.name}/{prec} after prefill T={T}")

    tok = int(out.logits[0, -1].argmax())
    for step in range(DECODE_STEPS):
        out = run([[tok]], pkv)
        pkv = out.past_key_values
        logits, _ = ref.forward(st, [[tok]])
        check_rows(logits[0], out.logits[0].numpy(), row_tol,
                   f"{cfg.name}/{prec} T={T} decode step {step}")
        tok = int(out.logits[0, -1].argmax())                       # greedy, fed to both
    assert int(st.pos[0]) == T + DECODE_STEPS
    check_cache(cfg, st, pkv, state_tol, f"{cfg.name}/{prec} T={T} after {DECODE_STEPS} decode steps")


@pytest.mark.parametrize("name", ["tiny", "toy"])
def test_fp32_matches_fp64(name):
    cfg = PRESETS[name]
    row_tol, state_tol = TOL[(name, "fp32")]
    w = synthetic_weights(cfg, SEED)
    r32, r64 = Reference(cfg, w), Reference(cfg, w, dtype=np.float64)
    s32, s64 = r32.new_state(1), r64.new_state(1)
    ids = np.random.default_rng([SEED, 70]).integers(0, cfg.vocab_size, 70).tolist()
    steps = [ids] + [[t] for t in np.random.default_rng(5).integers(0, cfg.vocab_size, 4).tolist()]
    for k, toks in enumerate(steps):
        l32, h32 = r32.forward(s32, [toks])
        l64, _ = r64.forward(s64, [toks])
        assert l32[0].dtype == h32[0].dtype == np.float32
        check_rows(l32[0], l64[0], row_tol, f"{name} fp32 vs fp64 step {k}")
    for i in cfg.linear_layers:
        assert s32.conv[i].dtype == s32.rec[i].dtype == np.float32
        assert rel(s32.conv[i], s64.conv[i]) <= state_tol
        assert rel(s32.rec[i], s64.rec[i]) <= state_tol
    for i in cfg.full_layers:
        assert s32.k[i][0].dtype == np.float32
        assert rel(s32.k[i][0], s64.k[i][0]) <= state_tol
        assert rel(s32.v[i][0], s64.v[i][0]) <= state_tol


# ------------------------------------------------------------------------------------------ MTP

def _mtp_by_hand(cfg, w, tokens, hids, swap=False):
    """docs/MODEL.md §8.1 for rows at positions 0, 1, … of a fresh MTP cache, spelled out head by head.

    Uses only rms1p / rope / silu / sigmoid from the reference; ``swap`` feeds the fc the halves in
    the wrong order [hidden; embedding] (to show the test notices).
    """
    f = {n: np.asarray(a, np.float64) for n, a in w.items()}
    eps, H, Hkv, D, G = (cfg.rms_norm_eps, cfg.num_attention_heads, cfg.num_key_value_heads,
                         cfg.head_dim, cfg.gqa_group)
    p = MTP + "layers.0."
    a = p + "self_attn."
    Ks, Vs, logits, outs = [], [], [], []
    for pos, (y, hid) in enumerate(zip(tokens, hids)):
        e_n = rms1p(f[DECODER + "embed_tokens.weight"][y], f[MTP + "pre_fc_norm_embedding.weight"], eps)
        h_n = rms1p(np.asarray(hid, np.float64), f[MTP + "pre_fc_norm_hidden.weight"], eps)
        u = f[MTP + "fc.weight"] @ (np.concatenate([h_n, e_n]) if swap else np.concatenate([e_n, h_n]))
        t = rms1p(u, f[p + "input_layernorm.weight"], eps)
        qg = f[a + "q_proj.weight"] @ t
        k = (f[a + "k_proj.weight"] @ t).reshape(Hkv, D)
        v = (f[a + "v_proj.weight"] @ t).reshape(Hkv, D)
        k = rope(rms1p(k, f[a + "k_norm.weight"], eps)[None], np.array([pos]), cfg.rotary_dim,
                 cfg.rope_theta)[0]
        Ks.append(k)
        Vs.append(v)
        o = np.zeros(H * D)
        for j in range(H):
            q_j = qg[2 * D * j:2 * D * j + D]                        # per head: [query | gate]
            gate_j = qg[2 * D * j + D:2 * D * (j + 1)]
            q_j = rope(rms1p(q_j, f[a + "q_norm.weight"], eps)[None, None], np.array([pos]),
                       cfg.rotary_dim, cfg.rope_theta)[0, 0]
            m = j // G
            s = np.array([q_j @ Ks[s_][m] for s_ in range(pos + 1)]) / np.sqrt(D)
            prob = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
            o_j = sum(prob[s_] * Vs[s_][m] for s_ in range(pos + 1))
            o[j * D:(j + 1) * D] = o_j * sigmoid(gate_j)
        u = u + f[a + "o_proj.weight"] @ o
        t = rms1p(u, f[p + "post_attention_layernorm.weight"], eps)
        u = u + f[p + "mlp.down_proj.weight"] @ (silu(f[p + "mlp.gate_proj.weight"] @ t)
                                                 * (f[p + "mlp.up_proj.weight"] @ t))
        h2 = rms1p(u, f[MTP + "norm.weight"], eps)
        outs.append(h2)
        logits.append(f["lm_head.weight"] @ h2)
    return np.array(logits), np.array(outs)


@pytest.mark.parametrize("name", ["tiny", "toy"])
def test_mtp_row_by_hand(name):
    cfg = PRESETS[name]
    w = synthetic_weights(cfg, SEED)
    ref = Reference(cfg, w, dtype=np.float64)
    rng = np.random.default_rng(7)
    tokens = rng.integers(0, cfg.vocab_size, 3).tolist()
    hids = rng.standard_normal((3, cfg.hidden_size)) * 2.0

    want_l, want_h = _mtp_by_hand(cfg, w, tokens, hids)
    st = ref.new_state(1)
    got_l, got_h = ref.mtp_forward(st, [tokens], [hids], [0])
    assert rel(got_l[0], want_l) <= 1e-12 and rel(got_h[0], want_h) <= 1e-12
    assert st.mtp_k[0].shape == (cfg.num_key_value_heads, 3, cfg.head_dim)

    # The concat order matters: [hidden; embedding] gives something else entirely.
    swap_l, _ = _mtp_by_hand(cfg, w, tokens, hids, swap=True)
    assert rel(swap_l, want_l) > 1e-2

    # Row by row through the cache equals all rows at once.
    st1 = ref.new_state(1)
    for i in range(3):
        l1, _ = ref.mtp_forward(st1, [tokens[i:i + 1]], [hids[i:i + 1]], [i])
        assert rel(l1[0][0], want_l[i]) <= 1e-12

    # A rejected draft is overwritten: re-running position 1 with another token truncates the cache.
    other = (tokens[1] + 1) % cfg.vocab_size
    l2, _ = ref.mtp_forward(st1, [[other]], [hids[1:2]], [1])
    want2, _ = _mtp_by_hand(cfg, w, [tokens[0], other], hids[:2])
    assert st1.mtp_k[0].shape[1] == 2
    assert rel(l2[0][0], want2[1]) <= 1e-12
    with pytest.raises(ValueError):
        ref.mtp_forward(st1, [[other]], [hids[:1]], [5])             # a gap in the MTP cache
