"""`qwen38gen run --backend emu`: 5 requests of different lengths at --batch 2
give per request the same ids as at --batch 1, greedy and with temperature 0.8 and a seed; stderr
says in one line that the schedule runs in numpy, not the CUDA kernels."""

from __future__ import annotations

import pytest

import json
import subprocess
import sys

from tests.test_run_cli import MAX_TOKENS, show_requests, write_requests

ENV = {"COLUMNS": "200", "PATH": "/usr/bin:/bin:/usr/local/bin", "OPENBLAS_NUM_THREADS": "1"}


def run_emu(*args):
    p = subprocess.run([sys.executable, "-m", "cli", "run", "--backend", "emu", "--model", "tiny",
                        "--pt", "4", *args], capture_output=True, text=True, env=ENV)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.slow
def test_emu_batch_2_gives_the_ids_of_batch_1(tmp_path):
    reqs = write_requests(tmp_path / "R.jsonl", show_requests())
    got, figures = {}, {}
    for b in (2, 1):
        o = tmp_path / f"out{b}.jsonl"
        rc, out, err = run_emu("--batch", str(b), "--prompts", reqs, "--output", str(o),
                               "--json", str(tmp_path / f"s{b}.json"))
        assert rc == 0, err
        notice = [x for x in err.splitlines() if x.startswith("emu backend:")]
        assert notice == ["emu backend: runs the emitted program's schedule in numpy on the CPU "
                          "(slowly), not the CUDA kernels"]
        lines = [json.loads(x) for x in o.read_text().splitlines()]
        got[b] = {x["id"]: x["token_ids"] for x in lines}
        assert sorted(got[b]) == sorted(r["id"] for r in show_requests())
        figures[b] = json.loads((tmp_path / f"s{b}.json").read_text())
        assert figures[b]["backend"] == "emu" and figures[b]["slots"] == b
        assert figures[b]["output_tokens"] == 2 * sum(MAX_TOKENS)
    assert got[2] == got[1]
    assert sum(got[1][f"greedy-{i}"] != got[1][f"sampled-{i}"] for i in range(5)) >= 3
    assert figures[2]["steps"] < figures[1]["steps"]


def test_emu_run_mtp(tmp_path):
    """`run --backend emu --mtp 1`: the greedy requests get the plain program's ids, every line
    and the figures carry the acceptance, the throughput line says it."""
    lines = [r for r in show_requests() if r["id"] in ("greedy-0", "greedy-1", "sampled-1")]
    for r in lines:
        r["max_tokens"] = 3
    reqs = write_requests(tmp_path / "R.jsonl", lines)
    got = {}
    for mtp in ("0", "1"):
        o, j = tmp_path / f"out{mtp}.jsonl", tmp_path / f"s{mtp}.json"
        rc, out, err = run_emu("--batch", "2", "--mtp", mtp, "--prompts", reqs, "--output", str(o),
                               "--json", str(j))
        assert rc == 0, err
        got[mtp] = {x["id"]: x for x in map(json.loads, o.read_text().splitlines())}
        fig = json.loads(j.read_text())
    assert {i: x["token_ids"] for i, x in got["1"].items() if i.startswith("greedy")} == \
        {i: x["token_ids"] for i, x in got["0"].items() if i.startswith("greedy")}
    for x in got["1"].values():
        assert x["drafts_proposed"] >= x["drafts_accepted"] >= 0 and "acceptance" in x
    assert fig["mtp"] == 1 and fig["drafts_proposed"] == sum(x["drafts_proposed"]
                                                             for x in got["1"].values())
    line = [x for x in err.splitlines() if x.startswith("Throughput:")][0]
    assert "verify" in line and f"mtp 1: acceptance {fig['acceptance']:.2f}" in line
