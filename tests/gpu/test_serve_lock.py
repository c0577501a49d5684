"""`check --serve` on the GPU: the serve lock's requests through
B slots of the emitted tiny program on the PyCUDA runtime, each against itself run alone."""

from __future__ import annotations

import pytest

from qwen38gen.config import PRESETS
from qwen38gen.lanes import Lanes
from qwen38gen.verify.serve_lock import gpu_backends, serve_lock


@pytest.mark.parametrize("B", [2, 3, 16])
def test_serve_lock_on_the_gpu(B):
    cfg = PRESETS["tiny"]
    lanes = Lanes.make(B, pt=8)
    res, stats = serve_lock(gpu_backends(cfg, lanes), B, 8, cfg)
    assert res.ok, res.rows
    assert stats.requests == 2 * B + 1


def test_serve_lock_with_wide_chunk_tiles_on_the_gpu():
    """Tuning.chunk_btg = 64: chunks of 64 rows or more run the 64-row tile's GEMV kernels while
    decode steps (and a request's chunks alone, at most 32 rows) run the lane's 8-row tile; a
    decoder riding in a wide chunk must get the bits it gets in a decode step, so every request
    equals itself alone."""
    from qwen38gen.tuning import Tuning

    cfg = PRESETS["tiny"]
    lanes = Lanes.make(3, pt=32, tuning=Tuning(chunk_btg=64))
    res, stats = serve_lock(gpu_backends(cfg, lanes), 3, 32, cfg)
    assert res.ok, res.rows
    assert stats.prompt_rows > 0


@pytest.mark.parametrize("B", [2, 3])
def test_spec_serve_lock_on_the_gpu(B):
    """`check --serve --mtp 1` on the GPU: the speculative engine over the mtp program's slots
    (RuntimeSpecBackend, the host path for sampled requests): greedy requests equal the plain
    program alone, sampled ones themselves alone."""
    from qwen38gen.verify.serve_lock import spec_serve_lock

    cfg = PRESETS["tiny"]
    plain, spec = Lanes.make(B, pt=8), Lanes.make(B, pt=8, mtp=1)
    res, stats = spec_serve_lock(gpu_backends(cfg, plain), gpu_backends(cfg, spec), B, 8, cfg)
    print(f"\nspec serve lock B={B}: " + "; ".join(" ".join(r) for r in res.rows))
    assert res.ok, res.rows
    assert stats.requests == 2 * B + 1


@pytest.mark.parametrize("B", [2, 3])
def test_the_program_samples_as_the_host_does_on_the_gpu(B):
    """The mtp program judges sampled slots' drafts itself on the GPU (the default since version
    31: sampling.cuh SPEC = 1, spec_accept_sampled); every lock request gets the tokens of the
    host path (--tune spec_sample=0), and `check --serve --mtp 1`'s lock holds for it."""
    from qwen38gen.serve.spec_engine import SpecEngine
    from qwen38gen.tuning import Tuning
    from qwen38gen.verify.serve_lock import lock_requests, spec_serve_lock

    cfg = PRESETS["tiny"]
    host = Lanes.make(B, pt=8, mtp=1, tuning=Tuning.parse(["spec_sample=0"]))
    dev = Lanes.make(B, pt=8, mtp=1)
    reqs = lock_requests(B, 8, cfg.vocab_size)
    assert any(not r.sampling.greedy for r in reqs) and any(r.sampling.greedy for r in reqs)
    runs = {}
    for name, lanes in (("host", host), ("device", dev)):
        with gpu_backends(cfg, lanes)(B) as be:
            assert be.device_spec == (name == "device")
            runs[name] = {r.id: (r.token_ids, r.finish_reason) for r in SpecEngine(be).run(reqs)}
    assert runs["device"] == runs["host"]
    res, _ = spec_serve_lock(gpu_backends(cfg, Lanes.make(B, pt=8)), gpu_backends(cfg, dev), B, 8,
                             cfg)
    assert res.ok, res.rows
