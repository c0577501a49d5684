"""Streaming int4 g128 quantizer and the reader of its output (docs/FORMAT.md "Files").

``quantize_checkpoint`` reads an HF checkpoint one tensor at a time, packs every linear weight
(``ModelConfig.is_int4``) into ``NAME.qweight`` / ``NAME.scales`` / ``NAME.shape`` and copies the
rest, writing shards as they fill so RAM stays at about one shard. ``load_quantized`` reads the
result back; ``dequantized_weights`` turns it into HF-named float32 tensors for the numpy
reference.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .config import EMBED, LM_HEAD, ModelConfig, load_config
from .errors import UserError
from .importer import (
    check_quant_config, check_sources, has_source, import_tensors, read_quant_config,
)
from .interrupt import handling
from .outputs import check_folder_pair, umask
from .checkpoint import DEFAULT_SHARD_BYTES, CheckpointReader, ShardWriter, atomic_dir, check_tensors
from .weights import check_packed, dequantize, quantize_pack

FORMAT_NAME = "qwen38gen-int4-g128-tile16x64"
FORMAT_VERSION = 1
QUANT_JSON = "quantization.json"
QUANT_META = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "group_size": 128}

# The tokenizer's and generation's files, copied from the source folder as they are.
TEXT_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
              "generation_config.json", "special_tokens_map.json", "vocab.json", "merges.txt")

# NAME.weight -> NAME.qweight / NAME.scales / NAME.shape
_SUFFIXES = ("qweight", "scales", "shape")


def _base(name: str) -> str:
    """``…q_proj.weight`` -> ``…q_proj`` (FORMAT.md calls it NAME)."""
    assert name.endswith(".weight"), name
    return name[: -len(".weight")]


@dataclass
class QuantizedTensor:
    """One packed linear weight: ``qweight uint32 [Np/16, K/64, 32, 4]``,
    ``scales bf16 [Np/16, K/128, 16]``, ``shape = (N, K)`` (unpadded)."""

    qweight: np.ndarray
    scales: np.ndarray
    shape: tuple[int, int]

    def dequantize(self) -> np.ndarray:
        """float32 [N, K]."""
        return dequantize(self.qweight, self.scales, self.shape)


def written_config(src: Path, mtp: bool) -> str:
    """The source's config.json text, with ``mtp_num_hidden_layers`` 0 when MTP is left out
    (in ``text_config`` where the file has one), so the folder says what it holds, and without
    a source ``quantization_config`` (the folder's format is in quantization.json)."""
    text = (src / "config.json").read_text()
    raw = json.loads(text)
    cfg = raw["text_config"] if isinstance(raw.get("text_config"), dict) else raw
    if mtp and "quantization_config" not in raw and "quantization_config" not in cfg:
        return text
    if not mtp:
        cfg["mtp_num_hidden_layers"] = 0
    raw.pop("quantization_config", None)
    cfg.pop("quantization_config", None)
    return json.dumps(raw, indent=2) + "\n"


def quantize_checkpoint(src_dir: str | Path, out_dir: str | Path,
                        progress: Callable[[int, int, str], None] | None = None,
                        max_shard_bytes: int = DEFAULT_SHARD_BYTES, overwrite: bool = False,
                        mtp: bool = True, report_to: dict | None = None) -> Path:
    """Quantize the HF checkpoint in ``src_dir`` into ``out_dir`` (FORMAT.md "Files").

    A checkpoint already in int4 (``quantization_config`` in its config.json: GPTQ or
    compressed-tensors pack-quantized) is imported instead (``importer.import_tensors``): its
    codes carry over, its linear weights kept in bf16 are quantized here, and
    ``quantization.json`` lists which is which (also copied into ``report_to`` when given).

    The config comes from ``src_dir/config.json``; the checkpoint is validated against it first
    (``check_tensors``; with ``mtp=False`` MTP tensors may be absent and are not written, and the
    written config says ``mtp_num_hidden_layers: 0``). Both tensor spellings are read
    (``model.layers.*`` of Qwen3_5ForCausalLM, ``model.language_model.*`` of the released
    checkpoints); the output uses the released one. Only the text tensors of the config are
    written (vision tensors are skipped). A tied config (``tie_word_embeddings``) gets its int4
    ``lm_head`` from ``embed_tokens``. ``progress(done, total, name)`` is called after each
    tensor. Atomic: written into a temp folder next to ``out_dir`` and renamed (also on SIGTERM
    and Ctrl-C the temp folder is removed); an existing non-empty ``out_dir`` is refused unless
    ``overwrite``. Returns ``out_dir``.
    """
    src = Path(src_dir)
    if not src.is_dir():
        raise UserError(f"checkpoint folder {str(src)!r} does not exist or is not a folder")
    if not (src / "config.json").is_file():
        raise UserError(f"checkpoint folder {str(src)!r} has no config.json")
    out = Path(out_dir)
    check_folder_pair(src, out)
    cfg = load_config(src)
    qconf = read_quant_config(json.loads((src / "config.json").read_text()))
    if qconf is not None:
        check_quant_config(qconf)
    reader = CheckpointReader(src)
    if qconf is None:
        check_tensors(cfg, reader, mtp=mtp)
    else:
        check_sources(cfg, reader, mtp=mtp)
    shapes = cfg.tensor_shapes(mtp=mtp and bool(cfg.mtp_num_hidden_layers))
    # name to write -> name to read (a tied lm_head reads the embedding)
    plan = {n: (EMBED if cfg.tie_word_embeddings and n == LM_HEAD else n) for n in shapes}
    plan = {n: r for n, r in plan.items() if has_source(cfg, reader, r, shapes[n])}
    # Fail on K % 128 before any work is done.
    for n in plan:
        if cfg.is_int4(n, shapes[n]) and shapes[n][1] % 128:
            raise UserError(f"tensor {n!r} has shape {list(shapes[n])}: int4 g128 needs K (the "
                            f"input dimension, {shapes[n][1]}) to be a multiple of 128; "
                            f"config {cfg.name!r} cannot be quantized")
    meta = dict(QUANT_META)
    if cfg.tie_word_embeddings:
        meta["lm_head"] = f"tied: int4 of {EMBED}"
    with handling(), atomic_dir(out, overwrite=overwrite) as tmp:
        tmp.chmod(0o777 & ~umask())   # mkdtemp's 0700: the folder gets what mkdir would give it
        w = ShardWriter(tmp, max_shard_bytes)
        if qconf is not None:
            report = import_tensors(cfg, reader, qconf, plan, shapes, w.add, progress)
            meta.update(report.to_dict())
            plan = {}
        for i, (n, rn) in enumerate(plan.items(), 1):
            a = reader.get(rn)
            if cfg.is_int4(n, a.shape):
                qw, st = quantize_pack(a, n)
                b = _base(n)
                w.add({b + ".qweight": qw, b + ".scales": st,
                       b + ".shape": np.array(a.shape, dtype=np.int64)})
            else:
                w.add({n: a})
            del a
            if progress is not None:
                progress(i, len(plan), n)
        w.close()
        (tmp / "config.json").write_text(written_config(src, mtp))
        for f in TEXT_FILES:  # the tokenizer travels with the weights (`generate --prompt TEXT`)
            if (src / f).is_file():
                shutil.copyfile(src / f, tmp / f)
        (tmp / QUANT_JSON).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        for f in tmp.iterdir():   # safetensors writes its shards 0600, whatever the umask
            f.chmod(0o666 & ~umask())
    if report_to is not None and qconf is not None:
        report_to.update(meta)
    return out


def _read_quant_meta(d: Path) -> dict:
    p = d / QUANT_JSON
    if not p.is_file():
        raise UserError(f"{str(d)!r} is not a quantized checkpoint: {QUANT_JSON} is missing "
                        "(make one with `qwen38gen quantize`)")
    try:
        meta = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{str(p)!r} is not valid JSON: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        got = meta.get("format") if isinstance(meta, dict) else meta
        raise UserError(f"{str(p)!r}: format {got!r} is not supported; expected {FORMAT_NAME!r}")
    if meta.get("version") != FORMAT_VERSION or meta.get("group_size") != 128:
        raise UserError(f"{str(p)!r}: version {meta.get('version')!r}, group_size "
                        f"{meta.get('group_size')!r} are not supported; expected version "
                        f"{FORMAT_VERSION}, group_size 128 (re-run `qwen38gen quantize`)")
    return meta


def load_quantized(out_dir: str | Path, cfg: ModelConfig | None = None,
                   mapped: bool = False) -> dict[str, "QuantizedTensor | np.ndarray"]:
    """Read a quantized checkpoint: HF name -> ``QuantizedTensor`` (linear weights) or array.
    ``mapped``: the arrays are read-only views of the files (``CheckpointReader.mapped``), read
    when touched (run's GPU backend uploads them straight from the pages).

    Checks ``quantization.json`` and that every tensor of the config (``out_dir/config.json``
    unless ``cfg`` is given) is present with the right shape; MTP tensors are required when any
    is present. Raises UserError naming what is wrong.
    """
    d = Path(out_dir)
    if not d.is_dir():
        raise UserError(f"quantized checkpoint folder {str(d)!r} does not exist")
    _read_quant_meta(d)
    if cfg is None:
        cfg = load_config(d)
    r = CheckpointReader(d)
    get = r.mapped if mapped else r.get
    have = set(r.names())
    shapes = cfg.tensor_shapes(mtp=True)
    has_mtp = any(n.startswith("mtp.") for n in have)
    out: dict[str, QuantizedTensor | np.ndarray] = {}
    for n, want in shapes.items():
        if n.startswith("mtp.") and not has_mtp:
            continue
        if cfg.is_int4(n, want):
            keys = [f"{_base(n)}.{s}" for s in _SUFFIXES]
            for k in keys:
                if k not in have:
                    raise UserError(f"quantized checkpoint {str(d)!r} is missing tensor {k!r}")
            shape = tuple(int(v) for v in r.get(keys[2]))
            if shape != tuple(want):
                raise UserError(f"quantized checkpoint {str(d)!r}: tensor {n!r} has shape "
                                f"{list(shape)}, expected {list(want)}")
            qt = QuantizedTensor(get(keys[0]), get(keys[1]), shape)
            try:  # the packed arrays must fit the shape
                check_packed(qt.qweight, qt.scales, shape)
            except UserError as e:
                raise UserError(f"quantized checkpoint {str(d)!r}: tensor {n!r}: {e}") from None
            out[n] = qt
        else:
            if n not in have:
                raise UserError(f"quantized checkpoint {str(d)!r} is missing tensor {n!r}")
            if r.shape(n) != tuple(want):
                raise UserError(f"quantized checkpoint {str(d)!r}: tensor {n!r} has shape "
                                f"{list(r.shape(n))}, expected {list(want)}")
            out[n] = get(n)
    return out


def dequantized_weights(src: "str | Path | dict") -> dict[str, np.ndarray]:
    """HF-named float32 tensors from a quantized folder or ``load_quantized``'s dict.

    Linear weights are ``q * s`` (exact in fp32); the other tensors are cast to float32.
    """
    loaded = load_quantized(src) if isinstance(src, (str, Path)) else src
    return {n: (v.dequantize() if isinstance(v, QuantizedTensor)
                else np.asarray(v).astype(np.float32))
            for n, v in loaded.items()}


def int4_weights(cfg: ModelConfig, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """In memory: every linear weight replaced by its int4 g128 dequantization (float32), the rest
    cast to float32. This is what the q4 program computes with, so it is the q4 oracle's input."""
    shapes = cfg.tensor_shapes()
    out = {}
    for n, v in tensors.items():
        if n in shapes and cfg.is_int4(n, shapes[n]):
            q, s = quantize_pack(np.asarray(v, dtype=np.float32), n)
            out[n] = dequantize(q, s, v.shape)
        else:
            out[n] = np.asarray(v).astype(np.float32)
    return out


def load_any(model_dir: str | Path, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """Float32 tensors from an HF checkpoint or a `quantize` output folder (dequantized)."""
    from .checkpoint import load_checkpoint

    d = Path(model_dir)
    if (d / QUANT_JSON).exists():
        return dequantized_weights(load_quantized(d, cfg))
    try:
        qconf = read_quant_config(json.loads((d / "config.json").read_text()))
    except (OSError, ValueError, RecursionError, AttributeError):
        qconf = None   # load_checkpoint names what is wrong with the folder
    if qconf is not None:
        method = qconf.get("quant_method", "quantized")
        raise UserError(f"{str(d)!r} is a {method} int4 checkpoint, which the reference reads "
                        f"once imported: qwen38gen quantize {d} -o {d.name}-q4, then give "
                        f"{d.name}-q4")
    return {n: np.asarray(v).astype(np.float32) for n, v in load_checkpoint(d, cfg).items()}
