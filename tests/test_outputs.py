"""qwen38gen.outputs and qwen38gen.interrupt (a path the user gives is never destroyed): the one output
helper (regular targets or new paths, in place for a device or FIFO, inputs and other outputs
refused, the umask, temp files removed on every way out) and the one signal policy (clean up,
kill the children's process group, 128 + the signal)."""

from __future__ import annotations

import os
import signal
import stat
import threading
import time

import pytest

from qwen38gen import interrupt as I
from qwen38gen import outputs as O
from qwen38gen.errors import UserError


def names(d):
    return sorted(p.name for p in d.iterdir())


# ----------------------------------------------------------------------------- targets
def test_new_and_regular_targets_are_replaced_whole(tmp_path):
    O.write_text(tmp_path / "a.json", "new\n")
    (tmp_path / "b.json").write_text("old\n")
    O.write_text(tmp_path / "b.json", "new\n")
    assert (tmp_path / "a.json").read_text() == (tmp_path / "b.json").read_text() == "new\n"
    assert names(tmp_path) == ["a.json", "b.json"]


def test_a_fifo_is_written_in_place_never_replaced(tmp_path):
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo).read()), daemon=True)
    reader.start()
    O.write_text(fifo, "line\n")
    reader.join(10)
    assert got == ["line\n"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and names(tmp_path) == ["p"]


def test_dev_null_stays_a_device_and_may_be_two_outputs(tmp_path):
    from tests.test_reliability import null_device

    null = null_device(tmp_path)
    O.check_outputs({"--output": null, "--json": null})
    O.write_text(null, "x\n")
    assert stat.S_ISCHR(os.stat(null).st_mode)


@pytest.mark.parametrize("make,pattern", [
    (lambda p: p.mkdir(), r"it is a folder; give a file name"),
    (lambda p: __import__("socket").socket(__import__("socket").AF_UNIX).bind(str(p)),
     r"it is a socket"),
])
def test_a_folder_or_socket_is_refused(tmp_path, make, pattern):
    make(tmp_path / "t")
    with pytest.raises(UserError, match=pattern):
        O.write_text(tmp_path / "t", "x")
    assert names(tmp_path) == ["t"]


def test_a_path_under_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("keep\n")
    with pytest.raises(UserError, match=r"'.*/f' is a file, not a folder"):
        O.write_text(tmp_path / "f" / "sub" / "x", "x")
    assert (tmp_path / "f").read_text() == "keep\n"


def test_inputs_and_other_outputs_are_refused_through_links(tmp_path):
    (tmp_path / "req.jsonl").write_text("{}\n")
    os.symlink(tmp_path / "req.jsonl", tmp_path / "link")
    os.link(tmp_path / "req.jsonl", tmp_path / "hard")
    for p in ("req.jsonl", "link", "hard", "./req.jsonl"):
        with pytest.raises(UserError, match=r"is the input --prompts"):
            O.check_outputs({"--output": tmp_path / p}, {"--prompts": tmp_path / "req.jsonl"})
    with pytest.raises(UserError, match=r"--json '.*o' is also --output"):
        O.check_outputs({"--output": tmp_path / "o", "--json": tmp_path / "sub" / ".." / "o"})
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    with pytest.raises(UserError, match=r"is inside the input --weights"):
        O.check_outputs({"--json": tmp_path / "model" / "config.json"},
                        {"--weights": tmp_path / "model"})
    O.check_outputs({"--json": tmp_path / "model" / "new.json"}, {"--weights": tmp_path / "model"})
    assert (tmp_path / "req.jsonl").read_text() == "{}\n"


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_the_umask_is_honoured(tmp_path, mask):
    old = os.umask(mask)
    try:
        O.write_text(tmp_path / "a", "x")
        with O.Target(tmp_path / "b") as f:
            f.write("x")
    finally:
        os.umask(old)
    for p in ("a", "b"):
        assert stat.S_IMODE(os.stat(tmp_path / p).st_mode) == 0o666 & ~mask


def test_an_exception_leaves_neither_temp_nor_target(tmp_path):
    with pytest.raises(RuntimeError):
        with O.Target(tmp_path / "out") as f:
            f.write("half")
            assert len(names(tmp_path)) == 1   # the temp file, beside the target
            raise RuntimeError
    assert names(tmp_path) == []


def test_a_full_disk_is_a_user_error_naming_the_target(tmp_path, monkeypatch):
    t = O.Target(tmp_path / "out")
    f = t.open()

    def full(_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(f, "write", full)
    with pytest.raises(UserError, match=r"cannot write '.*/out': No space left on device"):
        t.write("x")
    assert names(tmp_path) == []


def test_quantize_folder_pairs():
    for src, out, pattern in [("a/src", "a/src", "is the source folder"),
                              ("a/src", "a/src/../src/", "is the source folder"),
                              ("a/src", "a", "contains the source folder"),
                              ("a", "a/src/q", "lies inside the source folder")]:
        with pytest.raises(UserError, match=pattern):
            O.check_folder_pair(src, out)
    O.check_folder_pair("a/src", "a/q4")


# ----------------------------------------------------------------------------- signals
def _kill_self_later(sig, delay=0.2):
    threading.Timer(delay, os.kill, (os.getpid(), sig)).start()


@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129),
                                      (signal.SIGINT, 130)])
def test_a_signal_mid_write_removes_every_temp(tmp_path, sig, code):
    with pytest.raises(I.Interrupted) as e, I.handling():
        with O.Target(tmp_path / "out") as f:
            f.write("half")
            os.kill(os.getpid(), sig)
            time.sleep(5)
    assert e.value.exit_code == code and names(tmp_path) == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_pair_is_both_new_or_both_old(tmp_path, monkeypatch):
    """A signal during the second temp file's write leaves both old files; one during the renames
    is deferred until both are done (never a new .cu beside an old manifest)."""
    a, b = tmp_path / "x.cu", tmp_path / "x.manifest.json"
    a.write_text("old\n")
    b.write_text("old\n")
    real_write = O.Target.write

    def write_then_signal(self, data):
        real_write(self, data)
        if self.path == b:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(O.Target, "write", write_then_signal)
    with pytest.raises(I.Interrupted), I.handling():
        O.write_files({a: "new\n", b: "new\n"})
    assert a.read_text() == b.read_text() == "old\n" and names(tmp_path) == ["x.cu",
                                                                          "x.manifest.json"]
    monkeypatch.undo()
    real_commit = O.Target.commit

    def commit_then_signal(self):
        real_commit(self)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(O.Target, "commit", commit_then_signal)
    with pytest.raises(I.Interrupted), I.handling():
        O.write_files({a: "new\n", b: "new\n"})
    assert a.read_text() == b.read_text() == "new\n"


def test_run_group_kills_the_whole_group(tmp_path):
    """A child's own children (nvcc's ptxas and cicc) die with it on a signal."""
    pidf = tmp_path / "pid"
    _kill_self_later(signal.SIGTERM, 0.5)
    with pytest.raises(I.Interrupted), I.handling():
        I.run_group(["sh", "-c", f"sleep 30 & echo $! > {pidf}; wait"])
    pid = int(pidf.read_text())
    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"grandchild {pid} still runs")
