"""The signal policy of every command that writes or spawns (STYLE.md principle 19).

While ``handling()`` is active (the CLI's ``main`` holds it for the whole command), SIGINT, SIGTERM
and SIGHUP raise ``Interrupted`` in the main thread, so that every ``finally`` and
``except BaseException`` on the way out runs: temp files and folders are removed where they were
made (``outputs``, ``checkpoint.atomic_dir``, the gate's work folder). Before it raises, the handler
kills the process group of every child started by ``run_group`` (nvcc and the ptxas and cicc it
starts) and ignores further signals, so the clean-up itself is not cut short. ``critical()``
defers a signal over a few renames that must happen together (the .cu and its manifest, a folder
swap); it is raised once they are done. The CLI exits 128 + the signal's number: 130 for SIGINT,
143 for SIGTERM, 129 for SIGHUP.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(BaseException):
    """A signal stopped the command. Not an Exception: nothing catching errors swallows it."""

    def __init__(self, signum: int):
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(f"interrupted by {self.name}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


_lock = threading.Lock()
_children: set[subprocess.Popen] = set()
_state = {"depth": 0, "stopping": None, "defer": 0, "pending": None}


def stopping() -> bool:
    """Whether a signal has been received (worker threads stop starting new work)."""
    return _state["stopping"] is not None


def kill_children() -> None:
    """Kill the process group of every child that run_group started and that still runs."""
    with _lock:
        procs = list(_children)
    for p in procs:
        with contextlib.suppress(OSError):
            os.killpg(p.pid, signal.SIGKILL)


def _handler(signum, frame):
    if _state["stopping"] is not None:
        return
    _state["stopping"] = signum
    for s in SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    kill_children()
    if _state["defer"]:
        _state["pending"] = signum
        return
    raise Interrupted(signum)


@contextlib.contextmanager
def handling():
    """Install the policy (main thread only; elsewhere, and when already installed, a no-op);
    the previous handlers are put back on the way out."""
    if threading.current_thread() is not threading.main_thread() or _state["depth"]:
        yield
        return
    old = {s: signal.getsignal(s) for s in SIGNALS}
    _state.update(depth=1, stopping=None, pending=None, defer=0)
    for s in SIGNALS:
        signal.signal(s, _handler)
    try:
        yield
    finally:
        _state.update(depth=0, stopping=None, pending=None, defer=0)
        for s, h in old.items():
            signal.signal(s, h)


def in_worker() -> None:
    """The initializer of a worker process forked from a command: a terminal's Ctrl-C is the
    parent's to handle (ignored here), SIGTERM and SIGHUP end the worker at once; the parent's
    handlers and children are not its own."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_DFL)
    _state.update(depth=0, stopping=None, pending=None, defer=0)
    with _lock:
        _children.clear()


@contextlib.contextmanager
def critical():
    """Defer a signal until the block is done (a few renames that go together); then raise it."""
    _state["defer"] += 1
    try:
        yield
    finally:
        _state["defer"] -= 1
    if not _state["defer"] and _state["pending"] is not None:
        signum, _state["pending"] = _state["pending"], None
        raise Interrupted(signum)


def run_group(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output=True, text=True) in a process group of its own, which is
    killed whole (nvcc's ptxas and cicc too) if this process is interrupted or fails meanwhile."""
    if stopping():
        raise Interrupted(_state["stopping"])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, **kw)
    with _lock:
        _children.add(proc)
    try:
        out, err = proc.communicate()
    except BaseException:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    finally:
        with _lock:
            _children.discard(proc)
        for f in (proc.stdout, proc.stderr):
            with contextlib.suppress(OSError):
                f.close()
    if stopping() and proc.returncode < 0:
        raise Interrupted(_state["stopping"])
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
