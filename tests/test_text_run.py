"""Text in and out through a model folder: ``--model DIR`` on emit, run
and check; ``run --model DIR --prompt TEXT [--chat]`` on the reference backend; generation that
stops at the end-of-sequence ids, in ``Reference.generate`` and in ``generate``.

The model folder is built in code: the ``tiny`` geometry with the small test tokenizer's
vocabulary of 300 (tests/test_tokenizer.py), seeded synthetic weights saved as an HF checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from qwen38gen.config import PRESETS  # noqa: E402
from qwen38gen.errors import UserError  # noqa: E402
from qwen38gen.reference import Reference  # noqa: E402
from qwen38gen.tokenizer import load_tokenizer  # noqa: E402
from qwen38gen.checkpoint import save_checkpoint  # noqa: E402
from qwen38gen.weights import synthetic_weights  # noqa: E402
from tests.test_tokenizer import small_model_dir  # noqa: E402

from tests._blas_threads import single_threaded  # noqa: E402, F401

CFG = dataclasses.replace(PRESETS["tiny"], vocab_size=300)
ROOT = Path(__file__).resolve().parents[1]


def cli(*args, cwd=None):
    r = subprocess.run([sys.executable, "-m", "cli", *map(str, args)], capture_output=True,
                       text=True, timeout=600, cwd=cwd,
                       env={"COLUMNS": "200", "PATH": "/usr/bin:/bin:/usr/local/bin",
                            "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    return r.returncode, r.stdout, r.stderr


def one_line_error(r, text: str) -> None:
    rc, out, err = r
    assert rc == 2 and err.strip() == f"error: {text}", err
    assert "Traceback" not in err


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("text") / "m"
    save_checkpoint(CFG, synthetic_weights(CFG, 2), d)
    small_model_dir(d)
    return d


# --------------------------------------------------------------------------------------- emit
def test_emit_model_dir_is_the_folders_config(model, tmp_path):
    """emit --model DIR emits the program of DIR/config.json: the same source as --model of
    that config.json, and not the tiny preset's (another vocabulary)."""
    rc, a, err = cli("emit", "--model", model, "--batch", 16, "--stdout")
    assert rc == 0, err
    rc, b, err = cli("emit", "--model", model / "config.json", "--batch", 16, "--stdout")
    assert rc == 0, err
    rc, c, err = cli("emit", "--model", "tiny", "--batch", 16, "--stdout")
    assert rc == 0, err
    assert a == b and a != c
    rc, out, err = cli("emit", "--model", model, "--batch", 16, cwd=tmp_path)
    assert rc == 0, err
    assert len(list(tmp_path.glob("*.cu"))) == len(list(tmp_path.glob("*.manifest.json"))) == 1


def test_model_errors_on_emit_run_check(tmp_path):
    (tmp_path / "empty").mkdir()
    presets = ", ".join(PRESETS)
    missing = (f"unknown model {str(tmp_path / 'nope')!r}: not a preset and no such file; "
               f"presets are {presets}, or pass a config.json / model folder")
    empty = (f"model folder {str(tmp_path / 'empty')!r} has no config.json; pass a preset "
             f"({presets}), a config.json or a checkpoint folder")
    for cmd in (["emit", "--batch", 2], ["run", "--backend", "reference", "--prompt", "hi"],
                ["check"]):
        one_line_error(cli(*cmd, "--model", tmp_path / "nope"), missing)
        one_line_error(cli(*cmd, "--model", tmp_path / "empty"), empty)


# ---------------------------------------------------------------------------------------- run
def lines(out: str) -> list[dict]:
    return [json.loads(x) for x in out.splitlines()]


@pytest.mark.slow
def test_run_prompt_chat_prints_text(model, tmp_path):
    """run --model DIR --prompt TEXT --chat: one JSON line per prompt, its prompt the chat
    template's rendering, its text the decoding of its ids with the folder's tokenizer; the
    folder's weights are used (the same lines as --weights DIR, not those of synthetic weights)."""
    tok = load_tokenizer(model)
    args = ("run", "--backend", "reference", "--batch", 2, "--prompt", "Hello world",
            "--prompt", "The quick brown fox", "--chat", "--max-tokens", 5, "--ignore-eos")
    rc, out, err = cli(*args, "--model", model)
    assert rc == 0, err
    got = sorted(lines(out), key=lambda d: d["id"])
    assert [d["id"] for d in got] == [0, 1]
    for d, text in zip(got, ("Hello world", "The quick brown fox")):
        want = tok.encode(tok.render_chat([{"role": "user", "content": text}]))
        assert d["prompt_tokens"] == len(want)
        assert d["output_tokens"] == len(d["token_ids"]) == 5
        assert d["text"] == tok.decode(d["token_ids"]) and d["finish_reason"] == "length"
    rc, out2, err = cli(*args, "--weights", model)
    assert rc == 0, err
    assert sorted(lines(out2), key=lambda d: d["id"]) == got
    bare = small_model_dir(tmp_path / "bare")   # the config and tokenizer, no weights
    (bare / "config.json").write_text((model / "config.json").read_text())
    rc, out3, err = cli(*args, "--model", bare)   # seeded synthetic weights
    assert rc == 0, err
    assert sorted(lines(out3), key=lambda d: d["id"]) != got
    # --think renders the thinking mode: another prompt
    rc, out4, err = cli(*args[:-1], "--think", "--model", model)
    assert rc == 0, err
    think = tok.encode(tok.render_chat([{"role": "user", "content": "Hello world"}],
                                       enable_thinking=True))
    assert sorted(lines(out4), key=lambda d: d["id"])[0]["prompt_tokens"] == len(think)


def test_run_prompt_stops_at_the_tokenizers_eos(model, tmp_path):
    """The end-of-sequence ids are the tokenizer's (generation_config.json): with eos set to the
    third token greedy generation gives, the request stops there ("stop"), unless --ignore-eos."""
    args = ("run", "--backend", "reference", "--batch", 1, "--prompt", "Hello world",
            "--max-tokens", 8)
    rc, out, err = cli(*args, "--model", model, "--ignore-eos")
    assert rc == 0, err
    ids = lines(out)[0]["token_ids"]
    k = next(i for i in range(1, 7) if ids[i] not in ids[:i])
    d = tmp_path / "m"
    save_checkpoint(CFG, synthetic_weights(CFG, 2), d)
    small_model_dir(d, generation_eos=(ids[k],))
    rc, out, err = cli(*args, "--model", d)
    assert rc == 0, err
    got = lines(out)[0]
    assert got["token_ids"] == ids[:k + 1] and got["finish_reason"] == "stop"
    rc, out, err = cli(*args, "--model", d, "--ignore-eos")
    assert rc == 0, err
    assert lines(out)[0]["token_ids"] == ids


def test_run_prompt_refusals(model, tmp_path):
    ref = ("run", "--backend", "reference")
    f = tmp_path / "r.jsonl"
    f.write_text('{"prompt": "Hi"}\n')
    one_line_error(cli(*ref, "--model", model, "--prompt", "Hi", "--prompts", f),
                   "give the prompts either as --prompt TEXT (repeatable) or as a --prompts FILE "
                   "of JSON lines, not both")
    one_line_error(cli(*ref, "--model", model),
                   "run needs prompts: --prompts FILE (JSON lines, docs/RUN_FORMAT.md) or "
                   "--prompt TEXT (repeatable)")
    one_line_error(cli(*ref, "--model", model, "--prompts", f, "--max-tokens", 3),
                   "--max-tokens goes with --prompt; in a --prompts file each line sets its own "
                   "fields (docs/RUN_FORMAT.md)")
    one_line_error(cli(*ref, "--model", "tiny", "--prompt", "Hi"),
                   "--prompt is text, and this model has no tokenizer.json to encode it; give a "
                   "model folder with one (--model DIR), or token ids in a file (--prompts FILE "
                   "with \"prompt_ids\")")
    one_line_error(cli(*ref, "--model", model, "--prompt", "Hi", "--think"),
                   "--think is the chat template's thinking mode; it needs --chat")
    one_line_error(cli(*ref, "--model", model, "--prompt", "Hi", "--max-tokens", 0),
                   "--max-tokens 0 must be an integer ≥ 1")
    one_line_error(cli(*ref, "--model", model, "--prompt", "Hi", "--temperature", -1),
                   "--temperature -1.0 is out of range: it must be ≥ 0 (0 = greedy)")
    one_line_error(cli(*ref, "--model", model, "--prompt", "Hi", "--top-p", 0),
                   "--top-p 0.0 is out of range: it must be in (0, 1]")
    one_line_error(cli(*ref, "--model", model, "--prompt", ""),
                   "--prompt number 1 is empty; give some text")
    one_line_error(cli(*ref, "--model", "tiny", "--weights", model, "--prompt", "Hi"),
                   f"--model 'tiny' (config {PRESETS['tiny'].hash}) is not the geometry of "
                   f"--weights {str(model)!r} (config {CFG.hash}); leave --model out to use the "
                   "folder's config.json")


# -------------------------------------------------------------------------------------- check
def test_check_model_without_golden_files(model):
    """Golden runs exist for the tiny preset's seeded synthetic weights only: a checkpoint
    folder, or another geometry, is refused naming the models that have them."""
    why = ("check compares against the golden runs, which exist only for tiny (its seeded "
           "synthetic weights)")
    one_line_error(cli("check", "--model", model),
                   f"check --model {str(model)!r}: {why}; this model's weights have none. "
                   "Check a geometry with `qwen38gen check --reference MODEL` (against the numpy "
                   "reference), a checkpoint's text with `qwen38gen run --backend reference "
                   "--model DIR` against `--backend gpu`")
    one_line_error(cli("check", "--model", "toy"),
                   f"check --model 'toy': {why}; this model's geometry has none. "
                   "Check a geometry with `qwen38gen check --reference MODEL` (against the numpy "
                   "reference), a checkpoint's text with `qwen38gen run --backend reference "
                   "--model DIR` against `--backend gpu`")


# ------------------------------------------------------------------------------ early stopping
def test_reference_generate_stops_when_every_sequence_has_stopped(monkeypatch):
    """Reference.generate(stop=...) keeps each sequence's tokens up to its first stop id and
    runs no decode step once every sequence has stopped."""
    cfg = PRESETS["tiny"]
    ref = Reference(cfg, synthetic_weights(cfg, 0), dtype=np.float32)
    prompts = [[1, 2, 3], [7, 8]]
    full = ref.generate(prompts, 10)
    # one stop id from each sequence, first emitted at a step ≥ 1
    stop = tuple(next(g[i] for i in range(1, 9) if g[i] not in g[:i]) for g in full)

    def cut(g):
        return g[:next(i for i, t in enumerate(g) if t in stop) + 1]

    want = [cut(g) for g in full]
    calls = []
    real = ref.decode
    monkeypatch.setattr(ref, "decode", lambda st, t: calls.append(1) or real(st, t))
    assert ref.generate(prompts, 10, stop=stop) == want
    assert len(calls) == max(map(len, want)) - 1 < 9   # the loop ended early
    calls.clear()
    assert ref.generate([prompts[0]], 10, stop=stop) == [want[0]]
    assert len(calls) == len(want[0]) - 1
    calls.clear()
    assert ref.generate(prompts, 10, stop=()) == full and len(calls) == 9


def test_generate_stops_early_at_eos(model, tmp_path):
    """generate --model DIR stops at the folder's end-of-sequence id: set it to a token the model
    emits, and the output ends with it, where --ignore-eos runs all the steps."""
    def gen(d, *a):
        rc, out, err = cli("generate", "--model", d, "--prompt", "Hello world", "--steps", 8, *a)
        assert rc == 0, err
        row = next(ln for ln in out.splitlines() if ln.startswith("│   0 │"))
        return [int(t) for t in row.split("│")[3].strip().split(",")]

    ids = gen(model, "--ignore-eos")
    assert len(ids) == 8
    k = next(i for i in range(1, 7) if ids[i] not in ids[:i])
    d = tmp_path / "m"
    save_checkpoint(CFG, synthetic_weights(CFG, 2), d)
    small_model_dir(d, generation_eos=(ids[k],))
    assert gen(d) == ids[:k + 1]
    assert gen(d, "--ignore-eos") == ids
    assert load_tokenizer(d).eos_ids == (ids[k],)


def test_user_error_type_is_the_one_raised():
    """prompt_requests refuses text without a tokenizer before it reads anything."""
    from qwen38gen.serve.requests import prompt_requests

    with pytest.raises(UserError, match=r"^--prompt is text, and this model has no "
                                        r"tokenizer\.json"):
        prompt_requests(["Hi"], 300, None)


def test_check_model_resolves_to_the_preset_with_golden_runs(tmp_path):
    """check --model of a config.json (or its folder) of tiny's geometry is the tiny preset; the
    golden folder decides which models have golden runs."""
    from qwen38gen.verify.check import check_model
    from qwen38gen.verify.golden import golden_path

    d = tmp_path / "t"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(PRESETS["tiny"].to_hf_dict()))
    assert check_model("tiny") is PRESETS["tiny"]
    assert check_model(d) is PRESETS["tiny"] and check_model(d / "config.json") is PRESETS["tiny"]
    g = tmp_path / "golden"
    g.mkdir()
    golden_path(PRESETS["toy"], folder=g).write_text("{}")
    assert check_model("toy", g) is PRESETS["toy"]
    with pytest.raises(UserError, match=r"^check --model 'tiny': check compares against the "
                                        r"golden runs, which exist only for toy "):
        check_model("tiny", g)
