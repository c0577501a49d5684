"""The sampling rule's numpy twin (qwen38gen/sampling.py): Philox known answers, the float32
exp2 recipe, each filter against a direct reading of its definition, the draw's distribution,
and the parameter checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qwen38gen import sampling as S
from qwen38gen.errors import UserError


# Random123's published known-answer vectors for Philox4x32-10 (its tests/kat_vectors).
@pytest.mark.parametrize("ctr,key,want", [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_philox_known_answers(ctr, key, want):
    assert S.philox4x32_10(ctr, key) == want


def test_exp2q():
    t = np.concatenate([np.linspace(-32, 0, 4001, dtype=np.float32),
                        np.float32([0, -1, -0.5, -31.999, -32, -32.001, -np.inf])])
    e = S.exp2q(t)
    assert e.dtype == np.float32
    assert e[np.flatnonzero(t == 0)[0]] == 1.0
    live = t >= -32
    np.testing.assert_allclose(e[live], np.exp2(t[live].astype(np.float64)), rtol=3e-6)
    assert np.all(e[~live] == 0)


def test_greedy_is_argmax_lowest_index():
    x = np.float32([1, 5, 3, 5, 5])
    assert S.sample(x, S.SamplingParams(), 7) == 1
    # below the epsilon is greedy too; the seed does not matter then
    assert S.sample(x, S.SamplingParams(temperature=1e-6, seed=3), 7) == 1


def _softmax(x, t):
    z = (x.astype(np.float64) - x.max()) / t
    p = np.exp(z)
    return p / p.sum()


def test_filters_by_definition():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(400).astype(np.float32)
    x[[3, 9, 50]] = x.max() + 0.25          # a tie at the top: three maxima
    x[[10, 11]] = np.sort(x)[-30]           # ties somewhere in the middle
    for k in (1, 2, 3, 30, 31, 399, 400, 0, -1):
        keep, _ = S.survivors(x, S.SamplingParams(temperature=1.0, top_k=k))
        kth = np.sort(x)[::-1][k - 1] if 1 <= k < 400 else -np.inf
        assert np.array_equal(keep, x >= kth), k
    for mp in (0.0, 0.1, 0.5, 1.0):
        keep, _ = S.survivors(x, S.SamplingParams(temperature=0.7, min_p=mp))
        p = _softmax(x, 0.7)
        want = p >= mp * p.max()
        near = np.abs(p - mp * p.max()) < 1e-5 * p.max()   # exp2q's error at the edge
        assert np.array_equal(keep[~near], want[~near]), mp
    for tp in (0.05, 0.3, 0.9, 0.999, 1.0):
        keep, _ = S.survivors(x, S.SamplingParams(temperature=0.9, top_p=tp))
        p = _softmax(x, 0.9)
        above = np.array([p[x > v].sum() for v in x])
        want = above < tp
        near = np.abs(above - tp) < 1e-5
        assert np.array_equal(keep[~near], want[~near]), tp
        assert keep[3] and keep[9] and keep[50]           # the maxima always stay


def _nucleus_by_definition(x, w, keep, q24):
    """Step 5 as written: every candidate against the weight of the candidates above it (a full
    sort; sampling._nucleus ranks only the largest, and must agree with this bit for bit)."""
    W = int(w[keep].sum(dtype=np.uint64))
    P = -(-(q24 * W) // (1 << S.TOP_P_BITS))
    xs_idx = np.flatnonzero(keep)
    order = np.argsort(x[xs_idx], kind="stable")
    xs, ws = x[xs_idx][order], w[xs_idx][order]
    cum = np.concatenate([[np.uint64(0)], np.cumsum(ws, dtype=np.uint64)])
    above = np.uint64(W) - cum[np.searchsorted(xs, xs, side="right")]
    stay = np.zeros(x.shape[0], bool)
    stay[xs_idx[order]] = above < np.uint64(P)
    return stay


@pytest.mark.parametrize("V", [7, 400, 5000, 248320])
def test_the_nucleus_ranks_only_what_it_needs(V):
    """sampling._nucleus (the largest candidates ranked m at a time) equals step 5 by definition
    on rows with ties (at the top, in the middle, at the edge of the ranked m), narrow and flat
    rows (where the nucleus holds nearly everything), with and without top_k / min_p."""
    rng = np.random.default_rng(V)
    rows = [rng.standard_normal(V).astype(np.float32) * sc for sc in (0.01, 1.0, 3.0, 30.0)]
    rows.append(np.round(rng.standard_normal(V) * 4).astype(np.float32))   # many ties
    flat = np.zeros(V, np.float32)
    flat[: V // 2] = 1.0
    rows.append(flat)
    n = 0
    for x in rows:
        for t, tp, k, mp in ((1.0, 0.9, -1, 0.0), (0.7, 0.95, 50, 0.0), (1.3, 0.5, -1, 0.05),
                             (0.9, 0.999, -1, 0.0), (2.0, 0.3, 2000, 0.0), (1.0, 1e-6, -1, 0.0)):
            prm = S.SamplingParams(temperature=t, top_p=tp, top_k=k, min_p=mp)
            e, w = S.weights(x, t)
            keep = e >= np.float32(mp)
            if 1 <= k < V:
                keep &= x >= np.partition(x, V - k)[V - k]
            want = _nucleus_by_definition(x, w, keep, prm.top_p_q24)
            got, _ = S.survivors(x, prm)
            assert np.array_equal(got, want), (t, tp, k, mp)
            n += int(want.sum())
    assert n > 0


def test_draw_distribution():
    """4000 draws of a 6-token row at T = 1 and T = 0.5: frequencies within 5 standard errors of
    the softmax (each position is an independent draw)."""
    x = np.float32([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    for t in (1.0, 0.5):
        p = S.SamplingParams(temperature=t, seed=11)
        got = np.bincount([S.sample(x, p, n) for n in range(4000)], minlength=6) / 4000
        want = _softmax(x, t)
        assert np.all(np.abs(got - want) < 5 * np.sqrt(want * (1 - want) / 4000) + 1e-3), (got, want)


def test_draw_is_keyed_by_seed_and_position_only():
    rng = np.random.default_rng(2)
    x = rng.standard_normal(1024).astype(np.float32)
    p = S.SamplingParams(temperature=1.2, top_k=50, top_p=0.9, min_p=0.01, seed=5)
    a = [S.sample(x, p, n) for n in range(40)]
    assert a == [S.sample(x, p, n) for n in range(40)]
    assert len(set(a)) > 5
    b = [S.sample(x, S.SamplingParams(temperature=1.2, top_k=50, top_p=0.9, min_p=0.01, seed=6), n)
         for n in range(40)]
    assert a != b
    got = S.sample_rows(np.stack([x, x]), [p, p], [3, 4])
    assert got.tolist() == [a[3], a[4]] and got.dtype == np.int32


def test_big_seed_and_vocab():
    """Seeds are taken mod 2^64; a row of the 27B vocabulary samples in well under a second."""
    x = np.random.default_rng(3).standard_normal(248320).astype(np.float32)
    a = S.sample(x, S.SamplingParams(temperature=0.8, top_p=0.95, seed=-1), 10)
    assert a == S.sample(x, S.SamplingParams(temperature=0.8, top_p=0.95, seed=2**64 - 1), 10)
    assert 0 <= a < 248320


@pytest.mark.parametrize("kw,msg", [
    ({"temperature": -0.1}, r"^temperature -0\.1 is out of range: it must be ≥ 0 \(0 = greedy\)$"),
    ({"top_p": 0.0}, r"^top_p 0\.0 is out of range: it must be in \(0, 1\]$"),
    ({"top_p": 1.5}, r"^top_p 1\.5 is out of range: it must be in \(0, 1\]$"),
    ({"top_k": -2}, r"^top_k -2 is out of range: it must be an integer ≥ -1 \(-1 or 0 = off\)$"),
    ({"top_k": 2.5}, r"^top_k 2\.5 is out of range"),
    ({"min_p": -0.5}, r"^min_p -0\.5 is out of range: it must be in \[0, 1\]$"),
    ({"min_p": 2}, r"^min_p 2 is out of range: it must be in \[0, 1\]$"),
    ({"temperature": math.nan}, r"^temperature must be a finite number, got nan$"),
    ({"seed": "x"}, r"^seed must be an integer, got 'x'$"),
])
def test_bad_parameters(kw, msg):
    with pytest.raises(UserError, match=msg):
        S.SamplingParams(**kw)


def test_parameter_columns_and_defaults_have_one_owner():
    """sampling.py owns the kernel's parameter columns and the defaults; the program's buffers,
    the emulator's unpacking, the run format's table and the CLI's help agree with it."""
    import re
    from pathlib import Path

    from click.testing import CliRunner

    from qwen38gen.plan.sampling import sample_buffers
    from qwen38gen.serve.requests import DEFAULT_MAX_TOKENS, SAMPLING_FIELDS

    bufs = sample_buffers(3)
    assert bufs["samp_fpar"]["shape"] == [3, len(S.FPAR_COLUMNS)]
    assert bufs["samp_upar"]["shape"] == [3, len(S.UPAR_COLUMNS)]
    p = S.SamplingParams(temperature=0.75, top_k=7, top_p=0.5, min_p=0.25, seed=(5 << 32) | 9)
    fpar, upar, _ = S.pack_params([p], [0])
    assert S.unpack_params(fpar[0], upar[0]) == p
    assert S.unpack_params(*(a[0] for a in S.pack_params([S.DEFAULTS], [0])[:2])) == S.DEFAULTS
    root = Path(__file__).resolve().parents[1]
    cuh = (root / "kernels" / "sampling.cuh").read_text()
    assert re.search(r"fpar\s+fp32 \[R, 2\]\s+" + ", ".join(S.FPAR_COLUMNS), cuh)

    doc = (root / "docs" / "RUN_FORMAT.md").read_text()
    table = dict(re.findall(r"^\| `(\w+)` \| ([^|]+?) \|", doc, re.M))
    num = lambda s: float(s.replace("−", "-"))  # noqa: E731
    for f in SAMPLING_FIELDS:
        assert num(table[f]) == getattr(S.DEFAULTS, f), f
    assert num(table["max_tokens"]) == DEFAULT_MAX_TOKENS

    import cli

    help_text = CliRunner().invoke(cli.cli, ["run", "--help"], terminal_width=1000).output
    assert f"[default: {DEFAULT_MAX_TOKENS}]" in help_text
    assert "greedy) [default: 0]" in help_text and S.DEFAULTS.temperature == 0


def test_errors_carry_their_field():
    """A bad parameter's error names its field (what `run --prompt` turns into the option's
    name), also through a request line."""
    from qwen38gen.serve.requests import parse_request

    with pytest.raises(UserError) as e:
        S.SamplingParams(temperature=0.5, top_k=-3)
    assert (e.value.field, e.value.reason) == ("top_k", "-3 is out of range: it must be an "
                                                        "integer ≥ -1 (-1 or 0 = off)")
    with pytest.raises(UserError, match=r"^line 4: min_p 2 is out of range") as e:
        parse_request({"prompt_ids": [1], "min_p": 2}, "line 4", 0, 16)
    assert e.value.field == "min_p" and e.value.reason.startswith("2 is out of range")


def test_put_greedy_params_fills_the_sampler_columns_only_where_they_exist():
    """put_greedy_params: every slot's row of samp_fpar / samp_upar unpacks to greedy parameters
    (a greedy run of a spec_sample program must not read a fill's or a poison's values); a
    program without those buffers gets nothing."""
    from qwen38gen.sampling import put_greedy_params, unpack_params

    got = {}
    put_greedy_params(got.__setitem__, {"samp_fpar": {}, "samp_upar": {}}, 3)
    assert set(got) == {"samp_fpar", "samp_upar"} and got["samp_fpar"].shape[0] == 3
    assert all(unpack_params(f, u).greedy for f, u in zip(got["samp_fpar"], got["samp_upar"]))
    none = {}
    put_greedy_params(none.__setitem__, {"logits": {}}, 3)
    assert none == {}
