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
