"""The sampler (kernels/sampling.cuh) as the program's optional phase ``schedule["sample"]``: one
launch over the B rows of logits after a decode step or a prefill chunk, writing ``next`` (the
token each slot chooses) by the rule of qwen38gen/sampling.py, the numpy twin that defines it.

Its per-slot parameters live in buffers the host fills when a slot takes a request
(``sampling.FPAR_COLUMNS`` and ``UPAR_COLUMNS``, packed by ``sampling.pack_params``): samp_fpar
[B, 2] (temperature, min_p), samp_upar [B, 4] (top_k, top_p in 2^-24, seed low and high words;
uint32 bit patterns in an int32 buffer). The
Philox counter of a row is the position of the token being chosen, which is the slot's ``pos``
after the step's advance. The phase runs only when some slot samples; greedy steps keep the
step's own argmax.
"""

from __future__ import annotations

from ..sampling import FPAR_COLUMNS, UPAR_COLUMNS
from .entries import BF, I32, Entry, buf

HEADER = "sampling.cuh"


def sample_entry(v: int, split: bool = False) -> Entry:
    """split (Tuning.sample_split): the histograms' sums by 32-bit shared atomics with a carry,
    not 64-bit ones (the same integers: kernels/sampling.cuh, version 27)."""
    return Entry(f"q38_sample_v{v}" + ("_s" if split else ""),
                 f"q38::sample_rows<{v}, {int(split)}>",
                 ((BF, "logits"), ("const float*", "fpar"), ("const uint32_t*", "upar"),
                  (I32, "ctr"), ("int*", "tok")), 1024,
                 asserts=(f"q38::SampleLaunch<{v}>::threads == 1024",), family="sample")


def spec_sample_entry(v: int, split: bool = False) -> Entry:
    """Speculative sampling of a verify pass's rows (sampling.cuh, SPEC = 1): one block per row,
    the slot's parameters, row j's position ctr[slot] + 1 + j."""
    return Entry(f"q38_sample_v{v}" + ("_s" if split else "") + "_spec",
                 f"q38::sample_rows<{v}, {int(split)}, 1>",
                 ((BF, "logits"), ("const float*", "fpar"), ("const uint32_t*", "upar"),
                  (I32, "ctr"), ("int*", "tok"), (I32, "vtok"), ("int", "kp"), ("int*", "acc")),
                 1024, asserts=(f"q38::SampleLaunch<{v}>::threads == 1024",),
                 family="sample", meta=(("spec", 1),))


def sample_buffers(batch: int) -> dict:
    return {"samp_fpar": {"dtype": "float32", "shape": [batch, len(FPAR_COLUMNS)]},
            "samp_upar": {"dtype": "int32", "shape": [batch, len(UPAR_COLUMNS)]}}


def sample_phase(plan, batch: int, vocab: int, split: bool = False) -> list[dict]:
    """The sample phase's launch (its entry added to the plan): one block per slot."""
    e = plan.entry(sample_entry(vocab, split))
    return [{"k": e.name, "grid": [batch, 1, 1],
             "args": [buf("logits"), buf("samp_fpar"), buf("samp_upar"), buf("pos"),
                      buf("next")]}]
