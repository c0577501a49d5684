"""The lane matrix that `make gate` compiles: models × batches × prefill widths, plus the mtp
lanes (models × B ∈ MTP_BATCHES × K ∈ MTP_K at the default pt) and the portable sm_90 build
(models × B ∈ PORTABLE_BATCHES at the default pt); the rest use the default arch."""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .config import PRESETS
from .emit import emit_program, write_program
from .errors import UserError
from .gate import GateError, gate_file
from .lanes import DEFAULT_PT, Lanes

MODELS = ("qwen3.8-27b", "tiny")
BATCHES = (1, 2, 3, 4, 8, 16, 17, 32, 64)
PTS = (1, DEFAULT_PT, 64)
MTP_BATCHES = (1, 16)
MTP_K = (1, 2)
PORTABLE_BATCHES = (16, 64)   # the sm_90 build (no wgmma) at the default pt


def matrix_lanes() -> list[tuple[str, Lanes]]:
    def make(m, b, **kw):   # the lanes a user gets for model m at B (its default tile)
        return m, Lanes.make(b, model=PRESETS[m], **kw)

    return ([make(m, b, pt=pt) for m in MODELS for b in BATCHES for pt in PTS]
            + [make(m, b, pt=DEFAULT_PT, mtp=k) for m in MODELS for b in MTP_BATCHES for k in MTP_K]
            + [make(m, b, pt=DEFAULT_PT, arch="sm_90") for m in MODELS for b in PORTABLE_BATCHES])


def run_matrix(jobs: int = 2, console=None, out_dir: Path | None = None):
    """Emit and gate every lane of the matrix; [(name, GateResult | None, problem | None)]."""
    tmp = None
    if out_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="qwen38-matrix-")
        out_dir = Path(tmp.name)
    try:
        paths = []
        for model, lanes in matrix_lanes():
            prog = emit_program(PRESETS[model], lanes)
            cu, _ = write_program(prog, out_dir / f"{prog.name}.cu")
            paths.append((prog.name, cu))

        def one(item):
            name, cu = item
            try:
                return name, gate_file(cu), None
            except GateError as e:
                res = getattr(e, "result", None)
                return name, res, str(e).splitlines()[0]
            except UserError as e:
                return name, None, str(e)

        results = []
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            for i, r in enumerate(pool.map(one, paths), 1):
                results.append(r)
                if console is not None:
                    console.print(f"[{i}/{len(paths)}] {r[0]}: "
                                  f"{'pass' if r[2] is None else 'FAIL ' + r[2]}", markup=False)
        return results
    finally:
        if tmp is not None:
            tmp.cleanup()
