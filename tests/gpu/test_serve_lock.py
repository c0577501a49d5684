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
