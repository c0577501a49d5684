"""The import graph's rooms: the numpy emulator runs without the PyCUDA runtime, serving and
benchmarking build without the verifier."""

import subprocess
import sys

import pytest


def imported(*modules: str) -> set[str]:
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "print(' '.join(m for m in sys.modules if m.startswith('qwen38gen')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


@pytest.mark.parametrize("modules, absent", [
    (("qwen38gen.emu.schedule", "qwen38gen.emu.backend"), "qwen38gen.runtime"),
    (("qwen38gen.serve.run", "qwen38gen.serve.engine", "qwen38gen.serve.backends"), "qwen38gen.verify"),
    (("qwen38gen.perf.bench", "qwen38gen.perf.bench_mtp", "qwen38gen.perf.perfmodel"), "qwen38gen.verify"),
])
def test_rooms(modules, absent):
    got = imported(*modules)
    assert not {m for m in got if m == absent or m.startswith(absent + ".")}
