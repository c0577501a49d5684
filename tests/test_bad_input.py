"""Bad input as a new user meets it: each is one `error:` line, exit code 2, and
nothing half-written. Most run the command line in this process (cli.main); the ones that need a
read-only folder run it in a subprocess, as an unprivileged user where the tests run as root."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cli
from qwen38gen.config import PRESETS

ROOT = Path(__file__).resolve().parents[1]
needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")


def invoke(capsys, *args):
    """Run the command line in this process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as e:
        cli.main([str(a) for a in args])
    o = capsys.readouterr()
    return e.value.code, o.out, o.err


def assert_user_error(rc, out, err, pattern):
    import re

    assert rc == 2, (rc, out, err)
    assert "Traceback" not in err + out
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert re.search(pattern, lines[0]), lines[0]


@pytest.fixture()
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QWEN38_CACHE", str(tmp_path / "cache"))


@pytest.fixture()
def readonly_dir(tmp_path):
    """(a folder of mode 0555, the command prefix under which it is read-only): root writes
    anywhere, so as root the command runs without CAP_DAC_OVERRIDE (setpriv)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    prefix = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: no folder is read-only")
        prefix = ["setpriv", "--bounding-set=-dac_override", "--"]
    try:
        yield ro, prefix
    finally:
        ro.chmod(0o755)


def run_cli(*args, cwd, env=None, prefix=()):
    """`python -m cli ARGS` in a subprocess with this checkout's code first on the path."""
    e = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), "COLUMNS": "200",
         "HOME": str(cwd), **(env or {})}
    p = subprocess.run([*prefix, sys.executable, "-m", "cli", *map(str, args)],
                       capture_output=True, text=True, cwd=cwd, env=e)
    return p.returncode, p.stdout, p.stderr


# ------------------------------------------------------------------------------------------ info
@pytest.mark.parametrize("args,pattern", [
    (("--bandwidth", "0"), r"--bandwidth 0: the copy bandwidth must be a positive number"),
    (("--bandwidth", "-4e12"), r"--bandwidth -4e\+12: the copy bandwidth must be a positive"),
    (("--bandwidth", "nan"), r"--bandwidth nan: the copy bandwidth must be a positive"),
    (("--ctx", "-1"), r"--ctx -1: the context length must be ≥ 0 tokens"),
])
def test_info_floor_options(capsys, args, pattern):
    assert_user_error(*invoke(capsys, "info", "tiny", *args), pattern)


def test_info_names_a_mistyped_config_key(capsys, tmp_path):
    d = PRESETS["tiny"].to_hf_dict()
    d["layer_types"] = 8
    (tmp_path / "config.json").write_text(json.dumps(d))
    assert_user_error(*invoke(capsys, "info", tmp_path / "config.json"),
                      r"layer_types is 8; expected a list of layer type names")


# ------------------------------------------------------------------------------------------ emit
def test_emit_onto_a_folder(capsys, tmp_path):
    (tmp_path / "x.cu").mkdir()
    assert_user_error(*invoke(capsys, "emit", "--batch", "3", "-o", tmp_path / "x.cu"),
                      r"cannot write '.*/x\.cu': it is a folder; give a file name")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.cu"]


def test_emit_when_the_manifest_path_is_a_folder_writes_nothing(capsys, tmp_path):
    """The .cu's temp file exists by then: it is removed, and no .cu appears."""
    (tmp_path / "x.manifest.json").mkdir()
    assert_user_error(*invoke(capsys, "emit", "--batch", "3", "-o", tmp_path / "x.cu"),
                      r"cannot write '.*/x\.manifest\.json': it is a folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.manifest.json"]


def test_emit_under_a_file(capsys, tmp_path):
    (tmp_path / "f").write_text("a file\n")
    assert_user_error(*invoke(capsys, "emit", "--batch", "3", "-o", tmp_path / "f" / "sub" / "x.cu"),
                      r"cannot write '.*/f/sub/x\.cu': '.*/f' is a file, not a folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_emit_into_a_readonly_folder(readonly_dir):
    ro, prefix = readonly_dir
    rc, out, err = run_cli("emit", "--batch", "3", "-o", ro / "x.cu", cwd=ro.parent, prefix=prefix)
    assert_user_error(rc, out, err, r"cannot write '.*/ro/x\.cu': Permission denied")
    assert list(ro.iterdir()) == []


def test_emit_writes_both_files_or_neither(tmp_path):
    """write_program renames the two temp files only once both are written."""
    from qwen38gen.emit import emit_program, write_program
    from qwen38gen.lanes import Lanes

    prog = emit_program(PRESETS["tiny"], Lanes.make(3))
    cu, man = write_program(prog, tmp_path / "x.cu")
    assert cu.read_text() == prog.source and json.loads(man.read_text()) == prog.manifest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.cu", "x.manifest.json"]


# ------------------------------------------------------------------------------------------ gate
# Valid only for sm_90a (a wgmma fence): a program the gate must compile for the arch its
# header names when there is no manifest.
SM90A = """// generated by hand for a test
// compile: nvcc -arch=sm_90a -std=c++17 -O3 -cubin -Xptxas -v THIS_FILE
// ---- end of header ----
extern "C" __global__ void __launch_bounds__(128) fence() { asm volatile("wgmma.fence.sync.aligned;"); }
"""


@needs_nvcc
def test_gate_without_manifest_uses_the_header_arch_and_says_what_is_skipped(capsys, tmp_path,
                                                                             own_cache):
    cu = tmp_path / "alone.cu"
    cu.write_text(SM90A)
    rc, out, err = invoke(capsys, "gate", cu)
    assert rc == 0, out + err
    assert "note" in out and "no manifest beside it (alone.manifest.json): the launch-bound " \
                              "checks (registers × threads, blocks per SM) were skipped" in out
    assert f"pass {cu}" in out


@needs_nvcc
def test_gate_without_manifest_nor_header_compiles_for_sm_90(tmp_path, own_cache):
    from qwen38gen import gate as G

    cu = tmp_path / "bare.cu"
    cu.write_text(SM90A.split("// ---- end of header ----\n")[1].replace(
        'asm volatile("wgmma.fence.sync.aligned;");', ""))
    res = G.gate_file(cu)
    assert res.notes[0].startswith("no manifest and no `// compile: nvcc -arch=...` header "
                                   "line: compiled for sm_90")


@pytest.mark.parametrize("manifest,pattern", [
    ("{not json", r"is malformed \(not readable JSON: "),
    ('{"lanes": {"arch": "sm_90a"}}', r'is malformed \(no "kernels" object\)'),
    ('{"lanes": {"arch": 90}, "kernels": {}}', r"is malformed \(lanes.arch is 90, not an sm_NN"),
    ('{"lanes": {"arch": "sm_90a"}, "kernels": {"k": {"block": [128, 1]}}}',
     r"is malformed \(kernel 'k': block is \[128, 1\], not three positive integers\)"),
    ('{"lanes": {"arch": "sm_90a"}, "kernels": {"k": {"block": [128, 1, 1], "smem": "0"}}}',
     r'is malformed \(kernel \'k\': smem is "0", not a non-negative integer\)'),
])
def test_gate_malformed_manifest(capsys, tmp_path, own_cache, manifest, pattern):
    cu = tmp_path / "x.cu"
    cu.write_text(SM90A)
    (tmp_path / "x.manifest.json").write_text(manifest)
    assert_user_error(*invoke(capsys, "gate", cu),
                      r"manifest '.*/x\.manifest\.json' " + pattern + r".*`qwen38gen emit`")


def _file(path: Path, content) -> Path:
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return path


@pytest.mark.parametrize("make,pattern", [
    (lambda d: _file(d / "bin.cu", b"\x7fELF\x02\x01\x01\x00\x00\xff\xfe"),
     r"'.*/bin\.cu' is not a text file \(binary content\); give an emitted \.cu"),
    (lambda d: _file(d / "nul.cu", "int a;\0\n"), r"'.*/nul\.cu' is not a text file"),
    (lambda d: d, r"'.*' is a folder; give the emitted \.cu files \(or --matrix\)"),
    (lambda d: _file(d / "x.manifest.json", "{}"),
     r"'.*/x\.manifest\.json' is not a \.cu file; .* the program of this manifest is '.*/x\.cu'"),
    (lambda d: d / "missing.cu", r"no such file '.*/missing\.cu'; emit one with `qwen38gen emit`"),
])
def test_gate_refuses_what_is_not_an_emitted_program(capsys, tmp_path, own_cache, make, pattern):
    assert_user_error(*invoke(capsys, "gate", make(tmp_path)), pattern)


@pytest.mark.parametrize("jobs", ["0", "-3"])
def test_gate_jobs_must_be_positive(capsys, jobs):
    assert_user_error(*invoke(capsys, "gate", "--matrix", "-j", jobs),
                      rf"--jobs {jobs}: give at least 1 parallel nvcc process")


@needs_nvcc
def test_gate_cache_that_is_a_file(capsys, tmp_path, monkeypatch):
    (tmp_path / "cachefile").write_text("")
    monkeypatch.setenv("QWEN38_CACHE", str(tmp_path / "cachefile"))
    cu = tmp_path / "x.cu"
    cu.write_text(SM90A)
    assert_user_error(*invoke(capsys, "gate", cu),
                      r"the gate's cache folder '.*/cachefile/gate' is not usable \(Not a "
                      r"directory\); set QWEN38_CACHE to a writable folder")


@needs_nvcc
def test_gate_cache_that_is_readonly(readonly_dir):
    ro, prefix = readonly_dir
    cu = ro.parent / "x.cu"
    cu.write_text(SM90A)
    rc, out, err = run_cli("gate", cu, cwd=ro.parent, env={"QWEN38_CACHE": str(ro)},
                           prefix=prefix)
    assert_user_error(rc, out, err, r"the gate's cache folder '.*/ro/gate' is not usable "
                                    r"\(Permission denied\); set QWEN38_CACHE to a writable folder")
