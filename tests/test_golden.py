"""Golden files: refused when stale or corrupted (naming the regenerate command), and the committed
file agrees with the numpy reference (the CPU half of `qwen38gen check`, run in CI)."""

import json
import shutil

import pytest

from qwen38gen.errors import UserError
from qwen38gen.verify import golden as G
from qwen38gen.verify.check import validate_golden

PATH = G.golden_path()


def test_golden_file_is_committed():
    assert PATH.is_file(), f"{PATH} is missing: {G.REGENERATE}"


@pytest.fixture()
def doc():
    return json.loads(PATH.read_text())


def _write(tmp_path, d):
    p = tmp_path / "g.json"
    p.write_text(json.dumps(d) if isinstance(d, dict) else d)
    return p


def test_loads_and_has_the_setup():
    g = G.load_golden()
    assert len(g.sequences) >= 16 and g.steps >= 64
    lens = [len(s["prompt"]) for s in g.sequences]
    assert min(lens) == 1 and max(lens) > 64
    assert all(len(s["tokens"]) == g.steps and len(s["topk"]) == g.steps for s in g.sequences)
    assert g.lane == G.golden_lanes().name


@pytest.mark.parametrize("mutate,pattern", [
    (lambda d: d.update(version=99), r"format version 99.*regenerate it with: qwen38gen golden --update"),
    (lambda d: d.update(config_hash="000000000000"), r"is stale: config hash 000000000000"),
    (lambda d: d["sequences"][3]["tokens"].__setitem__(5, 7), r"corrupted \(payload digest mismatch\)"),
    (lambda d: d.update(format="other"), r"is not a qwen38gen-golden file"),
])
def test_refuses_stale_or_corrupted(tmp_path, doc, mutate, pattern):
    mutate(doc)
    with pytest.raises(UserError, match=pattern):
        G.load_golden(_write(tmp_path, doc))


def test_refuses_truncated_file(tmp_path):
    with pytest.raises(UserError, match=r"corrupted \(not JSON"):
        G.load_golden(_write(tmp_path, PATH.read_text()[:1000]))


@pytest.mark.slow
def test_golden_agrees_with_reference():
    res = validate_golden(G.load_golden())
    bad = [r for r in res.rows if r[-1] != "ok"]
    assert res.ok, f"golden vs reference mismatches: {bad}"


def _payload(edit):
    """An edit of the sequences with the digest recomputed: the shape checks must catch it."""
    def mutate(d):
        edit(d["sequences"])
        d["digest"] = G._digest(d["sequences"])
    return mutate


@pytest.mark.parametrize("mutate,pattern", [
    (lambda d: d.pop("lane"), r"lacks the key 'lane'"),
    (lambda d: d.pop("weights"), r"lacks the key 'weights'"),
    (lambda d: d["weights"].update(seed=7), r'is stale: weights is \{"kind": "synthetic-int4", '
                                            r'"seed": 7\}, this version\'s setup has .*"seed": 0\}'),
    (lambda d: d.update(lane="b1-btg8-pt64-q4-mtp0-sm90-lmint4"),
     r'is stale: lane is "b1-btg8-pt64-q4-mtp0-sm90-lmint4"'),
    (lambda d: d.update(steps=63), r"is stale: steps is 63, this version's setup has 64"),
    (_payload(lambda s: s[3]["tokens"].pop()),
     r"malformed: sequence 3 has 63 tokens and 64 topk rows; both must be steps = 64"),
    (_payload(lambda s: s[5]["topk"].pop()),
     r"malformed: sequence 5 has 64 tokens and 63 topk rows"),
    (_payload(lambda s: s[0].pop("topk")),
     r"malformed: sequence 0 lacks the list 'topk'"),
    (_payload(lambda s: s[2]["topk"][9].__setitem__(0, [5000, 1.0])),
     r"malformed: sequence 2 topk row 9 is not a non-empty list of \[token id, logit\]"),
    (_payload(lambda s: s[1]["tokens"].__setitem__(0, -1)),
     r"malformed: sequence 1 has a token id outside the vocabulary 0\.\.1023"),
])
def test_refuses_malformed_or_foreign(tmp_path, doc, mutate, pattern):
    """Keys outside the payload digest (the lane, the seed, the steps) are checked against this
    version's setup, and the payload's shape even where its digest was recomputed."""
    mutate(doc)
    with pytest.raises(UserError, match=pattern + r".*regenerate it with: qwen38gen golden"):
        G.load_golden(_write(tmp_path, doc))


def test_golden_folder(tmp_path):
    """load_golden(folder=DIR) reads DIR's file of the golden lane (`--golden DIR`)."""
    shutil.copy(PATH, tmp_path / PATH.name)
    assert G.load_golden(folder=tmp_path).sequences == G.load_golden().sequences
    with pytest.raises(UserError, match=r"golden folder '.*/nowhere' does not exist or is not a "
                                        r"folder; give the folder that holds tiny_b1-.*\.json"):
        G.load_golden(folder=tmp_path / "nowhere")
    (tmp_path / PATH.name).unlink()
    with pytest.raises(UserError, match=rf"golden file {tmp_path}/tiny_b1-.*\.json is missing"):
        G.load_golden(folder=tmp_path)


@pytest.mark.parametrize("command", [("golden",), ("check", "--batch", "3")])
def test_golden_option_of_the_commands(capsys, tmp_path, doc, command):
    """`golden --golden DIR` and `check --golden DIR` read DIR, not the packaged folder."""
    import cli

    doc["version"] = 99
    _write(tmp_path, doc).rename(tmp_path / PATH.name)
    with pytest.raises(SystemExit) as e:
        cli.main([*command, "--golden", str(tmp_path)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"error: golden file {tmp_path}/{PATH.name} has "
                                                "format version 99"), err
