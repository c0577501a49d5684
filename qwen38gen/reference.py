"""Numpy reference of the Qwen3.5/3.6 hybrid decoder (and its MTP row): the oracle, and the spec in code.

Every function follows docs/MODEL.md (section numbers in the comments). The reference
computes in one floating dtype throughout (``np.float32`` by default, ``np.float64`` for the
oracle): weights are converted once, no intermediate is rounded to bf16. It is meant to be read;
speed only matters so far as the tests run in seconds on the ``tiny`` and ``toy`` configs.

Public API
----------

``Reference(cfg, weights, dtype=np.float32, delta_rule="recurrent")``
    ``weights``: dict checkpoint name -> array (bf16 ``ml_dtypes`` arrays from
    ``weights.synthetic_weights``, fp32 dequantized int4 weights, ... anything ``astype`` takes).
    Names are the released-checkpoint names (``model.language_model.…``, ``lm_head.weight``,
    ``mtp.…``); ``model.X`` (the ``Qwen3_5ForCausalLM`` names) is accepted too. With
    ``tie_word_embeddings`` a missing ``lm_head.weight`` is ``embed_tokens`` (one given, such as
    the int4 dequantization of the embedding the q4 program uses, is used). ``mtp.*`` is
    optional (needed only by ``mtp_forward``). ``delta_rule="chunked"`` runs the GDN layers
    with ``gdn_chunked`` instead of the token-by-token recurrence (the definition).

``Reference.new_state(B) -> State``
    B independent, empty sequences.

``Reference.forward(state, tokens) -> (logits, hiddens)``
    ``tokens[b]``: the next chunk of token ids of sequence b (any length; 1 = a decode step,
    0 = sequence b idles this call). Returns, per sequence, ``logits[b]`` ``[T_b, vocab]`` and
    ``hiddens[b]`` ``[T_b, hidden]`` (the final-normed ``h_out`` of every row, what MTP reads), and
    advances the state. Sequences are computed one after the other, independently: a batch gives
    bitwise the results of B single-sequence runs.

``Reference.mtp_forward(state, tokens, hiddens, positions) -> (logits, hiddens)``
    MTP rows (docs/MODEL.md §8.1). Per sequence b: ``tokens[b]`` (n_b ids), ``hiddens[b]``
    ``[n_b, hidden]`` and ``positions[b]``, the position of its first row; rows are at
    consecutive positions. The row at position i takes the token at position i+1 and h_out(i) of the
    main model (the caller does this pairing, §8.1; later drafts pass the MTP's own h'). The rows' K/V go to slots p, p+1, … of the sequence's MTP cache, which is first
    truncated to p (so a rejected draft is overwritten, §8.3); p must not exceed its length.
    Returns per sequence the draft logits ``[n_b, vocab]`` and ``h'`` ``[n_b, hidden]``.

``Reference.prefill(state, prompts, chunk=None) -> (logits, hiddens)``
    ``forward`` over whole prompts, ``chunk`` tokens per call (None: the whole prompt at once);
    returns every row, concatenated per sequence.

``Reference.decode(state, tokens) -> (logits [B, vocab], hiddens [B, hidden])``
    One token per sequence.

``Reference.generate(prompts, steps, chunk=None, stop=()) -> list[list[int]]``
    Greedy: fresh state, prefill, then ``steps`` new tokens per sequence (the first from the
    prefill's last row, then ``steps - 1`` decode steps). ``np.argmax``: ties go to the lowest id.
    A sequence ends at its first id of ``stop`` (kept); the steps end when all have ended.

Free functions, the math of single pieces: ``rms1p``, ``rms_gated``, ``l2n``, ``silu``,
``sigmoid``, ``softplus``, ``rope``, ``gdn_recurrent`` (§4.2 step 6), ``gdn_chunked`` (§5, the
WY/UT chunked form) and ``conv_to_ring`` (the reference's conv state -> the GPU ring layout).

State layouts (``State``; chosen to match docs/KERNELS.md so comparisons are slices)
-----------------------------------------------------------------------------------------
* ``pos``: int64 ``[B]``, tokens already processed per sequence (= position of the next token).
* ``conv[i]`` for each GDN layer i: ``[B, K-1, C]``, the raw (pre-conv) ``in_proj_qkv`` outputs of
  the last K-1 tokens, **oldest first** (row K-2 = the newest token); zeros for a fresh sequence.
  HF keeps ``[B, C, K]`` (one extra, unused oldest column): ``hf[:, :, 1:] == ref.transpose(0, 2, 1)``.
  The GPU keeps a ring indexed by position % (K-1): see ``conv_to_ring``.
* ``rec[i]`` for each GDN layer i: ``[B, Hv, dk, dv]``, row = key dim (HF orientation).
* ``k[i]``, ``v[i]`` for each attention layer i: a list of B arrays ``[Hkv, T_b, D]``
  (K k-normed and rotated, V raw), T_b = ``pos[b]``; = the GPU cache slice ``[layer, b, :, :T_b]``.
* ``mtp_k``, ``mtp_v``: lists of B arrays ``[Hkv, T_b, D]``, the MTP layer's cache.
All of them in the reference's dtype.
"""

from __future__ import annotations

import copy as _copy
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .config import DECODER, EMBED, FULL, LINEAR, LM_HEAD, MTP, ModelConfig, canonical_name
from .errors import UserError

__all__ = [
    "Reference", "State", "rms1p", "rms_gated", "l2n", "silu", "sigmoid", "softplus", "rope",
    "gdn_recurrent", "gdn_chunked", "conv_to_ring", "check_fits",
]


# --------------------------------------------------------------------------------------------------
# Memory: the reference holds every text tensor in fp32, plus the source while it converts
def memory_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_fits(cfg: ModelConfig, what: str) -> None:
    """Refuse, before anything is built, a model whose weights will not fit in memory in fp32
    (4 bytes a parameter) beside their bf16 or int4 source (about 2 more)."""
    need = cfg.text_params * 6 + cfg.mtp_params * 6
    have = memory_available()
    if have is not None and need > have:
        raise UserError(f"{what} of {cfg.name!r} would need about {need / 1e9:.0f} GB of memory "
                        f"for the CPU reference ({cfg.text_params / 1e9:.1f} B parameters in fp32 plus "
                        f"their source); {have / 1e9:.0f} GB is available. Use a smaller model "
                        "(e.g. --model tiny, or `qwen38gen info --list`)")


# --------------------------------------------------------------------------------------------------
# §3 common pieces (all over the last axis, in the dtype of x)

def silu(x: np.ndarray) -> np.ndarray:
    """silu(x) = x·σ(x)."""
    return x * sigmoid(x)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """σ(x) = 1 / (1 + e^{−x}) (e^{−x} may overflow to inf for x ≪ 0; the result is then 0)."""
    with np.errstate(over="ignore"):
        return 1 / (1 + np.exp(-x))


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + eˣ), switching to x for x > 20 like PyTorch/vLLM."""
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def rms1p(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """Zero-centred RMSNorm: RMS1p(x; w) = x / sqrt(mean(x²) + ε) ⊙ (1 + w)."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1 + w)


def rms_gated(o: np.ndarray, w: np.ndarray, z: np.ndarray, eps: float) -> np.ndarray:
    """GDN output norm per v-head: RMSg(o; w, z) = o / sqrt(mean(o²) + ε) ⊙ w ⊙ silu(z) (plain w)."""
    return o / np.sqrt(np.mean(o * o, axis=-1, keepdims=True) + eps) * w * silu(z)


def l2n(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """l2n(x) = x / sqrt(Σ x² + 1e-6) (eps inside the sqrt)."""
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def rope(x: np.ndarray, pos: np.ndarray, rotary_dim: int, theta: float) -> np.ndarray:
    """Partial NeoX RoPE (§4.1 step 4).

    x: [T, heads, D]; pos: [T] positions. For i < R/2: ω_i = θ^(−2i/R), φ = p·ω_i and the pair
    (u_i, u_{i+R/2}) rotates by φ; dims R.. pass through. Computed in x's dtype.
    """
    dt = x.dtype
    half = rotary_dim // 2
    inv = np.asarray(theta, dt) ** (-(2 * np.arange(half, dtype=dt)) / np.asarray(rotary_dim, dt))
    phi = np.asarray(pos, dt)[:, None] * inv[None, :]            # [T, R/2]
    cos, sin = np.cos(phi)[:, None, :], np.sin(phi)[:, None, :]  # [T, 1, R/2]
    x1, x2 = x[..., :half], x[..., half:rotary_dim]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., rotary_dim:]], axis=-1)


# --------------------------------------------------------------------------------------------------
# §4.2 step 6 / §5: the gated delta rule of one sequence

def _kv_heads(x: np.ndarray, hv: int) -> np.ndarray:
    """[T, Hk, d] -> [T, Hv, d]: v-head h reads k-head ⌊h / r⌋ (repeat_interleave, not tiling)."""
    return np.repeat(x, hv // x.shape[1], axis=1)


def gdn_recurrent(q, k, v, g, beta, S0):
    """The gated delta rule token by token (§4.2 step 6: the definition).

    q, k: [T, Hk, dk] (q already l2-normed and scaled by 1/√dk, k l2-normed); v: [T, Hv, dv];
    g, beta: [T, Hv] (log-decay g < 0, β = σ(b)); S0: [Hv, dk, dv] (row = key dim).
    Returns o [T, Hv, dv] and the final state S [Hv, dk, dv]. S0 is not modified.

        S ← e^{g_t} S;  u = Sᵀ k_t;  δ = β_t (v_t − u);  S ← S + k_t δᵀ;  o_t = Sᵀ q_t
    """
    hv = v.shape[1]
    q, k = _kv_heads(q, hv), _kv_heads(k, hv)
    S = S0.copy()
    o = np.empty_like(v)
    for t in range(v.shape[0]):
        S = np.exp(g[t])[:, None, None] * S                              # decay first
        u = np.matmul(k[t][:, None, :], S)[:, 0]                         # [Hv, dv]: Sᵀ k
        delta = beta[t][:, None] * (v[t] - u)
        S = S + k[t][:, :, None] * delta[:, None, :]                     # rank-1 write k δᵀ
        o[t] = np.matmul(q[t][:, None, :], S)[:, 0]                      # read the updated S
    return o, S


def _solve_unit_lower(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """X = (I + A)⁻¹ B for strictly lower-triangular A [H, L, L], B [H, L, n] (forward substitution)."""
    X = np.empty_like(B)
    for t in range(B.shape[1]):
        X[:, t] = B[:, t] - np.matmul(A[:, t:t + 1, :t], X[:, :t])[:, 0]
    return X


def gdn_chunked(q, k, v, g, beta, S0, chunk: int = 64):
    """The same delta rule in the chunked WY/UT form (§5), chunks of ``chunk`` rows.

    Same arguments and results as ``gdn_recurrent``; equal to it up to rounding. Per v-head and
    chunk of L rows with state S0 (c ⊙ Mat scales the rows of Mat by the vector c):

        Γ_t = Σ_{s≤t} g_s;   A_ts = β_t e^{Γ_t−Γ_s} (k_t·k_s) for s < t, else 0
        U  = (I + A)⁻¹ (β ⊙ V);   Wk = (I + A)⁻¹ (β e^{Γ} ⊙ K);   V' = U − Wk S0
        O  = (e^{Γ} ⊙ Q) S0 + ((Q Kᵀ) ⊙ M) V',   M_ts = e^{Γ_t−Γ_s} for s ≤ t, else 0
        S_L = e^{Γ_L} S0 + (e^{Γ_L−Γ} ⊙ K)ᵀ V'
    """
    T, hv = v.shape[0], v.shape[1]
    q, k = _kv_heads(q, hv), _kv_heads(k, hv)
    S = S0.copy()
    o = np.empty_like(v)
    for c0 in range(0, T, chunk):
        sl = slice(c0, min(c0 + chunk, T))
        Q, K, V = (x[sl].transpose(1, 0, 2) for x in (q, k, v))     # [Hv, L, d]
        G = np.cumsum(g[sl].T, axis=1)                               # Γ [Hv, L]
        Bt = beta[sl].T                                              # β [Hv, L]
        L = G.shape[1]
        D = G[:, :, None] - G[:, None, :]                            # Γ_t − Γ_s [Hv, L, L]
        causal = np.tril(np.ones((L, L), dtype=bool))                # s ≤ t
        M = np.exp(np.where(causal, D, -np.inf))                     # masked before exp (no overflow)
        A = Bt[:, :, None] * M * np.matmul(K, K.transpose(0, 2, 1))
        A = A * np.tril(np.ones((L, L), dtype=A.dtype), -1)          # strictly lower
        U = _solve_unit_lower(A, Bt[:, :, None] * V)
        Wk = _solve_unit_lower(A, (Bt * np.exp(G))[:, :, None] * K)
        Vp = U - np.matmul(Wk, S)                                    # V' [Hv, L, dv]
        O = np.matmul(np.exp(G)[:, :, None] * Q, S) + np.matmul(np.matmul(Q, K.transpose(0, 2, 1)) * M, Vp)
        o[sl] = O.transpose(1, 0, 2)
        S = (np.exp(G[:, -1])[:, None, None] * S
             + np.matmul((np.exp(G[:, -1:] - G)[:, :, None] * K).transpose(0, 2, 1), Vp))
    return o, S


def conv_to_ring(conv: np.ndarray, pos: int) -> np.ndarray:
    """One sequence's conv state [K-1, C] (oldest first) -> the GPU ring [K-1, C] (KERNELS.md).

    The ring's slot j holds the token whose position % (K-1) == j; row i of ``conv`` is the token at
    position pos − (K−1) + i (rows of positions < 0 are zeros either way).
    """
    kc = conv.shape[0]
    ring = np.empty_like(conv)
    for i in range(kc):
        ring[(pos - kc + i) % kc] = conv[i]
    return ring


# --------------------------------------------------------------------------------------------------
# State

@dataclass
class State:
    """B independent sequences; layouts in the module docstring. Built by ``Reference.new_state``."""

    pos: np.ndarray                                                  # int64 [B]
    conv: dict[int, np.ndarray] = field(default_factory=dict)        # GDN layer -> [B, K-1, C]
    rec: dict[int, np.ndarray] = field(default_factory=dict)         # GDN layer -> [B, Hv, dk, dv]
    k: dict[int, list[np.ndarray]] = field(default_factory=dict)     # attn layer -> B × [Hkv, T_b, D]
    v: dict[int, list[np.ndarray]] = field(default_factory=dict)
    mtp_k: list[np.ndarray] = field(default_factory=list)            # B × [Hkv, T_b, D]
    mtp_v: list[np.ndarray] = field(default_factory=list)

    @property
    def B(self) -> int:
        return len(self.pos)

    def copy(self) -> "State":
        """A deep copy (a snapshot to roll back to)."""
        return _copy.deepcopy(self)


# --------------------------------------------------------------------------------------------------
# The model



class Reference:
    """The decoder of ``cfg`` with ``weights``, computing in ``dtype``. See the module docstring."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, np.ndarray], dtype=np.float32,
                 delta_rule: str = "recurrent"):
        if delta_rule not in ("recurrent", "chunked"):
            raise ValueError(f"delta_rule must be 'recurrent' or 'chunked', got {delta_rule!r}")
        self.cfg = cfg
        self.dtype = np.dtype(dtype)
        if self.dtype not in (np.float32, np.float64):
            raise ValueError(f"dtype must be float32 or float64, got {self.dtype}")
        self.delta_rule = delta_rule
        self.eps = cfg.rms_norm_eps
        have = {canonical_name(n): a for n, a in weights.items()}
        if cfg.tie_word_embeddings and LM_HEAD not in have and EMBED in have:
            have[LM_HEAD] = have[EMBED]                      # tied: the lm_head is the embedding
        missing = [n for n in cfg.tensor_shapes(mtp=False) if n not in have]
        if missing:
            raise KeyError(f"weights lack {len(missing)} tensors of {cfg.name!r}, e.g. {missing[0]!r}")
        self.has_mtp = bool(cfg.mtp_num_hidden_layers) and all(n in have for n in cfg.mtp_shapes())
        names = cfg.tensor_shapes(mtp=self.has_mtp)
        self.w: dict[str, np.ndarray] = {}
        for n, shape in names.items():
            a = np.asarray(have[n])
            if tuple(a.shape) != tuple(shape):
                raise ValueError(f"weight {n!r} has shape {tuple(a.shape)}, expected {tuple(shape)}")
            a = a.astype(self.dtype)
            if n.endswith("conv1d.weight"):
                a = a[:, 0, :]                                       # [C, 1, K] -> [C, K]
            self.w[n] = np.ascontiguousarray(a)

    # ------------------------------------------------------------------ state
    def new_state(self, B: int) -> State:
        cfg, dt = self.cfg, self.dtype
        Hkv, D = cfg.num_key_value_heads, cfg.head_dim
        st = State(pos=np.zeros(B, dtype=np.int64))
        for i in cfg.linear_layers:
            st.conv[i] = np.zeros((B, cfg.linear_conv_kernel_dim - 1, cfg.conv_dim), dt)
            st.rec[i] = np.zeros((B, cfg.linear_num_value_heads, cfg.linear_key_head_dim,
                                  cfg.linear_value_head_dim), dt)
        for i in cfg.full_layers:
            st.k[i] = [np.zeros((Hkv, 0, D), dt) for _ in range(B)]
            st.v[i] = [np.zeros((Hkv, 0, D), dt) for _ in range(B)]
        st.mtp_k = [np.zeros((Hkv, 0, D), dt) for _ in range(B)]
        st.mtp_v = [np.zeros((Hkv, 0, D), dt) for _ in range(B)]
        return st

    # ------------------------------------------------------------------ pieces
    def _block(self, p: str, x: np.ndarray, mix) -> np.ndarray:
        """One decoder block (§4, §8.1) on the residual stream x: x + mix(RMS1p(x)), then
        + MLP(RMS1p(·)). mix is the token mixer (GDN or gated attention), which updates its state."""
        x = x + mix(rms1p(x, self.w[p + "input_layernorm.weight"], self.eps))
        return x + self._mlp(p, rms1p(x, self.w[p + "post_attention_layernorm.weight"], self.eps))

    def _mlp(self, p: str, h: np.ndarray) -> np.ndarray:
        """MLP(h) = W_down (silu(W_gate h) ⊙ (W_up h)); h [T, hidden]."""
        w = self.w
        return (silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)) \
            @ w[p + "mlp.down_proj.weight"].T

    def _attn(self, p: str, h: np.ndarray, p0: int, kc: np.ndarray, vc: np.ndarray):
        """Gated full attention (§4.1, §5) of one sequence's chunk.

        h: [T, hidden] (normed) at positions p0 … p0+T−1; kc, vc: [Hkv, p0, D] cached K/V.
        Returns (out [T, hidden], K [Hkv, p0+T, D], V [Hkv, p0+T, D]) — the caches with the chunk
        appended.
        """
        cfg, w, dt = self.cfg, self.w, self.dtype
        T = h.shape[0]
        H, Hkv, D, G = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.gqa_group
        a = p + "self_attn."
        qg = (h @ w[a + "q_proj.weight"].T).reshape(T, H, 2 * D)     # per head [query | gate]
        q, gate = qg[:, :, :D], qg[:, :, D:].reshape(T, H * D)
        k = (h @ w[a + "k_proj.weight"].T).reshape(T, Hkv, D)
        v = (h @ w[a + "v_proj.weight"].T).reshape(T, Hkv, D)
        q = rms1p(q, w[a + "q_norm.weight"], self.eps)                # QK-norm before RoPE
        k = rms1p(k, w[a + "k_norm.weight"], self.eps)
        pos = p0 + np.arange(T)
        q = rope(q, pos, cfg.rotary_dim, cfg.rope_theta)
        k = rope(k, pos, cfg.rotary_dim, cfg.rope_theta)
        K = np.concatenate([kc, k.transpose(1, 0, 2)], axis=1)       # [Hkv, p0+T, D]
        V = np.concatenate([vc, v.transpose(1, 0, 2)], axis=1)
        kv = np.arange(H) // G                                       # q head j reads kv head j // G
        s = np.matmul(q.transpose(1, 0, 2), K[kv].transpose(0, 2, 1)) / np.sqrt(np.asarray(D, dt))
        allowed = np.arange(p0 + T)[None, :] <= pos[:, None]          # [T, p0+T]: slot ≤ position
        s = np.where(allowed[None], s, -np.inf)                       # [H, T, p0+T]
        s = np.exp(s - s.max(axis=-1, keepdims=True))
        prob = s / s.sum(axis=-1, keepdims=True)
        o = np.matmul(prob, V[kv]).transpose(1, 0, 2).reshape(T, H * D)
        o = o * sigmoid(gate)                                         # output gate
        return o @ w[a + "o_proj.weight"].T, K, V

    def _gdn(self, p: str, h: np.ndarray, X: np.ndarray, S0: np.ndarray):
        """Gated DeltaNet (§4.2, §5) of one sequence's chunk.

        h: [T, hidden] (normed); X: [K-1, C] conv state (oldest first); S0: [Hv, dk, dv].
        Returns (out [T, hidden], X' [K-1, C], S' [Hv, dk, dv]).
        """
        cfg, w, dt = self.cfg, self.w, self.dtype
        T = h.shape[0]
        Hk, Hv = cfg.linear_num_key_heads, cfg.linear_num_value_heads
        dk, dv, kw = cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.linear_conv_kernel_dim
        la = p + "linear_attn."
        # 1. projections
        m = h @ w[la + "in_proj_qkv.weight"].T                        # [T, C] rows [Q | K | V]
        z = (h @ w[la + "in_proj_z.weight"].T).reshape(T, Hv, dv)
        b = h @ w[la + "in_proj_b.weight"].T                          # [T, Hv]
        a = h @ w[la + "in_proj_a.weight"].T                          # [T, Hv]
        # 2. causal depthwise conv over [X_0 … X_{K-2}, m_0 … m_{T-1}]; tap K-1 = current token
        Y = np.concatenate([X, m], axis=0)                            # [K-1+T, C]
        wc = w[la + "conv1d.weight"]                                  # [C, K]
        c = sum(wc[:, j] * Y[j:j + T] for j in range(kw))
        y = silu(c)
        X_new = Y[T:]                                                 # last K-1 raw rows
        # 3. split; 4. l2-norm q, k per key head, q scaled by 1/√dk
        kd = cfg.linear_key_dim
        q = l2n(y[:, :kd].reshape(T, Hk, dk)) / np.sqrt(np.asarray(dk, dt))
        k = l2n(y[:, kd:2 * kd].reshape(T, Hk, dk))
        v = y[:, 2 * kd:].reshape(T, Hv, dv)
        # 5. gates
        g = -np.exp(w[la + "A_log"]) * softplus(a + w[la + "dt_bias"])
        beta = sigmoid(b)
        # 6. delta rule
        rule = gdn_recurrent if self.delta_rule == "recurrent" else gdn_chunked
        o, S = rule(q, k, v, g, beta, S0)
        # 7. gated norm per v-head; 8. out_proj
        o = rms_gated(o, w[la + "norm.weight"], z, self.eps)
        return o.reshape(T, Hv * dv) @ w[la + "out_proj.weight"].T, X_new, S

    def _embed(self, tokens) -> np.ndarray:
        ids = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.cfg.vocab_size):
            raise ValueError(f"token ids must be in [0, {self.cfg.vocab_size}), got {ids.tolist()}")
        return self.w[DECODER + "embed_tokens.weight"][ids]

    def _check_batch(self, state: State, rows, what: str) -> None:
        if len(rows) != state.B:
            raise ValueError(f"{what}: got {len(rows)} sequences, the state holds {state.B}")

    # ------------------------------------------------------------------ main model
    def forward(self, state: State, tokens: list[list[int]]):
        """Process the next chunk of every sequence (§4, §5); see the module docstring.

        Returns (logits, hiddens): lists of B arrays [T_b, vocab] and [T_b, hidden].
        """
        self._check_batch(state, tokens, "forward")
        cfg, w = self.cfg, self.w
        logits, hiddens = [], []
        for b, toks in enumerate(tokens):                              # sequences independently
            T = len(toks)
            if T == 0:
                logits.append(np.zeros((0, cfg.vocab_size), self.dtype))
                hiddens.append(np.zeros((0, cfg.hidden_size), self.dtype))
                continue
            p0 = int(state.pos[b])
            x = self._embed(toks)                                      # [T, hidden] residual stream
            for i, kind in enumerate(cfg.layer_types):
                p = f"{DECODER}layers.{i}."
                if kind == LINEAR:
                    def mix(h, i=i, p=p):
                        out, state.conv[i][b], state.rec[i][b] = self._gdn(
                            p, h, state.conv[i][b], state.rec[i][b])
                        return out
                else:
                    assert kind == FULL

                    def mix(h, i=i, p=p):
                        out, state.k[i][b], state.v[i][b] = self._attn(
                            p, h, p0, state.k[i][b], state.v[i][b])
                        return out
                x = self._block(p, x, mix)
            h_out = rms1p(x, w[DECODER + "norm.weight"], self.eps)
            hiddens.append(h_out)
            logits.append(h_out @ w["lm_head.weight"].T)
            state.pos[b] = p0 + T
        return logits, hiddens

    # ------------------------------------------------------------------ MTP (§8.1)
    def mtp_forward(self, state: State, tokens: list[list[int]], hiddens: list[np.ndarray],
                    positions: list[int]):
        """MTP rows per sequence; see the module docstring. Returns (logits, h') per sequence."""
        if not self.has_mtp:
            raise ValueError(f"config {self.cfg.name!r}: no MTP layer or no mtp.* weights given")
        for what, rows in (("tokens", tokens), ("hiddens", hiddens), ("positions", positions)):
            self._check_batch(state, rows, f"mtp_forward {what}")
        cfg, w = self.cfg, self.w
        p = MTP + "layers.0."
        logits, outs = [], []
        for b in range(state.B):
            n = len(tokens[b])
            hid = np.asarray(hiddens[b], dtype=self.dtype).reshape(n, cfg.hidden_size)
            p0 = int(positions[b])
            have = state.mtp_k[b].shape[1]
            if not 0 <= p0 <= have:
                raise ValueError(f"mtp_forward: sequence {b} starts at position {p0} but its MTP "
                                 f"cache holds {have} slots (needs 0 ≤ position ≤ {have})")
            if n == 0:
                logits.append(np.zeros((0, cfg.vocab_size), self.dtype))
                outs.append(np.zeros((0, cfg.hidden_size), self.dtype))
                continue
            e = self._embed(tokens[b])
            u = np.concatenate([rms1p(e, w[MTP + "pre_fc_norm_embedding.weight"], self.eps),  # embedding first
                                rms1p(hid, w[MTP + "pre_fc_norm_hidden.weight"], self.eps)],  # hidden second
                               axis=-1) @ w[MTP + "fc.weight"].T

            def mix(t):
                out, state.mtp_k[b], state.mtp_v[b] = self._attn(
                    p, t, p0, state.mtp_k[b][:, :p0], state.mtp_v[b][:, :p0])
                return out
            u = self._block(p, u, mix)                                  # one gated-attention block
            h2 = rms1p(u, w[MTP + "norm.weight"], self.eps)
            outs.append(h2)
            logits.append(h2 @ w["lm_head.weight"].T)
        return logits, outs

    # ------------------------------------------------------------------ helpers
    def prefill(self, state: State, prompts: list[list[int]], chunk: int | None = None):
        """Whole prompts through ``forward``, ``chunk`` tokens per call (None: all at once).

        Returns (logits, hiddens) of every prompt row, per sequence ([T_b, vocab], [T_b, hidden]).
        """
        self._check_batch(state, prompts, "prefill")
        n = max((len(pr) for pr in prompts), default=0)
        step = chunk or max(n, 1)
        parts = [([], []) for _ in prompts]
        for c0 in range(0, n, step):
            lg, hd = self.forward(state, [list(pr[c0:c0 + step]) for pr in prompts])
            for b in range(state.B):
                parts[b][0].append(lg[b])
                parts[b][1].append(hd[b])
        logits = [np.concatenate(l_, axis=0) if l_ else np.zeros((0, self.cfg.vocab_size), self.dtype)
                  for l_, _ in parts]
        hiddens = [np.concatenate(h_, axis=0) if h_ else np.zeros((0, self.cfg.hidden_size), self.dtype)
                   for _, h_ in parts]
        return logits, hiddens

    def decode(self, state: State, tokens: list[int]):
        """One decode step, one token per sequence. Returns logits [B, vocab], hiddens [B, hidden]."""
        lg, hd = self.forward(state, [[int(t)] for t in tokens])
        return np.concatenate(lg, axis=0), np.concatenate(hd, axis=0)

    def generate(self, prompts: list[list[int]], steps: int, chunk: int | None = None,
                 stop: tuple[int, ...] = ()) -> list[list[int]]:
        """Greedy generation: up to ``steps`` new token ids per prompt (prompts must be
        non-empty). A sequence ends after it emits an id of ``stop`` (the id is kept); the loop
        ends when every sequence has ended, so the lists may be shorter than ``steps``."""
        if any(len(pr) == 0 for pr in prompts):
            raise ValueError("generate: every prompt needs at least one token")
        stop = frozenset(stop)
        st = self.new_state(len(prompts))
        lg, _ = self.prefill(st, prompts, chunk)
        nxt = [int(np.argmax(l_[-1])) for l_ in lg]
        out = [[t] for t in nxt] if steps > 0 else [[] for _ in prompts]
        live = [bool(o) and o[-1] not in stop for o in out]
        for _ in range(steps - 1):
            if not any(live):
                break
            lg2, _ = self.decode(st, nxt)   # ended sequences still step; their tokens are dropped
            nxt = [int(t) for t in np.argmax(lg2, axis=-1)]
            for b, (o, t) in enumerate(zip(out, nxt)):
                if live[b]:
                    o.append(t)
                    live[b] = t not in stop
        return out
