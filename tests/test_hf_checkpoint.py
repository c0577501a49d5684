"""A checkpoint as HF itself writes it, end to end on the CPU.

``Qwen3_5ForCausalLM`` with random weights and non-trivial norms (HF initialises the zero-centred
norms to 0 and the GDN norm to 1; we draw them), ``save_pretrained`` in bf16 (tensor names
``model.layers.*`` / ``model.embed_tokens.*``, no ``mtp.*``, no ``lm_head`` when tied), tied and
untied, with and without an MTP layer (HF has none, so its tensors are added to the file by
hand). Each goes through ``qwen38gen quantize`` and ``qwen38gen generate`` (subprocesses, as a
user runs them), and the schedule emulator on the quantized folder gives HF's logits (HF in fp32
on the dequantized weights) within the fp32 oracle's tolerance of tests/test_reference_hf.py
(1e-5 per row on the tiny geometry).
"""

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

from qwen38gen.config import DECODER, LM_HEAD, PRESETS, _hybrid
from qwen38gen.emit import emit_program
from qwen38gen.lanes import Lanes
from qwen38gen.quantize import dequantized_weights, load_quantized
from qwen38gen.reference import Reference
from qwen38gen.verify.hf_e2e import randomize
from qwen38gen.weights import synthetic_tensor
from qwen38gen.emu.schedule import Emu

from tests._blas_threads import single_threaded  # noqa: F401

TOL = 1e-5  # tests/test_reference_hf.py TOL[("tiny", "fp32")]
LAYERS = 4


def cfg_of(tied: bool):
    t = PRESETS["tiny"]
    return dataclasses.replace(t, name="hf-tiny", num_hidden_layers=LAYERS,
                               layer_types=_hybrid(LAYERS), tie_word_embeddings=tied)


def cli(*args, check=True):
    r = subprocess.run([sys.executable, "-m", "cli", *map(str, args)], capture_output=True,
                       text=True, timeout=600)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def hf_save(cfg, path, mtp: bool, seed: int = 3):
    torch.manual_seed(seed)
    m = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**cfg.to_hf_dict()))
    randomize(m, weights=False)   # norms, A_log and dt_bias; HF's own linear init
    m.to(torch.bfloat16).save_pretrained(path)
    f = path / "model.safetensors"
    t = load_file(f)
    assert "model.layers.0.input_layernorm.weight" in t
    assert (LM_HEAD in t) != cfg.tie_word_embeddings
    if mtp:  # HF writes no MTP layer; add one by hand, seeded
        t.update({n: synthetic_tensor(n, s, seed) for n, s in cfg.mtp_shapes().items()})
        save_file(t, str(f), metadata={"format": "pt"})
    return m


def hf_logits(cfg, deq: dict, prompt: list[int]) -> np.ndarray:
    """HF fp32 on the dequantized weights: the logits of every prompt row."""
    m = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**cfg.to_hf_dict())).float().eval()
    sd = {("model." + n[len(DECODER):] if n.startswith(DECODER) else n): torch.from_numpy(a)
          for n, a in deq.items() if not n.startswith("mtp.")}
    if cfg.tie_word_embeddings:
        # HF ties lm_head to embed_tokens; the program's lm_head is the int4 of the embedding
        m.lm_head.weight = torch.nn.Parameter(sd.pop(LM_HEAD))
    else:
        pass
    missing, unexpected = m.load_state_dict({k: v for k, v in sd.items() if k != LM_HEAD or
                                             not cfg.tie_word_embeddings}, strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= {"lm_head.weight"}, missing
    with torch.no_grad():
        return m(torch.tensor([prompt])).logits[0].double().numpy()


@pytest.mark.parametrize("tied", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["untied", "tied"])
@pytest.mark.parametrize("mtp", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["no-mtp", "mtp"])
def test_hf_saved_checkpoint_quantizes_generates_and_emulates(tmp_path, tied, mtp):
    cfg = cfg_of(tied)
    src, q = tmp_path / "hf", tmp_path / "q"
    hf_save(cfg, src, mtp)
    if not mtp:  # the config says mtp_num_hidden_layers 1 but the file has no mtp.*
        r = cli("quantize", src, "-o", q, check=False)
        assert r.returncode == 2 and "--no-mtp" in r.stderr and "missing tensor 'mtp." in r.stderr
        assert not q.exists()
    cli("quantize", src, "-o", q, *([] if mtp else ["--no-mtp"]))
    written = json.loads((q / "config.json").read_text())
    assert written["mtp_num_hidden_layers"] == (1 if mtp else 0)
    loaded = load_quantized(q)
    assert any(n.startswith("mtp.") for n in loaded) == mtp
    qcfg = dataclasses.replace(cfg, mtp_num_hidden_layers=int(mtp))
    prompt = [5, 900, 17, 3, 3, 250, 1000]
    g = cli("generate", "--weights", q, "--prompt-ids", ",".join(map(str, prompt)), "--steps", 3)
    assert "reference greedy generation" in g.stdout
    # the emulated program on the quantized folder against HF on the dequantized weights
    deq = dequantized_weights(loaded)
    want = hf_logits(qcfg, deq, prompt)
    # ... and the numpy reference (what generate runs) on them, every prompt row
    ref = Reference(qcfg, deq, dtype=np.float64)
    ref_lg, _ = ref.prefill(ref.new_state(1), [prompt])
    ref_err = np.linalg.norm(ref_lg[0] - want, axis=-1) / np.linalg.norm(want, axis=-1)
    assert ref_err.max() <= TOL, ref_err
    B, pt = 1, 4
    man = emit_program(qcfg, Lanes.make(B, pt=pt)).manifest
    emu = Emu(man, qcfg, loaded, tmax=64)
    rows = []
    for c in range(0, len(prompt), pt):
        piece = prompt[c:c + pt]
        emu.buf["tokens"][:len(piece)], emu.buf["ntok"][:] = piece, len(piece)
        emu.run("prefill")
        rows.append(emu.view(["buf", "logits", 0, 0], (B, qcfg.vocab_size))[0].copy())
    got = np.array(rows)
    last = want[[min(c + pt, len(prompt)) - 1 for c in range(0, len(prompt), pt)]]
    err = np.linalg.norm(got - last, axis=-1) / np.linalg.norm(last, axis=-1)
    print(f"emulator vs HF fp32, tied={tied}, mtp={mtp}: max row rel error {err.max():.3g}")
    assert err.max() <= TOL, err


# ------------------------------------------------------------------------------------ bad input
def test_quantize_sigterm_leaves_no_temp_folder(tmp_path):
    """SIGTERM during quantize removes the temp folder, as Ctrl-C does."""
    import os
    import signal

    from qwen38gen.interrupt import Interrupted
    from qwen38gen.quantize import quantize_checkpoint
    from qwen38gen.checkpoint import save_checkpoint
    from qwen38gen.weights import synthetic_weights

    cfg = PRESETS["tiny"]
    save_checkpoint(cfg, synthetic_weights(cfg, 1), tmp_path / "src")

    def progress(done, total, name):
        if done == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(Interrupted) as e:
        quantize_checkpoint(tmp_path / "src", tmp_path / "q", progress=progress)
    assert e.value.exit_code == 143
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


@pytest.mark.parametrize("args,msg", [
    (("--seed", "-1"), r"error: --seed -1 must be ≥ 0"),
    (("--prompt", "1 2 3"), r"error: --prompt '1 2 3' is not a comma-separated list of token ids"),
    (("--prompt-ids", "1 2 3"), r"error: --prompt-ids '1 2 3' is not a comma-separated list"),
])
def test_generate_bad_input(args, msg):
    import re

    r = cli("generate", *args, check=False)
    assert r.returncode == 2 and re.search(msg, r.stderr) and "Traceback" not in r.stderr, r.stderr


def test_generate_refuses_a_model_too_big_before_building(monkeypatch):
    from qwen38gen import reference
    from qwen38gen.errors import UserError

    monkeypatch.setattr(reference, "memory_available", lambda: 64 * 10**9)
    with pytest.raises(UserError, match=r"generate of 'qwen3.8-27b' would need about 164 GB of "
                                        r"memory for the CPU reference \(26.9 B parameters"):
        reference.check_fits(PRESETS["qwen3.8-27b"], "generate")
    reference.check_fits(PRESETS["tiny"], "generate")


def test_generate_weights_reads_the_folders_config(tmp_path):
    """--weights DIR without --model takes DIR/config.json (toy here, not the default tiny);
    a --model of another geometry is refused."""
    from qwen38gen.checkpoint import save_checkpoint
    from qwen38gen.weights import synthetic_weights

    cfg = PRESETS["toy"]
    save_checkpoint(cfg, synthetic_weights(cfg, 1), tmp_path / "toy")
    r = cli("generate", "--weights", tmp_path / "toy", "--prompt-ids", "1,2,3", "--steps", 2)
    assert "toy" in r.stdout
    r = cli("generate", "--weights", tmp_path / "toy", "--model", "tiny", check=False)
    assert r.returncode == 2 and "is not the geometry of --weights" in r.stderr


@pytest.mark.slow
def test_model_dir_on_info_quantize_and_generate(tmp_path):
    """--model DIR names a checkpoint folder on info, quantize and generate; generate --model DIR
    runs on the folder's weights (the same tokens as --weights DIR)."""
    from qwen38gen.checkpoint import save_checkpoint
    from qwen38gen.weights import synthetic_weights

    cfg = PRESETS["tiny"]
    src, q = tmp_path / "src", tmp_path / "q"
    save_checkpoint(cfg, synthetic_weights(cfg, 1), src)
    assert f"config hash {cfg.hash}" in cli("info", "--model", src).stdout
    cli("quantize", "--model", src, "-o", q)
    a = cli("generate", "--model", q, "--prompt-ids", "1,2,3", "--steps", 3).stdout
    b = cli("generate", "--weights", q, "--prompt-ids", "1,2,3", "--steps", 3).stdout
    c = cli("generate", "--model", "tiny", "--prompt-ids", "1,2,3", "--steps", 3).stdout
    row = lambda s: [ln for ln in s.splitlines() if "1,2,3" in ln][0]  # noqa: E731
    assert row(a) == row(b) and row(a) != row(c)
    r = cli("quantize", "-o", q, check=False)
    assert r.returncode == 2 and "quantize needs the checkpoint folder" in r.stderr
