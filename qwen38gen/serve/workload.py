"""Seeded synthetic serving workloads (`bench --serve`): how many requests, the stated length
distributions, which half is sampled.

Prompt and output lengths are drawn uniformly from closed integer ranges; prompt tokens uniformly
from the vocabulary; every other request (odd numbers) samples (temperature 0.8, top_p 0.95,
its seed from the workload's seed), the rest are greedy; every request ignores EOS, so it makes
exactly its drawn number of tokens. The same (workload, vocabulary, seed) gives the same requests
on every machine (numpy's PCG64).

* ``short``: 3 000 requests, prompts of 1–100 tokens, 1–48 new tokens (Serving II's first table).
* ``long``: 1 000 requests, prompts of 8–128 tokens, 32–256 new tokens (its second).
* ``realistic``: 256 requests, prompts of 128–4 096 tokens, 64–1 024 new tokens (its item 4's
  example, for the 27B).

Requests are queued all at once, or arrive as a Poisson process of a stated rate
(``arrival_times``: seeded exponential gaps, the first request at 0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import UserError
from ..sampling import SamplingParams
from .requests import Request, default_seed


@dataclass(frozen=True)
class Workload:
    name: str
    requests: int
    prompt: tuple[int, int]       # closed range of prompt lengths
    output: tuple[int, int]       # closed range of new tokens

    def describe(self) -> str:
        return (f"{self.name}: {self.requests} requests, prompts {self.prompt[0]}–"
                f"{self.prompt[1]} tokens, outputs {self.output[0]}–{self.output[1]} (uniform), "
                "half sampled (T 0.8, top_p 0.95), EOS ignored")


WORKLOADS = {w.name: w for w in (
    Workload("short", 3000, (1, 100), (1, 48)),
    Workload("long", 1000, (8, 128), (32, 256)),
    Workload("realistic", 256, (128, 4096), (64, 1024)),
)}


def workload(name: str) -> Workload:
    if name not in WORKLOADS:
        raise UserError(f"unknown workload {name!r}; choose one of {', '.join(WORKLOADS)}")
    return WORKLOADS[name]


def requests(w: Workload, vocab: int, seed: int = 0, n: int | None = None) -> list[Request]:
    """The first ``n`` (default: all) requests of workload ``w`` over a vocabulary of ``vocab``."""
    n = w.requests if n is None else n
    if not 1 <= n <= w.requests:
        raise UserError(f"--requests {n} must be in 1..{w.requests} for workload {w.name!r}")
    rng = np.random.default_rng([seed, 0x5E12])
    lp = rng.integers(w.prompt[0], w.prompt[1] + 1, w.requests)
    lo = rng.integers(w.output[0], w.output[1] + 1, w.requests)
    out = []
    for i in range(n):
        prompt = tuple(int(t) for t in rng.integers(0, vocab, int(lp[i])))
        sp = (SamplingParams(temperature=0.8, top_p=0.95, seed=default_seed(seed, i)) if i % 2
              else SamplingParams())
        out.append(Request(f"w{i}", prompt, int(lo[i]), ignore_eos=True, sampling=sp))
    return out


def arrival_times(n: int, rate: float | None, seed: int = 0) -> list[float]:
    """Seconds at which n requests arrive: all at 0 (``rate`` None or 0), else a Poisson process
    of ``rate`` requests per second (exponential gaps of mean 1/rate, seeded), the first at 0."""
    if not rate:
        return [0.0] * n
    if rate < 0 or not np.isfinite(rate):
        raise UserError(f"--rate {rate}: give requests per second > 0 (0: all at once)")
    gaps = np.random.default_rng([seed, 0xA77]).exponential(1.0 / rate, n)
    gaps[0] = 0.0
    return [float(t) for t in np.cumsum(gaps)]
