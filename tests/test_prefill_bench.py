"""bench --prefill's floors (perf/prefill_bench.py) and its table, on the CPU; the timed pass's
result is checked on the GPU (tests/gpu/test_engine.py)."""

from __future__ import annotations

import pytest

from qwen38gen.config import PRESETS, load_config
from qwen38gen.perf.prefill_bench import (TENSOR_PEAK, PrefillRow, prefill_floor,
                                          prefill_flops)
from qwen38gen.report import prefill_table


def test_flops_count_the_linear_layers_per_token_and_the_lm_head_once():
    cfg = PRESETS["tiny"]
    lm = cfg.vocab_size * cfg.hidden_size
    per_layer = 4 * cfg.num_attention_heads * cfg.head_dim * len(cfg.full_layers)
    # one token: every linear weight once (lm_head included), attention over one position
    assert prefill_flops(cfg, 1, 1) == pytest.approx(2 * cfg.linear_params + per_layer)
    # P tokens, B sequences: the lm_head once per sequence, attention causal
    P, B = 37, 3
    want = B * (2 * ((cfg.linear_params - lm) * P + lm) + per_layer * P * (P + 1) / 2)
    assert prefill_flops(cfg, B, P) == pytest.approx(want)


def test_floors_of_the_27b():
    cfg = load_config("qwen3.8-27b")
    fb, ff, chunks = prefill_floor(cfg, 1, 1024, 64, 3.0e12)
    assert chunks == 16
    assert fb == pytest.approx(16 * cfg.int4_weight_bytes() / 3.0e12)
    # ~27 B params, 1 024 tokens: ~55 TFLOP, ~56 ms at the nominal peak
    assert 45e-3 < ff < 70e-3
    assert prefill_floor(cfg, 16, 1000, 64, 3.0e12)[2] == 16      # a partial last chunk counts
    assert ff == pytest.approx(prefill_flops(cfg, 1, 1024) / TENSOR_PEAK)


def test_table_names_the_worse_floor():
    cfg = PRESETS["tiny"]
    r = PrefillRow(batch=1, pt=16, prompt=1024, chunks=64, ttft_ms=30.0,
                   ttft_ms_spread=(29.0, 31.0), passes=3, tok_s=34133.0, floor_bytes_ms=10.0,
                   floor_flops_ms=2.0, tflops=1.0)
    from rich.console import Console

    con = Console(width=200, record=True)
    con.print(prefill_table(cfg, 3.0e12, TENSOR_PEAK, [r]))
    text = con.export_text()
    assert "3.00" in text and "30.0" in text   # × the larger floor (10 ms): 3.00


@pytest.mark.parametrize("args,pattern", [
    (["--prefill", "1024", "--pt", "16,0"], r"--pt '16,0' needs positive integers"),
    (["--prefill", "1024", "--pt", "200"], r"lane pt=200 is not supported; supported pt: 1\.\.128"),
    (["--prefill", "1024,x"], r"--prefill '1024,x' is not a comma-separated list of integers"),
    (["--prefill", "300000"], r"--prefill 300000: 'qwen3.8-27b' holds \d+ positions"),
    (["--prefill", "64", "--serve", "short"], r"--serve and --prefill are two benchmarks"),
    (["--serve", "short", "--pt", "16,64"], r"--serve runs one prefill chunk width"),
])
def test_bad_prefill_options(args, pattern):
    """Bad options fail before any GPU work, as one-line errors."""
    from tests.test_cli import assert_user_error
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "cli", "bench", *args], capture_output=True,
                       text=True, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert_user_error(p.returncode, p.stdout, p.stderr, pattern)
