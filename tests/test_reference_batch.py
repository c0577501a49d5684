"""Self-consistency of the numpy reference: batching, chunked prefill, the chunked delta rule.

* A batch of sequences with different prompt lengths in one State gives *bitwise* the results of
  single-sequence runs (the reference computes sequences one after the other with the same shapes),
  through prefill, decode steps, uneven chunks (some sequences idle) and MTP rows.
* Chunked prefill equals whole-prompt prefill to rounding, and leaves the same state.
* ``gdn_chunked`` (docs/MODEL.md §5, WY/UT form) equals ``gdn_recurrent`` (§4.2, the definition).
"""

from __future__ import annotations

import numpy as np
import pytest

from qwen38gen.config import DECODER, PRESETS
from qwen38gen.reference import Reference, conv_to_ring, gdn_chunked, gdn_recurrent, l2n, rms1p
from qwen38gen.weights import synthetic_weights

from tests._blas_threads import single_threaded  # noqa: F401  (autouse: 1 BLAS thread)

SEED = 3
PROMPT_LENGTHS = (1, 5, 67, 3)


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300))


def row_rel(a, b) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b, axis=-1) / np.linalg.norm(b, axis=-1)


def prompts_for(cfg, lengths, seed=SEED):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, cfg.vocab_size, n).tolist() for n in lengths]


_REFS: dict = {}


def reference(name: str, dtype=np.float32, **kw) -> Reference:
    key = (name, np.dtype(dtype).name, tuple(sorted(kw.items())))
    if key not in _REFS:
        cfg = PRESETS[name]
        _REFS[key] = Reference(cfg, synthetic_weights(cfg, SEED), dtype=dtype, **kw)
    return _REFS[key]


def assert_same_sequence(cfg, st, b, one, exact=True, tol=0.0):
    """Sequence b of State ``st`` against sequence 0 of ``one``: equal (exact) or within tol."""
    def same(x, y, what):
        if exact:
            assert x.shape == y.shape and np.array_equal(x, y), what
        else:
            assert x.shape == y.shape and rel(x, y) <= tol, f"{what}: {rel(x, y):.3g}"

    assert st.pos[b] == one.pos[0]
    for i in cfg.linear_layers:
        same(st.conv[i][b], one.conv[i][0], f"conv layer {i}")
        same(st.rec[i][b], one.rec[i][0], f"recurrent layer {i}")
    for i in cfg.full_layers:
        same(st.k[i][b], one.k[i][0], f"K layer {i}")
        same(st.v[i][b], one.v[i][0], f"V layer {i}")
    same(st.mtp_k[b], one.mtp_k[0], "MTP K")
    same(st.mtp_v[b], one.mtp_v[0], "MTP V")


# -------------------------------------------------------------------------------------- batching

@pytest.mark.parametrize("name,dtype", [("tiny", np.float32), ("toy", np.float32), ("toy", np.float64)])
@pytest.mark.parametrize("chunk", [None, 16])
def test_batch_equals_single_sequences(name, dtype, chunk):
    ref = reference(name, dtype)
    cfg = ref.cfg
    prompts = prompts_for(cfg, PROMPT_LENGTHS)
    B = len(prompts)

    st = ref.new_state(B)
    lg, hd = ref.prefill(st, prompts, chunk)
    ones = [ref.new_state(1) for _ in range(B)]
    for b in range(B):
        lg1, hd1 = ref.prefill(ones[b], [prompts[b]], chunk)
        assert lg[b].shape == (len(prompts[b]), cfg.vocab_size)
        assert np.array_equal(lg[b], lg1[0]) and np.array_equal(hd[b], hd1[0])
        assert_same_sequence(cfg, st, b, ones[b])

    # MTP rows over every prompt position: row i = (token i+1, h_out(i), position i), the last row
    # with the greedy next token (docs/MODEL.md §8.2 step 1).
    nxt = [int(np.argmax(x[-1])) for x in lg]
    mt = [pr[1:] + [t] for pr, t in zip(prompts, nxt)]
    ml, mh = ref.mtp_forward(st, mt, hd, [0] * B)
    for b in range(B):
        ml1, mh1 = ref.mtp_forward(ones[b], [mt[b]], [hd[b]], [0])
        assert np.array_equal(ml[b], ml1[0]) and np.array_equal(mh[b], mh1[0])

    # Decode steps, then one uneven step (chunks of 3, 1, 0 and 2 tokens: sequence 2 idles).
    rng = np.random.default_rng(11)
    for step in range(5):
        lgd, hdd = ref.decode(st, nxt)
        assert lgd.shape == (B, cfg.vocab_size) and hdd.shape == (B, cfg.hidden_size)
        for b in range(B):
            lg1, hd1 = ref.decode(ones[b], [nxt[b]])
            assert np.array_equal(lgd[b], lg1[0]) and np.array_equal(hdd[b], hd1[0]), (step, b)
        nxt = [int(t) for t in np.argmax(lgd, axis=-1)]
    uneven = [rng.integers(0, cfg.vocab_size, n).tolist() for n in (3, 1, 0, 2)]
    lgu, _ = ref.forward(st, uneven)
    for b in range(B):
        if uneven[b]:
            lg1, _ = ref.forward(ones[b], [uneven[b]])
            assert np.array_equal(lgu[b], lg1[0])
        else:
            assert lgu[b].shape == (0, cfg.vocab_size)
        assert_same_sequence(cfg, st, b, ones[b])


def test_generate_batch_equals_single_and_chunked():
    ref = reference("toy", np.float64)
    prompts = prompts_for(ref.cfg, PROMPT_LENGTHS, seed=4)
    out = ref.generate(prompts, 6)
    assert [len(o) for o in out] == [6] * len(prompts)
    assert out == [ref.generate([pr], 6)[0] for pr in prompts]
    assert out == ref.generate(prompts, 6, chunk=16)
    # generate = prefill, argmax, then decode steps feeding back the argmax
    st = ref.new_state(1)
    lg, _ = ref.prefill(st, [prompts[2]])
    toks = [int(np.argmax(lg[0][-1]))]
    for _ in range(5):
        lgd, _ = ref.decode(st, [toks[-1]])
        toks.append(int(np.argmax(lgd[0])))
    assert toks == out[2]


def test_state_copy_is_a_snapshot():
    ref = reference("toy")
    st = ref.new_state(2)
    ref.prefill(st, prompts_for(ref.cfg, (4, 7)))
    snap = st.copy()
    a, _ = ref.forward(st, [[1, 2], [3]])
    b, _ = ref.forward(snap, [[1, 2], [3]])
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_bad_inputs():
    ref = reference("toy")
    st = ref.new_state(2)
    with pytest.raises(ValueError):
        ref.forward(st, [[1]])                                        # 1 chunk for 2 sequences
    with pytest.raises(ValueError):
        ref.forward(st, [[1], [ref.cfg.vocab_size]])                  # token id out of range
    with pytest.raises(ValueError):
        Reference(ref.cfg, {}, dtype=np.float16)
    with pytest.raises(KeyError):
        Reference(ref.cfg, {})


# ------------------------------------------------------------------------------- chunked prefill

@pytest.mark.parametrize("name", [pytest.param("tiny", marks=pytest.mark.slow), "toy"])
def test_chunked_prefill_equals_whole(name):
    # Not bitwise: a chunk of T rows multiplies [T, in] by the weights, and BLAS picks its kernel
    # and summation order by shape (gemv for T = 1, blocked gemm otherwise), and the attention
    # scores/softmax of a row are reduced inside differently shaped arrays. Same math, different
    # rounding; the delta rule itself runs token by token either way.
    ref = reference(name, np.float64)
    cfg = ref.cfg
    prompt = prompts_for(cfg, (130,), seed=5)[0]                     # > 2 × 64
    whole = ref.new_state(1)
    lw, hw = ref.prefill(whole, [prompt])
    tail = [7, 1, 3]
    for chunk in (1, 16, 64, 100):
        st = ref.new_state(1)
        lc, hc = ref.prefill(st, [prompt], chunk)
        assert row_rel(lc[0], lw[0]).max() <= 1e-10, chunk
        assert row_rel(hc[0], hw[0]).max() <= 1e-10, chunk
        assert_same_sequence(cfg, st, 0, whole, exact=False, tol=1e-10)
        w2 = whole.copy()
        for t in tail:                                                # the hand-off to decode
            a, _ = ref.decode(st, [t])
            b, _ = ref.decode(w2, [t])
            assert rel(a, b) <= 1e-10, chunk


# ---------------------------------------------------------------------------------- delta rule

def _random_gdn(T, Hk, Hv, dk, dv, dtype, seed):
    rng = np.random.default_rng(seed)
    q = l2n(rng.standard_normal((T, Hk, dk))) / np.sqrt(dk)
    k = l2n(rng.standard_normal((T, Hk, dk)))
    v = rng.standard_normal((T, Hv, dv))
    # log-decays from mild to strong (e^{-8} per token), β over (0, 1)
    g = -np.exp(rng.uniform(-1, 1, Hv)) * np.log1p(np.exp(rng.normal(0, 1.5, (T, Hv))))
    beta = 1 / (1 + np.exp(-rng.normal(0, 2, (T, Hv))))
    S0 = rng.standard_normal((Hv, dk, dv)) * 0.3
    return [x.astype(dtype) for x in (q, k, v, g, beta, S0)]


@pytest.mark.parametrize("T", [1, 5, 64, 65, 150])
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float32, 1e-5)])
def test_gdn_chunked_equals_recurrent(T, dtype, tol):
    args = _random_gdn(T, Hk=2, Hv=6, dk=16, dv=24, dtype=dtype, seed=T)
    S0 = args[-1].copy()
    o_r, S_r = gdn_recurrent(*args)
    assert np.array_equal(args[-1], S0)                               # S0 not modified
    for chunk in (64, 16):
        o_c, S_c = gdn_chunked(*args, chunk=chunk)
        assert o_c.dtype == S_c.dtype == dtype
        assert rel(o_c, o_r) <= tol, (chunk, rel(o_c, o_r))
        assert rel(S_c, S_r) <= tol, (chunk, rel(S_c, S_r))


def test_gdn_recurrent_one_step_by_hand():
    """§4.2 step 6 for one token, per v-head with explicit loops (v-head h reads k-head h // r)."""
    q, k, v, g, beta, S0 = _random_gdn(1, Hk=2, Hv=6, dk=4, dv=3, dtype=np.float64, seed=9)
    o, S = gdn_recurrent(q, k, v, g, beta, S0)
    for h in range(6):
        kh, qh = k[0, h // 3], q[0, h // 3]
        Sh = np.exp(g[0, h]) * S0[h]
        u = np.array([sum(Sh[i, j] * kh[i] for i in range(4)) for j in range(3)])
        Sh = Sh + np.outer(kh, beta[0, h] * (v[0, h] - u))
        assert np.allclose(S[h], Sh, rtol=0, atol=1e-14)
        assert np.allclose(o[0, h], Sh.T @ qh, rtol=0, atol=1e-14)


@pytest.mark.parametrize("name", ["tiny", "toy"])
def test_model_with_chunked_delta_rule(name):
    rec, chk = reference(name, np.float64), reference(name, np.float64, delta_rule="chunked")
    cfg = rec.cfg
    prompt = prompts_for(cfg, (70,), seed=6)[0]
    s1, s2 = rec.new_state(1), chk.new_state(1)
    for toks in (prompt, [5], [9, 2, 4]):
        a, _ = rec.forward(s1, [toks])
        b, _ = chk.forward(s2, [toks])
        assert row_rel(b[0], a[0]).max() <= 1e-10
    assert_same_sequence(cfg, s2, 0, s1, exact=False, tol=1e-10)


# ---------------------------------------------------------------------------------- conv state

def test_conv_state_holds_raw_projections_and_ring():
    """conv[i][b] row j = the raw in_proj_qkv output of the token at position pos−(K−1)+j; the GPU
    ring (conv_to_ring) keeps it in slot position % (K−1). Layer 0's input is the embedding, so its
    projections can be recomputed here."""
    ref = reference("toy", np.float64)
    cfg, w = ref.cfg, ref.w
    kc = cfg.linear_conv_kernel_dim - 1
    toks = prompts_for(cfg, (6,), seed=8)[0]
    p = f"{DECODER}layers.0."
    m = rms1p(w[DECODER + "embed_tokens.weight"][toks], w[p + "input_layernorm.weight"],
              cfg.rms_norm_eps) @ w[p + "linear_attn.in_proj_qkv.weight"].T
    st = ref.new_state(1)
    for n, t in enumerate(toks, 1):
        ref.forward(st, [[t]])
        conv = st.conv[0][0]
        ring = conv_to_ring(conv, n)
        for j in range(kc):
            pos = n - kc + j
            if pos < 0:                                               # before the first token
                assert not conv[j].any()
            else:
                assert rel(conv[j], m[pos]) <= 1e-12
                assert np.array_equal(ring[pos % kc], conv[j])
