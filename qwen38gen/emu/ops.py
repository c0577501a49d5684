"""Pure-numpy references of single kernel ops, written from docs/MODEL.md: the schedule emulator
(emu/schedule.py) runs each launch with them, and the GPU kernel tests compare each kernel with
them (tests/gpu/ref_ops.py re-exports this module).

Everything is fp64 unless a parameter says otherwise; inputs may be bf16 arrays (they are upcast).
"""

from __future__ import annotations

import numpy as np


def f64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """σ(x) = 1 / (1 + e^{−x})."""
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-f64(x)))


def silu(x: np.ndarray) -> np.ndarray:
    """silu(x) = x·σ(x)."""
    return f64(x) * sigmoid(x)


def rms1p(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """Zero-centred RMSNorm over the last axis (docs/MODEL.md §3): x / sqrt(mean(x²) + ε) ⊙ (1 + w)."""
    x = f64(x)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + f64(w))


def rope_angles(pos: np.ndarray, rd: int, theta: float, angle_dtype=np.float64) -> np.ndarray:
    """φ[t, i] = pos[t] · ω_i, ω_i = θ^(−2i/rd), i < rd/2 (docs/MODEL.md §4.1 step 4).

    angle_dtype=np.float32 forms ω and the product in fp32 the way HF does (§7: "RoPE cos/sin
    computed in fp32"): ω_i = fp32(1 / θ^(2i/rd)), φ = fp32(fp32(p) · ω_i). Returns fp64.
    """
    i = np.arange(rd // 2, dtype=np.float64)
    inv = 1.0 / np.power(np.float64(theta), 2.0 * i / rd)
    p = np.asarray(pos, dtype=np.float64)
    if angle_dtype == np.float32:
        phi = p.astype(np.float32)[:, None] * inv.astype(np.float32)[None, :]
        return phi.astype(np.float64)
    return p[:, None] * inv[None, :]


def rope_neox(x: np.ndarray, pos: np.ndarray, rd: int, theta: float,
              angle_dtype=np.float64) -> np.ndarray:
    """Partial NeoX rotate-half RoPE: x [T, heads, D], pos [T].

    For i < rd/2, the pair (u_i, u_{i+rd/2}) rotates by φ = p·ω_i:
    u_i' = u_i cos φ − u_{i+rd/2} sin φ, u_{i+rd/2}' = u_{i+rd/2} cos φ + u_i sin φ; dims ≥ rd pass.
    """
    x = f64(x)
    half = rd // 2
    phi = rope_angles(pos, rd, theta, angle_dtype)[:, None, :]   # [T, 1, rd/2]
    c, s = np.cos(phi), np.sin(phi)
    x1, x2 = x[..., :half], x[..., half:rd]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s, x[..., rd:]], axis=-1)


def attn_split_qkv(qkv: np.ndarray, H: int, HKV: int, D: int):
    """Split the fused q|k|v projection rows [R, ≥ 2HD + 2·HKV·D] (docs/MODEL.md §4.1 steps 1–2).

    q_proj's output is per head [query D | gate D]. Returns q, gate [R, H, D], k, v [R, HKV, D].
    """
    R = qkv.shape[0]
    qg = f64(qkv[:, :2 * H * D]).reshape(R, H, 2 * D)
    k = f64(qkv[:, 2 * H * D:2 * H * D + HKV * D]).reshape(R, HKV, D)
    v = f64(qkv[:, 2 * H * D + HKV * D:2 * H * D + 2 * HKV * D]).reshape(R, HKV, D)
    return qg[:, :, :D], qg[:, :, D:], k, v


def attn_prep(qkv, q_norm, k_norm, eps, theta, pos_rows, H, HKV, D, rd, angle_dtype=np.float64):
    """QK-norm then partial RoPE (§4.1 steps 3–4) for rows at positions pos_rows [R].

    Returns q [R, H, D], k [R, HKV, D] (normed + rotated), v [R, HKV, D] (raw), gate [R, H, D].
    """
    q, gate, k, v = attn_split_qkv(qkv, H, HKV, D)
    q = rope_neox(rms1p(q, q_norm, eps), pos_rows, rd, theta, angle_dtype)
    k = rope_neox(rms1p(k, k_norm, eps), pos_rows, rd, theta, angle_dtype)
    return q, k, v, gate


def gated_attention_row(q: np.ndarray, gate: np.ndarray, K: np.ndarray, V: np.ndarray) -> np.ndarray:
    """One query row over its visible slots (§4.1 steps 6–7).

    q, gate [H, D]; K, V [HKV, n, D] = the slots 0 .. p of this sequence. Query head j reads kv
    head ⌊j / G⌋; s = q_j·K / √D, a = softmax(s), o_j = Σ a V; returns (o ⊙ σ(gate)) [H·D].
    """
    q = f64(q)
    H, D = q.shape
    HKV = K.shape[0]
    G = H // HKV
    out = np.empty((H, D))
    for m in range(HKV):                                             # one kv head at a time:
        Km, Vm = f64(K[m]), f64(V[m])                                # long contexts stay small
        s = q[m * G:(m + 1) * G] @ Km.T / np.sqrt(D)                 # [G, n]
        a = np.exp(s - s.max(axis=-1, keepdims=True))
        a /= a.sum(axis=-1, keepdims=True)
        out[m * G:(m + 1) * G] = a @ Vm
    return (out * sigmoid(gate)).reshape(H * D)


def swiglu(gu: np.ndarray, F: int) -> np.ndarray:
    """h = silu(g) ⊙ u with gate g = gu[:, :F], up u = gu[:, F:2F] (docs/MODEL.md §3 MLP)."""
    gu = f64(gu)
    return silu(gu[:, :F]) * gu[:, F:2 * F]


def argmax_rows(logits: np.ndarray):
    """Per row: the first index of the maximum (numpy argmax) and that maximum."""
    x = f64(logits)
    i = np.argmax(x, axis=-1)
    return i.astype(np.int32), x[np.arange(x.shape[0]), i]


def topk_rows(logits: np.ndarray, k: int):
    """Per row: the k largest values, descending, equal values ordered by smaller index."""
    x = f64(logits)
    idx = np.empty((x.shape[0], k), dtype=np.int32)
    for r in range(x.shape[0]):
        order = np.lexsort((np.arange(x.shape[1]), -x[r]))   # last key sorts first
        idx[r] = order[:k]
    return np.take_along_axis(x, idx.astype(np.int64), axis=1), idx


# ---------------------------------------------------------------------- Gated DeltaNet (GDN)

def bf16_round(x) -> np.ndarray:
    """Round to bf16 (nearest, ties to even; through fp32 as a CUDA kernel does) and back to fp64."""
    import ml_dtypes

    return np.asarray(x, dtype=np.float64).astype(np.float32).astype(ml_dtypes.bfloat16).astype(
        np.float64)


def softplus(x: np.ndarray) -> np.ndarray:
    """softplus(x) = log(1 + eˣ), and x itself for x > 20 (PyTorch's threshold, docs/MODEL.md)."""
    x = f64(x)
    with np.errstate(over="ignore"):
        return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def l2n(x: np.ndarray) -> np.ndarray:
    """l2n(x) = x / sqrt(Σ x² + 1e-6) over the last axis (docs/MODEL.md §3)."""
    x = f64(x)
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def gdn_chunk(mz, ba, ba_off: int, conv_w, A_log, dt_bias, norm_w, eps: float, ring, state,
              pos, ntok, *, hk: int, hv: int, dk: int, dv: int, pt: int,
              hf_rounding: bool = False, per_token: bool = False):
    """One GDN layer core over a chunk of PT rows per sequence (docs/MODEL.md §4.2 steps 2–7, §5).

    mz [B·PT, ≥ C+Cv]: m = columns [0, C) (Q all k-heads | K | V all v-heads), z = [C, C+Cv);
    ba [B·PT, ≥ ba_off+HV]: b = columns [0, HV), a = [ba_off, ba_off+HV); conv_w [C, K];
    A_log, dt_bias [HV]; norm_w [DV]; ring [B, K−1, C] (slot j = raw m of the position ≡ j mod
    K−1); state [B, HV, DK, DV] (S[i, j], row = key dim); pos, ntok [B]. C = 2·HK·DK + HV·DV,
    Cv = HV·DV. Rows t ≥ ntok[b] are padding: never read; their output is 0.
    A position < 0 contributes 0 to the conv window (a fresh sequence), whatever the ring holds.

    hf_rounding=False: fp64 throughout. True: also round to bf16 where docs/MODEL.md §7 says HF does
    (conv output, SiLU output, delta-rule output, the normalised o, the final product).
    Returns out [B·PT, Cv], the new ring [B, K−1, C], the new state [B, HV, DK, DV] (fp64).

    The ring may hold RS ≥ K−1 slots (ring [B, RS, C], slot = position % RS, the mtp lane); the
    last min(ntok, RS) rows are written. per_token=True also returns the state after every token,
    [B, PT, HV, DK, DV] (rows t ≥ ntok[b] left NaN): the verify pass's state slots.
    """
    rnd = bf16_round if hf_rounding else (lambda a: a)
    B = len(pos)
    C, Cv, r = 2 * hk * dk + hv * dv, hv * dv, hv // hk
    K = conv_w.shape[1]
    KC = K - 1
    RS = ring.shape[1]
    assert RS >= KC, (RS, KC)
    W = f64(conv_w)
    A_log, dt_bias, norm_w = f64(A_log), f64(dt_bias), f64(norm_w)
    ring_new, S_all = f64(ring).copy(), f64(state).copy()
    out = np.zeros((B * pt, Cv))
    each = np.full((B, pt) + S_all.shape[1:], np.nan) if per_token else None
    kap = np.arange(hv) // r                    # v-head h reads key head ⌊h / r⌋
    for b in range(B):
        p0, n = int(pos[b]), int(ntok[b])
        # X = raw m of positions p0-KC .. p0-1, oldest first
        X = [f64(ring[b, (p0 - KC + j) % RS]) if p0 - KC + j >= 0 else np.zeros(C)
             for j in range(KC)]
        S = S_all[b]                            # [HV, DK, DV]
        for t in range(n):
            row = b * pt + t
            m = f64(mz[row, :C])
            Y = np.stack(X + [m], axis=1)       # [C, K]: window, current token last
            y = rnd(silu(rnd(np.sum(W * Y, axis=1))))
            X = X[1:] + [m]
            q = l2n(y[:hk * dk].reshape(hk, dk)) / np.sqrt(dk)
            k = l2n(y[hk * dk:2 * hk * dk].reshape(hk, dk))
            v = y[2 * hk * dk:].reshape(hv, dv)
            a = f64(ba[row, ba_off:ba_off + hv])
            g = -np.exp(A_log) * softplus(a + dt_bias)          # [HV], < 0
            beta = sigmoid(ba[row, :hv])
            kh, qh = k[kap], q[kap]                             # [HV, DK]
            S *= np.exp(g)[:, None, None]                       # S ← e^g S
            u = np.einsum("hij,hi->hj", S, kh)                  # u = Sᵀ k
            d = beta[:, None] * (v - u)                         # δ = β (v − u)
            S += kh[:, :, None] * d[:, None, :]                 # S ← S + k δᵀ
            o = rnd(np.einsum("hij,hi->hj", S, qh))             # o = Sᵀ q (updated S)
            z = f64(mz[row, C:C + Cv]).reshape(hv, dv)
            nrm = rnd(o / np.sqrt(np.mean(o * o, axis=1, keepdims=True) + eps))
            out[row] = rnd(nrm * norm_w[None, :] * silu(z)).reshape(Cv)
            if per_token:
                each[b, t] = S
        for t in range(max(0, n - RS), n):
            ring_new[b, (p0 + t) % RS] = f64(mz[b * pt + t, :C])
    if per_token:
        return out, ring_new, S_all, each
    return out, ring_new, S_all
