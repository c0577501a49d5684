"""The program against HF transformers end to end, as a user would meet it.

A random HF ``Qwen3_5ForCausalLM`` of a geometry that is no preset (``GEOMETRY``: 12 layers, hidden
768, 4/2 attention heads, 2/4 GDN heads, vocabulary 1536), with weights of realistic scale
(linear ~ N(0, 1/in)) and perturbed norms, A_log and dt_bias, is saved in bf16 with
``save_pretrained``; ``qwen38gen quantize`` packs it to int4 g128; ``qwen38gen run`` serves
``PROMPT_LENGTHS`` prompts (greedy, ``NEW_TOKENS`` each) at two batch sizes. Then HF fp32 on the
dequantized int4 weights, teacher-forced on each request's prompt and generated tokens, judges
every generated token: it must be HF's argmax, or within ``NEAR_TIE`` σ of it (σ the row's
standard deviation), and every request's tokens must be the same at both batch sizes.

``NEAR_TIE``: the locks allow a model of this depth logits within ``golden.tol_logits("reference",
12)`` = 0.30 σ of fp32 (1.5 × HF's own bf16 error, docs/PRECISION.md); two logits each off by
that much can swap a pair closer than twice that, so a token is accepted where fp32's argmax beats
it by at most golden.argmax_margin("reference", 12) = 0.60 σ. A negative control (``flip``: one generated token replaced by fp32's least likely one
before judging) must fail.

The program runs through the CLI (``run --backend gpu``; ``emu`` on a CPU checks the harness).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..config import DECODER, LM_HEAD, MTP, PRESETS, ModelConfig
from ..presets import hybrid

GEOMETRY = dict(hidden_size=768, num_hidden_layers=12, layer_types=hybrid(12),
                intermediate_size=2048, vocab_size=1536, num_attention_heads=4,
                num_key_value_heads=2, linear_num_key_heads=2, linear_num_value_heads=4)
PROMPT_LENGTHS = (1, 5, 19, 40, 3)
NEW_TOKENS = 12
BATCHES = (2, 5)
def near_tie() -> float:
    """σ units: twice the logit tolerance of a model of this depth (golden.argmax_margin)."""
    from .golden import argmax_margin

    return argmax_margin("reference", GEOMETRY["num_hidden_layers"])


NEAR_TIE = near_tie()
SEED = 7


def e2e_config() -> ModelConfig:
    import dataclasses

    return dataclasses.replace(PRESETS["tiny"], name="hf-e2e", **GEOMETRY)


def make_hf_checkpoint(folder: Path, cfg: ModelConfig, seed: int = SEED) -> None:
    """A random HF Qwen3_5ForCausalLM of ``cfg`` saved in bf16 (no MTP layer)."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    d = cfg.to_hf_dict()
    d["mtp_num_hidden_layers"] = 0
    torch.manual_seed(seed)
    m = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**d))
    randomize(m, weights=True)
    m.to(torch.bfloat16).save_pretrained(folder)


def randomize(model, weights: bool) -> None:
    """Draw an HF model's parameters from torch's generator, in parameter order: the norms
    perturbed (zero-centred ones ~ U(−0.5, 0.5), the GDN gated norm ~ U(0.5, 1.5)), A_log and
    dt_bias ~ U(−1, 1); with ``weights`` also the conv taps ~ N(0, 0.5²), the embedding ~ N(0, 1)
    and every linear weight ~ N(0, 1/in), so activations stay O(1) (HF's own init is far
    smaller and makes near-uniform logits)."""
    import torch

    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("linear_attn.norm.weight"):
                p.uniform_(0.5, 1.5)
            elif n.endswith("norm.weight"):
                p.uniform_(-0.5, 0.5)
            elif n.endswith(("A_log", "dt_bias")):
                p.uniform_(-1.0, 1.0)
            elif not weights:
                continue
            elif n.endswith("conv1d.weight"):
                p.normal_(0.0, 0.5)
            elif n.endswith("embed_tokens.weight"):
                p.normal_(0.0, 1.0)
            elif p.dim() == 2:
                p.normal_(0.0, p.shape[1] ** -0.5)


def write_requests(path: Path, cfg: ModelConfig, seed: int = SEED) -> list[dict]:
    rng = np.random.default_rng(seed)
    reqs = [{"id": f"r{i}", "prompt_ids": [int(t) for t in rng.integers(0, cfg.vocab_size, n)],
             "max_tokens": NEW_TOKENS, "ignore_eos": True} for i, n in enumerate(PROMPT_LENGTHS)]
    path.write_text("".join(json.dumps(r) + "\n" for r in reqs))
    return reqs


def _cli(*args) -> str:
    r = subprocess.run([sys.executable, "-m", "cli", *map(str, args)], capture_output=True,
                       text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"qwen38gen {' '.join(map(str, args))}: exit {r.returncode}: "
                           f"{r.stderr.strip()[-2000:]}")
    return r.stdout


def hf_fp32_rows(cfg: ModelConfig, deq: dict, sequences: list[list[int]], device: str):
    """HF fp32 on the dequantized weights: for each token sequence, the logits of every row."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    d = cfg.to_hf_dict()
    d["tie_word_embeddings"] = False
    with torch.device(device):
        m = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**d))
    sd = {("model." + n[len(DECODER):] if n.startswith(DECODER) else n): torch.from_numpy(a)
          for n, a in deq.items() if not n.startswith(MTP)}
    missing, unexpected = m.load_state_dict(sd, strict=False)
    if missing or unexpected or LM_HEAD not in sd:
        raise ValueError(f"HF state dict: missing {missing}, unexpected {unexpected}")
    m = m.float().eval()
    with torch.no_grad():
        return [m(input_ids=torch.tensor([s], device=device)).logits[0].double().cpu().numpy()
                for s in sequences]


@dataclass
class Report:
    batches: tuple[int, ...]
    tokens: int = 0              # generated tokens judged
    exact: int = 0               # equal to HF fp32's argmax
    near_tie: list = field(default_factory=list)   # (request, step, gap in σ) within NEAR_TIE
    wrong: list = field(default_factory=list)      # (request, step, gap in σ) beyond it
    same_across_batches: bool = True
    differing: list = field(default_factory=list)  # request ids whose tokens differ between B

    @property
    def ok(self) -> bool:
        return self.same_across_batches and not self.wrong and self.tokens > 0

    def lines(self) -> list[str]:
        worst = max((g for _, _, g in self.near_tie), default=0.0)
        out = [f"HF end to end ({GEOMETRY['num_hidden_layers']} layers, hidden "
               f"{GEOMETRY['hidden_size']}, vocab {GEOMETRY['vocab_size']}; run at B = "
               f"{', '.join(map(str, self.batches))}): {self.tokens} tokens compared, "
               f"{self.exact} equal to HF fp32's argmax, {len(self.near_tie)} near ties "
               f"(worst {worst:.3f} σ, allowed {NEAR_TIE} σ), {len(self.wrong)} wrong; tokens "
               f"{'identical' if self.same_across_batches else 'DIFFERENT'} across batch sizes"]
        out += [f"  wrong: request {r} step {s}: HF's argmax beats it by {g:.3f} σ"
                for r, s, g in self.wrong[:10]]
        if self.differing:
            out.append(f"  differ across B: {', '.join(self.differing)}")
        return out


def judge(reqs: list[dict], runs: dict[int, dict], rows: list[np.ndarray],
          flip: tuple[str, int] | None = None) -> Report:
    """``runs[B][id]``: the tokens of each request at batch B; ``rows[i]``: HF fp32's logits over
    request i's prompt + tokens (teacher-forced on the first batch's tokens). ``flip`` = (request
    id, step): judge that token replaced by fp32's least likely one (the negative control)."""
    bs = sorted(runs)
    rep = Report(tuple(bs))
    for r in reqs:
        toks = [runs[B][r["id"]] for B in bs]
        if any(t != toks[0] for t in toks):
            rep.same_across_batches = False
            rep.differing.append(r["id"])
    for r, lg in zip(reqs, rows):
        toks = list(runs[bs[0]][r["id"]])
        n = len(r["prompt_ids"])
        for s, t in enumerate(toks):
            row = lg[n - 1 + s]
            if flip == (r["id"], s):
                t = int(np.argmin(row))
            gap = float(row.max() - row[t]) / (float(np.std(row)) or 1.0)
            rep.tokens += 1
            if gap == 0.0:
                rep.exact += 1
            elif gap <= NEAR_TIE:
                rep.near_tie.append((r["id"], s, gap))
            else:
                rep.wrong.append((r["id"], s, gap))
    return rep


def run_e2e(work: Path, backend: str = "gpu", batches=BATCHES, device: str = "cuda",
            flip: tuple[str, int] | None = None) -> tuple[Report, Report]:
    """Build, quantize, run and judge in ``work``; returns (report, negative control's report)
    (the control is the same runs judged with one token flipped: ``flip``, default request r2
    step 3)."""
    from ..quantize import dequantized_weights

    cfg = e2e_config()
    work = Path(work)
    src, q4 = work / "hf", work / "q4"
    make_hf_checkpoint(src, cfg)
    _cli("quantize", src, "-o", q4)
    reqs = write_requests(work / "requests.jsonl", cfg)
    runs = {}
    for B in batches:
        out = work / f"run-b{B}.jsonl"
        _cli("run", "--backend", backend, "--model", q4, "--prompts", work / "requests.jsonl",
             "--batch", B, "--output", out)
        lines = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
        runs[B] = {d["id"]: d["token_ids"] for d in lines}
    deq = dequantized_weights(q4)
    seqs = [r["prompt_ids"] + runs[batches[0]][r["id"]][:-1] for r in reqs]
    rows = hf_fp32_rows(cfg, deq, seqs, device)
    return judge(reqs, runs, rows), judge(reqs, runs, rows, flip or ("r2", 3))
