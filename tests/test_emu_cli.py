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
