"""Checkpoint folders: HF-layout safetensors in and out.

- writing: ``atomic_dir`` (a folder replaced whole or not at all), ``ShardWriter`` (size-bounded
  shards and their index), ``save_checkpoint``
- reading: ``CheckpointReader`` (lazy: ``get`` reads one tensor, ``mapped`` maps one without
  reading it), ``load_checkpoint``, ``check_tensors``

Tensors are the numpy arrays of weights.py, keyed by their canonical checkpoint names
(``config.canonical_name``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import safetensors.numpy as st_numpy
from safetensors import safe_open

from .config import LM_HEAD, ModelConfig, canonical_name
from .errors import UserError
from .interrupt import critical
from .outputs import note_written
from .weights import BF16, tie_lm_head

# HF layout: model-0000i-of-0000N.safetensors shards plus model.safetensors.index.json
# ({"metadata": {"total_size"}, "weight_map": {name: shard}}), or one model.safetensors.

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
DEFAULT_SHARD_BYTES = 2 * 1024**3  # 2 GiB; RAM use of the writers is bounded by about one shard

# safetensors dtype strings -> numpy dtypes we accept as weights.
_FLOAT_DTYPES = {"BF16": BF16, "F16": np.dtype(np.float16), "F32": np.dtype(np.float32),
                 "F64": np.dtype(np.float64)}
# every safetensors dtype string -> the numpy dtype of a mapped view (CheckpointReader.mapped)
_VIEW_DTYPES = {**_FLOAT_DTYPES, "U8": np.dtype(np.uint8), "I8": np.dtype(np.int8),
                "U16": np.dtype(np.uint16), "I16": np.dtype(np.int16), "U32": np.dtype(np.uint32),
                "I32": np.dtype(np.int32), "U64": np.dtype(np.uint64), "I64": np.dtype(np.int64)}


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


def safetensors_offsets(path: Path) -> tuple[int, dict[str, tuple[str, tuple[int, ...], int, int]]]:
    """The data section's start in a safetensors file and, per stored name, (dtype string,
    shape, first byte, end byte) relative to it (the format: an 8-byte little-endian header
    length, the JSON header, then the data)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        head = json.loads(f.read(n))
    out = {k: (v["dtype"], tuple(v["shape"]), *v["data_offsets"])
           for k, v in head.items() if k != "__metadata__"}
    return 8 + n, out


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
        self._maps: dict[Path, tuple[np.ndarray, int, dict]] = {}  # shard -> (map, data start, entries)
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
        """The tensor as a read-only view of its shard: mapped, not read. Its pages come from the
        file, or the page cache, when something touches them; run's GPU backend uploads a
        quantized folder this way (upload.py), each weight read once at disk speed with no
        Python copy of the model in between. Each shard is mapped, and its header parsed, once."""
        fp, shape, _, key = self._entry(name)
        try:
            if fp not in self._maps:
                base, offs = safetensors_offsets(fp)
                mm = np.memmap(fp, np.uint8, "r") if fp.stat().st_size else np.zeros(0, np.uint8)
                self._maps[fp] = (mm, base, offs)
            mm, base, offs = self._maps[fp]
            dt, shp, b, e = offs[key]
            if dt not in _VIEW_DTYPES or tuple(shp) != tuple(shape) or base + e > mm.size:
                raise ValueError(f"header entry {dt} {list(shp)} [{b}, {e}) does not fit")
            return mm[base + b:base + e].view(_VIEW_DTYPES[dt]).reshape(shape)
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UserError(f"cannot map tensor {name!r} from {str(fp)!r}: {e}") from None

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
