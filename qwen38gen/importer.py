"""Import a pre-quantized int4 checkpoint into the program's format (docs/FORMAT.md), streaming.

``quantize_checkpoint`` hands a checkpoint whose config.json carries a ``quantization_config``
here. Two int4 formats are read; everything else is refused naming the field, with the advice to
quantize from the bf16 checkpoint:

* **compressed-tensors ``pack-quantized``** (llm-compressor's W4A16: int, 4 bits, symmetric,
  strategy group, group 128, no activation order). ``NAME.weight_packed`` int32 ``[N, K/8]`` holds
  element k of row n in bits 4·(k mod 8) of word k / 8 as ``q + 8``; ``NAME.weight_scale``
  ``[N, K/128]``; ``W = q · s``. The codes carry over as they are and a bf16 scale is kept as it
  is, so the import is lossless: our ``q · s`` is the library's dequantization, bit for bit.
* **GPTQ** (``quant_method: gptq``, bits 4, group 128, ``sym: true``, ``desc_act: false``,
  ``checkpoint_format`` gptq or gptq_v2). ``NAME.qweight`` int32 ``[K/8, N]`` holds row k of
  column n in bits 4·(k mod 8) of word (k / 8, n) as an unsigned nibble u; ``NAME.qzeros`` int32
  ``[K/128, N/8]`` holds the zero point z of column n in bits 4·(n mod 8) (gptq, "v1", stores
  z − 1; gptq_v2 stores z); ``NAME.scales`` fp16 ``[K/128, N]``; ``W = (u − z) · s``. Symmetric
  means z = 8 everywhere, so the code is ``u − 8`` in −8..7: the codes repack exactly.

  The scales are fp16 and the format's are bf16. We convert them (round to nearest even) rather
  than carry fp16 scales through the format and the kernels: the kernels turn a code and a bf16
  scale into a product with one ``lop3`` and a bf16 multiply (FORMAT.md "Tiles"), another scale
  type is a new kernel variant in every GEMV family, which this change does not own and could
  not verify on a GPU. bf16 keeps fp16's whole range (no overflow or underflow) with 8 bits of
  precision instead of 11, so a weight moves by at most 2⁻⁸ of itself (half a bf16 ulp); the
  import measures and reports the largest relative change of any weight
  (``ImportReport.max_rel_change``).

A linear weight the checkpoint keeps in bf16 (Qwen's ``Qwen3.5-27B-GPTQ-Int4`` keeps the
attention and Gated DeltaNet projections so, through its ``dynamic`` map; a tied or unquantized
``lm_head``) is quantized here with the project's own int4 (``weights.quantize_pack``).
``ImportReport`` lists which tensors came from the checkpoint and which were quantized here; the
same lists are written to the output's ``quantization.json``. Tensors that are not linear
weights keep their dtype.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .config import ModelConfig
from .errors import UserError
from .checkpoint import CheckpointReader
from .weights import BF16, GROUP, pack_int4, quantize_pack

ADVICE = "quantize from the bf16 checkpoint instead (`qwen38gen quantize BF16_DIR -o OUT`)"
_FLOATS = ("BF16", "F16", "F32")


@dataclass
class ImportReport:
    method: str                                     # "compressed-tensors" or "gptq"
    from_checkpoint: list[str] = field(default_factory=list)
    quantized_here: list[str] = field(default_factory=list)
    max_rel_change: float = 0.0                     # of any weight, by the scale conversion
    scale_dtype: str = ""

    def to_dict(self) -> dict:
        return {"source_method": self.method, "source_scale_dtype": self.scale_dtype,
                "max_rel_weight_change": self.max_rel_change,
                "from_checkpoint": self.from_checkpoint, "quantized_here": self.quantized_here}


def _refuse(field_: str, value, want: str):
    raise UserError(f"quantization_config.{field_} is {value!r}; only {want} is supported: "
                    f"{ADVICE}")


# ------------------------------------------------------------------------------ the configs
def read_quant_config(raw: dict) -> dict | None:
    """The checkpoint's quantization_config (top level or inside text_config), or None."""
    q = raw.get("quantization_config")
    if q is None and isinstance(raw.get("text_config"), dict):
        q = raw["text_config"].get("quantization_config")
    if q is None:
        return None
    if not isinstance(q, dict):
        raise UserError("quantization_config in config.json must be a JSON object")
    return q


def check_quant_config(q: dict) -> str:
    """The method of a supported config ("gptq" or "compressed-tensors"); else UserError naming
    the field."""
    method = q.get("quant_method")
    if method == "gptq":
        for k, want in (("bits", 4), ("group_size", GROUP), ("sym", True), ("desc_act", False)):
            if q.get(k, want if k == "desc_act" else None) != want:
                _refuse(k, q.get(k), json.dumps(want))
        fmt = q.get("checkpoint_format", "gptq")
        if fmt not in ("gptq", "gptq_v2"):
            _refuse("checkpoint_format", fmt, "gptq or gptq_v2")
        return method
    if method == "compressed-tensors":
        groups = q.get("config_groups")
        if not isinstance(groups, dict) or not groups:
            _refuse("config_groups", groups, "one or more config groups")
        for gname, g in groups.items():
            where = f"config_groups.{gname}"
            if not isinstance(g, dict):
                _refuse(where, g, "a JSON object (format, weights, targets)")
            fmt = g.get("format", q.get("format"))
            if fmt != "pack-quantized":
                _refuse(f"{where}.format", fmt, "pack-quantized")
            w = g.get("weights") or {}
            if not isinstance(w, dict):
                _refuse(f"{where}.weights", w, "a JSON object (num_bits, type, group_size, …)")
            for k, want in (("num_bits", 4), ("type", "int"), ("symmetric", True),
                            ("strategy", "group"), ("group_size", GROUP)):
                if w.get(k) != want:
                    _refuse(f"{where}.weights.{k}", w.get(k), json.dumps(want))
            if w.get("actorder") not in (None, False, "none"):
                _refuse(f"{where}.weights.actorder", w.get("actorder"), "null")
            if g.get("input_activations") is not None:
                _refuse(f"{where}.input_activations", g.get("input_activations"),
                        "null (weight-only W4A16)")
        return method
    if method == "awq":
        _refuse("quant_method", method, "gptq or compressed-tensors (AWQ stores zero points)")
    _refuse("quant_method", method, "gptq or compressed-tensors")


# ------------------------------------------------------------------------------ unpacking
def _nibbles(words: np.ndarray, axis: int) -> np.ndarray:
    """int32 words -> their 8 nibbles (uint8 0..15, nibble j = bits 4j..4j+3), the 8 laid out
    along ``axis`` (word w, nibble j -> index 8w + j)."""
    u = words.astype("<i4").view("<u4")
    nib = ((u[..., None] >> (4 * np.arange(8, dtype=np.uint32))) & 15).astype(np.uint8)
    if axis == -1 or axis == words.ndim - 1:
        return nib.reshape(*words.shape[:-1], words.shape[-1] * 8)
    # axis 0 of a 2-D [R, C] array: [R, C, 8] -> [R, 8, C] -> [8R, C]
    return nib.transpose(0, 2, 1).reshape(words.shape[0] * 8, words.shape[1])


def _scales_bf16(s: np.ndarray, codes: np.ndarray, name: str, rep: ImportReport) -> np.ndarray:
    """Scales [N, K/128] (bf16, fp16 or fp32) as bf16; the largest relative change of any weight
    with a nonzero code goes to the report (0 for bf16 scales)."""
    if s.dtype == BF16:
        return s
    if not np.isfinite(s.astype(np.float32)).all():
        raise UserError(f"tensor {name!r} has inf or NaN scales")
    sb = s.astype(np.float32).astype(BF16)
    s32 = s.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(s32 != 0, np.abs(sb.astype(np.float64) - s32) / np.abs(s32), 0.0)
    used = (codes.reshape(codes.shape[0], -1, GROUP) != 0).any(axis=2)
    if used.any():
        rep.max_rel_change = max(rep.max_rel_change, float(rel[used].max()))
    return sb


def _want(name: str, arr: np.ndarray | None, dtype: str, shape: tuple, r: CheckpointReader):
    if arr is None:
        raise UserError(f"checkpoint {str(r.path)!r} is missing tensor {name!r}")
    if r.dtype(name) != dtype or tuple(arr.shape) != tuple(shape):
        raise UserError(f"checkpoint {str(r.path)!r}: tensor {name!r} is {r.dtype(name)} "
                        f"{list(arr.shape)}, expected {dtype} {list(shape)}")


def _get(r: CheckpointReader, name: str):
    return r.get(name) if name in r else None


def codes_compressed_tensors(r: CheckpointReader, base: str, n: int, k: int):
    """(codes int8 [N, K], scales [N, K/128] as stored) of a pack-quantized weight."""
    for extra in ("weight_zero_point", "weight_g_idx"):
        if base + "." + extra in r:
            raise UserError(f"tensor {base + '.' + extra!r}: zero points and activation order "
                            f"are not supported; {ADVICE}")
    packed, scale = _get(r, base + ".weight_packed"), _get(r, base + ".weight_scale")
    _want(base + ".weight_packed", packed, "I32", (n, k // 8), r)
    sdt = r.dtype(base + ".weight_scale") if scale is not None else "BF16"
    _want(base + ".weight_scale", scale, sdt if sdt in _FLOATS else "BF16", (n, k // GROUP), r)
    shp = _get(r, base + ".weight_shape")
    if shp is not None and [int(v) for v in shp] != [n, k]:
        raise UserError(f"tensor {base + '.weight_shape'!r} is {[int(v) for v in shp]}, "
                        f"expected {[n, k]}")
    codes = _nibbles(packed, axis=-1).astype(np.int8) - 8
    return codes, scale


def codes_gptq(r: CheckpointReader, base: str, n: int, k: int, v1: bool):
    """(codes int8 [N, K], scales fp16 [N, K/128]) of a GPTQ weight; refuses zero points other
    than 8 (asymmetric) and a g_idx other than k / 128 (activation order)."""
    qw, qz, sc = (_get(r, base + s) for s in (".qweight", ".qzeros", ".scales"))
    _want(base + ".qweight", qw, "I32", (k // 8, n), r)
    _want(base + ".qzeros", qz, "I32", (k // GROUP, n // 8), r)
    _want(base + ".scales", sc, "F16", (k // GROUP, n), r)
    gi = _get(r, base + ".g_idx")
    if gi is not None and not np.array_equal(np.asarray(gi).reshape(-1),
                                             np.arange(k) // GROUP):
        raise UserError(f"tensor {base + '.g_idx'!r} reorders the input columns (activation "
                        f"order, desc_act); that is not supported: {ADVICE}")
    z = _nibbles(qz, axis=-1).astype(np.int16) + (1 if v1 else 0)        # [K/128, N]
    if not (z == 8).all():
        raise UserError(f"tensor {base + '.qzeros'!r} holds zero points other than 8 "
                        f"(asymmetric quantization); only sym: true is supported: {ADVICE}")
    u = _nibbles(qw, axis=0)                                              # [K, N]
    codes = np.ascontiguousarray((u.astype(np.int8) - 8).T)
    return codes, np.ascontiguousarray(sc.T)


# ------------------------------------------------------------------------------ the import
def import_tensors(cfg: ModelConfig, r: CheckpointReader, q: dict, plan: dict[str, str],
                   shapes: dict, add: Callable[[dict], None],
                   progress: Callable[[int, int, str], None] | None = None) -> ImportReport:
    """Write every tensor of ``plan`` (name to write -> name to read) through ``add`` in the
    program's format, reading int4 weights in the checkpoint's format where it has them."""
    method = check_quant_config(q)
    v1 = method == "gptq" and q.get("checkpoint_format", "gptq") == "gptq"
    rep = ImportReport(method)
    for i, (n, rn) in enumerate(plan.items(), 1):
        shape = shapes[n]
        base = rn[: -len(".weight")] if rn.endswith(".weight") else rn
        if cfg.is_int4(n, shape) and rn not in r:
            rows, k = shape
            if method == "gptq":
                codes, s = codes_gptq(r, base, rows, k, v1)
            else:
                codes, s = codes_compressed_tensors(r, base, rows, k)
            rep.scale_dtype = str(s.dtype)
            qw, st = pack_int4(codes, _scales_bf16(s, codes, base, rep))
            del codes
            rep.from_checkpoint.append(n)
        else:
            a = r.get(rn)
            if r.dtype(rn) not in _FLOATS or tuple(a.shape) != tuple(shape):
                raise UserError(f"checkpoint {str(r.path)!r}: tensor {rn!r} is {r.dtype(rn)} "
                                f"{list(a.shape)}, expected a float type {list(shape)}")
            if not cfg.is_int4(n, shape):
                add({n: a})
                if progress is not None:
                    progress(i, len(plan), n)
                continue
            qw, st = quantize_pack(a, n)
            rep.quantized_here.append(n)
        b = n[: -len(".weight")]
        add({b + ".qweight": qw, b + ".scales": st, b + ".shape": np.array(shape, np.int64)})
        if progress is not None:
            progress(i, len(plan), n)
    return rep


def has_source(cfg: ModelConfig, r: CheckpointReader, name: str, shape) -> bool:
    """Whether the checkpoint holds ``name`` as a float tensor or in an int4 packed form."""
    if name in r:
        return True
    if not cfg.is_int4(name, shape):
        return False
    base = name[: -len(".weight")]
    return base + ".qweight" in r or base + ".weight_packed" in r


def check_sources(cfg: ModelConfig, r: CheckpointReader, mtp: bool) -> None:
    """Every tensor of ``cfg`` present in some form (the optional ones aside)."""
    optional = cfg.checkpoint_optional(mtp)
    missing = [n for n, s in cfg.tensor_shapes(mtp=True).items()
               if n not in optional and not has_source(cfg, r, n, s)]
    if missing:
        more = f" (and {len(missing) - 1} more missing)" if len(missing) > 1 else ""
        hint = ("; this checkpoint has no MTP layer: import it with MTP off "
                "(`qwen38gen quantize --no-mtp`)" if missing[0].startswith("mtp.") else "")
        raise UserError(f"checkpoint {str(r.path)!r} is missing tensor {missing[0]!r} (as a "
                        f"float weight or in its int4 form){more}{hint}")

