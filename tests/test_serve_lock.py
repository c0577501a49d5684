"""`check --serve` (qwen38gen/verify/serve_lock.py): the continuous-batching lock as a check mode. Here,
without a GPU, it runs on the emulated schedule and says so; it fails on a backend whose slot
reset leaves the old request's recurrent state behind."""

from __future__ import annotations

import subprocess
import sys
from contextlib import nullcontext

import pytest

from qwen38gen.config import PRESETS
from qwen38gen.emu.backend import EmuBackend
from qwen38gen.emu.spec_backend import EmuSpecBackend
from qwen38gen.lanes import Lanes
from qwen38gen.verify.serve_lock import (ctx_for, emu_backends, lock_requests, serve_lock,
                                         spec_serve_lock)
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


def test_check_serve_mtp_cli_without_gpu():
    """`check --serve --mtp 1` on the emulated programs: greedy requests batched through the
    speculative engine equal the plain program alone, sampled ones themselves alone."""
    p = subprocess.run([sys.executable, "-m", "cli", "check", "--serve", "--batch", "2", "--pt",
                        "4", "--mtp", "1"], capture_output=True, text=True,
                       env={"COLUMNS": "300", "PATH": "/usr/bin:/bin", "OPENBLAS_NUM_THREADS": "1"})
    assert p.returncode == 0, p.stderr
    assert "speculative serve lock (emu): batched --mtp 1 vs the plain program alone" in p.stdout
    assert "lane b2-btg8-pt4-q4-mtp1-sm90a-lmint4; 5 requests through 2 slots with --mtp 1: " \
        in p.stdout
    assert p.stdout.count(" ok ") == 5 and "PASS 5/5 requests" in p.stdout


class LeakySpecEmu(EmuSpecBackend):
    """Resets the position but keeps the recurrent state, conv ring and K/V of the last request."""

    def _reset_state(self, slot):
        self.emu.buf["pos"].reshape(-1)[slot] = 0


@pytest.mark.slow
def test_spec_lock_and_a_leaky_refill():
    cfg = PRESETS["tiny"]
    lanes = Lanes.make(2, pt=4, mtp=1)
    plain = emu_backends(cfg, Lanes.make(2, pt=4))
    res, stats = spec_serve_lock(plain, emu_backends(cfg, lanes), 2, 4, cfg)
    assert res.ok and stats.requests == 5 and stats.drafts_proposed > 0
    tensors, ctx = default_tensors(cfg, mtp=True), ctx_for(2, 4, cfg.vocab_size)

    def leaky(B):
        return nullcontext(LeakySpecEmu(cfg, lanes, tensors, ctx))

    res, _ = spec_serve_lock(plain, leaky, 2, 4, cfg)
    assert not res.ok and any(r[-1] == "MISMATCH" for r in res.rows)
