"""The compiled code of every gate-matrix program, kernel by kernel, for showing that a change of
the emitted text (dead kernel code dropped, say) leaves the machine code as it was.

  python3 scripts/sass_diff.py dump DIR [-j N]   # emit + nvcc (gate cache) + cuobjdump -sass
  python3 scripts/sass_diff.py compare OLD NEW   # per program, per kernel; exit 1 on a difference

`dump` writes one json per program of qwen38gen.matrix.matrix_lanes(): for each entry function its
`cuobjdump -sass` text and its `ptxas -v` lines (stack frame, spills, registers, barriers, smem,
cmem), plus the program's ptxas lines outside any entry (gmem, wgmma serialization warnings).
Nothing is normalized but the compiled file's name; the "Compile time = ..." line is left out
(a timing, not a figure) and so are nvcc front-end diagnostics (they name source lines, which move
when text is removed). To compare two commits, run `dump` in a checkout of each: the script
imports the qwen38gen beside it. cuobjdump and nvdisasm come from PATH or $CUDA_BIN.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qwen38gen.config import PRESETS  # noqa: E402
from qwen38gen.emit import emit_program  # noqa: E402
from qwen38gen.errors import UserError  # noqa: E402
from qwen38gen.gate import compile_source  # noqa: E402
from qwen38gen.matrix import matrix_lanes  # noqa: E402

_FUNC = re.compile(r"^\s*Function : (\S+)\s*$")
_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"^\s+\d+ bytes stack frame")


def tool(name: str) -> str:
    """cuobjdump (or nvdisasm, which cuobjdump runs) from $CUDA_BIN or PATH."""
    cands = [Path(os.environ["CUDA_BIN"]) / name] if os.environ.get("CUDA_BIN") else []
    if found := shutil.which(name):
        cands.append(Path(found))
    for c in cands:
        if c.is_file():
            return str(c)
    raise UserError(f"{name} not found in $CUDA_BIN or on PATH; install the CUDA toolkit's {name} "
                    f"(or the pip package nvidia-cuda-{name}) and put its bin folder on PATH "
                    "or in CUDA_BIN")


def split_sass(text: str) -> dict[str, str]:
    """`cuobjdump -sass` output -> {function: its listing}."""
    funcs: dict[str, list[str]] = {}
    cur = None
    for line in text.splitlines():
        if m := _FUNC.match(line):
            cur = funcs.setdefault(m.group(1), [])
        elif cur is not None:
            cur.append(line.rstrip())
    return {k: "\n".join(v).strip("\n") + "\n" for k, v in funcs.items()}


def split_ptxas(log: str, source_name: str) -> dict[str, list[str]]:
    """`-Xptxas -v` log -> {entry function: its lines}; "" holds the lines outside any entry."""
    out: dict[str, list[str]] = {"": []}
    cur = ""
    for line in log.splitlines():
        line = re.sub(r"\S*" + re.escape(source_name) + r"(\.cu)?", "THIS_FILE", line.rstrip())
        if not (line.startswith("ptxas") or _FRAME.search(line)) or "Compile time =" in line:
            continue   # nvcc front-end diagnostics, and the timing
        if m := _ENTRY.search(line):
            cur = m.group(1)
            out.setdefault(cur, [])
        elif (m := _PROPS.search(line)) and m.group(1) != cur:
            cur = m.group(1)   # a device function's properties: its own section
            out.setdefault(cur, [])
        out[cur].append(line)
    return out


def dump_one(model: str, lanes, out_dir: Path, cuobjdump: str) -> str:
    prog = emit_program(PRESETS[model], lanes)
    res = compile_source(prog.source, prog.name + ".cu", arch=lanes.arch, manifest=prog.manifest)
    env = dict(os.environ, PATH=str(Path(cuobjdump).parent) + os.pathsep + os.environ["PATH"])
    sass = subprocess.run([cuobjdump, "-sass", res.cubin], capture_output=True, text=True, env=env)
    if sass.returncode != 0:
        raise UserError(f"cuobjdump -sass {res.cubin} failed: {sass.stderr.strip()}")
    log = (Path(res.cubin).parent / "ptxas.log").read_text()
    ptxas = split_ptxas(log, prog.name)
    kernels = {k: {"sass": s, "ptxas": ptxas.get(k, [])} for k, s in split_sass(sass.stdout).items()}
    data = {"model": model, "lanes": lanes.name, "program": ptxas[""], "kernels": kernels,
            "ptxas_only": {k: v for k, v in ptxas.items() if k and k not in kernels}}
    path = out_dir / f"{model}__{lanes.name}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=0, sort_keys=True))
    os.replace(tmp, path)
    return f"{model}/{lanes.name}: {len(kernels)} kernels{' (cached)' if res.cached else ''}"


def dump(out_dir: Path, jobs: int) -> None:
    cuobjdump = tool("cuobjdump")
    tool("nvdisasm")
    out_dir.mkdir(parents=True, exist_ok=True)
    lanes = matrix_lanes()
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futs = [pool.submit(dump_one, m, ln, out_dir, cuobjdump) for m, ln in lanes]
        for i, f in enumerate(futs, 1):
            print(f"[{i}/{len(futs)}] {f.result()}", flush=True)


def compare_program(old: dict, new: dict) -> list[str]:
    """Differences between two dumps of one program, one line (or a short diff) each."""
    diffs = []
    if old["program"] != new["program"]:
        diffs.append(f"program-level ptxas lines: {old['program']} -> {new['program']}")
    for part in ("kernels", "ptxas_only"):
        a, b = old[part], new[part]
        for k in sorted(set(a) ^ set(b)):
            diffs.append(f"{k}: only in {'old' if k in a else 'new'}")
        for k in sorted(set(a) & set(b)):
            x, y = a[k], b[k]
            if part == "ptxas_only":
                x, y = {"ptxas": x}, {"ptxas": y}
            if x["ptxas"] != y["ptxas"]:
                diffs.append(f"{k}: ptxas {x['ptxas']} -> {y['ptxas']}")
            if x.get("sass") != y.get("sass"):
                d = list(difflib.unified_diff(x["sass"].splitlines(), y["sass"].splitlines(),
                                              "old", "new", lineterm="", n=1))
                diffs.append(f"{k}: sass differs\n" + "\n".join(d[:20]))
    return diffs


def compare(old_dir: Path, new_dir: Path) -> int:
    olds = {p.name for p in old_dir.glob("*.json")}
    news = {p.name for p in new_dir.glob("*.json")}
    if not olds:
        raise UserError(f"{old_dir} holds no dump; run: python3 scripts/sass_diff.py dump {old_dir}")
    bad = [f"{n}: only in {'old' if n in olds else 'new'}" for n in sorted(olds ^ news)]
    kernels = 0
    for n in sorted(olds & news):
        old = json.loads((old_dir / n).read_text())
        new = json.loads((new_dir / n).read_text())
        kernels += len(old["kernels"])
        bad += [f"{n[:-5]}: {d}" for d in compare_program(old, new)]
    print(f"{len(olds & news)} programs, {kernels} kernels compared "
          f"(SASS and ptxas -v lines): {len(bad)} differences")
    for b in bad:
        print(b)
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="sass_diff.py", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("dir", type=Path)
    d.add_argument("-j", type=int, default=1)
    c = sub.add_parser("compare")
    c.add_argument("old", type=Path)
    c.add_argument("new", type=Path)
    a = ap.parse_args(argv)
    try:
        if a.cmd == "dump":
            if a.j < 1:
                raise UserError(f"-j {a.j}: give at least 1 job")
            dump(a.dir, a.j)
            return 0
        return compare(a.old, a.new)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
