"""Weights: seeded synthetic tensors and int4 g128 packing.

Tensors are plain numpy arrays keyed by their checkpoint names (``model.language_model.…``,
``lm_head.weight``, ``mtp.…``). bf16 tensors use ``ml_dtypes.bfloat16``.

- synthetic: ``synthetic_tensor``, ``synthetic_weights``, ``default_tensors``
- int4 g128 (docs/FORMAT.md): ``quantize_int4``, ``pack_int4``, ``unpack_int4``,
  ``quantize_pack``, ``dequantize``, ``gemv_reference``
- the scale folded into a bf16 weight (docs/GEMV_MAINLOOP.md §2 "New", kernels/gemv_cv.cuh):
  ``dequantize_bf16``, ``gemv_cv_reference``

Checkpoint folders (safetensors in and out) are in ``checkpoint.py``; the streaming quantizer of
whole checkpoints is in ``quantize.py``.
"""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np

from .config import EMBED, LM_HEAD, ModelConfig
from .errors import UserError

BF16 = np.dtype(ml_dtypes.bfloat16)

# Tensors the released Qwen3.5 checkpoints keep in fp32 (docs/MODEL.md §2).
FP32_SUFFIXES = ("linear_attn.A_log", "linear_attn.norm.weight")

DEFAULT_SEED = 0   # the synthetic weights of the golden runs and of every default run


def _rng(seed: int, name: str) -> np.random.Generator:
    """One stream per tensor, so a tensor does not depend on the order others are drawn in."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def synthetic_tensor(name: str, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """One seeded synthetic tensor with non-trivial statistics (docs/MODEL.md §1.2).

    Linear weights ~ N(0, 1/in) so activations stay O(1); zero-centred norm weights (used as
    1 + w) ~ U(−0.5, 0.5); the GDN gated-norm weight (plain w) ~ U(0.5, 1.5); A_log ~ U(−1, 1);
    dt_bias ~ N(0, 0.5²); conv taps ~ N(0, 0.5²); the embedding ~ N(0, 1).
    """
    rng = _rng(seed, name)
    if name.endswith("embed_tokens.weight"):
        a = rng.standard_normal(shape)
    elif name.endswith("linear_attn.A_log"):
        a = rng.uniform(-1.0, 1.0, shape)
    elif name.endswith("linear_attn.dt_bias"):
        a = 0.5 * rng.standard_normal(shape)
    elif name.endswith("linear_attn.norm.weight"):
        a = rng.uniform(0.5, 1.5, shape)
    elif name.endswith("conv1d.weight"):
        a = 0.5 * rng.standard_normal(shape)
    elif len(shape) == 1:
        a = rng.uniform(-0.5, 0.5, shape)
    else:
        a = rng.standard_normal(shape) / np.sqrt(shape[-1])
    dtype = np.float32 if name.endswith(FP32_SUFFIXES) else BF16
    return a.astype(np.float32).astype(dtype)


def synthetic_weights(cfg: ModelConfig, seed: int = DEFAULT_SEED, mtp: bool = True) -> dict[str, np.ndarray]:
    """Every text tensor of ``cfg`` (plus MTP), seeded, under the checkpoint names. A tied
    config's ``lm_head.weight`` is the embedding itself (the same array)."""
    w = {}
    for n, s in cfg.tensor_shapes(mtp=mtp).items():
        tied = cfg.tie_word_embeddings and n == LM_HEAD
        w[n] = w[EMBED] if tied else synthetic_tensor(n, s, seed)
    return w


def default_tensors(cfg: ModelConfig, seed: int = DEFAULT_SEED, mtp: bool = False) -> dict:
    """The embedded default's weights: seeded synthetic, as the int4 program and its oracle use
    them (the runtime packs the float weights itself; the reference gets the dequantization).
    mtp: with the MTP layer's tensors (each tensor is seeded by its name, so the others are the
    same either way). The golden runs are of seed DEFAULT_SEED."""
    return synthetic_weights(cfg, seed, mtp=mtp)


def tie_lm_head(cfg: ModelConfig, tensors: dict) -> dict:
    """``tensors`` with ``lm_head.weight`` = ``embed_tokens`` when ``cfg`` ties them (HF's
    save_pretrained leaves the lm_head out then; one written anyway is not used, as in HF)."""
    if cfg.tie_word_embeddings and EMBED in tensors:
        tensors = dict(tensors)
        tensors[LM_HEAD] = tensors[EMBED]
    return tensors


# ====================================================================== int4 g128 (FORMAT.md)
GROUP = 128          # input columns per scale
TILE_N, TILE_K = 16, 64  # a tile: 16 rows x 64 input columns, 512 bytes
_ROW_BLOCK = 4096    # rows per block in the quantizer/packer (a multiple of TILE_N)

# Tile column 16c + 4i + e sits in nibble 2*_E_SLOT[e] + h of word i of lane 4g + c, for tile row
# 8h + g (FORMAT.md table: nibbles 0..7 = (e, h) = (0,0) (0,1) (2,0) (2,1) (1,0) (1,1) (3,0) (3,1)).
# _E_ORDER lists e by slot; swapping 1 and 2 is its own inverse.
_E_ORDER = np.array([0, 2, 1, 3])
_SHIFTS = (4 * np.arange(8, dtype=np.uint32))


def _check_k(shape, name: str | None = None) -> tuple[int, int]:
    if len(shape) != 2:
        raise UserError(f"int4 quantization needs a 2-D weight, got shape {list(shape)}"
                        + (f" for tensor {name!r}" if name else ""))
    n, k = int(shape[0]), int(shape[1])
    if k % GROUP or k == 0 or n == 0:
        what = f"tensor {name!r}" if name else "weight"
        raise UserError(f"{what} has shape [{n}, {k}]: int4 g128 needs K (the input dimension, "
                        f"{k}) to be a positive multiple of {GROUP}")
    return n, k


def quantize_int4(w: np.ndarray, name: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int4 g128 quantization of ``w [N, K]`` (any float dtype, incl. bf16).

    Returns ``(codes int8 [N, K] in -8..7, scales bf16 [N, K/128])`` with
    ``s = bf16(max|w_group| / 7)`` (rounded before the codes), ``q = clip(rint(w/s), -8, 7)``,
    ``q = 0`` where ``s = 0``. Works in row blocks, so temporaries stay small.
    """
    n, k = _check_k(w.shape, name)
    codes = np.empty((n, k), np.int8)
    scales = np.empty((n, k // GROUP), BF16)
    for r0 in range(0, n, _ROW_BLOCK):
        c, s = _quantize_block(w[r0:r0 + _ROW_BLOCK], name)
        codes[r0:r0 + len(c)] = c
        scales[r0:r0 + len(c)] = s
    return codes, scales


def _quantize_block(w: np.ndarray, name: str | None) -> tuple[np.ndarray, np.ndarray]:
    rows, k = w.shape
    g = np.asarray(w, dtype=np.float32).reshape(rows, k // GROUP, GROUP)
    amax = np.abs(g).max(axis=2)
    if not np.isfinite(amax).all():
        raise UserError(f"tensor {name or '<weight>'!r} holds inf or NaN; cannot quantize it")
    s = (amax / np.float32(7)).astype(BF16)          # the stored scale, rounded first
    sf = s.astype(np.float32)
    # Where s = 0 every |w| is tiny (all zero, or so small s underflows): dividing by 1 gives
    # q = 0 there, as FORMAT.md says, without a division by zero.
    sf[sf == 0] = 1.0
    q = g / sf[:, :, None]
    np.rint(q, out=q)                                  # rint = round half to even
    np.clip(q, -8, 7, out=q)
    codes = q.astype(np.int8).reshape(rows, k)
    return codes, s


def _pack_block(codes: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """codes [R, K] (R % 16 == 0, padding already added), scales [R, K/128] -> tiled block."""
    r, k = codes.shape
    u = (codes.astype(np.int8) + np.int8(8)).view(np.uint8)           # stored nibble 0..15
    # row = 16 rt + 8 h + g, col = 64 kt + 16 c + 4 i + e
    u = u.reshape(r // TILE_N, 2, 8, k // TILE_K, 4, 4, 4)           # rt h g kt c i e
    u = u.transpose(0, 3, 2, 4, 5, 6, 1)                             # rt kt g c i e h
    u = u[:, :, :, :, :, _E_ORDER, :]                                # e -> slot order
    u = u.reshape(r // TILE_N, k // TILE_K, 32, 4, 8)                # rt kt lane word nibble
    # Nibble 2m is the low half of byte m of the little-endian word; 4 bytes make the word.
    b = np.ascontiguousarray(u[..., 0::2] | (u[..., 1::2] << 4))
    qweight = b.view("<u4")[..., 0].astype(np.uint32, copy=False)
    st = scales.reshape(r // TILE_N, TILE_N, k // GROUP).transpose(0, 2, 1)
    return qweight, np.ascontiguousarray(st)


def pack_int4(codes: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lay out int4 codes and scales as FORMAT.md "Tiles" / "Scales".

    ``codes [N, K]`` (ints in -8..7), ``scales bf16 [N, K/128]`` ->
    ``(qweight uint32 [Np/16, K/64, 32, 4], scales_tiled bf16 [Np/16, K/128, 16])``,
    ``Np = ceil(N/16)*16``; padding rows get code 8 (q = 0) and scale 0.
    """
    n, k = _check_k(codes.shape)
    if scales.shape != (n, k // GROUP):
        raise UserError(f"scales have shape {list(scales.shape)}, expected {[n, k // GROUP]}")
    if codes.min(initial=0) < -8 or codes.max(initial=0) > 7:
        raise UserError("int4 codes must lie in -8..7")
    return _pack_blocks(n, k, ((codes[r0:r0 + _ROW_BLOCK], scales[r0:r0 + _ROW_BLOCK])
                               for r0 in range(0, n, _ROW_BLOCK)))


def _pack_blocks(n: int, k: int, blocks) -> tuple[np.ndarray, np.ndarray]:
    """Pack consecutive row blocks (codes, scales) of an [n, k] weight into the tile layout,
    padding the last block to whole 16-row tiles (code 0 -> q = 0, scale 0)."""
    np_ = -(-n // TILE_N) * TILE_N
    qweight = np.empty((np_ // TILE_N, k // TILE_K, 32, 4), np.uint32)
    st = np.empty((np_ // TILE_N, k // GROUP, TILE_N), BF16)
    r0 = 0
    for c, s in blocks:
        s = s.astype(BF16)
        rows = len(c)
        pad = -rows % TILE_N
        if pad:
            c = np.concatenate([c, np.zeros((pad, k), c.dtype)])
            s = np.concatenate([s, np.zeros((pad, k // GROUP), BF16)])
        t0 = r0 // TILE_N
        qweight[t0:t0 + len(c) // TILE_N], st[t0:t0 + len(c) // TILE_N] = _pack_block(c, s)
        r0 += rows
    return qweight, st


def quantize_pack(w: np.ndarray, name: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``pack_int4(*quantize_int4(w))`` block by block, without holding all codes at once."""
    n, k = _check_k(w.shape, name)
    return _pack_blocks(n, k, (_quantize_block(w[r0:r0 + _ROW_BLOCK], name)
                               for r0 in range(0, n, _ROW_BLOCK)))


def check_packed(qweight, scales_tiled, shape) -> tuple[int, int, int]:
    """Check qweight/scales_tiled fit ``shape = (N, K)``; return (N, K, row tiles)."""
    n, k = _check_k(shape)
    nt = -(-n // TILE_N)
    if qweight.dtype != np.uint32 or qweight.shape != (nt, k // TILE_K, 32, 4):
        raise UserError(f"qweight has {qweight.dtype} {list(qweight.shape)}, expected uint32 "
                        f"{[nt, k // TILE_K, 32, 4]} for shape [{n}, {k}]")
    if scales_tiled.shape != (nt, k // GROUP, TILE_N):
        raise UserError(f"scales have shape {list(scales_tiled.shape)}, expected "
                        f"{[nt, k // GROUP, TILE_N]} for shape [{n}, {k}]")
    return n, k, nt


def _unpack_tiles(qweight: np.ndarray) -> np.ndarray:
    """qweight [T, K/64, 32, 4] -> codes q (int8, -8..7) [16T, K] incl. padding rows."""
    t, kt = qweight.shape[:2]
    u = ((qweight[..., None] >> _SHIFTS) & 15).astype(np.int8) - 8  # rt kt lane word nibble
    u = u.reshape(t, kt, 8, 4, 4, 4, 2)                              # rt kt g c i slot h
    u = u[:, :, :, :, :, _E_ORDER, :]                                # slot -> e
    u = u.transpose(0, 6, 2, 1, 3, 4, 5)                             # rt h g kt c i e
    return u.reshape(t * TILE_N, kt * TILE_K)


def xtile_index(rows: int, k: int, nt: int) -> np.ndarray:
    """FORMAT.md "Activation tiles": for an activation matrix [rows, k] (bf16) in wgmma_q4's
    tile order for batch tiles of 8·nt rows, the element offset of (r, c) in the tiled buffer,
    int64 [rows, k]. The buffer holds ceil(rows / (8·nt)) · 8·nt rows."""
    _check_k((1, k))
    btg, ng = 8 * nt, k // GROUP
    r = np.arange(rows)[:, None]
    c = np.arange(k)[None, :]
    rb, n, gi, kk = r // btg, r % btg, c // GROUP, c % GROUP
    nb, n8 = n // 8, n % 8
    h, ch = kk // 64, (kk % 64) // 8            # k-tile, 16-byte chunk within it
    ih, j, t, e = ch % 2, ch // 2, (kk % 8) // 2, kk % 2
    byte = ((rb * ng + gi) * (2048 * nt) + ((4 * h + 2 * ih) * nt + nb) * 256 + n8 * 16
            + (t % 2) * 128 + (t // 2) * nt * 256 + j * 4 + e * 2)
    return byte // 2


def tile_activations(x: np.ndarray, nt: int) -> np.ndarray:
    """x [rows, k] (any dtype; bf16 bits as uint16 for the GPU) in wgmma_q4's activation tile
    order for batch tiles of 8·nt rows: a flat array of ceil(rows / (8·nt)) · 8·nt · k elements,
    zero in the padding rows."""
    rows, k = x.shape
    out = np.zeros(-(-rows // (8 * nt)) * 8 * nt * k, x.dtype)
    out[xtile_index(rows, k, nt).ravel()] = x.ravel()
    return out


def unpack_int4(qweight: np.ndarray, scales_tiled: np.ndarray,
                shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of ``pack_int4``: ``(codes int8 [N, K], scales bf16 [N, K/128])``."""
    n, k, nt = check_packed(qweight, scales_tiled, shape)
    codes = _unpack_tiles(qweight)[:n]
    scales = scales_tiled.transpose(0, 2, 1).reshape(nt * TILE_N, k // GROUP)[:n]
    return np.ascontiguousarray(codes), np.ascontiguousarray(scales)


def _dequant_tiles(qweight, scales_tiled, dtype=np.float32) -> np.ndarray:
    """Dequantized rows of a run of row tiles (padding rows included), [16T, K]."""
    q = _unpack_tiles(qweight).astype(dtype)
    s = scales_tiled.transpose(0, 2, 1).reshape(q.shape[0], -1).astype(dtype)
    return (q.reshape(q.shape[0], -1, GROUP) * s[:, :, None]).reshape(q.shape)


def dequantize(qweight: np.ndarray, scales_tiled: np.ndarray,
               shape: tuple[int, int]) -> np.ndarray:
    """``W~ = q * s`` as float32 ``[N, K]`` (exact: a 4-bit integer times a bf16)."""
    n, k, nt = check_packed(qweight, scales_tiled, shape)
    out = np.empty((n, k), np.float32)
    bt = _ROW_BLOCK // TILE_N
    for t0 in range(0, nt, bt):
        d = _dequant_tiles(qweight[t0:t0 + bt], scales_tiled[t0:t0 + bt])
        r0 = t0 * TILE_N
        out[r0:r0 + len(d)] = d[:n - r0]
    return out


def _gemv_by_row_blocks(qweight: np.ndarray, scales_tiled: np.ndarray, shape: tuple[int, int],
                        x: np.ndarray, block) -> np.ndarray:
    """The frame the GEMV twins share: ``x [..., K]`` checked, then per block of rows
    ``out[..., rows] = block(x, d)`` with ``d`` the rows' ``W~`` in float64 ``[rows, K]``."""
    n, k, nt = check_packed(qweight, scales_tiled, shape)
    x = np.asarray(x, dtype=np.float64)
    if x.shape[-1] != k:
        raise UserError(f"x has last dim {x.shape[-1]}, expected K = {k}")
    out = np.empty(x.shape[:-1] + (n,), np.float64)
    bt = _ROW_BLOCK // TILE_N
    for t0 in range(0, nt, bt):
        d = _dequant_tiles(qweight[t0:t0 + bt], scales_tiled[t0:t0 + bt], np.float64)
        r0 = t0 * TILE_N
        d = d[:n - r0]
        out[..., r0:r0 + len(d)] = block(x, d)
    return out


def gemv_reference(qweight: np.ndarray, scales_tiled: np.ndarray, shape: tuple[int, int],
                   x: np.ndarray) -> np.ndarray:
    """``x @ W~.T`` in float64: ``x [..., K]`` -> ``[..., N]`` (the kernel's target)."""
    return _gemv_by_row_blocks(qweight, scales_tiled, shape, x, lambda x, d: x @ d.T)


def dequantize_bf16(qweight: np.ndarray, scales_tiled: np.ndarray,
                    shape: tuple[int, int]) -> np.ndarray:
    """``Ŵ = bf16(q * s)`` as float32 ``[N, K]``: the exact product ``W~`` rounded once to
    bf16, nearest even (docs/GEMV_MAINLOOP.md §2 "New"; on the device
    ``fma.rn.bf16x2(q, s, -0)``). Weights with |q| in {0, 1, 2, 4, 8}, and products below 2^-126
    (multiples of bf16's subnormal step 2^-133), are unchanged; the others move by less than 2^-8
    of themselves (bf16's unit roundoff: q · s has up to 11 significant bits, bf16 keeps 8)."""
    return dequantize(qweight, scales_tiled, shape).astype(BF16).astype(np.float32)


def gemv_cv_reference(qweight: np.ndarray, scales_tiled: np.ndarray, shape: tuple[int, int],
                      x: np.ndarray, ks: int) -> np.ndarray:
    """The twin of kernels/gemv_cv.cuh, in float64: ``x [..., K]`` -> ``[..., N]``.

    The K/128 groups are cut into ``ks`` parts (part p = groups [p·NG/ks, (p+1)·NG/ks), as the
    kernel cuts them); per part the fp64 sum of ``Ŵ · x`` over its columns (``dequantize_bf16``),
    the parts added in order from 0. The kernel's chains are fp32 on the tensor core, which numpy
    does not reproduce bit for bit: a tolerance reference."""
    _, k, _ = check_packed(qweight, scales_tiled, shape)
    ng = k // GROUP
    if not 1 <= ks <= ng:
        raise UserError(f"ks = {ks}: the parts of K = {k} number 1 to {ng} (one group of "
                        f"{GROUP} at least each)")
    cols = [p * ng // ks * GROUP for p in range(ks + 1)]

    def parts(x, d):
        d = d.astype(BF16).astype(np.float64)   # Ŵ: q·s is exact in float64, rounded once
        acc = np.zeros(x.shape[:-1] + (len(d),), np.float64)
        for a, b in zip(cols[:-1], cols[1:]):
            acc = acc + x[..., a:b] @ d[:, a:b].T
        return acc
    return _gemv_by_row_blocks(qweight, scales_tiled, shape, x, parts)
