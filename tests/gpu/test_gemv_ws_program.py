"""Tuning.gemv_ws on the GPU: the tiny program built with gemv_ws (kernels/gemv_cv.cuh with
gemv_q4's arithmetic, AR = 1: a loader warp by bulk copies and consumer warps) gives bit for bit
the tokens and top-k logits of the default program, which runs gemv_q4 on the same launches (and
fuses SwiGLU into gate_up, which gemv_ws leaves to the swiglu kernel: the same bits by
construction). Fresh seeded prompts of several lengths, prefill chunks and decode steps."""

from __future__ import annotations

import numpy as np
import pytest

from qwen38gen.config import PRESETS
from qwen38gen.lanes import Lanes
from qwen38gen.tuning import Tuning
from qwen38gen.verify.check import quantized_synthetic, run_batches


@pytest.mark.parametrize("B", [1, 3, 16])
def test_gemv_ws_program_equals_the_default(B):
    cfg = PRESETS["tiny"]
    rng = np.random.default_rng([B, 32])
    prompts = [[int(t) for t in rng.integers(0, cfg.vocab_size, int(n))]
               for n in rng.integers(1, 40, B)]
    steps = 6
    tmax = max(map(len, prompts)) + steps
    tensors = quantized_synthetic(cfg)
    want, _ = run_batches(cfg, Lanes.make(B, pt=8), tensors, prompts, steps, tmax)
    ws = Lanes.make(B, pt=8, tuning=Tuning(gemv_ws=True))
    got, _ = run_batches(cfg, ws, tensors, prompts, steps, tmax)
    for i, (a, b) in enumerate(zip(want, got)):
        assert a["nonfinite"] is None and b["nonfinite"] is None, (i, a["nonfinite"], b["nonfinite"])
        assert a["tokens"] == b["tokens"], f"B={B} sequence {i}: tokens differ"
        assert np.array_equal(np.asarray(a["topk"], np.float64), np.asarray(b["topk"], np.float64)), \
            f"B={B} sequence {i}: top-k logits differ"
