"""The CUDA program against HF transformers end to end (qwen38gen/verify/hf_e2e.py): a random HF
checkpoint of a geometry that is no preset, `qwen38gen quantize`, `qwen38gen run --backend gpu`
at B = 2 and 5, HF fp32 on the dequantized weights teacher-forced on the tokens. Every token is
HF's argmax or within the stated near-tie margin, tokens are identical across the batch sizes,
and the flipped-token control fails. The report line is printed (the device log keeps it)."""

from __future__ import annotations

import pytest

from qwen38gen.verify import hf_e2e as E


def test_program_against_hf_end_to_end(tmp_path):
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "Qwen3_5ForCausalLM"):
        pytest.skip(f"transformers {transformers.__version__} has no Qwen3_5ForCausalLM")
    rep, control = E.run_e2e(tmp_path, backend="gpu", device="cuda")
    print("\n" + "\n".join(rep.lines()))
    print("negative control: " + control.lines()[0])
    assert rep.ok, rep.lines()
    assert rep.tokens == len(E.PROMPT_LENGTHS) * E.NEW_TOKENS
    assert not control.ok and control.wrong
