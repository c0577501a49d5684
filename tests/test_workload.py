"""The serving workloads of `bench --serve` (serve/workload.py) and the engine's schedule over
them on the fake backend of test_engine.py: riding decoders give every request its tokens and
take fewer steps than waiting decoders and than lockstep batches."""

from __future__ import annotations

import pytest

from qwen38gen.errors import UserError
from qwen38gen.serve.engine import Engine
from qwen38gen.serve.workload import WORKLOADS, arrival_times, requests, workload

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
    def slots(cfg, B, pt, tensors, ctx, mtp=0):
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
    assert [r.lane.split("-")[:3] for r in rows] == [["b2", "btg8", "pt16"], ["b5", "btg8", "pt16"]]
    con = Console(width=250, record=True)
    con.print(serve_table(cfg, w.describe(), rows))
    out = con.export_text()
    assert "serving tiny, short: 3000 requests" in out and "TTFT" in out
    assert all(f"{r.steps} ({r.prefill_steps} / {r.decode_steps})" in out for r in rows)


def test_bench_btg_is_capped_at_what_each_batch_needs():
    """bench --btg T: the GEMV tile T at every B, capped at B's largest (B = 7 needs 8 rows);
    without it, the model's default (the tiny model's weights sit in L2: 16 rows at most)."""
    from qwen38gen.config import PRESETS
    from qwen38gen.perf.serve_bench import serve_lanes

    big, tiny = PRESETS["qwen3.8-27b"], PRESETS["tiny"]
    assert [serve_lanes(big, B, 16, 0, btg=16).btg for B in (7, 16, 64)] == [8, 16, 16]
    assert [serve_lanes(big, B, 16, 0).btg for B in (7, 16, 64)] == [8, 16, 64]
    assert [serve_lanes(tiny, B, 16, 0).btg for B in (7, 16, 64)] == [8, 16, 16]
    assert serve_lanes(tiny, 64, 16, 0, btg=32).name.startswith("b64-btg32-pt16")


def test_arrival_times_are_a_seeded_poisson_process():
    assert arrival_times(5, 0) == [0.0] * 5 and arrival_times(3, None) == [0.0] * 3
    a = arrival_times(4000, 50.0, seed=2)
    assert a == arrival_times(4000, 50.0, seed=2) != arrival_times(4000, 50.0, seed=3)
    gaps = [y - x for x, y in zip(a, a[1:])]
    assert a[0] == 0.0 and min(gaps) >= 0
    assert abs(sum(gaps) / len(gaps) - 1 / 50) < 0.002           # mean gap 1/rate
    for bad in (-1.0, float("inf")):
        with pytest.raises(UserError, match=r"--rate .*: give requests per second > 0"):
            arrival_times(3, bad)


class Clock:
    """A fake clock: each engine step costs ``dt`` seconds (advanced by the backend's calls),
    sleeping advances it by what was asked."""

    def __init__(self):
        self.t = 0.0
        self.slept = []

    def __call__(self):
        return self.t

    def sleep(self, s):
        assert s > 0
        self.slept.append(s)
        self.t += s


def test_requests_join_at_their_arrival():
    """A request is admitted only once the clock passes its arrival; with nothing to run the
    engine sleeps until the next arrival; all arriving at 0 is the old run."""
    clock = Clock()

    class Timed(FakeBackend):
        def prefill(self, chunks):
            clock.t += 0.01
            return super().prefill(chunks)

        def decode(self, tokens):
            clock.t += 0.01
            return super().decode(tokens)

    w = workload("short")
    reqs = requests(w, 97, 0, 6)
    at = [0.0, 0.0, 5.0, 5.001, 9.0, 30.0]
    eng = Engine(Timed(2, 16, vocab=97))
    started = {}

    def on_step(done):
        for seq in eng.sched.running.values():
            started.setdefault(seq.req.id, clock.t)
        for r in done:
            started.setdefault(r.id, clock.t)

    res = eng.run(reqs, on_step=on_step, arrivals=at, clock=clock, sleep=clock.sleep)
    assert sorted(r.id for r in res) == sorted(r.id for r in reqs)
    for r, t in zip(reqs, at):
        assert started[r.id] > t                      # nothing runs before it arrives
    assert len(clock.slept) >= 3 and clock.t > 30.0   # idle gaps slept through
    alone = Engine(FakeBackend(2, 16, vocab=97)).run(reqs)
    assert {r.id: r.token_ids for r in res} == {r.id: r.token_ids for r in alone}
    with pytest.raises(ValueError, match="2 arrival times for 6 requests"):
        Engine(FakeBackend(2, 16, vocab=97)).run(reqs, arrivals=[0.0, 1.0])


def test_serve_bench_counts_ttft_from_arrival():
    """At a low rate every request finds a free slot: TTFT is a few steps, not the queue."""
    from contextlib import contextmanager

    from qwen38gen.config import PRESETS
    from qwen38gen.perf.serve_bench import serve_bench

    @contextmanager
    def slots(cfg, B, pt, tensors, ctx, mtp=0):
        yield FakeBackend(B, pt, vocab=cfg.vocab_size, ctx=ctx)

    cfg, w = PRESETS["tiny"], workload("short")
    (queued,) = serve_bench(cfg, [2], w, 16, n=12, slots=slots)
    (paced,) = serve_bench(cfg, [2], w, 16, n=12, slots=slots, rate=40.0)
    assert (queued.rate, paced.rate) == (0.0, 40.0)
    assert paced.output_tokens == queued.output_tokens
    assert paced.seconds >= arrival_times(12, 40.0)[-1]
    assert paced.ttft_p99_ms < queued.ttft_p99_ms


@pytest.mark.slow
def test_serve_bench_mtp_on_the_emulated_program():
    """bench --serve --mtp 1's path end to end on the emulated mtp program (tiny): the
    speculative engine, acceptance counted, implied tokens/s rising with α."""
    from contextlib import contextmanager

    from qwen38gen.config import PRESETS
    from qwen38gen.emu.spec_backend import EmuSpecBackend
    from qwen38gen.lanes import Lanes
    from qwen38gen.perf.serve_bench import ALPHAS, serve_bench
    from qwen38gen.weights import default_tensors

    cfg, w = PRESETS["tiny"], workload("short")
    tensors = default_tensors(cfg, mtp=True)

    @contextmanager
    def slots(cfg, B, pt, _tensors, ctx, mtp=0):
        yield EmuSpecBackend(cfg, Lanes.make(B, pt=pt, mtp=mtp), tensors, ctx)

    (r,) = serve_bench(cfg, [2], w, 8, n=4, slots=slots, mtp=1)
    want = sum(q.max_tokens for q in requests(w, cfg.vocab_size, 0, 4))
    assert (r.mtp, r.schedule, r.output_tokens) == (1, "alternate", want)
    assert 0.0 <= r.acceptance <= 1.0 and 1.0 <= r.tokens_per_verify <= 2.0
    implied = [r.implied_tok_s[str(a)] for a in ALPHAS]
    assert implied == sorted(implied) and implied[-1] > 0


@pytest.mark.parametrize("args,pattern", [
    (["--serve", "short", "--rate", "-2"], r"--rate -2\.0: give requests per second > 0"),
    (["--serve", "short", "--mtp", "1", "--schedule", "both"],
     r"--schedule goes with the plain program; under --mtp prefill chunks and verify steps "
     r"alternate"),
    (["--serve", "short", "--btg", "12"],
     r"--btg 12 is not a supported batch tile; give one of 8, 16, 24, 32, 64"),
    (["--serve", "short", "--mtp", "9"], r"lane mtp=9 is not supported; supported mtp: 0, 1"),
])
def test_bad_serve_options(args, pattern):
    """Bad options fail before any GPU work, as one-line errors."""
    import subprocess
    import sys

    from tests.test_cli import assert_user_error

    p = subprocess.run([sys.executable, "-m", "cli", "bench", "--model", "tiny", *args],
                       capture_output=True, text=True,
                       env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert_user_error(p.returncode, p.stdout, p.stderr, pattern)


def test_serve_plot(tmp_path):
    """bench --serve --plot: a PNG, written whole (matplotlib is not a dependency: skipped where
    it is not installed, as on the CPU machines)."""
    pytest.importorskip("matplotlib")
    from qwen38gen.config import PRESETS
    from qwen38gen.perf.serve_bench import ServeRow, plot

    rows = [ServeRow(b, 16, "ride", 10, 100, 1.0, 100.0 * b, 10, 5, 5, 50, 50, 0.9, 0.9, 12,
                     1.0, 5.0, 9.0, 1.0, 2.0) for b in (7, 16, 64)]
    out = tmp_path / "serve.png"
    plot(out, PRESETS["tiny"], workload("short"), rows)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_serve_bench_reports_each_row_as_measured():
    from contextlib import contextmanager

    from qwen38gen.config import PRESETS
    from qwen38gen.perf.serve_bench import serve_bench

    @contextmanager
    def slots(cfg, B, pt, tensors, ctx, mtp=0):
        yield FakeBackend(B, pt, vocab=cfg.vocab_size, ctx=ctx)

    seen = []
    rows = serve_bench(PRESETS["tiny"], [2, 3], workload("short"), 16, n=6, slots=slots,
                       on_row=seen.append)
    assert seen == rows and [r.batch for r in seen] == [2, 3]


def test_phase_inputs_fill_the_bucket_they_time():
    """bench --serve times each prefill bucket with a packed chunk that lands in that bucket:
    slots of pt prompt tokens and the others riding with one row (the ride schedule's shape)."""
    from types import SimpleNamespace

    from qwen38gen.plan.program import prefill_buckets
    from qwen38gen.perf.serve_bench import phase_inputs

    for B, pt, btg in ((7, 16, 7), (16, 16, 8), (64, 16, 8), (3, 4, 3)):
        put = {}
        sched = {"prefill_pt": pt, "prefill_buckets": {"rows": prefill_buckets(B, pt, btg)}}
        rt = SimpleNamespace(B=B, pt=pt, cfg=SimpleNamespace(vocab_size=1024),
                             manifest={"schedule": sched}, put=lambda n, a: put.__setitem__(n, a))
        buckets = sched["prefill_buckets"]["rows"]
        for i, rows in enumerate(buckets):
            phase = "prefill" if rows == buckets[-1] else f"prefill_r{rows}"
            phase_inputs(rt, phase)                 # asserts put_chunk chose this phase
            got = int(put["ntok"].sum())
            assert got == rows, (B, phase, got)
        phase_inputs(rt, "decode")
        assert put["ntok"].tolist() == [1] * B
