"""Golden single-sequence runs: their setup, file format, validation and comparisons.

A golden file holds what the batch-1 program computed on the GPU for the embedded default (the
``tiny`` preset, seeded synthetic int4 weights): per prompt the greedy token ids and, per step,
the top-k logits. It is written by `qwen38gen golden --update` only after it agrees with the numpy
reference, and carries the format version, config hash, lane name and generator version, plus a
digest of its payload; a stale or corrupted file is refused with the command that regenerates it.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import __version__
from ..compare import nonfinite_where, worst
from ..config import PRESETS, ModelConfig
from ..errors import UserError
from ..lanes import DEFAULT_PT, Lanes, lane_name
from ..resources import golden_dir
from ..weights import DEFAULT_SEED

FORMAT = "qwen38gen-golden"
VERSION = 1
REGENERATE = "qwen38gen golden --update   (on a machine with a GPU)"

MODEL = "tiny"
SEED = DEFAULT_SEED   # synthetic weights
PROMPT_SEED = 1234
PROMPT_LENGTHS = (1, 2, 3, 5, 8, 13, 16, 17, 24, 31, 32, 33, 47, 64, 65, 70)
STEPS = 64

# The tolerance rule (docs/PRECISION.md): the program may be no worse than RULE times the error
# of HF transformers' own bf16 inference against fp32, on the same dequantized int4 weights, at the
# same depth, in the same setting (prompts and steps). HF bf16 is the precision users accept every
# day; measured, the program sits at 0.8 to 1.5 times it (worst per layer 1.29, worst logits 1.47).
# Errors: logits as max |Δ| over the run's top-k token ids in units of σ, the standard deviation
# of the reference row; states as ‖x − fp32‖ / ‖fp32‖ per layer and kind (recurrent state, conv
# ring, K, V) at the end of the stream. The yardstick tables hold HF bf16's worst error over
# sequences and kinds, as a running maximum over depth (a layer's allowance never falls below a
# shallower one's), and over steps for logits.
RULE = 1.5
YARDSTICK = {
    # The golden lock (tiny, the 16 golden prompts, 64 steps, teacher-forced on the golden
    # tokens): HF bf16 vs fp32 on a CPU (torch 2.13, transformers 5.17), scripts/precision.py
    # golden -> bench/precision/2026-12-06-cpu-golden-yardstick.json.
    "golden": {"logits": 0.0953,
               "state": (0.0061, 0.0110, 0.0150, 0.0150, 0.0208, 0.0247, 0.0292, 0.0292)},
    # check --reference (prompts of 1, 7, 16, 33 tokens, 16 steps) over tiny, qwen3.5-0.8b, -2b
    # and -4b: HF bf16 vs fp32 on an H100 (torch 2.11, transformers 5.17), scripts/precision.py
    # run -> bench/precision/2026-12-06-h100-precision.json. Logits by the model's layer count
    # (a deeper model than measured takes the deepest value), state by depth (layers deeper than
    # measured take the deepest value times depth / 32: the measured error grows about linearly
    # with depth).
    "reference": {"logits": ((8, 0.068), (24, 0.199), (32, 0.199)),
                  "state": (0.0062, 0.0107, 0.0150, 0.0163, 0.0208, 0.0253, 0.0281, 0.0281,
                            0.0333, 0.0338, 0.0387, 0.0387, 0.0491, 0.0534, 0.0627, 0.0627,
                            0.0627, 0.0660, 0.0718, 0.0718, 0.0764, 0.0764, 0.0828, 0.0828,
                            0.0828, 0.0828, 0.0828, 0.0828, 0.0828, 0.0828, 0.0828, 0.0828)},
}
# The argmax must agree wherever the reference's top-2 margin exceeds twice the logit tolerance
# (two logits each off by the tolerance can swap a pair closer than that).
ARGMAX_FACTOR = 2.0


def tol_logits(setting: str, layers: int) -> float:
    """The logit tolerance in σ of ``setting`` ("golden" or "reference") for a model of
    ``layers`` layers: RULE × HF bf16's error there."""
    y = YARDSTICK[setting]["logits"]
    if isinstance(y, float):
        return RULE * y
    return RULE * next((e for n, e in y if layers <= n), y[-1][1])


def tol_state(setting: str, layer: int) -> float:
    """The state tolerance of layer ``layer`` (0 = first): RULE × HF bf16's error at that depth."""
    y = YARDSTICK[setting]["state"]
    if layer < len(y):
        return RULE * y[layer]
    return RULE * y[-1] * (layer + 1) / len(y)


def argmax_margin(setting: str, layers: int) -> float:
    return ARGMAX_FACTOR * tol_logits(setting, layers)


def golden_prompts(cfg: ModelConfig, seed: int = PROMPT_SEED) -> list[list[int]]:
    """16 prompts of the lengths above (1 token, and more than 64), seeded token ids."""
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, cfg.vocab_size, n)] for n in PROMPT_LENGTHS]


def golden_lanes() -> Lanes:
    """The batch-1 program that produces the golden runs (the portable sm_90 build: the batched
    programs of either arch are checked against it bit for bit)."""
    return Lanes.make(1, pt=DEFAULT_PT, arch="sm_90")


def golden_path(cfg: ModelConfig | None = None, lanes: Lanes | None = None,
                folder: Path | None = None) -> Path:
    """The golden file of (cfg, lanes) in ``folder`` (default: the packaged golden/ folder)."""
    cfg = cfg or PRESETS[MODEL]
    return Path(folder or golden_dir()) / f"{cfg.name}_{lane_name(lanes or golden_lanes())}.json"


def _digest(seqs: list) -> str:
    return hashlib.sha256(json.dumps(seqs, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


@dataclass
class Golden:
    cfg_hash: str
    lane: str
    seed: int
    steps: int
    sequences: list[dict]   # {"prompt": [...], "tokens": [...], "topk": [[[id, logit]...]...]}
    generator: str = f"qwen38gen {__version__}"

    def to_json(self) -> str:
        return json.dumps({
            "format": FORMAT, "version": VERSION, "generator": self.generator,
            "model": MODEL, "config_hash": self.cfg_hash, "lane": self.lane,
            "weights": {"kind": "synthetic-int4", "seed": self.seed}, "steps": self.steps,
            "digest": _digest(self.sequences), "sequences": self.sequences,
        }, indent=0, sort_keys=True) + "\n"


def load_golden(path: Path | None = None, cfg: ModelConfig | None = None,
                folder: Path | None = None) -> Golden:
    """Read and verify a golden file (``path``, else the one of ``folder``, else the packaged
    one); refuse stale, corrupted or malformed data naming the fix."""
    cfg = cfg or PRESETS[MODEL]
    if path is None and folder is not None and not Path(folder).is_dir():
        raise UserError(f"golden folder {str(folder)!r} does not exist or is not a folder; give "
                        f"the folder that holds {golden_path(cfg, folder=Path('.')).name}")
    path = Path(path) if path else golden_path(cfg, folder=folder)
    fix = f"regenerate it with: {REGENERATE}"
    if not path.is_file():
        raise UserError(f"golden file {path} is missing; {fix}")
    try:
        d = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"golden file {path} is corrupted (not JSON: {e}); {fix}") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise UserError(f"golden file {path} is not a {FORMAT} file; {fix}")
    if d.get("version") != VERSION:
        raise UserError(f"golden file {path} has format version {d.get('version')}, this qwen38gen "
                        f"reads version {VERSION}; {fix}")
    for key in _KEYS:
        if key not in d:
            raise UserError(f"golden file {path} lacks the key {key!r}; {fix}")
    if d["config_hash"] != cfg.hash:
        raise UserError(f"golden file {path} is stale: config hash {d['config_hash']} != "
                        f"{cfg.hash} of {cfg.name!r}; {fix}")
    seqs = d["sequences"]
    if not isinstance(seqs, list) or d["digest"] != _digest(seqs):
        raise UserError(f"golden file {path} is corrupted (payload digest mismatch); {fix}")
    want = {"model": MODEL, "lane": golden_lanes().name, "steps": STEPS,
            "weights": {"kind": "synthetic-int4", "seed": SEED}}
    for key, v in want.items():
        if d[key] != v:
            raise UserError(f"golden file {path} is stale: {key} is {json.dumps(d[key])}, this "
                            f"version's setup has {json.dumps(v)}; {fix}")
    for i, s in enumerate(seqs):
        problem = _sequence_problem(s, cfg)
        if problem:
            raise UserError(f"golden file {path} is malformed: sequence {i} {problem}; {fix}")
    if [s["prompt"] for s in seqs] != golden_prompts(cfg):
        raise UserError(f"golden file {path} is stale: its prompts differ from this version's "
                        f"setup; {fix}")
    return Golden(cfg_hash=d["config_hash"], lane=d["lane"], seed=d["weights"]["seed"],
                  steps=d["steps"], sequences=seqs, generator=d.get("generator", "?"))


# Every key a golden file must hold (the generator's name is informative only).
_KEYS = ("model", "config_hash", "lane", "weights", "steps", "digest", "sequences")


def _is_id(v, vocab: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < vocab


def _sequence_problem(s, cfg: ModelConfig) -> str | None:
    """What is wrong with one golden sequence ({prompt, tokens, topk}, STEPS of each), or None."""
    if not isinstance(s, dict):
        return "is not a JSON object"
    for key in ("prompt", "tokens", "topk"):
        if not isinstance(s.get(key), list):
            return f"lacks the list {key!r}"
    if len(s["tokens"]) != STEPS or len(s["topk"]) != STEPS:
        return (f"has {len(s['tokens'])} tokens and {len(s['topk'])} topk rows; both must be "
                f"steps = {STEPS}")
    if not all(_is_id(t, cfg.vocab_size) for t in s["prompt"] + s["tokens"]):
        return f"has a token id outside the vocabulary 0..{cfg.vocab_size - 1}"
    for r, row in enumerate(s["topk"]):
        ok = isinstance(row, list) and row and all(
            isinstance(e, list) and len(e) == 2 and _is_id(e[0], cfg.vocab_size)
            and isinstance(e[1], (int, float)) and not isinstance(e[1], bool) for e in row)
        if not ok:
            return f"topk row {r} is not a non-empty list of [token id, logit] pairs"
        bad = next((e for e in row if not math.isfinite(e[1])), None)
        if bad is not None:
            return f"topk row {r} holds a non-finite logit ({bad[1]}) for token {bad[0]}"
    return None


def reference_logits(ref, prompt: list[int], tokens: list[int]):
    """Teacher-forced reference: (logits [len(tokens), vocab], final State); row s predicts
    tokens[s] (row 0 from the prompt, row s from the prompt and tokens[:s])."""
    st = ref.new_state(1)
    lg, _ = ref.forward(st, [list(prompt)])
    rows = [lg[0][-1]]
    for t in tokens[:-1]:
        lg, _ = ref.forward(st, [[int(t)]])
        rows.append(lg[0][0])
    return np.stack(rows), st


@dataclass
class SeqReport:
    index: int
    steps: int
    max_logit_err: float
    argmax_checked: int
    argmax_mismatch: int
    first_mismatch: int | None
    nonfinite: str | None = None   # where a non-finite logit was (run or reference), or None
    logit_tol: float = float("inf")

    @property
    def ok(self) -> bool:
        # NaN fails every comparison: ``nan <= tol`` is False, and nonfinite names where it was.
        return (self.nonfinite is None and self.argmax_mismatch == 0
                and self.max_logit_err <= self.logit_tol)


def compare_to_reference(seq: dict, ref_logits: np.ndarray, index: int,
                         setting: str = "golden", layers: int | None = None) -> SeqReport:
    """One sequence's top-k logits and argmax (GPU or golden) against reference logits, in units
    of σ, the standard deviation of each reference row, with the tolerances of
    ``setting`` for a model of ``layers`` layers (default: the golden model's).

    Any non-finite value fails the comparison, with its place named: in the run's top-k logits,
    in the reference's row, or in the program's full logits row (``seq["nonfinite"]``, set by
    the runtime, which scans every logit a step wrote, not only the top k). So does a token id
    outside the vocabulary (what an argmax over NaN can return)."""
    layers = PRESETS[MODEL].num_hidden_layers if layers is None else layers
    ltol, margin = tol_logits(setting, layers), argmax_margin(setting, layers)
    vocab = ref_logits.shape[1]
    worst_err, checked, bad, first = 0.0, 0, 0, None
    where = seq.get("nonfinite")
    for s, (tok, top) in enumerate(zip(seq["tokens"], seq["topk"])):
        ids = np.array([i for i, _ in top])
        vals = np.array([v for _, v in top], dtype=np.float64)
        out = [int(i) for i in ids if not 0 <= i < vocab] + ([] if 0 <= tok < vocab else [tok])
        if out:
            where = where or (f"sequence {index} step {s}: token id {out[0]} outside the "
                              f"vocabulary 0..{vocab - 1}")
            continue
        broken = (nonfinite_where(vals, f"sequence {index} step {s} top-k logits")
                  or nonfinite_where(ref_logits[s], f"sequence {index} step {s} reference logits"))
        if broken:
            where = where or broken
            continue
        sigma = float(np.std(ref_logits[s])) or 1.0
        row, vals = ref_logits[s] / sigma, vals / sigma
        worst_err = worst([worst_err, np.max(np.abs(vals - row[ids]))])
        two = np.sort(row)[-2:]
        if two[1] - two[0] > margin:
            checked += 1
            if int(np.argmax(row)) != int(tok):
                bad += 1
                first = s if first is None else first
    return SeqReport(index, len(seq["tokens"]), worst_err, checked, bad, first, where, ltol)
