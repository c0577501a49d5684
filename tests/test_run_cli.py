"""`qwen38gen run` as a user meets it, on the reference backend (CPU): JSON-lines requests in,
one complete JSON line per finished request out, the throughput figures; the same ids per
request at --batch 2 as at --batch 1, greedy and sampled; every kind of bad input is a one-line
error with exit 2 and no output file."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.test_cli import assert_user_error


def run(*args):
    p = subprocess.run([sys.executable, "-m", "cli", "run", "--backend", "reference",
                        "--model", "tiny", *args], capture_output=True, text=True,
                       env={"COLUMNS": "200", "PATH": "/usr/bin:/bin:/usr/local/bin",
                            "OPENBLAS_NUM_THREADS": "1"})
    return p.returncode, p.stdout, p.stderr


LENGTHS = (5, 1, 20, 2, 35)        # 1 to 3 chunks of 16
MAX_TOKENS = (8, 3, 5, 10, 6)


def write_requests(path, lines):
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return str(path)


def show_requests():
    out = []
    for mode in ("greedy", "sampled"):
        for i, (n, m) in enumerate(zip(LENGTHS, MAX_TOKENS)):
            r = {"id": f"{mode}-{i}", "prompt_ids": [(37 * i + 11 * j) % 1024 for j in range(n)],
                 "max_tokens": m}
            if mode == "sampled":
                r.update(temperature=0.8, seed=1000 + i)
            out.append(r)
    return out


@pytest.mark.slow
def test_batch_2_gives_the_ids_of_batch_1(tmp_path):
    reqs = write_requests(tmp_path / "R.jsonl", show_requests())
    got = {}
    for b in (2, 1):
        o = tmp_path / f"out{b}.jsonl"
        rc, out, err = run("--batch", str(b), "--prompts", reqs, "--output", str(o),
                           "--json", str(tmp_path / f"s{b}.json"))
        assert rc == 0, err
        assert out == ""
        lines = [json.loads(x) for x in o.read_text().splitlines()]
        assert sorted(x["id"] for x in lines) == sorted(r["id"] for r in show_requests())
        for x in lines:
            assert set(x) == {"id", "token_ids", "finish_reason", "prompt_tokens", "output_tokens"}
            assert x["finish_reason"] == "length" and x["output_tokens"] == len(x["token_ids"])
        got[b] = {x["id"]: x["token_ids"] for x in lines}
        s = json.loads((tmp_path / f"s{b}.json").read_text())
        assert s["slots"] == b and s["requests"] == 10 and s["output_tokens"] == 2 * sum(MAX_TOKENS)
        assert s["steps"] == s["prefill_steps"] + s["decode_steps"]
        assert "Throughput: " in err and "requests/s" in err and "output tokens/s" in err
    assert got[2] == got[1]
    assert sum(got[1][f"greedy-{i}"] != got[1][f"sampled-{i}"] for i in range(5)) >= 3


def test_cold_start_is_reported(tmp_path):
    """The summary's cold_start: the weights, the backend ready and the first token, in that
    order, counted from the command's start, and the stderr line saying it."""
    reqs = write_requests(tmp_path / "R.jsonl", [{"prompt_ids": [1, 2, 3], "max_tokens": 2}])
    rc, out, err = run("--prompts", reqs, "--json", str(tmp_path / "s.json"))
    assert rc == 0, err
    c = json.loads((tmp_path / "s.json").read_text())["cold_start"]
    assert 0 < c["weights_s"] <= c["ready_s"] <= c["first_token_s"]
    assert c["weights"] == "synthetic, made on the host" and c["where"] == "host"
    assert f"Cold start: first token {c['first_token_s']:.2f} s after the command" in err


def test_big_synthetic_weights_are_made_on_the_gpu():
    """Only the gpu backend of a model over 1 GB of int4 without --weights takes DeviceFill."""
    from qwen38gen.config import PRESETS, load_config
    from qwen38gen.runtime import DeviceFill
    from qwen38gen.serve.run import backend_tensors

    big = load_config("qwen3.8-27b")
    assert backend_tensors(big, None, 5, False, "gpu") == DeviceFill(seed=5)
    assert isinstance(backend_tensors(PRESETS["tiny"], None, 5, False, "gpu"), dict)


def test_streams_to_stdout(tmp_path):
    reqs = write_requests(tmp_path / "R.jsonl", [
        {"prompt_ids": [1, 2, 3], "max_tokens": 2},
        {"id": "x", "prompt_ids": [4], "max_tokens": 1, "stop_token_ids": [5], "ignore_eos": True}])
    rc, out, err = run("--batch", "2", "--prompts", reqs)
    assert rc == 0, err
    lines = [json.loads(x) for x in out.splitlines()]
    assert [x["id"] for x in lines] == ["x", 0]     # in the order they finish; default id: number
    assert [x["prompt_tokens"] for x in lines] == [1, 3]


@pytest.mark.parametrize("lines,pattern", [
    ([{"prompt_ids": [1], "temperature": -1}],
     r"R\.jsonl, line 1: temperature -1 is out of range: it must be ≥ 0 \(0 = greedy\)$"),
    ([{"prompt_ids": [1]}, {"prompt_ids": [1], "top_p": 0}],
     r"R\.jsonl, line 2: top_p 0 is out of range: it must be in \(0, 1\]$"),
    ([{"prompt_ids": [1], "top_k": -3}], r"line 1: top_k -3 is out of range"),
    ([{"prompt_ids": [1], "min_p": 1.5}], r"line 1: min_p 1\.5 is out of range"),
    ([{"prompt_ids": [1], "max_tokens": 0}], r"line 1: max_tokens 0 must be an integer ≥ 1$"),
    ([{"prompt_ids": [1], "temprature": 1}], r"line 1: unknown field 'temprature'; known fields: "),
    ([{"prompt_ids": [1]}, "{not json"], r"R\.jsonl, line 2: not valid JSON"),
    ([{"prompt": "hello"}], r"line 1: the prompt is text but no tokenizer is available"),
    ([{"prompt_ids": [1, 2]}, {"id": 0, "prompt_ids": [3]}], r"line 2: id 0 repeats the request of line 1$"),
    ([{"prompt_ids": [1024]}], r"line 1: token id 1024 is outside the vocabulary 0\.\.1023$"),
])
def test_bad_requests(tmp_path, lines, pattern):
    p = tmp_path / "R.jsonl"
    p.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    o = tmp_path / "out.jsonl"
    assert_user_error(*run("--batch", "2", "--prompts", str(p), "--output", str(o)), pattern)
    assert list(tmp_path.iterdir()) == [p]    # no output, no temporary file left


def test_prompt_longer_than_the_context_and_mtp(tmp_path):
    reqs = write_requests(tmp_path / "R.jsonl", [{"id": "long", "prompt_ids": [1] * 9},
                                                 {"prompt_ids": [2], "temperature": 0.8}])
    o = tmp_path / "out.jsonl"
    assert_user_error(*run("--batch", "2", "--ctx", "8", "--prompts", reqs, "--output", str(o)),
                      r"^error: request 'long': the prompt has 9 tokens, more than the context "
                      r"of 8; pass a larger --ctx$")
    assert_user_error(*run("--batch", "2", "--mtp", "--prompts", reqs),
                      r"^error: --mtp runs the emitted mtp program: use --backend gpu or emu \(the "
                      r"reference backend computes the plain model\)$")
    assert_user_error(*run("--batch", "2", "--mtp", "2", "--ctx", "262141", "--prompts", reqs),
                      r"^error: --ctx 262141 must be in 1\.\.262140 with --mtp 2$")
    assert not o.exists()


def test_cold_start_line_gives_the_upload_and_its_bound():
    """A folder's weights uploaded by the staged copy: the line gives the bytes, the time, the
    host's reading and the wait on copies, and (above 256 MiB) the bandwidth alone and the
    bound it gives; a quantized folder is mapped for the gpu backend only."""
    from types import SimpleNamespace

    from qwen38gen.serve.run import cold_start_line, upload_figures

    c = {"first_token_s": 9.5, "weights": "read from q27", "weights_s": 0.05, "where": "GPU",
         "ready_s": 7.25, "upload": {"bytes": 14_200_000_000, "seconds": 6.1, "fill_s": 5.8,
                                     "wait_s": 0.2, "copies": 212, "h2d_gbs": 24.1, "bound_s": 5.8}}
    line = cold_start_line(c)
    assert "the weights' upload 6.10 s: 14.20 GB at 2.3 GB/s, the host reading them 5.80 s" in line
    assert "host to device alone 24.1 GB/s, so the upload's bound is 5.80 s)" in line
    del c["upload"]
    assert cold_start_line(c).endswith("on the GPU: 7.25 s)")
    small = SimpleNamespace(rt=SimpleNamespace(upload={"bytes": 1000, "seconds": 0.01,
                                                       "fill_s": 0.0, "wait_s": 0.0, "copies": 1}))
    assert upload_figures(small) == {"upload": small.rt.upload}     # no bandwidth run below 256 MiB
    assert upload_figures(SimpleNamespace()) == {}


def test_a_quantized_folder_is_mapped_for_the_gpu_backend(tmp_path):
    import numpy as np

    from qwen38gen import quantize as qz
    from qwen38gen import checkpoint as ck
    from qwen38gen import weights as wt
    from qwen38gen.config import PRESETS
    from qwen38gen.serve.run import backend_tensors

    tiny = PRESETS["tiny"]
    ck.save_checkpoint(tiny, wt.synthetic_weights(tiny, seed=2), tmp_path / "ck")
    q = qz.quantize_checkpoint(tmp_path / "ck", tmp_path / "q")
    for backend, mapped in (("gpu", True), ("reference", False), ("emu", False)):
        t = backend_tensors(tiny, q, 0, False, backend)
        qw = next(v for v in t.values() if isinstance(v, qz.QuantizedTensor)).qweight
        assert isinstance(qw, np.memmap) == mapped, backend


def test_mtp_with_sampled_requests_names_the_device_path(tmp_path):
    """`run --mtp 1` with sampled requests on a program that judges them on the host says so
    once and names --tune spec_sample=0 (version 31: the default program judges them itself);
    without it (or with greedy requests only) nothing is said."""
    def emu(*args):
        p = subprocess.run([sys.executable, "-m", "cli", "run", "--backend", "emu", "--model",
                            "tiny", "--batch", "2", "--pt", "4", "--mtp", "1", *args],
                           capture_output=True, text=True,
                           env={"COLUMNS": "200", "PATH": "/usr/bin:/bin:/usr/local/bin",
                                "OPENBLAS_NUM_THREADS": "1"})
        return p.returncode, p.stderr
    lines = [{"id": "g", "prompt_ids": [5, 6, 7], "max_tokens": 2},
             {"id": "s", "prompt_ids": [8, 9], "max_tokens": 2, "temperature": 0.8, "seed": 3}]
    mixed = write_requests(tmp_path / "mixed.jsonl", lines)
    greedy = write_requests(tmp_path / "greedy.jsonl", lines[:1])
    rc, err = emu("--prompts", mixed, "--tune", "spec_sample=0")
    assert rc == 0 and err.count("note: 1 sampled request will have its drafts judged on the "
                                 "host") == 1 and "--tune spec_sample=0" in err
    rc, err = emu("--prompts", mixed)
    assert rc == 0 and "note:" not in err
    rc, err = emu("--prompts", greedy)
    assert rc == 0 and "note:" not in err
