"""scripts/ab_step.py, the step A/B harness: its spec grammar, the patched trees it makes (all or
nothing), the environment each variant runs under, and the table it prints from bench's json."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import ab_step  # noqa: E402


def test_spec_grammar():
    vs = ab_step.parse_spec("""
        # the base first
        base
        cw4   tune=gate_up.sk_cfg=4:4:0   # a comment
        four  patch=a.diff patch=b.diff tune=gate_up.sk_cfg=4:4:0 tune=lm_head.sk_cfg=4:4:0 GEMV_X=
    """)
    assert [v.name for v in vs] == ["base", "cw4", "four"]
    assert vs[0].patches == [] and vs[0].env == {} and vs[0].tune == []
    assert vs[1].tune == ["gate_up.sk_cfg=4:4:0"] and vs[1].env == {}
    assert vs[1].tune_args() == ["--tune", "gate_up.sk_cfg=4:4:0"]
    assert vs[2].patches == ["a.diff", "b.diff"]
    assert vs[2].tune == ["gate_up.sk_cfg=4:4:0", "lm_head.sk_cfg=4:4:0"]
    assert vs[2].env == {"GEMV_X": ""}
    root = Path("/r")
    assert vs[1].tree(root) == root and vs[2].tree(root) == root / ".ab" / "four"


@pytest.mark.parametrize("text, says", [
    ("", "no variants"),
    ("# only a comment\n", "no variants"),
    ("base\nbase", "named twice"),
    ("-x", "not a variant name"),
    ("a/b", "not a variant name"),
    ("base lowercase=1", "neither patch=FILE, tune=KEY=VALUE nor NAME=VALUE"),
    ("base QWEN38_SK_CFG", "neither patch=FILE, tune=KEY=VALUE nor NAME=VALUE"),
    ("base tune=gdn_ge", "'tune=gdn_ge' is not tune=KEY=VALUE"),
])
def test_spec_errors_name_the_line(text, says):
    with pytest.raises(ab_step.SpecError, match=says) as e:
        ab_step.parse_spec(text, where="s.txt")
    assert str(e.value).startswith("s.txt")


def test_batches():
    assert ab_step.parse_batches("64") == [64] and ab_step.parse_batches("16, 64") == [16, 64]
    for bad in ("", "x", "0", "16,-1"):
        with pytest.raises(ab_step.SpecError, match="positive integers"):
            ab_step.parse_batches(bad)


def _repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "kernels").mkdir(parents=True)
    (root / "bench").mkdir()
    (root / "kernels" / "k.cuh").write_text("int a = 1;\n")
    (root / "bench" / "data.txt").write_text("big\n")
    (root / ".gitignore").write_text("/.ab/\n")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "."], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "x"], cwd=root, check=True)
    (root / "untracked.py").write_text("u = 1\n")
    (root / "kernels" / "k.cuh").write_text("int a = 2;\n")
    diff = subprocess.run(["git", "diff"], cwd=root, capture_output=True, text=True).stdout
    subprocess.run(["git", "checkout", "-q", "kernels/k.cuh"], cwd=root, check=True)
    (root / "p.diff").write_text(diff)
    (root / "q.diff").write_text(diff.replace("int a = 1;", "int a = 9;"))
    return root


def test_tree_is_the_checkout_patched(tmp_path):
    root = _repo(tmp_path)
    t = ab_step.make_tree(ab_step.Variant("v", ["p.diff"]), root)
    assert t == root / ".ab" / "v"
    assert (t / "kernels" / "k.cuh").read_text() == "int a = 2;\n"
    assert (t / "untracked.py").exists() and not (t / "bench").exists()
    assert (root / "kernels" / "k.cuh").read_text() == "int a = 1;\n"   # the checkout untouched
    assert [p.name for p in (root / ".ab").iterdir()] == ["v"]


def test_a_patch_that_does_not_apply_leaves_nothing(tmp_path):
    root = _repo(tmp_path)
    with pytest.raises(ab_step.SpecError, match="'q.diff' does not apply"):
        ab_step.make_tree(ab_step.Variant("v", ["q.diff"]), root)
    with pytest.raises(ab_step.SpecError, match="'nope.diff' not found"):
        ab_step.make_tree(ab_step.Variant("w", ["nope.diff"]), root)
    assert list((root / ".ab").iterdir()) == []


def test_variant_env(tmp_path):
    root = tmp_path
    v = ab_step.Variant("v", ["p.diff"], {"QWEN38_SK_CFG": "gate_up=4:4:0"})
    env = ab_step.variant_env(v, root, {"PYTHONPATH": f"/site:{root}", "QWEN38_CACHE": "/elsewhere"})
    assert env["PYTHONPATH"] == f"{root / '.ab' / 'v'}:/site"
    assert env["QWEN38_CACHE"] == str(root / ".cache" / "ab")     # one cache for every tree
    assert env["QWEN38_SK_CFG"] == "gate_up=4:4:0"
    assert ab_step.variant_env(ab_step.Variant("b"), root, {})["PYTHONPATH"] == str(root)


def _bench(step: dict, bw: float = 4.2e12) -> dict:
    return {"copy_bandwidth": bw, "rows": [
        {"batch": b, "step_ms": s, "graph_ms": {"gemv": s / 2, "delta rule": 1.0}}
        for b, s in step.items()]}


def test_summary_medians_and_changes():
    vs = ab_step.parse_spec("base\nnew X=1")
    runs = {"base": [_bench({16: 8.0, 64: 17.0}), _bench({16: 8.2, 64: 17.4}, 4.3e12)],
            "new": [_bench({16: 8.1, 64: 16.0}), _bench({16: 8.1, 64: 16.2})]}
    lines = ab_step.summarize(vs, runs)
    assert lines[0].split()[:3] == ["B", "variant", "step"]
    b16, n16, b64, n64 = lines[1:]
    assert b16.split()[:4] == ["16", "base", "8.100", "8.000-8.200"]
    assert n16.split()[:6] == ["16", "new", "8.100", "8.100-8.100", "+0.000", "+0.0%"]
    assert b64.split()[2] == "17.200" and b64.endswith("4.200-4.300")
    assert n64.split()[2:6] == ["16.100", "16.000-16.200", "-1.100", "-6.4%"]
    assert n64.split()[6:9] == ["8.050", "1.000", "0.000"]   # gemv, delta rule, attention


def test_cli_user_errors_exit_2(tmp_path, capsys):
    assert ab_step.main(["prep", str(tmp_path / "none.txt")]) == 2
    assert "not found" in capsys.readouterr().err
    spec = tmp_path / "s.txt"
    spec.write_text("base\nv patch=p.diff\n")
    assert ab_step.main(["run", str(spec), "--batch", "0"]) == 2
    assert "positive integers" in capsys.readouterr().err
    assert ab_step.main(["run", str(spec), "--rounds", "0"]) == 2
    assert ab_step.main(["run", str(spec)]) == 2    # no .ab/v: prep first
    assert "prep" in capsys.readouterr().err


FAKE_CLI = '''
import json, os, sys
a = sys.argv[1:]
assert a[:3] == ["bench", "--model", "qwen3.8-27b"] and a[5:7] == ["--ctx", "1024"], a
if os.environ.get("FAIL"):
    sys.exit("no GPU")
here = os.path.basename(os.getcwd())
with open(os.environ["LOG"], "a") as f:
    f.write(" ".join([here, os.environ.get("X", "-")] + a[9:]) + "\\n")
step = float(open("step.txt").read())
rows = [{"batch": int(b), "step_ms": step + int(b), "graph_ms": {"gemv": 1.0}} for b in a[4].split(",")]
json.dump({"copy_bandwidth": 4.2e12, "rows": rows}, open(a[8], "w"))
'''


def test_run_alternates_variants_in_their_trees(tmp_path, capsys):
    root = tmp_path / "repo"
    for name, step in (("", "1.0"), (".ab/p", "0.5")):
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / "cli.py").write_text(FAKE_CLI)
        (root / name / "step.txt").write_text(step)
    log = tmp_path / "log"
    vs = ab_step.parse_spec("base\nx X=7\np patch=p.diff\nt tune=gdn_ge=4 tune=in.sk16=3:6:1\n"
                            "broken FAIL=1")
    env = {"LOG": str(log), "PATH": "/usr/bin:/bin"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ab_step.os, "environ", env)
        lines = ab_step.run(vs, [16], 2, str(tmp_path / "ab.json"), root=root)
    assert log.read_text().split("\n")[:-1] == [
        "repo -", "repo 7", "p -", "repo - --tune gdn_ge=4 --tune in.sk16=3:6:1"] * 2
    assert "variant 'broken': bench exited 1:\nno GPU" in capsys.readouterr().out
    assert [ln.split()[1:3] for ln in lines[1:]] == [["base", "17.000"], ["x", "17.000"], ["p", "16.500"],
                                                     ["t", "17.000"]]
    assert lines[3].split()[4:6] == ["-0.500", "-2.9%"]
    assert (tmp_path / "ab.json").exists()


def test_run_refuses_what_prep_did_not_make(tmp_path):
    """run checks each variant against what prep recorded: a missing tree or stamp, a patch or a
    setting changed since, or a batch not prepared is a SpecError that says to run prep."""
    root = _repo(tmp_path)
    base, v = ab_step.parse_spec("base X=1\nv patch=p.diff")
    with pytest.raises(ab_step.SpecError, match="no tree for 'v'"):
        ab_step.check_prepared([v], [64], root)
    ab_step.make_tree(v, root)
    with pytest.raises(ab_step.SpecError, match="'base' was not prepared"):
        ab_step.check_prepared([base, v], [64], root)
    for x in (base, v):   # what prep writes once a variant's programs are built
        p = ab_step._stamp_path(x, root)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(json.dumps({**ab_step.stamp(x, root), "batches": [16, 64]}))
    ab_step.check_prepared([base, v], [64], root)
    ab_step.check_prepared([base, v], [16, 64], root)
    with pytest.raises(ab_step.SpecError, match="'base': batch 32 not prepared .prepared: 16,64."):
        ab_step.check_prepared([base, v], [32, 64], root)
    with pytest.raises(ab_step.SpecError, match="'base' changed since it was prepared"):
        ab_step.check_prepared(ab_step.parse_spec("base X=2"), [64], root)
    (root / "p.diff").write_text((root / "p.diff").read_text() + "\n")
    with pytest.raises(ab_step.SpecError, match="'v' changed since it was prepared"):
        ab_step.check_prepared([v], [64], root)


def test_prep_stamps_keep_the_batches_of_the_same_variant(tmp_path, monkeypatch):
    """A base named in several specs, prepared at different batches, stays prepared for all of
    them; a variant whose settings change is prepared anew (its old batches dropped)."""
    calls = []

    def fake_run(cmd, **kw):   # precompile.py: record the batch specs, succeed
        calls.append(cmd[2:])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(ab_step.subprocess, "run", fake_run)
    root = tmp_path
    (root / ".ab").mkdir()
    ab_step.prep(ab_step.parse_spec("base"), [64], root=root)
    ab_step.prep(ab_step.parse_spec("base"), [1, 16], root=root)
    assert calls == [["qwen3.8-27b:64"], ["qwen3.8-27b:1", "qwen3.8-27b:16"]]
    base = ab_step.parse_spec("base")
    ab_step.check_prepared(base, [1, 16, 64], root)
    ab_step.prep(ab_step.parse_spec("base X=1"), [16], root=root)
    with pytest.raises(ab_step.SpecError, match="'base' changed since"):
        ab_step.check_prepared(base, [16], root)
    with pytest.raises(ab_step.SpecError, match="batch 64 not prepared"):
        ab_step.check_prepared(ab_step.parse_spec("base X=1"), [64], root)
    ab_step.prep(ab_step.parse_spec("base tune=gdn_ge=4"), [16], root=root)   # --tune to precompile
    assert calls[-1] == ["--tune", "gdn_ge=4", "qwen3.8-27b:16"]
    with pytest.raises(ab_step.SpecError, match="'base' changed since"):
        ab_step.check_prepared(ab_step.parse_spec("base tune=gdn_ge=8"), [16], root)
    ab_step.check_prepared(ab_step.parse_spec("base tune=gdn_ge=4"), [16], root)
