"""Lanes: defaults, the QWEN38_PT environment, the one name, and rejections naming the field."""

import dataclasses

import pytest

from qwen38gen.config import PRESETS
from qwen38gen.errors import UserError
from qwen38gen.lanes import DEFAULT_PT, PT_ENV, Lanes, check_model, lane_name


def test_defaults_and_name(monkeypatch):
    monkeypatch.delenv(PT_ENV, raising=False)
    ln = Lanes.make(16)
    assert (ln.batch, ln.btg, ln.pt, ln.q4, ln.mtp, ln.arch, ln.lm_head) == (
        16, 16, DEFAULT_PT, True, 0, "sm_90a", "int4")
    assert lane_name(ln) == f"b16-btg16-pt{DEFAULT_PT}-q4-mtp0-sm90a-lmint4"
    assert Lanes.make(16, arch="sm_90").name == f"b16-btg16-pt{DEFAULT_PT}-q4-mtp0-sm90-lmint4"
    assert Lanes.make(1).btg == 8 and Lanes.make(17).btg == 24 and Lanes.make(24).btg == 24 \
        and Lanes.make(25).btg == 32 and Lanes.make(64).btg == 64 \
        and Lanes.make(200).btg == 64


def test_pt_from_environment(monkeypatch):
    monkeypatch.setenv(PT_ENV, "64")
    assert Lanes.make(4).pt == 64
    assert Lanes.make(4, pt=8).pt == 8  # explicit wins
    monkeypatch.setenv(PT_ENV, "lots")
    with pytest.raises(UserError, match="QWEN38_PT='lots' is not an integer"):
        Lanes.make(4)


@pytest.mark.parametrize("kw,msg", [
    (dict(batch=0), r"lane batch=0 is not supported; supported batch: 1\.\.256"),
    (dict(batch=4, btg=12), r"lane btg=12 is not supported; supported btg: 8, 16, 24, 32, 64"),
    (dict(batch=3, btg=32), r"btg=32 is larger than batch=3 needs; .* supported btg are 8"),
    (dict(batch=4, arch="sm_80"), r"lane arch='sm_80' is not supported; supported arch: sm_90a, sm_90"),
    (dict(batch=4, pt=0), r"lane pt=0 is not supported; supported pt: 1\.\.128"),
    (dict(batch=4, lm_head="fp8"), r"lane lm_head='fp8' is not supported; supported lm_head: int4"),
    (dict(batch=4, q4=False), r"lane q4=False is not supported"),
])
def test_bad_lanes(kw, msg):
    with pytest.raises(UserError, match=msg):
        Lanes.make(**kw)


def test_model_support():
    check_model(PRESETS["tiny"])
    check_model(PRESETS["qwen3.8-27b"])
    with pytest.raises(UserError, match=r"model 'toy': linear_key_head_dim=16 is not supported"):
        check_model(PRESETS["toy"])
    wide = dataclasses.replace(PRESETS["tiny"], name="tiny-g12", num_attention_heads=12,
                               num_key_value_heads=1)
    with pytest.raises(UserError, match=r"12 query heads over 1 kv heads is 12 per kv head.*"
                                        r"supported: 1\.\.8"):
        check_model(wide)
