"""The published dense Qwen3.5 sizes: presets against their config.json numbers, the kernels'
support check, and the emitted schedule of each size's per-head geometry in the emulator.

The real sizes are too big for the CPU emulator (the 0.8B alone is 0.75 B parameters), so each
size runs as a "small twin", the way ``tiny`` relates to the 27B: the same per-head geometry
(head_dim 256, rotary 64, GDN heads 128 x 128, conv 4), the same query heads per kv head (G) and
GDN value heads per key head (r), the same tie of the embeddings, with few heads, small widths
and four layers. The 4B's twin keeps a hidden size that is an odd multiple of 128 (2560 = 20·128
there, 640 = 5·128 here), the rest 512.
"""

import dataclasses

import numpy as np
import pytest

from qwen38gen.config import PRESETS, PUBLISHED, _hybrid, load_config
from qwen38gen.emit import emit_program
from qwen38gen.emu.schedule import Emu
from qwen38gen.errors import UserError
from qwen38gen.inputs import put_chunk
from qwen38gen.lanes import Lanes, check_model
from qwen38gen.quantize import int4_weights
from qwen38gen.reference import Reference
from qwen38gen.weights import default_tensors

from tests._blas_threads import single_threaded  # noqa: F401
from tests._helpers import assert_final_state

# The published text_config numbers (Qwen/Qwen3.5-<size>/config.json; where each was read is in
# the comment above the presets in qwen38gen/config.py):
# size: (hidden, layers, intermediate, q heads, kv heads, GDN key heads, GDN value heads, tied)
PUBLISHED_NUMBERS = {
    "0.8B": (1024, 24, 3584, 8, 2, 16, 16, True),
    "2B": (2048, 24, 6144, 8, 2, 16, 16, True),
    "4B": (2560, 32, 9216, 16, 4, 16, 32, True),
    "9B": (4096, 32, 12288, 16, 4, 16, 32, False),
    "27B": (5120, 64, 17408, 24, 4, 16, 48, False),
}
TOL = 1e-9  # as tests/test_schedule_emulation.py: both fp64 on the same dequantized weights


@pytest.mark.parametrize("size", list(PUBLISHED_NUMBERS))
def test_preset_is_the_published_config(size):
    cfg = PRESETS[PUBLISHED[size]]
    got = (cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size,
           cfg.num_attention_heads, cfg.num_key_value_heads, cfg.linear_num_key_heads,
           cfg.linear_num_value_heads, cfg.tie_word_embeddings)
    assert got == PUBLISHED_NUMBERS[size]
    # shared by every size
    assert (cfg.head_dim, cfg.rotary_dim, cfg.linear_key_head_dim, cfg.linear_value_head_dim,
            cfg.linear_conv_kernel_dim, cfg.vocab_size, cfg.mtp_num_hidden_layers) == \
        (256, 64, 128, 128, 4, 248320, 1)
    assert cfg.mrope_section == (11, 11, 10) and cfg.rope_theta == 1e7
    assert cfg.layer_types == _hybrid(cfg.num_hidden_layers)
    assert load_config(PUBLISHED[size]) is cfg
    check_model(cfg)                         # every published size is one the kernels take


def test_tied_parameters_count_the_embedding_once():
    c = PRESETS["qwen3.5-0.8b"]
    untied = dataclasses.replace(c, tie_word_embeddings=False)
    assert untied.text_params - c.text_params == c.vocab_size * c.hidden_size
    # the int4 lm_head is read every step either way
    assert untied.linear_params == c.linear_params


def test_a_size_the_kernels_do_not_take_is_refused_by_name():
    c = dataclasses.replace(PRESETS["qwen3.5-2b"], name="qwen3.5-2b-hd128", head_dim=128,
                            mrope_section=(16,))
    with pytest.raises(UserError, match=r"model 'qwen3.5-2b-hd128': head_dim=128 is not supported "
                                        r"by the kernels; supported head_dim: 256"):
        check_model(c)


def small_twin(size: str):
    p = PRESETS[PUBLISHED[size]]
    return dataclasses.replace(
        p, name=f"{p.name}-twin", hidden_size=640 if p.hidden_size % 512 else 512,
        num_hidden_layers=4, layer_types=_hybrid(4), intermediate_size=896, vocab_size=1024,
        num_attention_heads=p.gqa_group, num_key_value_heads=1, linear_num_key_heads=2,
        linear_num_value_heads=2 * p.linear_ratio)


def emulate_against_reference(cfg, tensors, ref, man, B: int, pt: int, seed: int):
    """Prefill prompts of 9, 1 and 5 tokens in chunks of pt, then three decode steps of random
    tokens (not greedy: a tied model's greedy choice tends to repeat its input, which would leave
    the conv ring of identical rows); every logit row and the final state against the reference."""
    emu = Emu(man, cfg, tensors, tmax=64)
    rng = np.random.default_rng(seed)
    prompts = [list(map(int, rng.integers(0, cfg.vocab_size, (9, 1, 5)[b % 3]))) for b in range(B)]
    st = ref.new_state(B)
    ref_lg, _ = ref.prefill(st, prompts)
    for c in range(max(-(-len(p) // pt) for p in prompts)):
        emu.run(put_chunk(emu.put, man["schedule"], [p[c * pt:(c + 1) * pt] for p in prompts]))
        logits = emu.view(["buf", "logits", 0, 0], (B, cfg.vocab_size))
        for b, p in enumerate(prompts):
            if -(-len(p) // pt) == c + 1:
                err = np.abs(logits[b] - ref_lg[b][-1]).max()
                assert err < TOL, f"prefill, sequence {b}: {err:.3g}"
    worst = 0.0
    for step in range(3):
        nxt = [int(t) for t in rng.integers(0, cfg.vocab_size, B)]
        emu.buf["tokens"][:B], emu.buf["ntok"][:] = nxt, 1
        emu.run("decode")
        got = emu.view(["buf", "logits", 0, 0], (B, cfg.vocab_size))
        want, _ = ref.decode(st, nxt)
        worst = max(worst, float(np.abs(got - want).max()))
        assert worst < TOL, f"decode step {step}: {worst:.3g}"
    assert_final_state(cfg, emu, st, B, TOL)
    return worst


@pytest.fixture(scope="module", params=["0.8B", *(pytest.param(s, marks=pytest.mark.slow)
                                                   for s in ("2B", "4B", "9B"))])
def twin(request):
    cfg = small_twin(request.param)
    check_model(cfg)
    t = default_tensors(cfg)
    return cfg, t, Reference(cfg, int4_weights(cfg, t), dtype=np.float64)


@pytest.mark.parametrize("B,pt,btg", [(3, 4, None), (16, 4, None), (40, 4, 64)])
def test_small_twin_schedule_matches_reference(twin, B, pt, btg):
    """B = 3 (gemv_q4), 16 (SwiGLU in the gate_up epilogue), 40 in 64-row tiles (wgmma_q4)."""
    cfg, t, ref = twin
    man = emit_program(cfg, Lanes.make(B, btg=btg, pt=pt)).manifest
    emulate_against_reference(cfg, t, ref, man, B, pt, seed=B * 100 + pt)


@pytest.mark.slow
@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="nvcc not on PATH")
@pytest.mark.parametrize("size", ["0.8B", "2B", "4B", "9B"])
def test_published_size_passes_the_gate(size, tmp_path, monkeypatch):
    """One program of each real size (B = 16) compiles with no spills or stack frames."""
    from qwen38gen import gate as G
    from qwen38gen.emit import write_program

    monkeypatch.setenv("QWEN38_CACHE", str(tmp_path / "cache"))
    prog = emit_program(PRESETS[PUBLISHED[size]], Lanes.make(16))
    cu, _ = write_program(prog, tmp_path / "p.cu")
    res = G.gate_file(cu)
    assert not res.problems and {k.name for k in res.kernels} == set(prog.manifest["kernels"])
