"""Emit + gate: the program of a model and lane choice, compiled (nvcc, cached by gate.py).
Serving, bench, the locks and the scripts build through here."""

from __future__ import annotations

from .config import ModelConfig
from .emit import emit_program
from .gate import ResourceError, compile_source
from .lanes import Lanes


def build(cfg: ModelConfig, lanes: Lanes, trace: bool = False) -> tuple[str, dict]:
    """(cubin path, manifest) of ``cfg`` under ``lanes``; ResourceError when the program spills
    or overflows a resource (allowed for the trace variant, whose extra registers may spill)."""
    prog = emit_program(cfg, lanes, trace=trace)
    res = compile_source(prog.source, prog.name + ".cu", arch=lanes.arch, manifest=prog.manifest)
    if res.problems and not trace:   # the trace variant's extra registers may spill: allowed
        raise ResourceError(res)
    return res.cubin, prog.manifest
