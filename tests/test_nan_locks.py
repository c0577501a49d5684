"""Every lock fails on a non-finite value and says where it was.

Planted NaN, +inf and -inf: in a golden file (its digest recomputed, so only the value check can
catch it), in the top-k logits of a run, in the reference, in a program's final state, in the
emulated program's logits (the engine's guard, the serve lock, the speculative loop). Before the
fix, ``max(worst, nan)`` kept ``worst`` and a golden file with a NaN logit validated with exit 0.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from contextlib import nullcontext

import numpy as np
import pytest

from qwen38gen.verify import golden as G
from qwen38gen.weights import default_tensors
from qwen38gen.compare import nonfinite_where, worst
from qwen38gen.config import PRESETS
from qwen38gen.emit import emit_program
from qwen38gen.emu.backend import EmuBackend
from qwen38gen.emu.schedule import Emu
from qwen38gen.serve.engine import Engine, NonFiniteLogits
from qwen38gen.errors import UserError
from qwen38gen.lanes import Lanes
from qwen38gen.serve.requests import Request
from qwen38gen.verify.serve_lock import ctx_for, serve_lock
from qwen38gen.verify.spec_runtime import speculative_run, tmax_needed

from tests._blas_threads import single_threaded  # noqa: F401  (autouse: 1 BLAS thread)

pytestmark = pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")

BAD = [float("nan"), float("inf"), float("-inf")]
TINY = PRESETS["tiny"]
FINAL_NORM = "model.language_model.norm.weight"


@pytest.mark.parametrize("order", ["nan first", "nan last"])
def test_worst_keeps_nan_wherever_it_is(order):
    vals = [float("nan"), 0.01] if order == "nan first" else [0.01, float("nan")]
    assert np.isnan(worst(vals))
    assert max(vals[::-1] if order == "nan first" else vals) == 0.01  # the hole it closes
    assert worst([0.01, 0.2]) == 0.2 and worst([]) == 0.0


def test_nonfinite_where_names_the_first():
    a = np.zeros((3, 4))
    assert nonfinite_where(a, "x") is None
    a[1, 2], a[2, 0] = np.inf, np.nan
    assert nonfinite_where(a, "x") == "x[1, 2] = inf (2 non-finite values)"


@pytest.mark.parametrize("bad", BAD)
def test_golden_file_with_a_nonfinite_logit_is_refused(tmp_path, bad):
    d = json.loads(G.golden_path().read_text())
    d["sequences"][4]["topk"][7][2][1] = bad
    d["digest"] = G._digest(d["sequences"])
    p = tmp_path / "g.json"
    p.write_text(json.dumps(d))   # json writes NaN / Infinity, and reads them back as floats
    with pytest.raises(UserError, match=r"malformed: sequence 4 topk row 7 holds a non-finite "
                                        r"logit \((nan|inf|-inf)\) for token \d+"):
        G.load_golden(p)


def test_cli_golden_and_check_refuse_a_golden_file_with_nan(tmp_path):
    d = json.loads(G.golden_path().read_text())
    d["sequences"][0]["topk"][0][0][1] = float("nan")
    d["digest"] = G._digest(d["sequences"])
    (tmp_path / G.golden_path().name).write_text(json.dumps(d))
    for cmd in (["golden"], ["check"]):
        r = subprocess.run([sys.executable, "-m", "cli", *cmd, "--golden", str(tmp_path)],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and "non-finite logit (nan)" in r.stderr, (cmd, r.stderr)


def _run_and_ref(steps=4, vocab=50, seed=0):
    rng = np.random.default_rng(seed)
    ref = rng.standard_normal((steps, vocab))
    top = [[[int(i), float(ref[s, i])] for i in np.argsort(-ref[s])[:8]] for s in range(steps)]
    return {"tokens": [int(np.argmax(r)) for r in ref], "topk": top}, ref


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("where", ["run top-k", "reference", "run row"])
def test_compare_to_reference_fails_on_nonfinite(bad, where):
    run, ref = _run_and_ref()
    assert G.compare_to_reference(run, ref, 0).ok
    if where == "run top-k":
        run["topk"][2][5][1] = bad
        want = "sequence 0 step 2 top-k logits[5]"
    elif where == "reference":
        ref[3, 17] = bad
        want = "sequence 0 step 3 reference logits[17]"
    else:   # the runtime's scan of the whole row found one outside the top k
        run["nonfinite"] = want = "sequence 0 step 1 logits[33] = nan (1 non-finite value)"
    rep = G.compare_to_reference(run, ref, 0)
    assert not rep.ok and rep.nonfinite.startswith(want)


@pytest.fixture(scope="module")
def toy_fake():
    """The fake program outputs of tests/test_check_reference.py (exact copies pass)."""
    from tests.test_check_reference import fake as fake_fixture

    return fake_fixture.__wrapped__()


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("layer", ["first", "last"])
def test_check_reference_fails_on_a_nonfinite_state(toy_fake, bad, layer):
    """A non-finite value in slot 2's recurrent state, in the first or the last GDN layer (a max
    over the layers would drop a NaN that comes after a number)."""
    from tests.test_check_reference import CFG, _run

    assert _run(toy_fake).ok
    st = copy.deepcopy(toy_fake[2])
    j = 0 if layer == "first" else len(CFG.linear_layers) - 1
    st[0]["rec"][j, 2, 0, 3, 4] = bad
    res = _run(toy_fake, states=st)
    assert not res.ok and res.rows[2][-1] == "MISMATCH" and res.rows[2][7] == "nan"
    assert [r[-1] for r in res.rows] == ["ok", "ok", "MISMATCH", "ok"]
    L = CFG.linear_layers[j]
    assert any(n.startswith(f"slot 2: non-finite: slot 2 recurrent state of layer {L}[0, 3, 4] = ")
               for n in res.notes)


def _poisoned(bad):
    t = default_tensors(TINY, mtp=True)
    t = dict(t)
    norm = np.array(t[FINAL_NORM], copy=True)
    norm[7] = bad
    t[FINAL_NORM] = norm
    return t


@pytest.mark.parametrize("bad", BAD)
def test_engine_guard_on_emulated_logits(bad):
    lanes = Lanes.make(2, pt=4)
    for device_sampling in (True, False):
        be = EmuBackend(TINY, lanes, _poisoned(bad), ctx=16, device_sampling=device_sampling)
        eng = Engine(be, check_finite=True)
        with pytest.raises(NonFiniteLogits, match=r"non-finite slot 0 logits\[\d+\] = "):
            eng.run([Request("a", (1, 2, 3), 3, ignore_eos=True)])


@pytest.mark.parametrize("bad", BAD)
def test_serve_lock_fails_on_nonfinite_logits(bad):
    lanes = Lanes.make(2, pt=4)
    t, ctx = _poisoned(bad), ctx_for(2, 4, TINY.vocab_size)
    res, _ = serve_lock(lambda B: nullcontext(EmuBackend(TINY, lanes, t, ctx)), 2, 4, TINY)
    assert not res.ok and res.notes[0].startswith("FAIL: non-finite slot 0 logits[")


@pytest.mark.parametrize("bad", BAD)
def test_speculative_loop_names_nonfinite_logits(bad):
    """check --mtp's loop (spec_runtime) on the emulated mtp program records where the first
    non-finite logit of each sequence was."""
    prompts = [[1, 2, 3], [4]]
    man = emit_program(TINY, Lanes.make(2, pt=4, mtp=1)).manifest
    emu = Emu(man, TINY, _poisoned(bad), tmax=tmax_needed(prompts, 3, 1))
    _, st, _ = speculative_run(emu, man, prompts, 3)
    assert st.nonfinite[0].startswith("sequence 0 prefill logits[")
    assert st.nonfinite[1].startswith("sequence 1 prefill logits[")


def test_run_says_a_broken_program_in_one_line(tmp_path):
    """`run` over weights whose final norm holds a NaN: the engine's guard stops it, one line on
    stderr, exit 1 (a broken program, not a user's mistake), no output file left."""
    from qwen38gen.checkpoint import save_checkpoint
    from qwen38gen.weights import synthetic_weights

    t = dict(synthetic_weights(TINY, 0))
    w = np.array(t[FINAL_NORM], copy=True)
    w[7] = np.nan
    t[FINAL_NORM] = w
    save_checkpoint(TINY, t, tmp_path / "m")
    (tmp_path / "r.jsonl").write_text('{"prompt_ids": [1, 2, 3], "max_tokens": 2}\n')
    r = subprocess.run([sys.executable, "-m", "cli", "run", "--backend", "reference", "--model",
                        str(tmp_path / "m"), "--prompts", str(tmp_path / "r.jsonl"), "--batch", "1",
                        "--output", str(tmp_path / "out.jsonl")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("error: the program computed request 0 (slot 0, position 3): "
                               "non-finite logits[") and r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "out.jsonl").exists()
