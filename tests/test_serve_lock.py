"""`check --serve` (qwen38gen/verify/serve_lock.py): the continuous-batching lock as a check mode. Here,
without a GPU, it runs on the emulated schedule and says so; it fails on a backend whose slot
reset leaves the old request's recurrent state behind."""

from __future__ import annotations

import subprocess
import sys
from contextlib import nullcontext

from qwen38gen.config import PRESETS
from qwen38gen.emu.backend import EmuBackend
from qwen38gen.lanes import Lanes
from qwen38gen.verify.serve_lock import ctx_for, emu_backends, lock_requests, serve_lock
from qwen38gen.weights import default_tensors

from tests._blas_threads import single_threaded  # noqa: F401  (autouse: 1 BLAS thread)


def test_lock_requests_cover_the_cases():
    reqs = lock_requests(3, 4, 1024)
    assert len(reqs) == 7
    assert min(len(r.prompt) for r in reqs) == 1 and max(len(r.prompt) for r in reqs) > 2 * 4
    assert len({r.max_tokens for r in reqs}) >= 5
    assert {r.sampling.greedy for r in reqs} == {True, False}


def test_check_serve_cli_without_gpu():
    p = subprocess.run([sys.executable, "-m", "cli", "check", "--serve", "--batch", "2", "--pt",
                        "4"], capture_output=True, text=True,
                       env={"COLUMNS": "300", "PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr
    assert "The serve lock runs on the emu backend: the program's schedule in numpy, not the " \
           "CUDA kernels." in p.stdout.splitlines()
    assert "serve lock (emu): batched vs alone" in p.stdout
    assert "lane b2-btg8-pt4-q4-mtp0-sm90a-lmint4; 5 requests through 2 slots: " in p.stdout
    assert p.stdout.count(" ok ") == 5 and "PASS 5/5 requests" in p.stdout


class LeakyEmu(EmuBackend):
    """Resets the position but keeps the recurrent state and conv ring of the last request."""

    def reset_slot(self, slot):
        self.emu.buf["pos"].reshape(-1)[slot] = 0


def test_a_leaky_reset_fails_the_lock():
    cfg = PRESETS["tiny"]
    lanes = Lanes.make(2, pt=4)
    res, stats = serve_lock(emu_backends(cfg, lanes), 2, 4, cfg)
    assert res.ok and stats.requests == 5
    tensors, ctx = default_tensors(cfg), ctx_for(2, 4, cfg.vocab_size)

    def leaky(B):
        return nullcontext(LeakyEmu(cfg, lanes, tensors, ctx))

    res, _ = serve_lock(leaky, 2, 4, cfg)
    assert not res.ok and any(r[-1] == "MISMATCH" for r in res.rows)
