"""The compile gate: nvcc only. Compile a .cu to a cubin, parse its resources, fail typed.

A program passes when nvcc compiles it, no kernel spills or keeps a local-memory stack frame, no
kernel uses more registers than its launch bound allows (registers × threads within the arch's
register file, 65536 on the H200: plan/arch.py, so one block fits an SM), none has its warpgroup
MMAs serialized by ptxas (C7513 and its kin: the wgmmas the schedule keeps in flight would wait
for each other), and each holds the blocks per SM its schedule needs (the arch's limits on
registers, shared memory, threads and blocks). Results are cached by the code (the generated header comment excluded: it
does not change the compiled bytes), the flags, the nvcc version and the arch.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import UserError
from .interrupt import run_group
from .plan.arch import ArchFacts, arch_facts
from .source import HEADER_END, kernels_dir

# The device's limits (register file, allocation unit, shared memory, threads and blocks an SM)
# are the arch's facts (plan/arch.py); both lane archs are the H200, the default here.
DEFAULT_ARCH = "sm_90"
NVCC_FLAGS = ("-std=c++17", "-O3", "-cubin", "-Xptxas", "-v")


@dataclass
class KernelResources:
    name: str
    registers: int = 0
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    smem: int = 0
    threads: int | None = None  # from the manifest, when there is one
    dyn_smem: int = 0           # dynamic shared memory (manifest)
    resident: int = 0           # blocks per SM its schedule needs (manifest; 0: not checked)
    serialized: str = ""        # ptxas's code (C75xx) where it serialized the kernel's wgmmas

    def blocks_per_sm(self, arch: ArchFacts | None = None) -> int:
        """Blocks of this kernel an SM of `arch` (default: DEFAULT_ARCH's) holds at once:
        registers, shared memory, threads."""
        a = arch or arch_facts(DEFAULT_ARCH)
        warps = -(-self.threads // 32)
        regs = -(-max(self.registers, 1) // a.reg_unit) * a.reg_unit
        smem = self.smem + self.dyn_smem + a.smem_reserved_per_block
        return min(a.regs_per_sm // (regs * 32 * warps), a.smem_per_sm // smem,
                   a.threads_per_sm // (32 * warps), a.max_blocks_per_sm)

    def problems(self, arch: ArchFacts | None = None) -> list[str]:
        a = arch or arch_facts(DEFAULT_ARCH)
        p = []
        if self.spill_stores or self.spill_loads:
            p.append(f"spills {self.spill_stores} B stores / {self.spill_loads} B loads")
        if self.stack:
            p.append(f"{self.stack} B local-memory stack frame")
        if self.smem + self.dyn_smem > a.smem_per_block:
            p.append(f"{self.smem + self.dyn_smem} B of shared memory per block > the "
                     f"{a.smem_per_block} B a block of {a.name} may have")
        if self.serialized:
            p.append(f"wgmma instructions serialized by ptxas ({self.serialized})")
        if self.threads and self.registers * self.threads > a.regs_per_sm:
            p.append(f"{self.registers} registers × {self.threads} threads > {a.regs_per_sm}")
        elif self.threads and self.resident and self.blocks_per_sm(a) < self.resident:
            p.append(f"{self.blocks_per_sm(a)} blocks per SM ({self.registers} registers, "
                     f"{self.smem + self.dyn_smem} B shared); its schedule needs {self.resident}")
        return p


@dataclass
class GateResult:
    source: str
    cubin: str
    cached: bool
    kernels: list[KernelResources] = field(default_factory=list)
    loaded: bool | None = None  # True: every manifest entry resolved on a GPU; None: no GPU
    notes: list[str] = field(default_factory=list)  # what was not checked, and why
    arch: str = DEFAULT_ARCH                        # whose facts the resource checks use

    @property
    def problems(self) -> list[str]:
        a = arch_facts(self.arch)
        return [f"{k.name}: {p}" for k in self.kernels for p in k.problems(a)]


class GateError(Exception):
    """The program did not pass: a compile error or a resource problem. Exit code 1."""


class CompileError(GateError):
    def __init__(self, cmd: list[str], log: str, kept: str):
        self.cmd, self.log, self.kept = cmd, log, kept
        super().__init__(f"nvcc failed on {kept}\ncommand: {' '.join(cmd)}\n{log}")


class ResourceError(GateError):
    def __init__(self, result: GateResult):
        self.result = result
        super().__init__(f"{result.source}: " + "; ".join(result.problems))


def nvcc_path() -> str:
    p = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc"
                                 if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    if not p:
        raise UserError("nvcc not found on PATH (nor /usr/local/cuda/bin/nvcc); "
                        "install the CUDA toolkit (13.0) or put nvcc on PATH")
    return p


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"release [\d.]+, V[\d.]+", out)
    return m.group(0) if m else out.strip().splitlines()[-1]


def cache_dir() -> Path:
    base = os.environ.get("QWEN38_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "qwen38gen")
    return Path(base) / "gate"


def code_of(source: str) -> str:
    """The source less its generated header comment (which names the lanes, not the code)."""
    i = source.find(HEADER_END)
    return source[i + len(HEADER_END):] if i >= 0 else source


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")
_SERIAL = re.compile(r"\((C\d+)\) Potential Performance Loss: wgmma.*serialized.*function '([^']+)'")


def parse_ptxas(log: str) -> list[KernelResources]:
    """Resources per entry function from `-Xptxas -v` output."""
    ks: list[KernelResources] = []
    cur = None
    for line in log.splitlines():
        if m := _ENTRY.search(line):
            cur = KernelResources(m.group(1))
            ks.append(cur)
        elif cur is not None and (m := _FRAME.search(line)):
            cur.stack, cur.spill_stores, cur.spill_loads = map(int, m.groups())
        elif cur is not None and (m := _USED.search(line)):
            cur.registers = int(m.group(1))
            cur.smem = int(m.group(2) or 0)
    serial = {m.group(2): m.group(1) for m in _SERIAL.finditer(log)}  # reported before the entries
    for k in ks:
        k.serialized = serial.get(k.name, "")
    return ks


def _manifest_kernels(manifest: dict | None) -> dict[str, tuple[int, int, int]]:
    """name -> (threads, dynamic shared memory, resident blocks per SM) from the manifest."""
    if not manifest:
        return {}
    return {name: (k["block"][0] * k["block"][1] * k["block"][2], k.get("smem", 0),
                   k.get("resident", 0))
            for name, k in manifest.get("kernels", {}).items()}


def compile_source(source: str, name: str, arch: str = "sm_90", manifest: dict | None = None,
                   include_dirs: tuple[str, ...] = ()) -> GateResult:
    """Compile source text (cached) and return its resources; raise CompileError on failure."""
    arch_facts(arch)   # an arch without device facts: a UserError before anything is compiled
    nvcc = nvcc_path()
    flags = [f"-arch={arch}", *NVCC_FLAGS, *[f"-I{d}" for d in include_dirs]]
    # A translation unit over include_dirs (compile_kernels) keys on the headers' text too, or a
    # kernel edit would be served the cubin of the headers before it.
    headers = [f"{f.name}\0{f.read_text()}" for d in include_dirs
               for f in sorted(Path(d).glob("*.cuh")) + sorted(Path(d).glob("*.h"))]
    key = hashlib.sha256("\0".join(
        [code_of(source), " ".join(flags), nvcc_version(nvcc), arch, *headers]).encode()).hexdigest()[:24]
    slot = cache_dir() / key
    cubin, logf = slot / "program.cubin", slot / "ptxas.log"
    cached = cubin.exists() and logf.exists()
    if not cached:
        try:
            slot.parent.mkdir(parents=True, exist_ok=True)
            work = tempfile.TemporaryDirectory(dir=slot.parent)
        except OSError as e:
            raise UserError(f"the gate's cache folder {str(slot.parent)!r} is not usable "
                            f"({e.strerror or e}); set QWEN38_CACHE to a writable folder") from None
        with work as tmp:
            src = Path(tmp) / (Path(name).stem + ".cu")
            src.write_text(source)
            out = Path(tmp) / "program.cubin"
            cmd = [nvcc, *flags, "-o", str(out), str(src)]
            proc = run_group(cmd)   # its own process group, killed whole on a signal
            log = proc.stdout + proc.stderr
            if proc.returncode != 0:
                kept = slot.parent / f"failed-{key}.cu"
                kept.write_text(source)
                raise CompileError(cmd, log, str(kept))
            (Path(tmp) / "ptxas.log").write_text(log)
            try:
                os.replace(tmp, slot)  # atomic publish of the whole slot
            except OSError:
                pass  # another process published the same key first
            os.makedirs(tmp, exist_ok=True)  # let TemporaryDirectory clean up quietly
    kernels = parse_ptxas(logf.read_text())
    known = _manifest_kernels(manifest)
    for k in kernels:
        if k.name in known:
            k.threads, k.dyn_smem, k.resident = known[k.name]
    return GateResult(source=name, cubin=str(cubin), cached=cached, kernels=kernels, arch=arch)


def compile_kernels(source: str, name: str, arch: str = "sm_90") -> GateResult:
    """compile_source for a translation unit over kernels/ (the sweep scripts' variants): a
    compile error is printed with its log and exits 1."""
    try:
        return compile_source(source, name, arch=arch, include_dirs=(str(kernels_dir()),))
    except CompileError as e:
        print(e, file=sys.stderr)
        raise SystemExit(1) from None


def _bad_manifest(m: Path, what: str) -> UserError:
    return UserError(f"manifest {str(m)!r} is malformed ({what}); emit the program again with "
                     "`qwen38gen emit`, or remove the manifest to gate the .cu alone")


def load_manifest(cu_path: Path) -> dict | None:
    """The manifest beside an emitted .cu (None where there is none), its launch fields checked."""
    m = cu_path.with_suffix(".manifest.json")
    if not m.exists():
        return None
    try:
        d = json.loads(m.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _bad_manifest(m, f"not readable JSON: {e}") from None
    if not isinstance(d, dict) or not isinstance(d.get("kernels"), dict):
        raise _bad_manifest(m, "no \"kernels\" object")
    arch = d.get("lanes", {}).get("arch") if isinstance(d.get("lanes"), dict) else None
    if not isinstance(arch, str) or not _ARCH.fullmatch(arch):
        raise _bad_manifest(m, f"lanes.arch is {json.dumps(arch)}, not an sm_NN arch")
    for name, k in d["kernels"].items():
        block = k.get("block") if isinstance(k, dict) else None
        if not (isinstance(block, list) and len(block) == 3 and all(_count(b, 1) for b in block)):
            raise _bad_manifest(m, f"kernel {name!r}: block is {json.dumps(block)}, not three "
                                   "positive integers")
        for key in ("smem", "resident"):
            if not _count(k.get(key, 0), 0):
                raise _bad_manifest(m, f"kernel {name!r}: {key} is {json.dumps(k[key])}, not a "
                                       "non-negative integer")
    return d


def _count(v, least: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= least


_ARCH = re.compile(r"sm_\d+a?")
_COMPILE_LINE = re.compile(r"^// compile: nvcc -arch=(\S+)", re.M)


def header_arch(source: str) -> str | None:
    """The arch the generated header names (its `// compile: nvcc -arch=...` line), if any."""
    end = source.find(HEADER_END)
    m = _COMPILE_LINE.search(source[:end] if end >= 0 else source[:4096])
    return m.group(1) if m and _ARCH.fullmatch(m.group(1)) else None


def read_program(p: Path) -> str:
    """The text of a .cu to gate; a folder, another kind of file or a binary one is refused."""
    if p.is_dir():
        raise UserError(f"{str(p)!r} is a folder; give the emitted .cu files (or --matrix)")
    if not p.exists():
        raise UserError(f"no such file {str(p)!r}; emit one with `qwen38gen emit`")
    if p.suffix != ".cu":
        beside = (f"; the program of this manifest is {str(p)[:-len('.manifest.json')] + '.cu'!r}"
                  if p.name.endswith(".manifest.json") else "")
        raise UserError(f"{str(p)!r} is not a .cu file; the gate compiles the .cu programs "
                        f"that `qwen38gen emit` writes{beside}")
    try:
        text = p.read_text()
    except UnicodeDecodeError:
        text = None
    except OSError as e:
        raise UserError(f"cannot read {str(p)!r}: {e.strerror or e}") from None
    if text is None or "\0" in text:
        raise UserError(f"{str(p)!r} is not a text file (binary content); give an emitted .cu")
    return text


def gpu_resolve(result: GateResult, manifest: dict | None) -> bool | None:
    """Where PyCUDA and a GPU exist, load the cubin and resolve every manifest entry point."""
    try:
        import pycuda.driver as drv
        drv.init()
        if drv.Device.count() == 0:
            return None
    except Exception:
        return None
    ctx = drv.Device(0).make_context()
    try:
        mod = drv.module_from_file(result.cubin)
        names = list((manifest or {}).get("kernels", {})) or [k.name for k in result.kernels]
        for n in names:
            mod.get_function(n)
        return True
    finally:
        ctx.pop()


def gate_file(path: str | Path, arch: str | None = None) -> GateResult:
    """Gate one emitted .cu. Its manifest beside it gives the arch and the launch bounds; without
    one the arch comes from the header and the result's notes say what was not checked."""
    p = Path(path)
    source = read_program(p)
    manifest = load_manifest(p)
    notes = []
    if arch is None:
        arch = manifest["lanes"]["arch"] if manifest else header_arch(source)
    if arch is None:
        arch = "sm_90"
        notes.append("no manifest and no `// compile: nvcc -arch=...` header line: compiled "
                     "for sm_90")
    if manifest is None:
        notes.append(f"no manifest beside it ({p.with_suffix('.manifest.json').name}): the "
                     "launch-bound checks (registers × threads, blocks per SM) were skipped")
    res = compile_source(source, p.name, arch=arch, manifest=manifest)
    res.source, res.notes = str(p), notes
    if res.problems:
        raise ResourceError(res)
    res.loaded = gpu_resolve(res, manifest)
    return res


def result_dict(res: GateResult) -> dict:
    return {"source": res.source, "cached": res.cached, "loaded": res.loaded,
            "notes": res.notes, "kernels": [asdict(k) for k in res.kernels]}
