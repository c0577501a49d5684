"""scripts/sass_diff.py, the per-kernel SASS and ptxas comparison of the gate matrix: how it splits
cuobjdump's listing and ptxas's log by kernel, what it leaves out (the compiled file's name, the
compile time, nvcc front-end diagnostics), and that compare finds every kind of difference."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import sass_diff  # noqa: E402

SASS = """
Fatbin elf code:
================
arch = sm_90a

\tcode for sm_90a
\t\tFunction : q38_b
\t.headerflags\t@"EF_CUDA_SM90"
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   EXIT ;
\t\t..........


\t\tFunction : q38_a
\t.headerflags\t@"EF_CUDA_SM90"
        /*0000*/                   MOV R2, 0x1 ;
        /*0010*/                   EXIT ;
\t\t..........
"""

LOG = """\
/tmp/qwen38-x/prog_b16.cu:11:9: warning: #pragma once in main file
   11 | #pragma once
      |         ^~~~
ptxas info    : 0 bytes gmem
ptxas info    : (C7513) Potential Performance Loss: wgmma.mma_async instructions are serialized in function 'q38_a' prog_b16
ptxas info    : Compiling entry function 'q38_a' for 'sm_90a'
ptxas info    : Function properties for q38_a
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 256 bytes smem, 400 bytes cmem[0]
ptxas info    : Compile time = 3.1 ms
ptxas info    : Function properties for __internal_accurate_pow
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function 'q38_b' for 'sm_90a'
ptxas info    : Function properties for q38_b
    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 255 registers, used 0 barriers
ptxas info    : Compile time = 9.9 ms
"""


def test_split_sass_by_function():
    funcs = sass_diff.split_sass(SASS)
    assert sorted(funcs) == ["q38_a", "q38_b"]
    assert "MOV R2, 0x1" in funcs["q38_a"] and "LDC R1" not in funcs["q38_a"]
    assert "LDC R1" in funcs["q38_b"]


def test_split_ptxas_keeps_the_figures_and_names_no_file():
    parts = sass_diff.split_ptxas(LOG, "prog_b16")
    assert parts[""] == ["ptxas info    : 0 bytes gmem",
                         "ptxas info    : (C7513) Potential Performance Loss: wgmma.mma_async "
                         "instructions are serialized in function 'q38_a' THIS_FILE"]
    assert parts["q38_a"] == [
        "ptxas info    : Compiling entry function 'q38_a' for 'sm_90a'",
        "ptxas info    : Function properties for q38_a",
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads",
        "ptxas info    : Used 40 registers, used 1 barriers, 256 bytes smem, 400 bytes cmem[0]"]
    assert parts["__internal_accurate_pow"][1].startswith("    0 bytes stack frame")
    assert "    8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads" in parts["q38_b"]
    assert not any("Compile time" in x or "#pragma" in x for v in parts.values() for x in v)


def _dump(tmp_path, name, sass=SASS, log=LOG):
    ptxas = sass_diff.split_ptxas(log, "prog_b16")
    kernels = {k: {"sass": s, "ptxas": ptxas.get(k, [])} for k, s in sass_diff.split_sass(sass).items()}
    d = tmp_path / name
    d.mkdir()
    (d / "tiny__b16.json").write_text(json.dumps(
        {"program": ptxas[""], "kernels": kernels,
         "ptxas_only": {k: v for k, v in ptxas.items() if k and k not in kernels}}))
    return d


def test_compare_equal(tmp_path, capsys):
    assert sass_diff.compare(_dump(tmp_path, "old"), _dump(tmp_path, "new")) == 0
    assert capsys.readouterr().out.startswith(
        "1 programs, 2 kernels compared (SASS and ptxas -v lines): 0 differences")


@pytest.mark.parametrize("sass,log,want", [
    (SASS.replace("MOV R2, 0x1", "MOV R2, 0x2"), LOG, "q38_a: sass differs"),
    (SASS, LOG.replace("Used 40 registers", "Used 42 registers"), "q38_a: ptxas"),
    (SASS, LOG.replace("(C7513)", "(C7514)"), "program-level ptxas lines"),
    (SASS, LOG.replace("0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\nptxas info"
                       "    : Compiling entry function 'q38_b'",
                       "4 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\nptxas info"
                       "    : Compiling entry function 'q38_b'"), "__internal_accurate_pow: ptxas"),
    (SASS.replace("Function : q38_b", "Function : q38_c"), LOG, "q38_b: only in old"),
])
def test_compare_finds_each_difference(tmp_path, capsys, sass, log, want):
    old, new = _dump(tmp_path, "old"), _dump(tmp_path, "new", sass, log)
    assert sass_diff.compare(old, new) == 1
    out = capsys.readouterr().out
    assert "0 differences" not in out and f"tiny__b16: {want}" in out, out


def test_compare_a_missing_program(tmp_path, capsys):
    old, new = _dump(tmp_path, "old"), tmp_path / "new"
    new.mkdir()
    assert sass_diff.compare(old, new) == 1
    assert "tiny__b16.json: only in old" in capsys.readouterr().out


def test_bad_input_is_one_line(tmp_path, monkeypatch, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert sass_diff.main(["compare", str(empty), str(empty)]) == 2
    assert capsys.readouterr().err == (f"error: {empty} holds no dump; run: python3 "
                                       f"scripts/sass_diff.py dump {empty}\n")
    assert sass_diff.main(["dump", str(tmp_path / "d"), "-j", "0"]) == 2
    assert capsys.readouterr().err == "error: -j 0: give at least 1 job\n"
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_BIN", raising=False)
    assert sass_diff.main(["dump", str(tmp_path / "d")]) == 2
    assert capsys.readouterr().err == (
        "error: cuobjdump not found in $CUDA_BIN or on PATH; install the CUDA toolkit's cuobjdump "
        "(or the pip package nvidia-cuda-cuobjdump) and put its bin folder on PATH or in "
        "CUDA_BIN\n")
