"""qwen38gen/verify/hf_e2e.py's harness on the CPU: a random HF checkpoint of a geometry that is no
preset, quantized with `qwen38gen quantize`, served by `qwen38gen run --backend emu` (the emitted
schedule in numpy, fp64: the GPU test runs the CUDA program) at B = 2 and 5, judged by HF fp32
teacher-forced on the tokens. The flipped-token control must fail. A judge unit test covers the
verdicts without HF."""

from __future__ import annotations

import numpy as np
import pytest

from qwen38gen.verify import hf_e2e as E
from qwen38gen.lanes import check_model

from tests._blas_threads import single_threaded  # noqa: F401


def test_the_geometry_is_no_preset_and_the_kernels_take_it():
    from qwen38gen.config import PRESETS

    cfg = E.e2e_config()
    check_model(cfg)
    assert cfg.hash not in {p.hash for p in PRESETS.values()}
    assert cfg.num_hidden_layers == 12 and cfg.full_layers == (3, 7, 11)


def test_judge_verdicts():
    reqs = [{"id": "a", "prompt_ids": [0, 1]}, {"id": "b", "prompt_ids": [2]}]
    rows = [np.array([[0, 0, 0], [0, 5, 0], [3.0, 2.9, -9], [0, 0, 1]]),
            np.array([[1.0, 0, 0], [0, 0, 7]])]
    runs = {2: {"a": [1, 1, 2], "b": [0, 2]}, 5: {"a": [1, 1, 2], "b": [0, 2]}}
    rep = E.judge(reqs, runs, rows)
    # a: step 0 exact, step 1 a near tie (0.1 over a std of ~5.4), step 2 exact; b: both exact
    assert rep.ok and rep.tokens == 5 and rep.exact == 4 and len(rep.near_tie) == 1
    bad = E.judge(reqs, runs, rows, flip=("b", 1))
    assert not bad.ok and bad.wrong[0][:2] == ("b", 1)
    runs[5]["b"] = [0, 1]
    assert not E.judge(reqs, runs, rows).ok


@pytest.mark.slow
def test_end_to_end_on_the_emulated_program(tmp_path):
    pytest.importorskip("transformers")
    rep, control = E.run_e2e(tmp_path, backend="emu", device="cpu")
    print("\n".join(rep.lines()))
    assert rep.ok, rep.lines()
    assert rep.tokens == len(E.PROMPT_LENGTHS) * E.NEW_TOKENS
    assert not control.ok and control.wrong
