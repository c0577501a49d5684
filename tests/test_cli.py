"""The command line as a user meets it: help, version, info, and one-line errors with exit 2."""

import json
import subprocess
import sys

import pytest


def run(*args, cwd=None):
    p = subprocess.run([sys.executable, "-m", "cli", *args], capture_output=True, text=True,
                       cwd=cwd, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin:/usr/local/bin"})
    return p.returncode, p.stdout, p.stderr


def assert_user_error(rc, out, err, pattern):
    import re

    assert rc == 2, (rc, out, err)
    assert "Traceback" not in err + out
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert re.search(pattern, lines[0]), lines[0]


def test_help_and_version():
    rc, out, _ = run("--help")
    assert rc == 0 and "emit" in out and "gate" in out and "info" in out
    rc, out, _ = run("--version")
    assert rc == 0 and out.startswith("qwen38gen, version ")


def test_info_27b():
    rc, out, _ = run("info", "qwen3.8-27b")
    assert rc == 0
    assert "26.896 B" in out          # text parameters (docs/MODEL.md §1.1)
    assert "13.21 GB" in out          # int4 weights (docs/PERFORMANCE.md W)
    assert "3.27 ms" in out and "4.63 ms" in out and "8.97 ms" in out  # docs/PERFORMANCE.md floors


@pytest.mark.parametrize("args,pattern", [
    (("info", "qwen9"), r"unknown model 'qwen9'"),
    (("info", "--ctx", "x"), r"Invalid value for '--ctx'"),
    (("nosuchcommand",), r"No such command 'nosuchcommand'"),
    (("generate", "--prompt", "1,a"), r"--prompt '1,a' is not a comma-separated list"),
    (("generate", "--prompt", "5000"), r"token id 5000 is outside the vocabulary 0\.\.1023"),
    (("quantize", "/nonexistent/model", "-o", "/tmp/q38-never"), r"/nonexistent/model"),
])
def test_user_errors(args, pattern):
    assert_user_error(*run(*args), pattern)


def test_malformed_config_file(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({"model_type": "qwen3_5_text", "hidden_size": 64}))
    assert_user_error(*run("info", str(p)), r"missing key 'num_hidden_layers'")


def test_quantize_then_generate(tmp_path):
    """quantize writes the packed model atomically; generate runs the reference on it."""
    from qwen38gen.config import PRESETS
    from qwen38gen.checkpoint import save_checkpoint
    from qwen38gen.weights import synthetic_weights

    cfg = PRESETS["tiny"]
    src, dst = tmp_path / "hf", tmp_path / "q4"
    save_checkpoint(cfg, synthetic_weights(cfg, 1), src)
    rc, out, err = run("quantize", str(src), "-o", str(dst))
    assert rc == 0, err
    assert (dst / "quantization.json").exists() and (dst / "model.safetensors.index.json").exists()
    rc, out2, err = run("quantize", str(src), "-o", str(dst))  # refuses to clobber
    assert_user_error(rc, out2, err, str(dst))
    rc, out, err = run("generate", "--model", str(dst), "--weights", str(dst),
                       "--prompt", "1,2,3", "--steps", "3")
    assert rc == 0, err
    # The same run on the in-memory int4 weights of the same seed gives the same tokens.
    rc, out_mem, err = run("generate", "--model", "tiny", "--seed", "1", "--int4",
                           "--prompt", "1,2,3", "--steps", "3")
    assert rc == 0, err
    row = lambda s: [l for l in s.splitlines() if "1,2,3" in l][0].split("│")[3].strip()
    assert row(out) == row(out_mem)


def test_bench_tables_keep_every_digit():
    """bench's tables, rendered from a committed run (version 20's json): at 200 columns (what a
    pipe or log gets) every step, floor and kind figure appears whole; at 80 (a narrow terminal)
    numbers fold onto two lines but no cell is cut to an ellipsis."""
    import io
    from pathlib import Path

    from rich.console import Console

    from qwen38gen import report as R
    from qwen38gen.perf.bench import BenchRow
    from qwen38gen.config import PRESETS

    d = json.loads((Path(__file__).resolve().parents[1] / "bench" / "2026-12-04-h200-v20.json").read_text())
    rows = [BenchRow(**{**r, "step_ms_spread": tuple(r["step_ms_spread"])}) for r in d["rows"]]
    tables = R.bench_tables(PRESETS["qwen3.8-27b"], d["ctx"], d["copy_bandwidth"], rows, "on")

    def render(width):
        buf = io.StringIO()
        con = Console(file=buf, width=width, highlight=False)
        for t in tables:
            con.print(t)
        return buf.getvalue()

    wide = render(200)
    for r in rows:
        for v in (f"{r.step_ms:.3f}", f"{r.floor_ms:.3f}", f"{r.graph_ms['gemv']:.3f}", f"{r.tok_s:,.0f}"):
            assert v in wide, v
    assert "…" not in wide and "…" not in render(80)
