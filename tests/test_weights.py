"""Checkpoint IO, the int4 g128 format of docs/FORMAT.md, and the streaming quantizer."""

import json
import os

import numpy as np
import pytest

from qwen38gen.config import PRESETS
from qwen38gen.errors import UserError
from qwen38gen import quantize as qz
from qwen38gen import checkpoint as ck
from qwen38gen import weights as wt
from qwen38gen.checkpoint import safetensors_offsets
from qwen38gen.weights import BF16

TINY = PRESETS["tiny"]
TOY = PRESETS["toy"]
QPROJ3 = "model.language_model.layers.3.self_attn.q_proj.weight"


def bits(a):
    """Raw bytes of an array, so bf16 compares bit for bit."""
    return np.ascontiguousarray(a).view(np.uint8)


def same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(bits(a), bits(b))


@pytest.fixture(scope="module")
def tiny_tensors():
    return wt.synthetic_weights(TINY, seed=1)


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory, tiny_tensors):
    d = tmp_path_factory.mktemp("ck") / "tiny"
    ck.save_checkpoint(TINY, tiny_tensors, d, max_shard_bytes=4 << 20)
    return d


@pytest.fixture(scope="module")
def tiny_quant(tmp_path_factory, tiny_ckpt):
    d = tmp_path_factory.mktemp("q") / "tiny-int4"
    calls = []
    qz.quantize_checkpoint(tiny_ckpt, d, progress=lambda *a: calls.append(a),
                           max_shard_bytes=3 << 20)
    return d, calls


# ============================================================================ save / load
def test_save_layout_and_roundtrip(tiny_ckpt, tiny_tensors):
    files = sorted(os.listdir(tiny_ckpt))
    shards = [f for f in files if f.startswith("model-")]
    n = len(shards)
    assert n > 2
    assert shards == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    assert set(files) == set(shards) | {"config.json", "model.safetensors.index.json"}
    assert not [f for f in os.listdir(tiny_ckpt.parent) if f.startswith(".")]  # no temp left

    index = json.loads((tiny_ckpt / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(tiny_tensors)
    assert set(index["weight_map"].values()) == set(shards)
    assert index["metadata"]["total_size"] == sum(a.nbytes for a in tiny_tensors.values())
    assert json.loads((tiny_ckpt / "config.json").read_text()) == TINY.to_hf_dict()
    # Shards stay under the limit (no single tiny tensor exceeds 4 MiB).
    for s in shards:
        assert os.path.getsize(tiny_ckpt / s) < (4 << 20) + 65536

    loaded = ck.load_checkpoint(tiny_ckpt, TINY)
    assert list(loaded) == list(TINY.tensor_shapes())
    for k, a in tiny_tensors.items():
        assert same(loaded[k], a), k
    assert loaded["model.language_model.layers.0.linear_attn.A_log"].dtype == np.float32

    r = ck.CheckpointReader(tiny_ckpt)
    assert set(r.names()) == set(tiny_tensors)
    assert r.shape(QPROJ3) == (3072, 512) and r.dtype(QPROJ3) == "BF16"
    assert same(r.get(QPROJ3), tiny_tensors[QPROJ3])


def test_single_file_checkpoint(tmp_path):
    import safetensors.numpy as stn

    t = wt.synthetic_weights(TOY, seed=2, mtp=False)
    d = tmp_path / "single"
    d.mkdir()
    stn.save_file(t, str(d / "model.safetensors"))
    with pytest.raises(UserError, match=r"missing tensor 'mtp\..*mtp=False"):
        ck.load_checkpoint(d, TOY)
    got = ck.load_checkpoint(d, TOY, mtp=False)
    assert set(got) == set(t) and all(same(got[k], t[k]) for k in t)


def test_hf_loads_saved_checkpoint(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    t = wt.synthetic_weights(TOY, seed=3)
    d = ck.save_checkpoint(TOY, t, tmp_path / "hf", max_shard_bytes=200_000)
    model, info = transformers.Qwen3_5ForCausalLM.from_pretrained(
        d, dtype=torch.float32, output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"]
    assert not [k for k in info["unexpected_keys"] if not k.startswith("mtp.")]
    sd = model.state_dict()
    decoder = [k for k in t if k.startswith("model.language_model.")]
    assert {"model." + k[len("model.language_model."):] for k in decoder} | {"lm_head.weight"} \
        == set(sd)
    for hf, ours in [("model.layers.3.self_attn.q_proj.weight", "model.language_model.layers.3"
                      ".self_attn.q_proj.weight"),
                     ("model.layers.0.linear_attn.A_log", "model.language_model.layers.0"
                      ".linear_attn.A_log"),
                     ("lm_head.weight", "lm_head.weight")]:
        assert np.array_equal(sd[hf].numpy(), t[ours].astype(np.float32)), hf


def test_save_is_atomic_and_refuses_nonempty(tmp_path):
    t = {"a": np.ones(4, np.float32), "bad": np.array([object()])}  # safetensors rejects 'bad'
    d = tmp_path / "out"
    with pytest.raises(Exception):
        ck.save_checkpoint(TOY, t, d, max_shard_bytes=1)
    assert not d.exists() and os.listdir(tmp_path) == []

    ok = {"a": np.ones(4, np.float32)}
    ck.save_checkpoint(TOY, ok, d)
    with pytest.raises(UserError, match="not empty.*overwrite"):
        ck.save_checkpoint(TOY, ok, d)
    ck.save_checkpoint(TOY, {"b": np.zeros(2, BF16)}, d, overwrite=True)
    assert ck.CheckpointReader(d).names() == ["b"]
    assert sorted(os.listdir(tmp_path)) == ["out"]


# ============================================================================ check_tensors
def test_check_tensors_messages(tmp_path, tiny_tensors):
    ck.check_tensors(TINY, tiny_tensors)
    t = dict(tiny_tensors)
    del t[QPROJ3]
    d = ck.save_checkpoint(TINY, t, tmp_path / "m")
    with pytest.raises(UserError, match=f"checkpoint {d} is missing tensor '{QPROJ3}'"):
        ck.check_tensors(TINY, ck.CheckpointReader(d))

    t = dict(tiny_tensors)
    t[QPROJ3] = np.zeros((3072, 256), BF16)
    with pytest.raises(UserError, match=r"'%s' has shape \[3072, 256\], expected \[3072, 512\]"
                       % QPROJ3):
        ck.check_tensors(TINY, t)

    t = {k: v for k, v in tiny_tensors.items() if not k.startswith("mtp.")}
    with pytest.raises(UserError, match=r"missing tensor 'mtp\.pre_fc_norm_embedding\.weight'.*"
                       r"mtp=False"):
        ck.check_tensors(TINY, t)
    ck.check_tensors(TINY, t, mtp=False)
    t["mtp.fc.weight"] = np.zeros((512, 512), BF16)  # present MTP tensors are still checked
    with pytest.raises(UserError, match=r"'mtp\.fc\.weight' has shape"):
        ck.check_tensors(TINY, t, mtp=False)


def test_reader_errors(tmp_path, tiny_ckpt):
    with pytest.raises(UserError, match=f"'{tmp_path / 'nope'}' does not exist"):
        ck.CheckpointReader(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="neither model.safetensors.index.json nor"):
        ck.CheckpointReader(tmp_path / "empty")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "model.safetensors").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(UserError, match=f"cannot read safetensors file '{bad}/model.safetensors'"):
        ck.CheckpointReader(bad)
    (bad / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(UserError, match="index file .* is not a valid safetensors index"):
        ck.CheckpointReader(bad)
    (bad / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"x": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(UserError, match="shard .*model-00001-of-00002.safetensors.* does not"):
        ck.CheckpointReader(bad)
    with pytest.raises(UserError, match="has no tensor 'x'"):
        ck.CheckpointReader(tiny_ckpt).get("x")


# ============================================================================ int4 format
def random_codes(rng, n, k):
    c = rng.integers(-8, 8, (n, k)).astype(np.int8)
    c[0, 0], c[-1, -1] = -8, 7
    s = (rng.standard_normal((n, k // 128)) * 0.01).astype(BF16)
    return c, s


@pytest.mark.parametrize("n,k", [(1, 128), (6, 256), (16, 128), (48, 384), (37, 640)])
def test_pack_unpack_roundtrip(n, k):
    rng = np.random.default_rng(n * 1000 + k)
    c, s = random_codes(rng, n, k)
    qw, st = wt.pack_int4(c, s)
    np_ = -(-n // 16) * 16
    assert qw.dtype == np.uint32 and qw.shape == (np_ // 16, k // 64, 32, 4)
    assert st.dtype == BF16 and st.shape == (np_ // 16, k // 128, 16)
    c2, s2 = wt.unpack_int4(qw, st, (n, k))
    assert np.array_equal(c2, c) and same(s2, s)
    # dequantize is q * s exactly, and gemv_reference is x @ W~.T
    w_deq = c.astype(np.float32) * np.repeat(s.astype(np.float32), 128, axis=1)
    assert np.array_equal(wt.dequantize(qw, st, (n, k)), w_deq)
    x = rng.standard_normal((3, k))
    assert np.allclose(wt.gemv_reference(qw, st, (n, k), x), x @ w_deq.astype(np.float64).T,
                       rtol=1e-12, atol=1e-12)


def test_padding_rows_read_as_zero():
    rng = np.random.default_rng(7)
    c, s = random_codes(rng, 6, 256)
    qw, st = wt.pack_int4(c, s)
    # rows 6..15 of the only row tile: every nibble is code 8 (q = 0) and every scale is 0
    full = wt._unpack_tiles(qw)
    assert full.shape == (16, 256) and (full[6:] == 0).all()
    assert (st[0, :, 6:].astype(np.float32) == 0).all()
    assert (wt._dequant_tiles(qw, st)[6:] == 0).all()


# FORMAT.md table: nibble -> (row in tile = g + 8*ROW, column in tile = 16c + 4i + COL)
NIBBLE_TABLE = {0: (0, 0), 1: (1, 0), 2: (0, 2), 3: (1, 2),
                4: (0, 1), 5: (1, 1), 6: (0, 3), 7: (1, 3)}


def expected_location(row, col, k):
    """(byte offset of the word in qweight, nibble) for W[row, col], read off FORMAT.md."""
    rt, r = divmod(row, 16)
    kt, cc = divmod(col, 64)
    g, h = r % 8, r // 8
    c, rest = divmod(cc, 16)
    i, e = divmod(rest, 4)
    (nib,) = [n for n, (hh, ee) in NIBBLE_TABLE.items() if (hh, ee) == (h, e)]
    lane = 4 * g + c
    tile = rt * (k // 64) + kt
    return 512 * tile + 16 * lane + 4 * i, nib


@pytest.mark.parametrize("rows", [32, 21])
def test_nibble_placement_matches_format_table(rows):
    """Set one code at a time and check exactly which byte word / nibble of qweight holds it."""
    k = 256
    s = np.ones((rows, k // 128), BF16)
    base = np.zeros((rows, k), np.int8)
    base_qw, _ = wt.pack_int4(base, s)
    assert (base_qw == 0x88888888).all()  # code 0 is stored as nibble 8 everywhere
    positions = [(r, c) for r in range(16) for c in range(64)]          # all of tile (0, 0)
    positions += [(r, c) for r in (0, 7, 8, 15, 16, rows - 1) for c in range(64, 256, 3)]
    for row, col in positions:
        code = (row * 7 + col * 3) % 16 - 8
        if code == 0:
            code = 5
        w = base.copy()
        w[row, col] = code
        qw, _ = wt.pack_int4(w, s)
        words = qw.reshape(-1)  # little-endian uint32 = the bytes the kernel reads
        changed = np.flatnonzero(words != base_qw.reshape(-1))
        off, nib = expected_location(row, col, k)
        assert changed.tolist() == [off // 4], (row, col)
        assert (int(words[off // 4]) >> (4 * nib)) & 15 == code + 8, (row, col)
        assert int(words[off // 4]) & ~(15 << (4 * nib)) & 0xFFFFFFFF == 0x88888888 & ~(
            15 << (4 * nib)) & 0xFFFFFFFF


def test_scale_placement():
    n, k = 21, 384
    s = (np.arange(n * 3).reshape(n, 3) + 1).astype(BF16)
    _, st = wt.pack_int4(np.zeros((n, k), np.int8), s)
    for row in range(n):
        for g in range(3):
            assert st[row // 16, g, row % 16] == s[row, g]
    assert (st[1, :, 5:].astype(np.float32) == 0).all()  # padding rows 21..31


def test_quantize_definition_and_error_bound():
    rng = np.random.default_rng(11)
    n, k = 40, 384
    w = (rng.standard_normal((n, k)) * np.exp(rng.uniform(-6, 2, (n, 1)))).astype(np.float32)
    w[3, 128:256] = 0.0                      # an all-zero group: s = 0, q = 0
    w[5, :128] = np.linspace(-1, 1, 128)
    codes, scales = wt.quantize_int4(w)
    assert codes.dtype == np.int8 and codes.shape == (n, k)
    assert scales.dtype == BF16 and scales.shape == (n, k // 128)
    amax = np.abs(w.reshape(n, 3, 128)).max(-1)
    assert same(scales, (amax / np.float32(7)).astype(BF16))
    assert scales[3, 1] == 0 and (codes[3, 128:256] == 0).all()
    sf = np.repeat(scales.astype(np.float32), 128, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        want = np.where(sf > 0, np.clip(np.rint(w / sf), -8, 7), 0)
    assert np.array_equal(codes, want)
    assert codes.min() >= -8 and codes.max() <= 7
    err = np.abs(w - codes * sf)
    assert (err <= sf / 2 * (1 + 1e-6) + 1e-30).all()  # bf16 rounding of s stays within s/2
    # bf16 input gives the same as its fp32 value, and quantize_pack == pack(quantize)
    wb = w.astype(BF16)
    c1, s1 = wt.quantize_int4(wb)
    c2, s2 = wt.quantize_int4(wb.astype(np.float32))
    assert np.array_equal(c1, c2) and same(s1, s2)
    qa, sa = wt.pack_int4(c1, s1)
    qb, sb = wt.quantize_pack(wb)
    assert np.array_equal(qa, qb) and same(sa, sb)


def test_round_half_even():
    w = np.zeros((1, 128), np.float32)
    w[0, 0] = 7.0                            # s = 1 exactly
    w[0, 1:5] = [0.5, 1.5, 2.5, -2.5]
    codes, scales = wt.quantize_int4(w)
    assert scales[0, 0] == 1
    assert codes[0, :5].tolist() == [7, 0, 2, 2, -2]


@pytest.mark.parametrize("shape", [(16, 64), (4, 200), (3, 0)])
def test_k_not_multiple_of_128(shape):
    with pytest.raises(UserError, match=r"K .* multiple of 128"):
        wt.quantize_int4(np.zeros(shape, np.float32), name="blk.w")
    with pytest.raises(UserError, match="multiple of 128"):
        wt.pack_int4(np.zeros(shape, np.int8), np.zeros((shape[0], 1), BF16))


def test_nonfinite_weight_is_refused():
    w = np.zeros((2, 128), np.float32)
    w[1, 3] = np.nan
    with pytest.raises(UserError, match="'t.w' holds inf or NaN"):
        wt.quantize_int4(w, name="t.w")


# ============================================================================ quantizer
def test_quantize_checkpoint_tiny(tiny_quant, tiny_ckpt, tiny_tensors):
    d, calls = tiny_quant
    files = set(os.listdir(d))
    shards = sorted(f for f in files if f.startswith("model-"))
    assert len(shards) > 2 and {"config.json", "quantization.json",
                                "model.safetensors.index.json"} <= files
    assert (d / "config.json").read_bytes() == (tiny_ckpt / "config.json").read_bytes()
    assert json.loads((d / "quantization.json").read_text()) == {
        "format": "qwen38gen-int4-g128-tile16x64", "version": 1, "group_size": 128}
    assert len(calls) == len(tiny_tensors) and calls[-1][:2] == (len(calls), len(calls))
    assert [c[2] for c in calls] == list(TINY.tensor_shapes())

    raw = ck.CheckpointReader(d)
    shapes = TINY.tensor_shapes()
    for n, a in tiny_tensors.items():
        if TINY.is_int4(n, shapes[n]):
            b = n[: -len(".weight")]
            assert n not in raw
            assert raw.dtype(b + ".qweight") == "U32" and raw.dtype(b + ".scales") == "BF16"
            assert raw.get(b + ".shape").dtype == np.int64
            assert raw.get(b + ".shape").tolist() == list(a.shape)
            qw, st = raw.get(b + ".qweight"), raw.get(b + ".scales")
            c, s = wt.quantize_int4(a)
            c2, s2 = wt.unpack_int4(qw, st, a.shape)
            assert np.array_equal(c2, c) and same(s2, s), n
        else:
            assert same(raw.get(n), a), n   # copied bit for bit, dtype kept

    q = qz.load_quantized(d)
    assert list(q) == list(shapes)
    qt = q[QPROJ3]
    assert isinstance(qt, qz.QuantizedTensor) and qt.shape == (3072, 512)
    assert isinstance(q["model.language_model.embed_tokens.weight"], np.ndarray)

    deq = qz.dequantized_weights(q)
    assert set(deq) == set(shapes)
    for n, a in deq.items():
        assert a.dtype == np.float32 and a.shape == shapes[n]
    c, s = wt.quantize_int4(tiny_tensors[QPROJ3])
    assert np.array_equal(deq[QPROJ3], c * np.repeat(s.astype(np.float32), 128, axis=1))
    emb = "model.language_model.embed_tokens.weight"
    assert np.array_equal(deq[emb], tiny_tensors[emb].astype(np.float32))
    assert np.array_equal(qz.dequantized_weights(d)["lm_head.weight"], deq["lm_head.weight"])


def test_quantize_refuses_and_is_atomic(tmp_path, tiny_ckpt, tiny_quant):
    d, _ = tiny_quant
    with pytest.raises(UserError, match="not empty.*overwrite"):
        qz.quantize_checkpoint(tiny_ckpt, d)

    def boom(done, total, name):
        if done == 20:
            raise RuntimeError("interrupted")

    out = tmp_path / "q"
    with pytest.raises(RuntimeError):
        qz.quantize_checkpoint(tiny_ckpt, out, progress=boom, max_shard_bytes=1 << 20)
    assert os.listdir(tmp_path) == []          # no out, no temp folder
    with pytest.raises(UserError, match="does not exist"):
        qz.quantize_checkpoint(tmp_path / "missing", out)


def test_quantize_missing_and_wrong_shape(tmp_path, tiny_tensors):
    t = dict(tiny_tensors)
    del t["model.language_model.layers.5.mlp.down_proj.weight"]
    src = ck.save_checkpoint(TINY, t, tmp_path / "m")
    with pytest.raises(UserError, match=r"missing tensor 'model\.language_model\.layers\.5\.mlp"
                       r"\.down_proj\.weight'"):
        qz.quantize_checkpoint(src, tmp_path / "o1")

    t = dict(tiny_tensors)
    t[QPROJ3] = np.zeros((3072, 384), BF16)
    src = ck.save_checkpoint(TINY, t, tmp_path / "s")
    with pytest.raises(UserError, match=r"'%s' has shape \[3072, 384\], expected \[3072, 512\]"
                       % QPROJ3.replace(".", r"\.")):
        qz.quantize_checkpoint(src, tmp_path / "o2")
    assert sorted(os.listdir(tmp_path)) == ["m", "s"]


def test_quantize_without_mtp(tmp_path):
    t = wt.synthetic_weights(TINY, seed=4, mtp=False)
    src = ck.save_checkpoint(TINY, t, tmp_path / "src")
    with pytest.raises(UserError, match="mtp=False"):
        qz.quantize_checkpoint(src, tmp_path / "q")
    qz.quantize_checkpoint(src, tmp_path / "q", mtp=False)
    q = qz.load_quantized(tmp_path / "q")
    assert set(q) == set(TINY.tensor_shapes(mtp=False))


def test_toy_cannot_be_quantized(tmp_path):
    src = ck.save_checkpoint(TOY, wt.synthetic_weights(TOY), tmp_path / "toy")
    with pytest.raises(UserError, match=r"shape \[\d+, 64\].*multiple of 128"):
        qz.quantize_checkpoint(src, tmp_path / "q")
    assert not (tmp_path / "q").exists()


def test_load_quantized_checks_format(tmp_path, tiny_quant):
    import shutil

    d = tmp_path / "copy"
    shutil.copytree(tiny_quant[0], d)
    meta = json.loads((d / "quantization.json").read_text())
    (d / "quantization.json").write_text(json.dumps({**meta, "version": 2}))
    with pytest.raises(UserError, match="version 2.*expected version 1"):
        qz.load_quantized(d)
    (d / "quantization.json").write_text(json.dumps({**meta, "format": "gptq"}))
    with pytest.raises(UserError, match="format 'gptq' is not supported"):
        qz.load_quantized(d)
    (d / "quantization.json").unlink()
    with pytest.raises(UserError, match="quantization.json is missing"):
        qz.load_quantized(d)
    with pytest.raises(UserError, match="quantization.json is missing"):
        qz.load_quantized(tmp_path)  # a folder without one


def _wgmma_store_x_tile(x: np.ndarray, nt: int, rb: int, gi: int) -> np.ndarray:
    """The bytes of the activation tile (row block rb, group gi) as wgmma_q4 with XT = 0 builds
    it in shared memory (kernels/wgmma_q4.cuh, load_x / store_x): unit u = (n8, ih, nb, h) loads
    the four 16-byte pieces at 32j + 16ih of k-tile h of its row and stores word t of each as
    core row t (k-step 4h + 2ih + t/2, half t%2). Rows past the matrix read its last row."""
    R = x.shape[0]
    xb = np.ascontiguousarray(x).view(np.uint8).reshape(R, -1)
    tile = np.zeros(2048 * nt, np.uint8)
    for u in range(32 * nt):
        n8, ih, nb, h = u & 7, (u >> 3) & 1, (u >> 4) % nt, u // (16 * nt)
        row = min(rb * 8 * nt + 8 * nb + n8, R - 1)
        base = gi * 256 + h * 128 + ih * 16
        words = [xb[row, base + 32 * j:base + 32 * j + 16].view(np.uint32) for j in range(4)]
        dst = ((4 * h + 2 * ih) * nt + nb) * 256 + n8 * 16
        for t, off in enumerate((0, 128, nt * 256, nt * 256 + 128)):
            tile[dst + off:dst + off + 16] = np.array([w[t] for w in words], np.uint32).view(np.uint8)
    return tile


@pytest.mark.parametrize("nt", [1, 2, 4, 8])
def test_activation_tile_order_is_wgmma_q4s_shared_tile(nt):
    """weights.tile_activations (what the norm and SwiGLU write for XT = 1) puts every value of
    a row block's group where wgmma_q4's own transpose (XT = 0) puts it in shared memory, so the
    two read the same B operand; padding rows of the last block are zero."""
    from qwen38gen.weights import tile_activations

    rng = np.random.default_rng(nt)
    R, K = 8 * nt * 2 - 3, 384
    x = rng.integers(0, 1 << 16, (R, K)).astype(np.uint16)
    tiled = tile_activations(x, nt).view(np.uint8).reshape(2, K // 128, 2048 * nt)
    for rb in range(2):
        valid = np.zeros(2048 * nt, bool)   # the bytes of rows < R
        for u in range(32 * nt):
            n8, ih, nb, h = u & 7, (u >> 3) & 1, (u >> 4) % nt, u // (16 * nt)
            if rb * 8 * nt + 8 * nb + n8 < R:
                dst = ((4 * h + 2 * ih) * nt + nb) * 256 + n8 * 16
                for off in (0, 128, nt * 256, nt * 256 + 128):
                    valid[dst + off:dst + off + 16] = True
        for gi in range(K // 128):
            want = _wgmma_store_x_tile(x, nt, rb, gi)
            assert np.array_equal(tiled[rb, gi][valid], want[valid]), (rb, gi)
            assert not tiled[rb, gi][~valid].any()


def test_both_spellings_read_alike_and_twice_is_refused(tmp_path):
    """A Qwen3_5ForCausalLM checkpoint (model.layers.*) reads under the released names; one that
    holds a tensor under both spellings is refused, naming both."""
    import safetensors.numpy as stn

    t = wt.synthetic_weights(TINY, seed=4, mtp=False)
    causal = {("model." + n[len("model.language_model."):] if n.startswith("model.language_model.")
               else n): a for n, a in t.items()}
    d = tmp_path / "causal"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(TINY.to_hf_dict()))
    stn.save_file(causal, str(d / "model.safetensors"))
    r = ck.CheckpointReader(d)
    assert r.stored_name(QPROJ3) == "model.layers.3.self_attn.q_proj.weight"
    got = ck.load_checkpoint(d, TINY, mtp=False)
    assert set(got) == set(t) and all(np.array_equal(got[n], t[n]) for n in t)
    both = dict(causal, **{QPROJ3: t[QPROJ3]})
    stn.save_file(both, str(d / "model.safetensors"))
    with pytest.raises(UserError, match=r"holds tensor 'model.language_model.layers.3.self_attn."
                                        r"q_proj.weight' twice, as .* keep one spelling"):
        ck.CheckpointReader(d)


def test_missing_mtp_names_the_no_mtp_option(tmp_path):
    t = wt.synthetic_weights(TINY, seed=4, mtp=False)
    with pytest.raises(UserError, match=r"missing tensor 'mtp\..*quantize it with MTP off "
                                        r"\(`qwen38gen quantize --no-mtp`"):
        ck.check_tensors(TINY, t)


def test_tied_checkpoint_reads_lm_head_from_the_embedding(tmp_path):
    import dataclasses

    cfg = dataclasses.replace(TINY, tie_word_embeddings=True)
    t = wt.synthetic_weights(cfg, seed=5, mtp=False)
    assert t["lm_head.weight"] is t["model.language_model.embed_tokens.weight"]
    ck.save_checkpoint(cfg, t, tmp_path / "c")
    assert "lm_head.weight" not in ck.CheckpointReader(tmp_path / "c")
    got = ck.load_checkpoint(tmp_path / "c", cfg, mtp=False)
    assert np.array_equal(got["lm_head.weight"], t["model.language_model.embed_tokens.weight"])


def test_mapped_views_equal_the_tensors_read(tiny_ckpt, tiny_quant):
    """CheckpointReader.mapped (run's GPU upload reads through it) gives every tensor's bytes,
    dtype and shape as get() reads them, read-only; a header that does not fit its file is an
    error naming the tensor."""
    for folder in (tiny_ckpt, tiny_quant[0]):
        r = ck.CheckpointReader(folder)
        for n in r.names():
            a, m = r.get(n), r.mapped(n)
            assert m.dtype == a.dtype and m.shape == a.shape, n
            assert np.array_equal(m.view(np.uint8), a.view(np.uint8)), n
            assert not m.flags.writeable
    mq = qz.load_quantized(tiny_quant[0], TINY, mapped=True)
    rq = qz.load_quantized(tiny_quant[0], TINY)
    for n, v in rq.items():
        if isinstance(v, qz.QuantizedTensor):
            assert np.array_equal(mq[n].qweight, v.qweight) and mq[n].shape == v.shape
            assert np.array_equal(mq[n].scales.view(np.uint16), v.scales.view(np.uint16))
        else:
            assert np.array_equal(np.asarray(mq[n]).view(np.uint8), v.view(np.uint8)), n


def test_mapped_view_of_a_truncated_shard_is_an_error(tmp_path, tiny_ckpt):
    import shutil

    d = tmp_path / "cut"
    shutil.copytree(tiny_ckpt, d)
    r = ck.CheckpointReader(d)
    shard = r._entry(r.names()[0])[0]
    base, offs = safetensors_offsets(shard)
    last = max(offs, key=lambda k: offs[k][3])          # the tensor at the end of the shard
    name = next(n for n in r.names() if r.stored_name(n) == last)
    shard.write_bytes(shard.read_bytes()[:-64])     # cut after the reader checked it
    with pytest.raises(UserError, match=f"cannot map tensor {name!r}"):
        r.mapped(name)
