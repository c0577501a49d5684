"""scripts/device.sh VERIFY=tests|rest|all with stubbed tools (tests/device_stubs:
nvidia-smi, compute-sanitizer, python3 as PY, the CLI as Q) in a copy of the scripts: the log's
first line names the commit of .gpu/COMMIT and its second whether the tree matched .gpu/FILES, the
summary table has a row per step (PASS, or FAIL with what failed), and the exit code is 1 when a
step failed. Also scripts/tree_match.py and scripts/device_commit.sh."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STUBS = ROOT / "tests" / "device_stubs"
HASH = "0123456789abcdef0123456789abcdef01234567"
SCRIPTS = ("device.sh", "device_verify.sh", "tree_match.py")

sys.path.insert(0, str(ROOT / "scripts"))
import tree_match  # noqa: E402


@pytest.fixture
def tree(tmp_path):
    """A copy of the scripts with the .gpu/ that `make device-prep` writes (a stand-in wheel)."""
    t = tmp_path / "tree"
    (t / "scripts").mkdir(parents=True)
    (t / ".gpu").mkdir()
    lines = []
    for name in SCRIPTS:
        shutil.copy(ROOT / "scripts" / name, t / "scripts" / name)
        lines.append(f"100644 {tree_match.blob_id(t / 'scripts' / name)} 0\tscripts/{name}")
    (t / ".gpu" / "FILES").write_text("\n".join(lines) + "\n")
    (t / ".gpu" / "COMMIT").write_text(HASH + "\n")
    (t / ".gpu" / "stub-1.0-py3-none-any.whl").write_text("")
    (t / ".cache" / "q38" / "gate" / "0123").mkdir(parents=True)
    return t


def verify(tree, part, **env):
    e = dict(os.environ, PATH=f"{STUBS}:{os.environ['PATH']}", PY=str(STUBS / "py"),
             Q=str(STUBS / "q"), OUT=str(tree.parent / "out"), TMPDIR=str(tree.parent),
             REAL_PYTHON=sys.executable, VERIFY=part)
    for k in ("QWEN38_CACHE", "JOBS", "CHECK_B", "MTP_CHECK_B", "BENCH_B", "STUB_FAIL"):
        e.pop(k, None)
    e.update(env)
    p = subprocess.run(["bash", "scripts/device.sh"], cwd=tree, env=e, capture_output=True,
                       text=True, timeout=120)
    tag = "all" if part in ("1", "all") else part
    log = tree.parent / "out" / f"verify-{tag}.log"
    return p, (log.read_text().splitlines() if log.exists() else [])


def rows(log):
    """The summary table's rows: (group, step, result) with the detail last."""
    i = log.index("==== summary ====")
    out = []
    for line in log[i + 2:-1]:
        group, rest = line[:10].strip(), line[10:]
        out.append((group, rest[:50].strip(), rest[51:57].strip(), rest[65:]))
    return out


def test_tests_part_all_pass(tree):
    p, log = verify(tree, "tests")
    assert p.returncode == 0, p.stdout + p.stderr
    assert log[0] == f"commit {HASH}"
    assert log[1] == "tree: matches the commit (3 tracked files, every blob equal)"
    r = rows(log)
    assert [x[:3] for x in r] == [
        ("tests", "pytest tests/gpu (JOBS=16)", "PASS"),
        ("lock", "check --batch 1", "PASS"),
        ("lock", "check --batch 3", "PASS"),
        ("lock", "check --batch 16", "PASS"),
        ("lock", "check --batch 64", "PASS"),
        ("lock", "check --mtp 1 --batch 1 (own + forced drafts)", "PASS"),
        ("lock", "check --mtp 1 --batch 16 (own + forced drafts)", "PASS"),
        ("device", "programs compiled here (not from .cache)", "ok"),
        ("device", f"tree = commit {HASH[:12]}", "ok"),
    ]
    assert r[0][3] == "tests: 3 of 3 test ids passed or skipped (0 skipped)"
    assert r[1][3] == "PASS 16/16 sequences"
    assert log[-1].startswith("verify tests: 9 rows, 0 failed, ")


def test_rest_part_all_pass_and_bench_files(tree):
    p, log = verify(tree, "rest")
    assert p.returncode == 0, p.stdout + p.stderr
    r = rows(log)
    assert [x[:3] for x in r[:-2]] == [
        ("lock", "run --backend gpu --batch 3 = --batch 1", "PASS"),
        ("lock", "check --serve --mtp 1 --batch 3 (run --mtp)", "PASS"),
        ("lock", "check --reference qwen3.5-0.8b --batch 3", "PASS"),
        ("bench", "bench 27B --batch 1,16,64 --peers", "PASS"),
        ("sanitizer", "memcheck B=3: prefill, decode, refill, decode", "PASS"),
        ("sanitizer", "racecheck B=3: prefill, decode, refill, decode", "PASS"),
    ]
    assert r[0][3] == "run lock: 2 requests, every line at --batch 3 equal to --batch 1"
    assert r[3][3] == ("bench: B=1 4.99 ms 200 tok/s 64% of floor; "
                       "B=64 17.35 ms 3689 tok/s 51% of floor")
    assert r[4][3] == "========= ERROR SUMMARY: 0 errors"
    assert sorted(f.name for f in (tree.parent / "out").iterdir()) == [
        "bench.json", "bench.png", "bench.txt", "verify-rest.log"]


@pytest.mark.parametrize("fail, part, name, detail", [
    ("check --batch 16$", "tests", "check --batch 16", "rc=1: FAIL 15/16 sequences"),
    ("pytest .*test_two", "tests", "pytest tests/gpu (JOBS=16)",
     "rc=1: tests: 2 of 3 test ids passed or skipped (0 skipped)"),
    ("run .*--batch 1 ", "rest", "run --backend gpu --batch 3 = --batch 1",
     "rc=1: run lock: the outputs at --batch 3 and --batch 1 differ"),
    ("bench", "rest", "bench 27B --batch 1,16,64 --peers", "rc=2: error: out of GPU memory"),
    ("racecheck", "rest", "racecheck B=3: prefill, decode, refill, decode",
     "rc=9: ========= ERROR SUMMARY: 2 errors"),
])
def test_a_failed_step_is_named_and_the_exit_code_is_1(tree, fail, part, name, detail):
    p, log = verify(tree, part, STUB_FAIL=fail)
    assert p.returncode == 1, p.stdout + p.stderr
    bad = [x for x in rows(log) if x[2] not in ("PASS", "ok")]
    assert bad == [(bad[0][0], name, "FAIL", detail)]
    assert " 1 failed, " in log[-1]


def test_a_check_that_did_not_reach_the_gpu_fails(tree):
    p, log = verify(tree, "tests", STUB_NOTRUN="1", CHECK_B="3", MTP_CHECK_B="", TESTS="0")
    assert p.returncode == 1
    assert [x[:3] for x in rows(log)[:1]] == [("lock", "check --batch 3", "FAIL")]
    assert rows(log)[0][3].startswith("the GPU part did NOT run: GPU part NOT run")


def test_all_runs_both_parts_into_one_log(tree):
    p, log = verify(tree, "all", CHECK_B="1", MTP_CHECK_B="", SAN_TOOLS="memcheck", BENCH_B="")
    assert p.returncode == 0, p.stdout + p.stderr
    assert log[0] == f"commit {HASH}"
    assert [x[1] for x in rows(log)][:5] == [
        "pytest tests/gpu (JOBS=16)", "check --batch 1", "run --backend gpu --batch 3 = --batch 1",
        "check --serve --mtp 1 --batch 3 (run --mtp)", "check --reference qwen3.5-0.8b --batch 3"]


def test_a_spent_budget_skips_the_steps(tree):
    p, log = verify(tree, "tests", VERIFY_BUDGET="5", MTP_CHECK_B="")
    assert p.returncode == 1
    assert [x[2] for x in rows(log)[:5]] == ["SKIP"] * 5
    assert rows(log)[1][3] == "not started: the call's budget of 5 s is spent"


def test_a_changed_tree_or_no_commit_file_is_said(tree):
    with open(tree / "scripts" / "device_verify.sh", "a") as f:
        f.write("# changed\n")
    (tree / ".gpu" / "COMMIT").unlink()
    p, log = verify(tree, "tests", TESTS="0", CHECK_B="1", MTP_CHECK_B="")
    assert p.returncode == 1
    assert log[0] == "commit unknown (no .gpu/COMMIT: run make device-prep on the CPU machine)"
    assert log[1] == ("tree: DIFFERS from the commit: 1 of 3 tracked files changed "
                      "(scripts/device_verify.sh), 0 missing")
    assert rows(log)[-1][2] == "FAIL"


def test_bad_verify_value(tree):
    p, log = verify(tree, "everything")
    assert p.returncode == 2
    assert "error: VERIFY=everything: give VERIFY=tests, VERIFY=rest or VERIFY=all" in p.stderr
    assert log == []


def test_tree_match_missing_file_and_symlink(tmp_path):
    (tmp_path / "a").write_text("x")
    os.symlink("a", tmp_path / "l")
    idx = (f"100644 {tree_match.blob_id(tmp_path / 'a')} 0\ta\n"
           f"120000 {tree_match.blob_id(tmp_path / 'l')} 0\tl\n"
           "100644 e69de29bb2d1d6434b8b29ae775ad8c2e48c5391 0\tgone\n"
           "160000 0000000000000000000000000000000000000000 0\tsub\n")
    assert tree_match.blob_id(tmp_path / "a") == "c1b0730e0133447badcfd47fd144e254807b06e1"  # git's
    assert tree_match.compare(idx, tmp_path) == (3, [], ["gone"])


def _git(repo, *args):
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True).stdout


@pytest.fixture
def repo(tmp_path):
    """A git repo with version 20's bench files, a version 21 device log and a keeper."""
    r = tmp_path / "repo"
    (r / "bench" / "ab").mkdir(parents=True)
    (r / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "device_commit.sh", r / "scripts")
    for name in ("2026-12-04-h200-v20.json", "2026-12-04-h200-v20.png",
                 "2026-12-04-h200-v20-bench.txt", "2026-12-04-h200-v21-pp2-mb4-store-ab.txt",
                 "ab/v22-sk8.txt"):
        (r / "bench" / name).write_text(name)
    _git(r, "init", "-q")
    _git(r, "add", ".")
    _git(r, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    return r


def _commit(repo, *dirs, **env):
    e = dict(os.environ, DAY="2026-12-06", **env)
    return subprocess.run(["bash", "scripts/device_commit.sh", *map(str, dirs)], cwd=repo,
                          env=e, capture_output=True, text=True, timeout=60)


def test_device_commit_files_two_calls_as_one_log(tree, repo, tmp_path):
    """Two device calls (tests, then rest: each its own files_at folder) -> one log that starts
    with the commit, holds both parts and ends with every row; bench files replace version 20's
    png and bench text and the version 21 log (its json stays: the timing model's calibration),
    staged."""
    out1, out2 = tmp_path / "call1", tmp_path / "call2"
    p, _ = verify(tree, "tests", CHECK_B="1", MTP_CHECK_B="")
    shutil.move(tree.parent / "out", out1)
    p, _ = verify(tree, "rest", SAN_TOOLS="memcheck")
    shutil.move(tree.parent / "out", out2)
    c = _commit(repo, out1, out2)
    assert c.returncode == 0, c.stderr
    log = (repo / "bench" / "2026-12-06-h200-v23-verify.log").read_text().splitlines()
    assert log[0] == f"commit {HASH}"
    assert log.count(f"commit {HASH}") == 1
    i = log.index("==== summary (every part) ====")
    steps = [line[10:60].strip() for line in log[i + 2:] if not line.startswith("verify ")]
    assert steps == ["pytest tests/gpu (JOBS=16)", "check --batch 1",
                     "programs compiled here (not from .cache)", f"tree = commit {HASH[:12]}",
                     "run --backend gpu --batch 3 = --batch 1",
                     "check --serve --mtp 1 --batch 3 (run --mtp)",
                     "check --reference qwen3.5-0.8b --batch 3",
                     "bench 27B --batch 1,16,64 --peers",
                     "memcheck B=3: prefill, decode, refill, decode",
                     "programs compiled here (not from .cache)", f"tree = commit {HASH[:12]}"]
    verdicts = [x.split(",")[:2] for x in log[i:] if x.startswith("verify ")]
    assert verdicts == [["verify tests: 4 rows", " 0 failed"], ["verify rest: 7 rows", " 0 failed"]]
    status = sorted(_git(repo, "status", "--porcelain").splitlines())
    assert status == sorted([
        "A  bench/2026-12-06-h200-v23-verify.log", "A  bench/2026-12-06-h200-v23.json",
        "A  bench/2026-12-06-h200-v23.png", "A  bench/2026-12-06-h200-v23-bench.txt",
        "D  bench/2026-12-04-h200-v20.png",
        "D  bench/2026-12-04-h200-v20-bench.txt",
        "D  bench/2026-12-04-h200-v21-pp2-mb4-store-ab.txt"])
    assert f"commit {HASH}: NOT in this checkout's history" in c.stdout


def test_device_commit_refuses_logs_of_two_commits(tree, repo, tmp_path):
    out1, out2 = tmp_path / "call1", tmp_path / "call2"
    verify(tree, "tests", CHECK_B="1", MTP_CHECK_B="", TESTS="0")
    shutil.move(tree.parent / "out", out1)
    (tree / ".gpu" / "COMMIT").write_text("f" * 40 + "\n")
    verify(tree, "rest", SAN_TOOLS="", BENCH_B="", REF_MODEL="")
    shutil.move(tree.parent / "out", out2)
    c = _commit(repo, out1, out2)
    assert c.returncode == 2
    assert c.stderr.startswith(f"error: {out2}/verify-rest.log names commit {'f' * 40}, ")
    assert _git(repo, "status", "--porcelain") == ""


@pytest.mark.parametrize("args, msg", [
    ([], "error: give the folders the device calls returned"),
    (["nowhere"], "error: nowhere is not a folder"),
    (["."], "error: no verify-all.log, verify-tests.log or verify-rest.log in: ."),
])
def test_device_commit_bad_input(repo, args, msg):
    c = _commit(repo, *args)
    assert c.returncode == 2 and c.stderr.startswith(msg)


def test_the_default_mode_still_runs_its_table(tree):
    """Without VERIFY: the GPU tests, check and the sanitizers as before, into device.log."""
    p, _ = verify(tree, "", JOBS="16", BASIC="0", CHECK_B="1 64", MTP_CHECK_B="16", SAN_B="3",
                  STUB_FAIL="check --batch 64")
    assert p.returncode == 0, p.stderr
    table = p.stdout.split("==== summary ====\n")[1].splitlines()
    assert table == [
        "pytest tests/gpu (JOBS=16)                   rc=0: 3 of 3 test ids passed or skipped "
        "(0 skipped)",
        "check --batch 1                              rc=0: PASS 16/16 sequences",
        "check --batch 64                             rc=1: FAIL 15/16 sequences",
        "check --mtp 1 --batch 16                     rc=0: PASS 16/16 sequences",
        "compute-sanitizer memcheck B=3 (prefill+decode) rc=0: ========= ERROR SUMMARY: 0 errors",
        "compute-sanitizer racecheck B=3 (prefill+decode) rc=0: ========= RACECHECK SUMMARY: 0 "
        "hazards displayed (0 errors, 0 warnings)"]
    assert (tree.parent / "out" / "device.log").read_text().endswith(table[-1] + "\n")
