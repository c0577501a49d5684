"""Golden files: refused when stale or corrupted (naming the regenerate command), and the committed
file agrees with the numpy reference (the CPU half of `qwen38gen check`, run in CI)."""

import json

import pytest

from qwen38gen import golden as G
from qwen38gen.check import validate_golden
from qwen38gen.errors import UserError

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
