"""The serving workloads of `bench --serve` (serve/workload.py) and the engine's schedule over
them on the fake backend of test_engine.py: riding decoders give every request its tokens and
take fewer steps than waiting decoders and than lockstep batches."""

from __future__ import annotations

import pytest

from qwen38gen.errors import UserError
from qwen38gen.serve.engine import Engine
from qwen38gen.serve.workload import WORKLOADS, requests, workload

from tests.test_engine import FakeBackend


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_workload_is_seeded_and_as_stated(name):
    w = workload(name)
    a, b = requests(w, 500, seed=3), requests(w, 500, seed=3)
    assert a == b and len(a) == w.requests
    assert requests(w, 500, seed=3, n=17) == a[:17]       # a prefix is the same requests
    assert requests(w, 500, seed=4) != a
    lp = [len(r.prompt) for r in a]
    lo = [r.max_tokens for r in a]
    assert w.prompt[0] <= min(lp) and max(lp) <= w.prompt[1]
    assert w.output[0] <= min(lo) and max(lo) <= w.output[1]
    assert max(lp) - min(lp) > (w.prompt[1] - w.prompt[0]) * 0.9   # the range is used
    assert sum(not r.sampling.greedy for r in a) == w.requests // 2
    assert all(r.ignore_eos and 0 <= min(r.prompt) and max(r.prompt) < 500 for r in a)


def test_bad_workload_and_count():
    with pytest.raises(UserError, match="unknown workload 'x'; choose one of short, long, realistic"):
        workload("x")
    with pytest.raises(UserError, match=r"--requests 0 must be in 1\.\.3000"):
        requests(workload("short"), 10, n=0)


@pytest.mark.parametrize("B,n", [(7, 300), (16, 600), (64, 1500)])
def test_riding_on_the_short_workload(B, n):
    """n requests of `short` through B slots (chunk 16): the same tokens whether decoders ride or
    wait; riding takes fewer steps than waiting and than lockstep batches, and keeps ≥ 90 % of the
    slots not feeding prompt tokens decoding (Stats.decode_occupancy; waiting: 0.19–0.54)."""
    class Waiting(Engine):
        ride = False

    reqs = requests(workload("short"), 97, seed=1, n=n)
    got, stats = {}, {}
    for cls in (Engine, Waiting):
        eng = cls(FakeBackend(B, 16))
        got[cls] = {r.id: r.token_ids for r in eng.run(reqs)}
        stats[cls] = eng.stats
    assert got[Engine] == got[Waiting]
    ride, wait = stats[Engine], stats[Waiting]
    assert ride.output_tokens == wait.output_tokens == sum(r.max_tokens for r in reqs)
    assert ride.steps < wait.steps and ride.steps < ride.lockstep_steps
    assert ride.decode_occupancy >= 0.9 > wait.decode_occupancy


def test_serve_bench_on_a_cpu_backend():
    """perf/serve_bench.py end to end on the fake backend (the GPU's RuntimeBackend swapped out):
    a row per B with the engine's counts, first tokens before last ones, and the table renders."""
    from contextlib import contextmanager

    from rich.console import Console

    from qwen38gen.config import PRESETS
    from qwen38gen.perf.serve_bench import serve_bench
    from qwen38gen.report import serve_table

    @contextmanager
    def slots(cfg, B, pt, tensors, ctx):
        yield FakeBackend(B, pt, vocab=cfg.vocab_size, ctx=ctx)

    cfg, w = PRESETS["tiny"], workload("short")
    rows = serve_bench(cfg, [2, 5], w, 16, n=40, ride=True, slots=slots)
    want = sum(r.max_tokens for r in requests(w, cfg.vocab_size, 0, 40))
    for r in rows:
        assert (r.requests, r.output_tokens, r.schedule) == (40, want, "ride")
        assert r.steps == r.prefill_steps + r.decode_steps and r.steps < r.lockstep_steps
        assert r.prompt_rows == sum(len(q.prompt) for q in requests(w, cfg.vocab_size, 0, 40))
        assert 0 < r.ttft_p50_ms <= r.ttft_p99_ms and 0 < r.tpot_p50_ms <= r.tpot_p99_ms
        assert r.decode_occupancy > 0.8 and r.tok_s > 0
    assert rows[1].steps < rows[0].steps
    con = Console(width=250, record=True)
    con.print(serve_table(cfg, w.describe(), rows))
    out = con.export_text()
    assert "serving tiny, short: 3000 requests" in out and "TTFT" in out
    assert all(f"{r.steps} ({r.prefill_steps} / {r.decode_steps})" in out for r in rows)
