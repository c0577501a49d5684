"""Issue 40 (Reliability II) as a user meets it: nothing a user points the tool at is destroyed,
every failure is one `error:` line with exit 2, every interruption leaves nothing behind.

Most run the command line in this process (cli.main); signals, closed streams and read-only
folders need a subprocess."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.test_bad_input import ROOT, assert_user_error, invoke, readonly_dir, run_cli  # noqa: F401

PY = sys.executable


def names(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def requests(path: Path, n: int = 1, max_tokens: int = 2) -> Path:
    path.write_text("".join(json.dumps({"id": i, "prompt_ids": [1, 2, 3],
                                        "max_tokens": max_tokens}) + "\n" for i in range(n)))
    return path


def run_args(*args):
    return ("run", "--backend", "reference", "--model", "tiny", "--batch", "2", *args)


def fake_checkpoint(d: Path) -> Path:
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}\n")
    (d / "model.safetensors").write_bytes(b"weights")
    return d


# ------------------------------------------------------------------ item 1: quantize's source
@pytest.mark.parametrize("out", ["par", "par/src", "par/src/q", "link", "link/q"])
def test_quantize_never_writes_over_or_around_its_source(capsys, tmp_path, monkeypatch, out):
    """`quantize par/src -o par --overwrite` deleted the source; a symlink to it as -o replaced
    it; -o inside it would be deleted with it."""
    src = fake_checkpoint(tmp_path / "par" / "src")
    os.symlink(src, tmp_path / "link")
    monkeypatch.chdir(tmp_path)
    assert_user_error(*invoke(capsys, "quantize", "par/src", "-o", out, "--overwrite"),
                      r"output folder '.*' (is|contains|lies inside) the source folder")
    assert names(src) == ["config.json", "model.safetensors"] and names(tmp_path / "par") == ["src"]


def test_quantize_dot_onto_its_own_path_is_one_line(capsys, tmp_path, monkeypatch):
    src = fake_checkpoint(tmp_path / "src")
    monkeypatch.chdir(src)
    assert_user_error(*invoke(capsys, "quantize", ".", "-o", "../src", "--overwrite"),
                      r"output folder '\.\./src' is the source folder '\.'")
    assert names(src) == ["config.json", "model.safetensors"]


# ------------------------------------------------------- item 2: run's outputs, before the run
def test_run_output_or_json_equal_to_the_requests_is_refused(capsys, tmp_path):
    req = requests(tmp_path / "r.jsonl")
    before = req.read_text()
    for opt in ("--output", "--json"):
        assert_user_error(*invoke(capsys, *run_args("--prompts", req, opt, req)),
                          rf"{opt} '.*r\.jsonl' is the input --prompts")
    os.symlink(req, tmp_path / "alias")
    assert_user_error(*invoke(capsys, *run_args("--prompts", req, "--output", tmp_path / "alias")),
                      r"is the input --prompts")
    assert req.read_text() == before and names(tmp_path) == ["alias", "r.jsonl"]


def test_run_json_equal_to_output_is_refused(capsys, tmp_path):
    req = requests(tmp_path / "r.jsonl")
    o = tmp_path / "o.jsonl"
    assert_user_error(*invoke(capsys, *run_args("--prompts", req, "--output", o, "--json", o)),
                      r"--json '.*o\.jsonl' is also --output")
    assert names(tmp_path) == ["r.jsonl"]


def test_run_writes_a_fifo_in_place(capsys, tmp_path):
    req = requests(tmp_path / "r.jsonl", n=2)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()))
    reader.start()
    rc, out, err = invoke(capsys, *run_args("--prompts", req, "--output", fifo))
    reader.join(30)
    assert rc == 0, err
    assert sorted(json.loads(x)["id"] for x in got[0].splitlines()) == [0, 1]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and names(tmp_path) == ["fifo", "r.jsonl"]


def test_run_onto_dev_null_leaves_the_device(capsys, tmp_path):
    req = requests(tmp_path / "r.jsonl")
    rc, out, err = invoke(capsys, *run_args("--prompts", req, "--output", "/dev/null",
                                            "--json", "/dev/null"))
    assert rc == 0, err
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


# ------------------------------------------- item 3: an unwritable target, found before the run
@pytest.mark.parametrize("opt", ["--output", "--json"])
@pytest.mark.parametrize("where,pattern", [
    ("folder", r"cannot write '.*/folder': it is a folder; give a file name"),
    ("file/x", r"cannot write '.*/file/x': '.*/file' is a file, not a folder"),
])
def test_run_target_that_cannot_be_written_fails_before_the_run(capsys, tmp_path, opt, where,
                                                                pattern):
    req = requests(tmp_path / "r.jsonl")
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("keep\n")
    rc, out, err = invoke(capsys, *run_args("--prompts", req, opt, tmp_path / where))
    assert_user_error(rc, out, err, pattern)
    assert "Throughput" not in err and names(tmp_path) == ["file", "folder", "r.jsonl"]
    assert names(tmp_path / "folder") == []


def test_run_into_a_readonly_folder_fails_before_the_run(readonly_dir, tmp_path):
    ro, prefix = readonly_dir
    req = requests(tmp_path / "r.jsonl")
    for opt in ("--output", "--json"):
        rc, out, err = run_cli(*run_args("--prompts", req, opt, ro / "o"), cwd=tmp_path,
                               prefix=prefix)
        assert_user_error(rc, out, err, r"cannot write '.*/ro/o': Permission denied")
        assert "Throughput" not in err and names(ro) == []


# ---------------------------------------------------------------------- item 5: the umask
@pytest.mark.parametrize("mask", [0o022, 0o002])
def test_run_output_files_honour_the_umask(capsys, tmp_path, mask):
    req = requests(tmp_path / "r.jsonl")
    old = os.umask(mask)
    try:
        rc, _, err = invoke(capsys, *run_args("--prompts", req, "--output", tmp_path / "o",
                                              "--json", tmp_path / "s"))
    finally:
        os.umask(old)
    assert rc == 0, err
    for p in ("o", "s"):
        assert stat.S_IMODE(os.stat(tmp_path / p).st_mode) == 0o666 & ~mask


# --------------------------------------------------- item 4: signals leave nothing behind
def _start(args, cwd):
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "COLUMNS": "200",
           "HOME": str(cwd), "OPENBLAS_NUM_THREADS": "1"}
    return subprocess.Popen([PY, "-m", "cli", *map(str, args)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(cond, proc, timeout=60):
    t0 = time.monotonic()
    while not cond():
        if proc.poll() is not None or time.monotonic() - t0 > timeout:
            proc.kill()
            pytest.fail(f"never happened; stderr: {proc.communicate()[1]}")
        time.sleep(0.05)


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129),
                                      (signal.SIGINT, 130)])
def test_a_signal_during_run_output_leaves_no_temp(tmp_path, sig, code):
    req = requests(tmp_path / "r.jsonl", n=1, max_tokens=500)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    p = _start(run_args("--prompts", req, "--ctx", 600, "--output", out_dir / "o.jsonl",
                        "--json", out_dir / "s.json"), tmp_path)
    _wait_for(lambda: len(names(out_dir)) == 2, p)   # both temp files: the run has begun
    time.sleep(0.3)
    p.send_signal(sig)
    _, err = p.communicate(timeout=30)
    assert p.returncode == code, err
    assert err.strip() == f"interrupted by {signal.Signals(sig).name}; nothing was written"
    assert names(out_dir) == []


def test_quantize_interrupted_after_its_rename_says_the_output_is_complete(capsys, tmp_path,
                                                                           monkeypatch):
    """Not "aborted" over a complete output: the line says what was written."""
    import cli
    import qwen38gen.quantize as Q
    from qwen38gen.config import PRESETS
    from qwen38gen.weights import save_checkpoint, synthetic_weights

    from .test_file_modes import SMALL

    save_checkpoint(SMALL, synthetic_weights(SMALL, 1), tmp_path / "hf")
    real = Q.quantize_checkpoint

    def then_signal(*a, **k):
        r = real(*a, **k)
        os.kill(os.getpid(), signal.SIGTERM)
        return r

    monkeypatch.setattr(Q, "quantize_checkpoint", then_signal)
    rc, out, err = invoke(capsys, "quantize", tmp_path / "hf", "-o", tmp_path / "q4")
    assert rc == 143 and "aborted" not in err
    assert err.strip() == f"interrupted by SIGTERM after {str(tmp_path / 'q4')!r} was written completely"
    assert "quantization.json" in names(tmp_path / "q4") and names(tmp_path) == ["hf", "q4"]
    assert PRESETS and cli


FAKE_NVCC = """#!/bin/sh
case "$1" in --version) echo "Cuda compilation tools, release 13.0, V13.0.0"; exit 0;; esac
sleep 60 &
echo $! > "$PIDFILE"
wait
"""


def test_sigterm_during_gate_kills_nvcc_and_its_children_and_leaves_no_temp_folder(tmp_path):
    from qwen38gen.config import PRESETS
    from qwen38gen.emit import emit_program, write_program
    from qwen38gen.lanes import Lanes

    cu, _ = write_program(emit_program(PRESETS["tiny"], Lanes.make(2)), tmp_path / "p.cu")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvcc").write_text(FAKE_NVCC)
    (bin_dir / "nvcc").chmod(0o755)
    pidf, cache = tmp_path / "ptxas.pid", tmp_path / "cache"
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT),
           "QWEN38_CACHE": str(cache), "PIDFILE": str(pidf), "HOME": str(tmp_path)}
    p = subprocess.Popen([PY, "-m", "cli", "gate", str(cu)], cwd=tmp_path, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(lambda: pidf.exists() and pidf.read_text().strip(), p)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=30)
    assert p.returncode == 143, err
    assert err.strip() == "interrupted by SIGTERM; nothing was written"
    assert names(cache / "gate") == []   # no temp folder, no failed-*.cu
    grandchild = int(pidf.read_text())
    for _ in range(100):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("nvcc's child outlived the gate")


# -------------------------------------------- item 6: closed, full and broken standard output
def _shell(cmd: str, cwd) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "HOME": str(cwd)}
    return subprocess.run(["sh", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True)


@pytest.mark.parametrize("redirect,pattern", [
    (">&-", r"cannot write to standard output: standard output is closed"),
    ("> /dev/full", r"cannot write to standard output: No space left on device"),
])
def test_a_closed_or_full_stdout_is_one_line(tmp_path, redirect, pattern):
    r = _shell(f"{PY} -m cli info tiny {redirect}", tmp_path)
    assert_user_error(r.returncode, "", r.stderr, pattern)


def test_a_closed_stdout_after_the_files_are_written_says_so(tmp_path):
    """emit writes its pair, then cannot print "wrote …": the files are whole, the line says why
    the exit is 2."""
    r = _shell(f"{PY} -m cli emit --batch 2 -o p.cu >&-", tmp_path)
    assert_user_error(r.returncode, "", r.stderr, r"standard output is closed")
    assert names(tmp_path) == ["p.cu", "p.manifest.json"]


def test_a_broken_pipe_is_one_line(tmp_path):
    read, write = os.pipe()
    os.close(read)
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    p = subprocess.run([PY, "-m", "cli", "emit", "--batch", "2", "--stdout"], cwd=tmp_path,
                       env=env, stdout=write, stderr=subprocess.PIPE, text=True)
    os.close(write)
    assert_user_error(p.returncode, "", p.stderr, r"cannot write to standard output: Broken pipe")

