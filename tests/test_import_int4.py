"""Pre-quantized int4 checkpoints through `quantize` (qwen38gen/importer.py).

* compressed-tensors ``pack-quantized``: the checkpoint is written by the compressed-tensors
  library itself (its ``PackedQuantizationCompressor.compress``), and its own ``decompress`` is the
  oracle: our dequantized weights equal the library's bit for bit (bf16 as the library returns
  them, and fp32 when the library multiplies in fp32).
* GPTQ (v1 and v2 checkpoint formats): written here to the published layout (``gptq_pack``), and
  checked against an independent dequantization written from the format's description
  (``gptq_dequant``): the codes repack exactly; the fp16 scales become bf16 and the reported
  largest relative change of any weight is the measured one (≤ 2⁻⁸: bf16 keeps 8 significant bits).
* Qwen's GPTQ layout: attention and GDN projections kept in bf16 are quantized here, and the
  written quantization.json lists which tensors came from where.
* Refusals name the field (AWQ, asymmetric, activation order, other group sizes, dtypes).
"""

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
import safetensors.numpy as stn

from qwen38gen.config import PRESETS, _hybrid
from qwen38gen.errors import UserError
from qwen38gen.quantize import QUANT_JSON, load_quantized, quantize_checkpoint
from qwen38gen.weights import BF16, quantize_int4, synthetic_weights, unpack_int4

CFG = dataclasses.replace(PRESETS["tiny"], name="imp", num_hidden_layers=4,
                          layer_types=_hybrid(4))
W = synthetic_weights(CFG, seed=7)
LINEAR = [n for n, s in CFG.tensor_shapes().items() if CFG.is_int4(n, s)]
CT_CONFIG = {
    "quant_method": "compressed-tensors", "format": "pack-quantized",
    "quantization_status": "compressed", "ignore": ["lm_head"],
    "config_groups": {"group_0": {
        "targets": ["Linear"], "format": "pack-quantized", "input_activations": None,
        "output_activations": None,
        "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                    "group_size": 128, "actorder": None, "dynamic": False,
                    "observer": "minmax"}}},
}


def write(d, tensors: dict, qconf: dict | None):
    d.mkdir(parents=True)
    c = CFG.to_hf_dict()
    if qconf is not None:
        c["quantization_config"] = qconf
    (d / "config.json").write_text(json.dumps(c))
    stn.save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    return d


# ------------------------------------------------------------------ compressed-tensors
ct = pytest.importorskip("compressed_tensors")


def _scheme():
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    return QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
        num_bits=4, type="int", symmetric=True, strategy="group", group_size=128))


def ct_checkpoint(d, scale_dtype=None):
    """Every linear weight but the lm_head compressed by the library (scales bf16, the weights'
    dtype, as llm-compressor writes them), the rest as they are."""
    import torch
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor

    scale_dtype = scale_dtype or torch.bfloat16
    out, lib = {}, {}
    for n, a in W.items():
        if n not in LINEAR or n == "lm_head.weight":
            out[n] = a
            continue
        w = torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
        g = w.float().reshape(w.shape[0], -1, 128).abs().amax(-1)
        s = (g / 7).to(scale_dtype)
        c = PackedQuantizationCompressor.compress({"weight": w, "weight_scale": s}, _scheme())
        base = n[: -len(".weight")]
        for k, v in c.items():
            out[f"{base}.{k}"] = v.numpy() if v.dtype != torch.bfloat16 else \
                v.view(torch.uint16).numpy().view(BF16)
        lib[n] = c
    write(d, out, CT_CONFIG)
    return lib


def test_compressed_tensors_import_is_bit_exact(tmp_path):
    import torch
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor

    lib = ct_checkpoint(tmp_path / "ct")
    rep = {}
    quantize_checkpoint(tmp_path / "ct", tmp_path / "q", report_to=rep)
    assert rep["source_method"] == "compressed-tensors" and rep["max_rel_weight_change"] == 0.0
    assert rep["quantized_here"] == ["lm_head.weight"]
    assert sorted(rep["from_checkpoint"]) == sorted(n for n in LINEAR if n != "lm_head.weight")
    q = load_quantized(tmp_path / "q")
    exact = total = 0
    for n, c in lib.items():
        ours = q[n].dequantize()                                        # fp32 q·s
        theirs = PackedQuantizationCompressor.decompress(c, _scheme())["weight"]
        assert theirs.dtype == torch.bfloat16
        a = torch.from_numpy(ours).to(torch.bfloat16).view(torch.int16)
        assert torch.equal(a, theirs.view(torch.int16)), n               # bit for bit, in bf16
        c32 = dict(c, weight_scale=c["weight_scale"].float())
        t32 = PackedQuantizationCompressor.decompress(c32, _scheme())["weight"]
        assert torch.equal(torch.from_numpy(ours).view(torch.int32), t32.view(torch.int32)), n
        exact += int((a == theirs.view(torch.int16)).sum())
        total += a.numel()
    assert exact == total and total == sum(np.prod(CFG.tensor_shapes()[n]) for n in lib)
    meta = json.loads((tmp_path / "q" / QUANT_JSON).read_text())
    assert meta["from_checkpoint"] == rep["from_checkpoint"]
    assert "quantization_config" not in json.loads((tmp_path / "q" / "config.json").read_text())


def test_compressed_tensors_fp16_scales_are_converted_and_reported(tmp_path):
    import torch

    ct_checkpoint(tmp_path / "ct", scale_dtype=torch.float16)
    rep = {}
    quantize_checkpoint(tmp_path / "ct", tmp_path / "q", report_to=rep)
    assert rep["source_scale_dtype"] == "float16"
    assert 0 < rep["max_rel_weight_change"] <= 2.0 ** -8


# ------------------------------------------------------------------ GPTQ
def gptq_pack(codes: np.ndarray, scales: np.ndarray, v1: bool):
    """The published GPTQ layout for a symmetric 4-bit g128 weight [N, K]: qweight int32 [K/8, N]
    (input row 8i + j of column n in bits 4j of word (i, n), as code + 8), qzeros int32
    [K/128, N/8] (column 8m + j's zero point 8 in bits 4j; v1 stores 8 − 1), scales fp16 [K/128, N],
    g_idx int32 [K] = k / 128."""
    n, k = codes.shape
    u = (codes.astype(np.int64) + 8).T                       # [K, N], 0..15
    qweight = np.zeros((k // 8, n), np.uint32)
    for j in range(8):
        qweight |= (u[j::8].astype(np.uint32) << np.uint32(4 * j))
    z = 7 if v1 else 8
    qzeros = np.zeros((k // 128, n // 8), np.uint32)
    for j in range(8):
        qzeros |= np.uint32(z << (4 * j))
    return {"qweight": qweight.view(np.int32), "qzeros": qzeros.view(np.int32),
            "scales": np.ascontiguousarray(scales.T.astype(np.float16)),
            "g_idx": (np.arange(k) // 128).astype(np.int32)}


def gptq_dequant(t: dict, v1: bool) -> np.ndarray:
    """W [N, K] in float64 from the GPTQ tensors, by the format's description (independent of
    the importer's code): W[n, k] = s[g(k), n] · (u[k, n] − z[g(k), n])."""
    qw = t["qweight"].view(np.uint32)
    k, n = qw.shape[0] * 8, qw.shape[1]
    u = np.empty((k, n), np.int64)
    for j in range(8):
        u[j::8] = (qw >> np.uint32(4 * j)) & 15
    qz = t["qzeros"].view(np.uint32)
    z = np.empty((qz.shape[0], n), np.int64)
    for j in range(8):
        z[:, j::8] = (qz >> np.uint32(4 * j)) & 15
    z += 1 if v1 else 0
    g = t["g_idx"].astype(np.int64)
    return (t["scales"].astype(np.float64)[g] * (u - z[g])).T


def gptq_checkpoint(d, v1: bool, keep_bf16=("self_attn.", "linear_attn."), qconf=None,
                    mutate=None):
    """A GPTQ checkpoint of W: the MLP weights (and any not matching keep_bf16) in GPTQ form
    with fp16 scales at full fp16 precision, the projections matching keep_bf16 and the lm_head
    in bf16 (as Qwen's Qwen3.5-27B-GPTQ-Int4 keeps them)."""
    out, src = {}, {}
    for n, a in W.items():
        if n not in LINEAR or n == "lm_head.weight" or any(s in n for s in keep_bf16):
            out[n] = a
            continue
        wf = a.astype(np.float32)
        s16 = (np.abs(wf.reshape(wf.shape[0], -1, 128)).max(-1) / 7).astype(np.float16)
        codes = np.clip(np.rint(wf.reshape(wf.shape[0], -1, 128)
                                / s16.astype(np.float32)[..., None]), -8, 7)
        codes = codes.reshape(wf.shape).astype(np.int8)
        t = gptq_pack(codes, s16, v1)
        if mutate:
            mutate(n, t)
        base = n[: -len(".weight")]
        out.update({f"{base}.{k}": v for k, v in t.items()})
        src[n] = (codes, t)
    fmt = "gptq" if v1 else "gptq_v2"
    q = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False,
         "checkpoint_format": fmt, "dynamic": {"-:.*attn.*": {}}}
    q.update(qconf or {})
    write(d, out, q)
    return src


@pytest.mark.parametrize("v1", [True, False], ids=["gptq", "gptq_v2"])
def test_gptq_import_codes_exact_scales_converted(tmp_path, v1):
    src = gptq_checkpoint(tmp_path / "g", v1)
    rep = {}
    quantize_checkpoint(tmp_path / "g", tmp_path / "q", report_to=rep)
    q = load_quantized(tmp_path / "q")
    worst = 0.0
    for n, (codes, t) in src.items():
        got_codes, got_scales = unpack_int4(q[n].qweight, q[n].scales, q[n].shape)
        assert np.array_equal(got_codes, codes), n                         # codes exact
        ref = gptq_dequant(t, v1)
        assert np.array_equal(np.rint(ref / np.repeat(t["scales"].T.astype(np.float64), 128, 1)
                                      ).astype(np.int8), codes)
        ours = q[n].dequantize().astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            rel = np.where(ref != 0, np.abs(ours - ref) / np.abs(ref), 0.0)
        assert np.all(ours[ref == 0] == 0)
        worst = max(worst, float(rel.max()))
    assert 0 < worst <= 2.0 ** -8
    assert rep["max_rel_weight_change"] == pytest.approx(worst, rel=1e-12)
    assert rep["source_scale_dtype"] == "float16"
    # Qwen's layout: the attention and GDN projections and the lm_head were quantized here
    assert sorted(rep["quantized_here"]) == sorted(
        n for n in LINEAR if "attn." in n or n == "lm_head.weight")
    assert sorted(rep["from_checkpoint"]) == sorted(src)
    meta = json.loads((tmp_path / "q" / QUANT_JSON).read_text())
    assert meta["quantized_here"] == rep["quantized_here"]


def test_gptq_import_cli_prints_the_lists_and_the_change(tmp_path):
    gptq_checkpoint(tmp_path / "g", v1=True)
    r = subprocess.run([sys.executable, "-m", "cli", "quantize", str(tmp_path / "g"), "-o",
                        str(tmp_path / "q")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    assert "imported gptq int4: 16 linear weights from the checkpoint" in r.stdout
    assert "largest relative change of any weight" in r.stdout
    assert "model.language_model.layers.*.self_attn.q_proj.weight ×1" in r.stdout
    assert "model.language_model.layers.*.linear_attn.in_proj_qkv.weight ×3" in r.stdout


def _bad_g_idx(n, t):
    t["g_idx"] = t["g_idx"][::-1].copy()


def _asym(n, t):
    t["qzeros"] = np.full_like(t["qzeros"], 0x66666666)


def _float_qweight(n, t):
    t["qweight"] = t["qweight"].astype(np.float32)


@pytest.mark.parametrize("qconf,mutate,msg", [
    ({"quant_method": "awq"}, None,
     r"quantization_config.quant_method is 'awq'; only gptq or compressed-tensors \(AWQ stores "
     r"zero points\) is supported: quantize from the bf16 checkpoint instead"),
    ({"desc_act": True}, None, r"quantization_config.desc_act is True; only false is supported"),
    ({"sym": False}, None, r"quantization_config.sym is False; only true is supported"),
    ({"group_size": 64}, None, r"quantization_config.group_size is 64; only 128 is supported"),
    ({"bits": 8}, None, r"quantization_config.bits is 8; only 4 is supported"),
    ({"checkpoint_format": "marlin"}, None,
     r"quantization_config.checkpoint_format is 'marlin'; only gptq or gptq_v2"),
    ({}, _bad_g_idx, r"g_idx' reorders the input columns \(activation order, desc_act\)"),
    ({}, _asym, r"qzeros' holds zero points other than 8 \(asymmetric quantization\)"),
    ({}, _float_qweight, r"qweight' is F32 \[64, 1024\], expected I32 \[64, 1024\]"),
])
def test_gptq_refusals_name_the_field(tmp_path, qconf, mutate, msg):
    gptq_checkpoint(tmp_path / "g", v1=False, qconf=qconf, mutate=mutate)
    with pytest.raises(UserError, match=msg):
        quantize_checkpoint(tmp_path / "g", tmp_path / "q")
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize("path,value,msg", [
    (("weights", "symmetric"), False,
     r"config_groups.group_0.weights.symmetric is False; only true is supported"),
    (("weights", "actorder"), "group", r"config_groups.group_0.weights.actorder is 'group'"),
    (("format",), "int-quantized", r"config_groups.group_0.format is 'int-quantized'; only "
                                   r"pack-quantized"),
    (("weights", "strategy"), "channel", r"weights.strategy is 'channel'; only \"group\""),
])
def test_compressed_tensors_refusals_name_the_field(tmp_path, path, value, msg):
    import copy

    qc = copy.deepcopy(CT_CONFIG)
    node = qc["config_groups"]["group_0"]
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    write(tmp_path / "c", {"x": np.zeros(1, np.float32)}, qc)
    with pytest.raises(UserError, match=msg):
        quantize_checkpoint(tmp_path / "c", tmp_path / "q")


def test_compressed_tensors_zero_points_refused(tmp_path):
    ct_checkpoint(tmp_path / "ct")
    t = stn.load_file(str(tmp_path / "ct" / "model.safetensors"))
    name = "model.language_model.layers.0.mlp.down_proj.weight_zero_point"
    t[name] = np.zeros((512, 8), np.int32)
    stn.save_file(t, str(tmp_path / "ct" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"weight_zero_point': zero points and activation order "
                                        r"are not supported; quantize from the bf16"):
        quantize_checkpoint(tmp_path / "ct", tmp_path / "q")


def test_own_quantizer_codes_are_in_the_gptq_range():
    """The independent GPTQ pack/dequant helpers above round-trip our own int4 codes."""
    w = W["model.language_model.layers.0.mlp.up_proj.weight"]
    codes, s = quantize_int4(w)
    t = gptq_pack(codes, s.astype(np.float32).astype(np.float16), v1=True)
    back = gptq_dequant(t, v1=True)
    assert np.array_equal(back, (codes * np.repeat(s.astype(np.float16).astype(np.float64),
                                                   128, 1)))


def test_import_names_a_float_tensor_of_the_wrong_dtype_or_shape(tmp_path):
    norm = "model.language_model.layers.0.input_layernorm.weight"
    gptq_checkpoint(tmp_path / "g", v1=False)
    f = tmp_path / "g" / "model.safetensors"
    t = stn.load_file(str(f))
    t[norm] = np.zeros(512, np.int32)
    stn.save_file(t, str(f), metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"tensor 'model.language_model.layers.0.input_layernorm"
                                        r".weight' is I32 \[512\], expected a float type \[512\]"):
        quantize_checkpoint(tmp_path / "g", tmp_path / "q")
    t[norm] = np.zeros(256, np.float32)
    stn.save_file(t, str(f), metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"input_layernorm.weight' is F32 \[256\], expected a float "
                                        r"type \[512\]"):
        quantize_checkpoint(tmp_path / "g", tmp_path / "q")
    assert not (tmp_path / "q").exists()


def test_import_without_mtp_needs_no_mtp(tmp_path):
    gptq_checkpoint(tmp_path / "g", v1=False)
    f = tmp_path / "g" / "model.safetensors"
    t = {n: a for n, a in stn.load_file(str(f)).items() if not n.startswith("mtp.")}
    stn.save_file(t, str(f), metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"missing tensor 'mtp\..*\(as a float weight or in its "
                                        r"int4 form\).*`qwen38gen quantize --no-mtp`"):
        quantize_checkpoint(tmp_path / "g", tmp_path / "q")
    rep = {}
    quantize_checkpoint(tmp_path / "g", tmp_path / "q", mtp=False, report_to=rep)
    assert not any(n.startswith("mtp.") for n in load_quantized(tmp_path / "q"))
    assert len(rep["from_checkpoint"]) == 12
