"""A/B of whole decode steps: variants of the program benched in turn, in one device call.

A variant is a name, optional patches and optional tuning settings (`qwen38gen lanes` lists
them; each is passed as --tune KEY=VALUE, so a variant's programs carry their own names), one
per line of a spec file (the first line is the base the others are compared with; '#' starts a
comment). NAME=VALUE (capitals) sets an environment variable of the variant's processes.

    base
    cw4      tune=gate_up.sk_cfg=4:4:0
    four     patch=bench/patches/X.diff tune=gate_up.sk_cfg=4:4:0 tune=lm_head.sk_cfg=4:4:0

  prep SPEC --batch 64[,32]          on the CPU machine: a variant with patches gets its own copy
                                     of the tree under .ab/NAME (tracked and untracked files, not
                                     bench/), the patches applied; every variant's bench programs
                                     are compiled and gated into the cache folder (--cache,
                                     default .cache/ab) with its tuning.
  run SPEC --batch 64 [--rounds 2] [--json F]
                                     on the GPU machine: `qwen38gen bench` of each variant in its
                                     tree with its settings, the variants alternating, ROUNDS
                                     rounds; a table of the step and each kind's graph time. It
                                     refuses a variant that prep did not make as the spec now
                                     says (patches, settings, batches: .ab/.stamps/NAME.json).

Carry `.ab` and `.cache/ab` to the device (scripts/device.sh runs `run` when AB is set); start
from an empty cache folder so that what travels stays under the device's 64 MiB.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AB_DIR = ".ab"
CACHE = ".cache/ab"
KINDS = ("gemv", "delta rule", "attention", "rest")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
_ENV = re.compile(r"([A-Z_][A-Z0-9_]*)=(.*)\Z")


class SpecError(ValueError):
    """A spec the user wrote is wrong; the message says what and what would be right."""


@dataclass
class Variant:
    name: str
    patches: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    tune: list[str] = field(default_factory=list)     # KEY=VALUE, as --tune takes them

    def tune_args(self) -> list[str]:
        return [a for t in self.tune for a in ("--tune", t)]

    def tree(self, root: Path = ROOT) -> Path:
        """The tree this variant runs in: the checkout itself, or its patched copy."""
        return root / AB_DIR / self.name if self.patches else root


def parse_spec(text: str, where: str = "spec") -> list[Variant]:
    out: list[Variant] = []
    for n, raw in enumerate(text.splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        name, rest = words[0], words[1:]
        if not _NAME.match(name):
            raise SpecError(f"{where}:{n}: {name!r} is not a variant name; use letters, digits, "
                            "'_', '.' and '-', starting with a letter or digit")
        if any(v.name == name for v in out):
            raise SpecError(f"{where}:{n}: variant {name!r} is named twice; give each line its own name")
        v = Variant(name)
        for w in rest:
            if w.startswith("patch="):
                v.patches.append(w[len("patch="):])
                continue
            if w.startswith("tune="):
                t = w[len("tune="):]
                if "=" not in t:
                    raise SpecError(f"{where}:{n}: {w!r} is not tune=KEY=VALUE (e.g. "
                                    "tune=gate_up.sk16=3:6:1; `qwen38gen lanes` lists the keys)")
                v.tune.append(t)
                continue
            m = _ENV.match(w)
            if not m:
                raise SpecError(f"{where}:{n}: {w!r} is neither patch=FILE, tune=KEY=VALUE nor "
                                "NAME=VALUE (an environment variable in capitals)")
            v.env[m.group(1)] = m.group(2)
        out.append(v)
    if not out:
        raise SpecError(f"{where}: no variants; write one per line, the base first")
    return out


def load_spec(path: str) -> list[Variant]:
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"spec file {path!r} not found; give a file with one variant per line")
    return parse_spec(p.read_text(), where=path)


def parse_batches(s: str) -> list[int]:
    try:
        bs = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        bs = []
    if not bs or any(b < 1 for b in bs):
        raise SpecError(f"--batch {s!r}: give batch sizes as positive integers, e.g. 64 or 32,64")
    return bs


def _tree_files(root: Path) -> list[str]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root,
                         capture_output=True, text=True, check=True).stdout
    return [f for f in out.split("\0") if f and not f.startswith(("bench/", f"{AB_DIR}/"))]


def make_tree(v: Variant, root: Path = ROOT) -> Path:
    """Copy the checkout (less bench/) to .ab/NAME and apply the variant's patches there; the
    copy is built in a temporary folder and renamed, so a failed patch leaves nothing behind."""
    dest = v.tree(root)
    for p in v.patches:
        if not (root / p).is_file():
            raise SpecError(f"variant {v.name!r}: patch {p!r} not found (paths are relative to {root})")
    (root / AB_DIR).mkdir(exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{v.name}-", dir=root / AB_DIR))
    try:
        for f in _tree_files(root):
            src = root / f
            if src.is_file():
                (tmp / f).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, tmp / f)
        for p in v.patches:
            r = subprocess.run(["git", "apply", f"--directory={tmp.relative_to(root)}", str(root / p)],
                               cwd=root, capture_output=True, text=True)
            if r.returncode:
                raise SpecError(f"variant {v.name!r}: patch {p!r} does not apply to this checkout:\n"
                                f"{r.stderr.strip()}")
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def variant_env(v: Variant, root: Path = ROOT, base: dict | None = None,
                cache: str = CACHE) -> dict[str, str]:
    """The process environment of a variant: its settings, its tree first on PYTHONPATH, and
    QWEN38_CACHE the one cache folder of every tree (relative to the checkout)."""
    env = dict(os.environ if base is None else base)
    tree = str(v.tree(root))
    keep = [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
            if p and Path(p).resolve() != root.resolve()]
    env["PYTHONPATH"] = os.pathsep.join([tree, *keep])
    env["QWEN38_CACHE"] = str(root / cache)
    env.update(v.env)
    return env


def stamp(v: Variant, root: Path = ROOT) -> dict:
    """What a variant's prepared programs depend on beyond the checkout: its patches' text and
    its settings. prep records it per variant (.ab/.stamps/NAME.json, with the batches prepared);
    run refuses a variant whose spec line or patches changed since, or a batch not prepared."""
    return {"patches": [hashlib.sha256((root / p).read_bytes()).hexdigest()[:16] for p in v.patches],
            "env": v.env, "tune": v.tune}


def _stamp_path(v: Variant, root: Path) -> Path:
    return root / AB_DIR / ".stamps" / f"{v.name}.json"   # names cannot start with a dot


def check_prepared(variants: list[Variant], batches: list[int], root: Path = ROOT) -> None:
    for v in variants:
        if v.patches and not v.tree(root).is_dir():
            raise SpecError(f"no tree for {v.name!r} under {AB_DIR}/; run prep first and carry {AB_DIR}")
        sp = _stamp_path(v, root)
        if not sp.is_file():
            raise SpecError(f"variant {v.name!r} was not prepared; run prep first and carry {AB_DIR}")
        st = json.loads(sp.read_text())
        if {k: st.get(k) for k in ("patches", "env", "tune")} != stamp(v, root):
            raise SpecError(f"variant {v.name!r} changed since it was prepared (its patches or "
                            "settings); run prep again")
        left = sorted(set(batches) - set(st.get("batches", [])))
        if left:
            raise SpecError(f"variant {v.name!r}: batch {','.join(map(str, left))} not prepared "
                            f"(prepared: {','.join(map(str, st.get('batches', [])))}); run prep "
                            "with those batches")


def prep(variants: list[Variant], batches: list[int], cache: str = CACHE, root: Path = ROOT) -> None:
    for v in variants:
        if v.patches:
            print(f"{v.name}: tree {make_tree(v, root).relative_to(root)}", flush=True)
        specs = [f"qwen3.8-27b:{b}" for b in batches]
        r = subprocess.run([sys.executable, "scripts/precompile.py", *v.tune_args(), *specs],
                           cwd=v.tree(root),
                           env=variant_env(v, root, cache=cache), capture_output=True, text=True)
        if r.returncode:
            log = (r.stdout + r.stderr).strip()
            if "Traceback" in log:  # the gate's or nvcc's own message is the exception's line
                log = log.splitlines()[-1]
            raise SpecError(f"variant {v.name!r}: its programs do not build:\n{log[-3000:]}")
        sp, st = _stamp_path(v, root), stamp(v, root)
        sp.parent.mkdir(parents=True, exist_ok=True)
        old = json.loads(sp.read_text()) if sp.is_file() else {}
        # the same variant prepared by several specs (a base) keeps every batch prepared
        done = old.get("batches", []) if {k: old.get(k) for k in st} == st else []
        sp.write_text(json.dumps({**st, "batches": sorted(set(done) | set(batches))}))
        print(f"{v.name}: {' '.join(specs)} compiled and gated", flush=True)


def bench_once(v: Variant, batches: list[int], out: Path, cache: str = CACHE,
               root: Path = ROOT) -> dict:
    cmd = [sys.executable, "-m", "cli", "bench", "--model", "qwen3.8-27b",
           "--batch", ",".join(map(str, batches)), "--ctx", "1024", "--json", str(out),
           *v.tune_args()]
    r = subprocess.run(cmd, cwd=v.tree(root), env=variant_env(v, root, cache=cache),
                       capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"variant {v.name!r}: bench exited {r.returncode}:\n{r.stderr[-3000:]}")
    return json.loads(out.read_text())


def summarize(variants: list[Variant], runs: dict[str, list[dict]]) -> list[str]:
    """One line per (batch, variant): the median step over rounds, its spread, the change from
    the base, each kind's graph time (medians) and the copy bandwidths of the runs."""
    lines = [f"{'B':>3} {'variant':<14} {'step ms':>8} {'min-max':>15} {'vs base':>14} "
             + " ".join(f"{k:>10}" for k in KINDS) + "  copy TB/s"]
    batches = sorted({r["batch"] for js in runs.values() for j in js for r in j["rows"]})
    for b in batches:
        base = None
        for v in variants:
            rows = [r for j in runs.get(v.name, []) for r in j["rows"] if r["batch"] == b]
            if not rows:
                continue
            steps = [r["step_ms"] for r in rows]
            med = statistics.median(steps)
            base = med if base is None else base
            d = med - base
            kinds = " ".join(f"{statistics.median(r['graph_ms'].get(k, 0.0) for r in rows):>10.3f}"
                             for k in KINDS)
            bws = sorted(j["copy_bandwidth"] / 1e12 for j in runs[v.name])
            lines.append(f"{b:>3} {v.name:<14} {med:>8.3f} {min(steps):>7.3f}-{max(steps):<7.3f} "
                         f"{d:>+7.3f} {100 * d / base:>+5.1f}% {kinds}  "
                         f"{bws[0]:.3f}-{bws[-1]:.3f}")
    return lines


def run(variants: list[Variant], batches: list[int], rounds: int, json_out: str | None,
        cache: str = CACHE, root: Path = ROOT) -> list[str]:
    runs: dict[str, list[dict]] = {v.name: [] for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(rounds):
            for v in variants:
                try:
                    j = bench_once(v, batches, Path(tmp) / f"{v.name}-{k}.json", cache, root)
                except RuntimeError as e:  # one variant's failure leaves the others' runs
                    print(f"round {k + 1}/{rounds} {e}", flush=True)
                    continue
                runs[v.name].append(j)
                print(f"round {k + 1}/{rounds} {v.name}: "
                      + ", ".join(f"B={r['batch']} {r['step_ms']:.3f} ms" for r in j["rows"]),
                      flush=True)
    if json_out:
        Path(json_out).write_text(json.dumps(
            {"variants": [v.__dict__ for v in variants], "runs": runs}, indent=1))
    return summarize(variants, runs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("verb", choices=("prep", "run"))
    ap.add_argument("spec")
    ap.add_argument("--batch", default="64")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--cache", default=CACHE, help="the programs' cache folder, relative to the "
                    f"checkout (default {CACHE})")
    a = ap.parse_args(argv)
    try:
        variants, batches = load_spec(a.spec), parse_batches(a.batch)
        if a.rounds < 1:
            raise SpecError(f"--rounds {a.rounds}: give at least 1")
        if a.verb == "run":
            check_prepared(variants, batches)
            print("\n".join(run(variants, batches, a.rounds, a.json, a.cache)))
        else:
            prep(variants, batches, a.cache)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
