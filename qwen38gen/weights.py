"""Weights: seeded synthetic tensors, HF-layout safetensors in and out, int4 g128 packing.

Tensors are plain numpy arrays keyed by their checkpoint names (``model.language_model.…``,
``lm_head.weight``, ``mtp.…``). bf16 tensors use ``ml_dtypes.bfloat16``.

- synthetic: ``synthetic_tensor``, ``synthetic_weights``, ``default_tensors``
- files: ``save_checkpoint``, ``CheckpointReader`` (lazy), ``load_checkpoint``, ``check_tensors``
- int4 g128 (docs/FORMAT.md): ``quantize_int4``, ``pack_int4``, ``unpack_int4``,
  ``quantize_pack``, ``dequantize``, ``gemv_reference``

The streaming quantizer of whole checkpoints is in ``quantize.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import zlib
from pathlib import Path

import ml_dtypes
import numpy as np
import safetensors.numpy as st_numpy
from safetensors import safe_open

from .config import EMBED, LM_HEAD, ModelConfig, canonical_name
from .errors import UserError
from .interrupt import critical
from .outputs import note_written

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


# ====================================================================== safetensors files
# HF layout: model-0000i-of-0000N.safetensors shards plus model.safetensors.index.json
# ({"metadata": {"total_size"}, "weight_map": {name: shard}}), or one model.safetensors.

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
DEFAULT_SHARD_BYTES = 2 * 1024**3  # 2 GiB; RAM use of the writers is bounded by about one shard

# safetensors dtype strings -> numpy dtypes we accept as weights.
_FLOAT_DTYPES = {"BF16": BF16, "F16": np.dtype(np.float16), "F32": np.dtype(np.float32),
                 "F64": np.dtype(np.float64)}


def _shard_name(i: int, n: int) -> str:
    return f"model-{i:05d}-of-{n:05d}.safetensors"


@contextlib.contextmanager
def atomic_dir(out_dir: str | Path, overwrite: bool = False):
    """Yield a temp folder next to ``out_dir``; on success it replaces ``out_dir``.

    On any exception the temp folder is removed and ``out_dir`` is left as it was, so nothing
    is ever half-written. An existing non-empty ``out_dir`` is refused unless ``overwrite``.
    """
    out = Path(out_dir).absolute()
    if out.exists() and not out.is_dir():
        raise UserError(f"output path {str(out)!r} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise UserError(f"output folder {str(out)!r} exists and is not empty; "
                        "choose another folder or pass overwrite=True (--overwrite)")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    except OSError as e:
        raise UserError(f"cannot create a folder next to {str(out)!r}: {e}") from None
    trash = None
    try:
        yield tmp
        with critical():   # a signal waits until the swap is done (or undone)
            try:
                if out.exists():  # swap: old -> trash, tmp -> out, then drop the trash
                    trash = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
                    os.rename(out, trash / "old")
                    try:
                        os.rename(tmp, out)
                    except OSError:
                        os.rename(trash / "old", out)
                        raise
                else:
                    os.rename(tmp, out)
            except OSError as e:
                raise UserError(f"cannot replace {str(out)!r}: {e.strerror or e}") from None
            note_written(out)
    finally:
        for d in (tmp, trash):
            if d is not None and d.exists():
                shutil.rmtree(d, ignore_errors=True)


class ShardWriter:
    """Writes tensors into HF-style shards inside ``folder``, flushing at ``max_shard_bytes``.

    ``add(group)`` takes a dict of tensors that stay in one shard (e.g. a qweight with its
    scales and shape). A group is buffered; the buffer is written as a shard before it would grow
    past ``max_shard_bytes`` (a group larger than that gets a shard of its own). ``close()``
    renames the shards to ``model-0000i-of-0000N.safetensors`` and writes the index.
    """

    def __init__(self, folder: Path, max_shard_bytes: int = DEFAULT_SHARD_BYTES):
        if max_shard_bytes <= 0:
            raise UserError(f"max_shard_bytes must be positive, got {max_shard_bytes}")
        self.folder = Path(folder)
        self.max = int(max_shard_bytes)
        self.buf: dict[str, np.ndarray] = {}
        self.buf_bytes = 0
        self.shards: list[tuple[Path, list[str]]] = []  # (temp file, names)
        self.total = 0

    def add(self, group: dict[str, np.ndarray]) -> None:
        nbytes = sum(a.nbytes for a in group.values())
        if self.buf and self.buf_bytes + nbytes > self.max:
            self.flush()
        for k, a in group.items():
            if k in self.buf or any(k in names for _, names in self.shards):
                raise ValueError(f"tensor {k!r} written twice")
            self.buf[k] = np.ascontiguousarray(a)
        self.buf_bytes += nbytes
        self.total += nbytes

    def flush(self) -> None:
        if not self.buf:
            return
        path = self.folder / f"shard-{len(self.shards) + 1:05d}.tmp"
        # "format": "pt" is what HF writes; transformers checks it when loading.
        st_numpy.save_file(self.buf, str(path), metadata={"format": "pt"})
        self.shards.append((path, list(self.buf)))
        self.buf, self.buf_bytes = {}, 0

    def close(self) -> None:
        self.flush()
        n = len(self.shards)
        weight_map = {}
        for i, (path, names) in enumerate(self.shards, 1):
            final = _shard_name(i, n)
            os.rename(path, self.folder / final)
            weight_map.update({k: final for k in names})
        index = {"metadata": {"total_size": self.total},
                 "weight_map": dict(sorted(weight_map.items()))}
        (self.folder / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")


def _write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def save_checkpoint(cfg: ModelConfig, tensors: dict[str, np.ndarray], out_dir: str | Path,
                    max_shard_bytes: int = DEFAULT_SHARD_BYTES, overwrite: bool = False) -> Path:
    """Write an HF-layout checkpoint: sharded safetensors + index + ``config.json``.

    ``tensors``: name -> array (bf16/fp32, checkpoint names), written in dict order.
    ``config.json`` is ``cfg.to_hf_dict()``, so ``Qwen3_5ForCausalLM.from_pretrained(out_dir)``
    loads it. Atomic: written in a temp folder, renamed into place. Returns ``out_dir``.
    """
    out = Path(out_dir)
    with atomic_dir(out, overwrite=overwrite) as tmp:
        w = ShardWriter(tmp, max_shard_bytes)
        for k, a in tensors.items():
            if cfg.tie_word_embeddings and k == LM_HEAD:
                continue  # tied: HF writes only embed_tokens, and so do we
            w.add({k: np.asarray(a)})
        w.close()
        _write_json(tmp / "config.json", cfg.to_hf_dict())
    return out


class CheckpointReader:
    """Lazy per-tensor reader of an HF safetensors checkpoint folder.

    Reads the index (or the single ``model.safetensors``) and every shard header at construction;
    ``get(name)`` reads one tensor from its shard, so a model is never held in RAM whole.
    """

    def __init__(self, model_dir: str | Path):
        self.path = Path(model_dir)
        p = self.path
        if not p.exists():
            raise UserError(f"checkpoint folder {str(p)!r} does not exist")
        if not p.is_dir():
            raise UserError(f"checkpoint path {str(p)!r} is not a folder")
        index = p / INDEX_NAME
        if index.is_file():
            try:
                raw = json.loads(index.read_text())
                wmap = raw["weight_map"]
                if not isinstance(wmap, dict):
                    raise TypeError("weight_map is not an object")
                bad = [(k, v) for k, v in wmap.items() if not isinstance(v, str) or not v]
                if bad:
                    raise TypeError(f"weight_map[{bad[0][0]!r}] is {bad[0][1]!r}, not a shard "
                                    "file name")
            except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
                raise UserError(f"index file {str(index)!r} is not a valid safetensors index: "
                                f"{type(e).__name__}: {e}") from None
            files = sorted(set(wmap.values()))
        elif (p / SINGLE_NAME).is_file():
            wmap, files = None, [SINGLE_NAME]
        else:
            raise UserError(f"checkpoint folder {str(p)!r} has neither {INDEX_NAME} nor "
                            f"{SINGLE_NAME}")
        # name -> (shard file, shape, safetensors dtype string, name in the file), from the shard
        # headers, keyed by the canonical name (``config.canonical_name``): a checkpoint saved by
        # Qwen3_5ForCausalLM (``model.layers.*``) reads like a released one
        # (``model.language_model.layers.*``).
        self._info: dict[str, tuple[Path, tuple[int, ...], str, str]] = {}
        stored = {}
        for f in files:
            fp = p / f
            if not fp.is_file():
                raise UserError(f"shard {str(fp)!r} listed in {str(index)!r} does not exist")
            try:
                with safe_open(str(fp), framework="numpy") as h:
                    for k in h.keys():
                        sl = h.get_slice(k)
                        c = canonical_name(k)
                        if c in self._info:
                            raise UserError(f"checkpoint {str(p)!r} holds tensor {c!r} twice, as "
                                            f"{self._info[c][3]!r} and {k!r}; keep one spelling")
                        self._info[c] = (fp, tuple(sl.get_shape()), sl.get_dtype(), k)
                        stored[k] = fp
            except UserError:
                raise
            except Exception as e:  # SafetensorError, OSError: truncated or not safetensors
                raise UserError(f"cannot read safetensors file {str(fp)!r}: {e}") from None
        if wmap is not None:
            for k, f in wmap.items():
                if k not in stored or stored[k].name != f:
                    raise UserError(f"index {str(index)!r} says tensor {k!r} is in {f!r}, "
                                    "but that shard does not hold it")

    def names(self) -> list[str]:
        return list(self._info)

    def __contains__(self, name: str) -> bool:
        return name in self._info

    def _entry(self, name: str):
        if name not in self._info:
            raise UserError(f"checkpoint {str(self.path)!r} has no tensor {name!r}")
        return self._info[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entry(name)[1]

    def dtype(self, name: str) -> str:
        """The safetensors dtype string ("BF16", "F32", "U32", "I64", …)."""
        return self._entry(name)[2]

    def stored_name(self, name: str) -> str:
        """The name ``name`` has inside the checkpoint's files."""
        return self._entry(name)[3]

    def mapped(self, name: str) -> np.ndarray:
        """A read-only view of the tensor's bytes in its shard, mapped, not read (mapped.py)."""
        from .mapped import map_tensor
        return map_tensor(self, name)

    def get(self, name: str) -> np.ndarray:
        fp, _, _, key = self._entry(name)
        try:
            with safe_open(str(fp), framework="numpy") as h:
                return h.get_tensor(key)
        except Exception as e:
            raise UserError(f"cannot read tensor {name!r} from {str(fp)!r}: {e}") from None


def _shape_and_dtype(src, name):
    if isinstance(src, CheckpointReader):
        return src.shape(name), _FLOAT_DTYPES.get(src.dtype(name), src.dtype(name))
    a = src[name]
    return tuple(a.shape), a.dtype


def check_tensors(cfg: ModelConfig, src: "CheckpointReader | dict[str, np.ndarray]",
                  mtp: bool = True, where: str | None = None) -> None:
    """Check that ``src`` holds every tensor of ``cfg.tensor_shapes()`` with the right shape.

    ``mtp=False`` makes the MTP tensors optional (those present are still shape-checked).
    Extra tensors (e.g. ``model.visual.*``) are ignored. Raises UserError naming the first
    missing tensor, wrong shape or non-float dtype.
    """
    if where is None:
        where = str(src.path) if isinstance(src, CheckpointReader) else "<in memory>"
    shapes = cfg.tensor_shapes(mtp=True)
    mtp_names = set(cfg.mtp_shapes())
    optional = cfg.checkpoint_optional(mtp)
    missing = [n for n in shapes if n not in src and n not in optional]
    if missing:
        more = f" (and {len(missing) - 1} more missing)" if len(missing) > 1 else ""
        hint = ""
        if missing[0] in mtp_names:
            hint = ("; this checkpoint has no MTP layer: quantize it with MTP off "
                    "(`qwen38gen quantize --no-mtp`, mtp=False in Python)")
        raise UserError(f"checkpoint {where} is missing tensor {missing[0]!r}{more}{hint}")
    for n, want in shapes.items():
        if n not in src:
            continue
        got, dt = _shape_and_dtype(src, n)
        if tuple(got) != tuple(want):
            raise UserError(f"checkpoint {where}: tensor {n!r} has shape {list(got)}, "
                            f"expected {list(want)}")
        if dt not in _FLOAT_DTYPES.values():
            raise UserError(f"checkpoint {where}: tensor {n!r} has dtype {dt}, expected a float "
                            "type (bf16, f16 or f32)")


def load_checkpoint(model_dir: str | Path, cfg: ModelConfig | None = None,
                    mtp: bool = True) -> dict[str, np.ndarray]:
    """Read a checkpoint folder into name -> array.

    With ``cfg``, the tensors are checked first (``check_tensors``) and only ``cfg``'s tensors
    are read (vision tensors and other extras are skipped); without it, every tensor is read.
    """
    r = CheckpointReader(model_dir)
    if cfg is None:
        return {n: r.get(n) for n in r.names()}
    check_tensors(cfg, r, mtp=mtp)
    return tie_lm_head(cfg, {n: r.get(n) for n in cfg.tensor_shapes(mtp=True) if n in r})


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


def gemv_reference(qweight: np.ndarray, scales_tiled: np.ndarray, shape: tuple[int, int],
                   x: np.ndarray) -> np.ndarray:
    """``x @ W~.T`` in float64: ``x [..., K]`` -> ``[..., N]`` (the kernel's target)."""
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
        out[..., r0:r0 + len(d)] = x @ d.T
    return out
