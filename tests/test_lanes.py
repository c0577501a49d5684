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


def test_spec_sample_needs_an_mtp_program():
    """spec_sample=1 only with --mtp; the table's choice (the default) is on in mtp programs and
    off in plain ones, spec_sample=0 keeps the host path; the plain lanes beside an mtp lane take
    the table's (no tuning suffix of their own)."""
    from qwen38gen.tuning import Tuning

    t = Tuning.parse(["spec_sample=1"])
    assert Lanes.make(3, mtp=1, tuning=t).spec_sample
    with pytest.raises(UserError, match=r"^tuning spec_sample=1 is for mtp programs .*give --mtp K"):
        Lanes.make(3, tuning=t)
    assert Lanes.make(3, mtp=1).spec_sample and not Lanes.make(3).spec_sample
    off = Lanes.make(3, mtp=1, tuning=Tuning.parse(["spec_sample=0"]))
    assert not off.spec_sample and off.name.endswith(off.tuning.suffix()) and off.tuning.suffix()
    assert Tuning.parse(["spec_sample=table"]) == Tuning()
    p = Lanes.make(3, mtp=1, tuning=Tuning.parse(["spec_sample=1", "gdn_ge=4"])).plain(pt=1)
    assert (p.mtp, p.pt, p.spec_sample, p.tuning.gdn_ge) == (0, 1, False, 4)
    assert Lanes.make(3, mtp=1).plain().name == Lanes.make(3).name


def test_the_default_tile_of_a_model_whose_weights_sit_in_l2():
    """Given the model, a model whose int4 weights fit SMALL_WEIGHTS takes at most 16 rows a
    tile (version 28, H100: the tiny model's B = 64 step 0.56 -> 0.26 ms); the others as before;
    an explicit btg wins."""
    from qwen38gen.config import PRESETS
    from qwen38gen.lanes import SMALL_WEIGHTS

    tiny, big = PRESETS["tiny"], PRESETS["qwen3.8-27b"]
    assert tiny.int4_weight_bytes() <= SMALL_WEIGHTS < PRESETS["qwen3.5-0.8b"].int4_weight_bytes()
    assert [Lanes.make(b, model=tiny).btg for b in (1, 7, 16, 17, 32, 64, 200)] == \
        [8, 8, 16, 16, 16, 16, 16]
    assert [Lanes.make(b, model=big).btg for b in (1, 16, 17, 64)] == [8, 16, 24, 64]
    assert Lanes.make(64, btg=64, model=tiny).btg == 64


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


# ------------------------------------------------------------------------------------ tuning
def test_tuning_defaults_keep_the_name():
    """The table's choices add nothing to the name, the header's lanes or the lane dict; a
    Tuning built from no settings is the default one."""
    from qwen38gen.tuning import Tuning

    ln = Lanes.make(16, pt=16)
    assert ln.tuning == Tuning() == Tuning.parse([]) and ln.tuning.settings() == []
    assert ln.name == "b16-btg16-pt16-q4-mtp0-sm90a-lmint4" and "tuning" not in ln.to_dict()


@pytest.mark.parametrize("setting,msg", [
    ("gemv_zs=3", "tuning gemv_zs='3' is not supported; supported gemv_zs: table, 1, 2, 4, 8"),
    ("swiglu_fuse=yes", "tuning swiglu_fuse='yes' is not supported; supported swiglu_fuse: 0, 1"),
    ("wgmma_sk=1", "tuning wgmma_sk='1' is not supported; supported wgmma_sk: table, off, all"),
    ("gdn_sr=12", "tuning key 'gdn_sr' is not known; keys: gemv_zs, "),
    ("gdn_ge=-2", "tuning gdn_ge='-2' is not supported; supported gdn_ge: table, -1..16"),
    ("attn_st=1", "tuning attn_st='1' is not supported; supported attn_st: 2, 3, 4"),
    ("attn_grid=0", "tuning attn_grid='0' is not supported; supported attn_grid: table, 1..1024"),
    ("gate_up.sk16=4:6:2", "tuning gate_up.sk16='4:6:2' is not supported; supported "
                           "gate_up.sk16: CW:XS:PP, CW 1..4, XS 2..16, PP 0 or 1"),
    ("down.wgmma_zs=3", "tuning down.wgmma_zs='3' is not supported; supported down.wgmma_zs: "
                        "1, 2, 4, 8 (dividing the weight's parts of K)"),
    ("mlp.sk16=3:6:1", "tuning key 'mlp.sk16': 'mlp' is not a weight role; roles: in, out, "
                       "gate_up, down, lm_head, fc"),
    ("sk16=3:6:1", "tuning key 'sk16' is not known; keys: gemv_zs, swiglu_fuse, out_xt, "
                   "wgmma_sk, ROLE.wgmma_zs, ROLE.sk_cfg, ROLE.sk16, ROLE.sk8, gdn_ge, "
                   "gdn_gw, attn_st, attn_mb, attn_grid"),
    ("in.gdn_ge=4", "tuning key 'in.gdn_ge' is not known"),
    ("gdn_ge", "tuning setting 'gdn_ge' is not KEY=VALUE; e.g. gdn_ge=4 or gate_up.sk16=3:6:1"),
])
def test_bad_tuning_names_field_value_and_allowed_set(setting, msg):
    from qwen38gen.tuning import Tuning

    with pytest.raises(UserError, match="^" + __import__("re").escape(msg)):
        Tuning.parse([setting])


def test_bad_tuning_fields_in_the_constructor():
    from qwen38gen.tuning import Tuning

    with pytest.raises(UserError, match=r"^tuning gdn_ge=17 is not supported; supported gdn_ge: "
                                        r"table, -1\.\.16$"):
        Tuning(gdn_ge=17)
    with pytest.raises(UserError, match=r"^tuning swiglu_fuse=1 is not supported"):
        Tuning(swiglu_fuse=1)
    with pytest.raises(UserError, match=r"^tuning up\.sk8: 'up' is not a weight role"):
        Tuning(sk8=(("up", (3, 6, 1)),))
    with pytest.raises(UserError, match=r"^lane tuning='gdn_ge=4' is not a Tuning"):
        Lanes.make(4, tuning="gdn_ge=4")
    # per-role fields are held sorted, so equal settings give equal (hashable) values
    a = Tuning(sk16={"in": (3, 6, 1), "gate_up": (3, 6, 1)})
    b = Tuning.parse(["in.sk16=3:6:1", "gate_up.sk16=3:6:1"])
    assert a == b and hash(a) == hash(b) and a.sk16 == (("gate_up", (3, 6, 1)), ("in", (3, 6, 1)))


def test_tuned_names_are_distinct_and_deterministic():
    """Every non-default setting gives its own lane name (and so its own file name, golden
    name and gate cache key); the same settings in any order give the same name."""
    from qwen38gen.tuning import ROLES, Tuning

    settings = (["gemv_zs=1", "gemv_zs=2", "swiglu_fuse=0", "out_xt=0", "wgmma_sk=off",
                 "wgmma_sk=all", "gdn_ge=-1", "gdn_ge=4", "gdn_gw=0", "attn_st=3",
                 "attn_mb=1", "attn_grid=264"]
                + [f"{r}.{f}={v}" for r in ROLES for f, v in (
                    ("sk16", "3:6:1"), ("sk16", "4:6:0"), ("sk8", "3:6:1"), ("sk_cfg", "3:6:1"),
                    ("wgmma_zs", "2"))])
    names = [Lanes.make(16, pt=16, tuning=Tuning.parse([s])).name for s in settings]
    assert len(set(names)) == len(names)
    assert all(n.startswith("b16-btg16-pt16-q4-mtp0-sm90a-lmint4-t") for n in names)
    pair = Lanes.make(16, tuning=Tuning.parse(["gdn_ge=4", "in.sk16=3:6:1"]))
    assert pair.name == Lanes.make(16, tuning=Tuning.parse(["in.sk16=3:6:1", "gdn_ge=4"])).name
    assert pair.name not in names and pair.to_dict()["tuning"] == {"gdn_ge": "4",
                                                                   "in.sk16": "3:6:1"}
    # setting a field back to its default is the default program
    assert Lanes.make(16, tuning=Tuning.parse(["gdn_ge=4", "gdn_ge=table"])).name == \
        Lanes.make(16).name


def test_tuning_from_the_old_environment_variables():
    """The A/B runs' QWEN38_* variables (read by the CLI at call time) map to tuning settings,
    the 27B's row classes to roles; a bad value names the variable."""
    from qwen38gen.tuning import Tuning, tuning_from_env

    env = {"QWEN38_SK16": "gate_up=3:6:1", "QWEN38_WGMMA_ZS": "long=4,narrow=2",
           "QWEN38_WGMMA_SK": "all", "QWEN38_GDN_GE": "-1", "QWEN38_SWIGLU_FUSE": "0",
           "QWEN38_GEMV_ZS": "", "QWEN38_SK_CFG": "lm_head=4:4:0"}
    t = Tuning.parse(tuning_from_env(env))
    assert t.settings() == [("down.wgmma_zs", "4"), ("fc.wgmma_zs", "4"), ("gate_up.sk16", "3:6:1"),
                            ("gdn_ge", "-1"), ("lm_head.sk_cfg", "4:4:0"), ("out.wgmma_zs", "2"),
                            ("swiglu_fuse", "0"), ("wgmma_sk", "all")]
    assert tuning_from_env({}) == [] and tuning_from_env({"QWEN38_WGMMA_SK": "1"}) == ["wgmma_sk=table"]
    for var, val, msg in [
        ("QWEN38_GEMV_ZS", "3", "QWEN38_GEMV_ZS='3': use 1 (no cluster split), or 2, 4 or 8"),
        ("QWEN38_WGMMA_ZS", "down=2", "QWEN38_WGMMA_ZS='down=2': use kind=ZS pairs separated by "
                                      "commas, kind one of gate_up, in, lm_head, long, narrow"),
        ("QWEN38_WGMMA_SK", "yes", "QWEN38_WGMMA_SK='yes': use 1 (the default"),
        ("QWEN38_SK8", "lm_head=3:6", "QWEN38_SK8='lm_head=3:6': 'lm_head=3:6' is not kind=CW:XS:PP"),
        ("QWEN38_GDN_SR", "12", "QWEN38_GDN_SR='12': removed (state rows in shared memory, "
                                "replaced by gdn_ge in version 17); use QWEN38_GDN_GE or --tune "
                                "gdn_ge=N, or leave it unset"),
        ("QWEN38_GDN_GE", "17", "QWEN38_GDN_GE='17': use -1 (every state row first) or 0 … 16"),
    ]:
        with pytest.raises(UserError, match="^" + __import__("re").escape(msg)):
            tuning_from_env({var: val})


def test_tune_file(tmp_path):
    from qwen38gen.tuning import read_tune_file

    f = tmp_path / "t.txt"
    f.write_text("# the v22 16-row sweep\ngate_up.sk16=3:6:1   # gate_up only\n\n gdn_ge=4\n")
    assert read_tune_file(f) == ["gate_up.sk16=3:6:1", "gdn_ge=4"]
    with pytest.raises(UserError, match=r"^tune file '.*nope' does not exist"):
        read_tune_file(tmp_path / "nope")


def test_no_module_reads_the_environment_at_import():
    """Importing every module of qwen38gen afresh, with os.environ (and so os.getenv) raising on
    any read, succeeds: nothing in the package reads the environment at import."""
    import subprocess
    import sys
    from pathlib import Path

    code = r'''
import importlib, os, pkgutil, sys
import qwen38gen
names = sorted(m.name for m in pkgutil.walk_packages(qwen38gen.__path__, "qwen38gen."))
for n in names:          # first with the environment: third-party imports are then cached
    importlib.import_module(n)
for n in [m for m in sys.modules if m == "qwen38gen" or m.startswith("qwen38gen.")]:
    del sys.modules[n]

class Raising:
    def _no(self, *a, **k):
        raise AssertionError(f"environment read at import: {a[:1]}")
    __getitem__ = __contains__ = __iter__ = __len__ = get = keys = items = copy = _no
    setdefault = pop = __setitem__ = _no

os.environ = Raising()
for n in ["qwen38gen"] + names:
    importlib.import_module(n)
print(len(names), "modules")
'''
    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert p.returncode == 0, p.stderr
    assert int(p.stdout.split()[0]) >= 20, p.stdout


def test_lanes_command_lists_the_tuning_fields():
    import subprocess
    import sys
    from pathlib import Path

    from qwen38gen.tuning import KNOBS, keys

    root = Path(__file__).resolve().parents[1]
    p = subprocess.run([sys.executable, "-m", "cli", "lanes"], capture_output=True, text=True,
                       cwd=root, env={"COLUMNS": "250", "PATH": "/usr/bin:/bin"})
    assert p.returncode == 0, p.stderr
    rows = {ln.split("│")[1].strip(): [c.strip() for c in ln.split("│")[2:4]]
            for ln in p.stdout.splitlines() if ln.count("│") >= 5}
    assert rows["gdn_ge"] == ["table, -1..16", "table"] and rows["attn_st"] == ["2, 3, 4", "2"]
    assert rows["ROLE.sk16"] == ["CW:XS:PP, CW 1..4, XS 2..16, PP 0 or 1", "table"]
    assert all(k in rows for k in keys()) and len(keys()) == len(KNOBS)
    assert "ROLE: in, out, gate_up, down, lm_head, fc" in p.stdout


def test_verify_btg_needs_an_mtp_program():
    """verify_btg (the verify pass at a wider tile) only with --mtp; the error names the fix."""
    from qwen38gen.tuning import Tuning

    t = Tuning.parse(["verify_btg=32"])
    assert Lanes.make(16, mtp=1, tuning=t).tuning.verify_btg == 32
    with pytest.raises(UserError, match=r"^tuning verify_btg=32 is for mtp programs .*give --mtp K"):
        Lanes.make(16, tuning=t)
    assert Lanes.make(16, mtp=1, tuning=t).plain(pt=1).name == Lanes.make(16, pt=1).name
    assert Lanes.make(16, mtp=1).plain(pt=1).name == Lanes.make(16, pt=1).name
    with pytest.raises(UserError, match=r"^tuning verify_btg='16' is not supported; supported "
                                        r"verify_btg: table, 0, 32, 64"):
        Tuning.parse(["verify_btg=16"])
