"""Lanes: every emit-time choice in one frozen dataclass, its validation, its one name.

The supported set is the table ``SUPPORTED``; validation and the emitter read the same table, and
a rejection names the field, the value and what is allowed, before any file is written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace

from .config import ModelConfig
from .errors import UserError
from .tuning import Tuning

PT_ENV = "QWEN38_PT"
DEFAULT_PT = 16
# sm_90a: the H100/H200 family target, with warpgroup MMA (wgmma_q4 serves the 24- to 64-row
# batch tiles where it measured faster); sm_90: the portable target, gemv_q4/gemm_q4 only. Both
# give the same bits (tests/gpu/test_gemv_q4.py).
DEFAULT_ARCH = "sm_90a"

# The supported set. Integer ranges are inclusive.
SUPPORTED = {
    "batch": range(1, 257),
    "btg": (8, 16, 24, 32, 64),
    "pt": range(1, 129),
    "q4": (True,),
    "mtp": (0, 1, 2, 3, 4),
    "arch": ("sm_90a", "sm_90"),
    "lm_head": ("int4",),
}

# Model geometry the kernels are written for (the 27B per-head geometry; widths are free).
MODEL_SUPPORT = {
    "linear_key_head_dim": (128,),
    "linear_value_head_dim": (128,),
    "head_dim": (256,),
    "rotary_dim": (64,),
    "linear_conv_kernel_dim": (4,),
}
MULTIPLE_OF_128 = ("hidden_size", "intermediate_size", "linear_value_dim", "q_dim", "conv_dim")
# Query heads per kv head: attn_tc (the program's attention) holds them in one 8-wide n-tile of
# Pᵀ; attention.cuh's attn would take more, but spills from 12 on (a G = 12 config fails the gate).
MAX_GQA_GROUP = 8


def _describe(allowed) -> str:
    if isinstance(allowed, range):
        return f"{allowed.start}..{allowed.stop - 1}"
    return ", ".join(str(a) for a in allowed)


# A model whose int4 weights take at most this many bytes keeps them in L2 (50 MB on the H100
# and H200) from one weight pass to the next: extra passes cost nothing, so its tile stops at
# 16 rows (version 28: the tiny model's B = 64 step 0.56 -> 0.26 ms at 16 rows, H100).
SMALL_WEIGHTS = 16 * 2**20
SMALL_BTG = 16


def default_btg(batch: int, weight_bytes: float | None = None) -> int:
    """The smallest supported batch tile that holds min(batch, 64) sequences: one pass over the
    weights serves up to 64 sequences (wgmma_q4 or gemm_q4 at 64 rows, plan/table.py). The
    24-row tile (version 16) serves B = 17 ... 24 for less than the 32-row one. With the model's
    int4 ``weight_bytes`` at most SMALL_WEIGHTS, at most 16 rows: the weights sit in L2, and the
    64-row kernels' pipelines, on the 8–16 blocks such a model's projections give them, cost
    more than the passes they save (gemv_q4 over grid.y instead)."""
    want = min(batch, 64)
    if weight_bytes is not None and weight_bytes <= SMALL_WEIGHTS:
        want = min(want, SMALL_BTG)
    return next(t for t in SUPPORTED["btg"] if t >= want)


def capped_btg(batch: int, btg: int | None) -> int | None:
    """``bench --btg``'s tile at batch B: at most what B needs (None: the default from B)."""
    return None if btg is None else min(btg, max_btg(batch))


def max_btg(batch: int) -> int:
    """A tile larger than the smallest one that holds the whole batch only wastes registers."""
    return next(t for t in SUPPORTED["btg"] if t >= min(batch, SUPPORTED["btg"][-1]))


def pt_from_env() -> int:
    """The prefill chunk width from QWEN38_PT, else DEFAULT_PT."""
    raw = os.environ.get(PT_ENV)
    if raw is None or raw == "":
        return DEFAULT_PT
    try:
        return int(raw)
    except ValueError:
        raise UserError(f"{PT_ENV}={raw!r} is not an integer; "
                        f"pt must be in {_describe(SUPPORTED['pt'])}") from None


@dataclass(frozen=True)
class Lanes:
    """One lane choice. ``Lanes.make`` fills the defaults; the constructor validates."""

    batch: int
    btg: int
    pt: int
    q4: bool = True
    mtp: int = 0
    arch: str = DEFAULT_ARCH
    lm_head: str = "int4"
    # The schedule choices beyond the lanes (tuning.py): the table's unless set, and then part
    # of the name.
    tuning: Tuning = Tuning()

    def __post_init__(self):
        if not isinstance(self.tuning, Tuning):
            raise UserError(f"lane tuning={self.tuning!r} is not a Tuning; build it with "
                            "Tuning.parse(['KEY=VALUE', ...])")
        for f in fields(self):
            if f.name == "tuning":
                continue
            v = getattr(self, f.name)
            allowed = SUPPORTED[f.name]
            ok = v in allowed and (type(v) is bool) == (f.name == "q4")
            if not ok:
                raise UserError(f"lane {f.name}={v!r} is not supported; "
                                f"supported {f.name}: {_describe(allowed)}")
        if self.tuning.verify_btg and not self.mtp:
            raise UserError(f"tuning verify_btg={self.tuning.verify_btg} is for mtp programs (the "
                            "verify pass); give --mtp K with it, or leave it out")
        if self.tuning.spec_sample is True and not self.mtp:
            raise UserError("tuning spec_sample=1 is for mtp programs (the verify pass's sampled "
                            "slots); give --mtp K with it, or leave it out")
        if self.btg > max_btg(self.batch):
            raise UserError(
                f"lane btg={self.btg} is larger than batch={self.batch} needs; "
                f"for batch {self.batch} the supported btg are "
                f"{_describe([t for t in SUPPORTED['btg'] if t <= max_btg(self.batch)])}"
            )

    @classmethod
    def make(cls, batch: int, btg: int | None = None, pt: int | None = None, model=None,
             **kw) -> "Lanes":
        """Lanes with defaults: btg from the batch (and, given ``model``, a ModelConfig, from
        its int4 weights' size: ``default_btg``), pt from QWEN38_PT or DEFAULT_PT."""
        if not isinstance(batch, int) or isinstance(batch, bool) or batch not in SUPPORTED["batch"]:
            raise UserError(f"lane batch={batch!r} is not supported; "
                            f"supported batch: {_describe(SUPPORTED['batch'])}")
        wb = None if model is None else model.int4_weight_bytes()
        return cls(batch=batch, btg=default_btg(batch, wb) if btg is None else btg,
                   pt=pt_from_env() if pt is None else pt, **kw)

    def plain(self, **kw) -> "Lanes":
        """The plain program's lanes beside this one (mtp 0; the mtp-only spec_sample and
        verify_btg back to the table's, off without mtp; ``kw`` replaces other fields, e.g. pt)."""
        return replace(self, mtp=0, tuning=replace(self.tuning, spec_sample=None,
                                                   verify_btg=None), **kw)

    @property
    def spec_sample(self) -> bool:
        """Whether the mtp program judges sampled slots' drafts on the device: Tuning.spec_sample,
        whose table choice is on in mtp programs (version 31)."""
        t = self.tuning.spec_sample
        return bool(self.mtp) if t is None else t

    @property
    def name(self) -> str:
        return lane_name(self)

    def to_dict(self) -> dict:
        """The lane choices; "tuning" (its non-default settings) only where it is not the
        table's, so that a default program's header and manifest stay as they were."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "tuning"}
        if not self.tuning.is_default:
            d["tuning"] = dict(self.tuning.settings())
        return d


def lane_name(lanes: Lanes) -> str:
    """The one name: file names, kernel-name suffixes, cache keys and golden files derive from it."""
    return (f"b{lanes.batch}-btg{lanes.btg}-pt{lanes.pt}-{'q4' if lanes.q4 else 'bf16'}"
            f"-mtp{lanes.mtp}-{lanes.arch.replace('_', '')}-lm{lanes.lm_head}"
            + lanes.tuning.suffix())


def check_model(cfg: ModelConfig) -> None:
    """Reject a model whose dimensions the kernels do not support, naming the field."""
    for key, allowed in MODEL_SUPPORT.items():
        v = getattr(cfg, key)
        if v not in allowed:
            raise UserError(f"model {cfg.name!r}: {key}={v} is not supported by the kernels; "
                            f"supported {key}: {_describe(allowed)}")
    for key in MULTIPLE_OF_128:
        v = getattr(cfg, key)
        if v % 128:
            raise UserError(f"model {cfg.name!r}: {key}={v} is not a multiple of 128, "
                            "which the int4 g128 weights need")
    if cfg.gqa_group > MAX_GQA_GROUP:
        raise UserError(f"model {cfg.name!r}: {cfg.num_attention_heads} query heads over "
                        f"{cfg.num_key_value_heads} kv heads is {cfg.gqa_group} per kv head, which "
                        f"the attention kernel does not support; supported: 1..{MAX_GQA_GROUP} "
                        "query heads per kv head")


def supported_table() -> list[tuple[str, str]]:
    """(field, allowed) rows for `qwen38gen lanes` and error messages."""
    rows = [(k, _describe(v)) for k, v in SUPPORTED.items()]
    rows += [(f"model.{k}", _describe(v)) for k, v in MODEL_SUPPORT.items()]
    rows += [(f"model.{k}", "multiple of 128") for k in MULTIPLE_OF_128]
    rows += [("model.num_attention_heads / num_key_value_heads", f"1..{MAX_GQA_GROUP}")]
    return rows
