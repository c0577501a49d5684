"""ModelConfig: presets, HF config loading, derived figures, and the errors that name the problem."""

import json

import pytest

from qwen38gen.config import PRESETS, ModelConfig, load_config
from qwen38gen.errors import UserError

Q27 = PRESETS["qwen3.8-27b"]


def test_27b_figures_match_model_and_perf():
    # docs/MODEL.md §1.1: 26.896 B text parameters, 0.425 B MTP; C = 10240, Cv = 6144.
    assert round(Q27.text_params / 1e9, 3) == 26.896
    assert round(Q27.mtp_params / 1e9, 3) == 0.425
    assert (Q27.conv_dim, Q27.linear_value_dim, Q27.q_dim, Q27.kv_dim) == (10240, 6144, 6144, 1024)
    assert Q27.full_layers == tuple(range(3, 64, 4)) and len(Q27.linear_layers) == 48
    # docs/PERFORMANCE.md: 25.622 B linear params, W = 13.21 GB, 64 KiB KV per token, 144 MiB state.
    assert round(Q27.linear_params / 1e9, 3) == 25.622
    assert round(Q27.int4_weight_bytes() / 1e9, 2) == 13.21
    assert Q27.kv_bytes_per_token == 64 * 1024
    assert Q27.recurrent_state_bytes == 144 * 2**20
    # docs/PERFORMANCE.md floor table at 4.149 TB/s, T = 1024.
    for b, gb, ms in ((1, 13.59, 3.27), (16, 19.21, 4.63), (64, 37.21, 8.97)):
        assert round(Q27.floor_bytes(b, 1024) / 1e9, 2) == gb
        assert round(Q27.floor_seconds(b, 1024, 4.149e12) * 1e3, 2) == ms


def test_small_presets_geometry():
    tiny, toy = PRESETS["tiny"], PRESETS["toy"]
    assert tiny.conv_dim == 1280 and tiny.tensor_shapes()[
        "model.language_model.layers.3.self_attn.q_proj.weight"] == (3072, 512)
    assert tiny.tensor_shapes()["mtp.fc.weight"] == (512, 1024)
    assert toy.conv_dim == 208 and toy.rotary_dim == 8
    assert toy.tensor_shapes()["model.language_model.layers.0.linear_attn.in_proj_z.weight"] == (144, 64)


@pytest.mark.parametrize("wrap", [False, True])
def test_hf_round_trip(tmp_path, wrap):
    for cfg in PRESETS.values():
        d = cfg.to_hf_dict()
        if wrap:  # Qwen3_5ForConditionalGeneration keeps the text config under text_config
            d = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
                 "text_config": d, "vision_config": {}}
        p = tmp_path / f"{cfg.name}.json"
        p.write_text(json.dumps(d))
        back = load_config(p)
        assert back.geometry_dict() == cfg.geometry_dict()
        assert back.hash == cfg.hash


def test_interval_instead_of_layer_types(tmp_path):
    d = Q27.to_hf_dict()
    del d["layer_types"]
    d["full_attention_interval"] = 4
    assert ModelConfig.from_hf_dict(d).layer_types == Q27.layer_types


def test_unknown_preset():
    with pytest.raises(UserError, match=r"unknown model 'qwen9'.*presets are qwen3.8-27b, qwen3.5-0.8b, qwen3.5-2b, qwen3.5-4b, qwen3.5-9b, tiny, toy"):
        load_config("qwen9")


def test_malformed_json(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("{not json")
    with pytest.raises(UserError, match="is not valid JSON"):
        load_config(p)


def test_missing_key():
    d = PRESETS["tiny"].to_hf_dict()
    del d["linear_num_value_heads"]
    with pytest.raises(UserError, match="missing key 'linear_num_value_heads'"):
        ModelConfig.from_hf_dict(d)


def test_inconsistent_dimensions():
    d = PRESETS["tiny"].to_hf_dict()
    d["num_key_value_heads"] = 4  # 6 q heads are not a multiple of 4 kv heads
    with pytest.raises(UserError, match=r"num_attention_heads \(6\) must be a multiple of num_key_value_heads \(4\)"):
        ModelConfig.from_hf_dict(d)
    d = PRESETS["tiny"].to_hf_dict()
    d["layer_types"] = d["layer_types"][:-1]
    with pytest.raises(UserError, match="layer_types has 7 entries but num_hidden_layers is 8"):
        ModelConfig.from_hf_dict(d)


def test_unknown_layer_type():
    d = PRESETS["tiny"].to_hf_dict()
    d["layer_types"][2] = "sliding_attention"
    with pytest.raises(UserError, match=r"layer_types\[2\] is 'sliding_attention'; supported layer types"):
        ModelConfig.from_hf_dict(d)


def test_wrong_model_type():
    d = PRESETS["tiny"].to_hf_dict()
    d["model_type"] = "llama"
    with pytest.raises(UserError, match="model_type 'llama' is not supported"):
        ModelConfig.from_hf_dict(d)


def _without_rope(d, key):
    d["rope_parameters"].pop(key, None)
    return d


@pytest.mark.parametrize("edit,pattern", [
    (lambda d: d.update(head_dim="256"), r'head_dim is "256"; expected a positive integer'),
    (lambda d: d.update(head_dim=[256]), r"head_dim is \[256\]; expected a positive integer"),
    (lambda d: _without_rope(d, "partial_rotary_factor").update(partial_rotary_factor="0.25"),
     r'partial_rotary_factor is "0.25"; expected a positive number'),
    (lambda d: d["rope_parameters"].update(partial_rotary_factor="0.25"),
     r'rope_parameters.partial_rotary_factor is "0.25"; expected a positive number'),
    (lambda d: d.update(rms_norm_eps="1e-6"), r'rms_norm_eps is "1e-6"; expected a positive number'),
    (lambda d: d["rope_parameters"].update(rope_theta="1e7"),
     r'rope_parameters.rope_theta is "1e7"; expected a positive number'),
    (lambda d: _without_rope(d, "rope_theta").update(rope_theta=None),
     r"rope_theta is null; expected a positive number"),
    (lambda d: d.update(mtp_num_hidden_layers="1"),
     r'mtp_num_hidden_layers is "1"; expected an integer ≥ 0'),
    (lambda d: d.update(max_position_embeddings="262144"),
     r'max_position_embeddings is "262144"; expected a positive integer'),
    (lambda d: d.pop("layer_types") and d.update(full_attention_interval=0),
     r"full_attention_interval is 0; expected a positive integer"),
    (lambda d: d.pop("layer_types") and d.update(full_attention_interval="4"),
     r'full_attention_interval is "4"; expected a positive integer'),
    (lambda d: d.update(layer_types=8),
     r"layer_types is 8; expected a list of layer type names \(linear_attention, full_attention\)"),
    (lambda d: d.update(attn_output_gate="yes"), r'attn_output_gate is "yes"; expected true or false'),
    (lambda d: d["rope_parameters"].update(mrope_section=[11, "11", 10]),
     r'rope_parameters.mrope_section is \[11, "11", 10\]; expected a list of non-negative integers'),
    (lambda d: d.update(eos_token_id=-1), r"eos_token_id is -1; expected a token id"),
])
def test_mistyped_keys_name_the_key_and_the_value(edit, pattern):
    """Each mistyped or out-of-range key of an HF config is one UserError naming the key, its
    value as JSON and what is expected (tracebacks before: int('256' * 0.25) and such)."""
    d = PRESETS["tiny"].to_hf_dict()
    edit(d)
    with pytest.raises(UserError, match=r"^config 'hf': " + pattern):
        ModelConfig.from_hf_dict(d)


def test_resolve_model_takes_a_preset_a_config_json_or_a_folder(tmp_path):
    from qwen38gen.config import resolve_model

    r = resolve_model("tiny")
    assert r.config is PRESETS["tiny"] and r.model_dir is None and not r.has_weights
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(PRESETS["toy"].to_hf_dict()))
    for spec in (d, d / "config.json", str(d)):
        r = resolve_model(spec)
        assert r.config.hash == PRESETS["toy"].hash and r.model_dir == d and not r.has_weights
    (d / "model.safetensors").write_bytes(b"")
    assert resolve_model(d).has_weights
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match=r"model folder '.*empty' has no config.json; pass a preset"):
        resolve_model(tmp_path / "empty")
    with pytest.raises(UserError, match=r"unknown model 'nope'"):
        resolve_model("nope")
