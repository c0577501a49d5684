"""The emitted bytes, pinned: sha256 of every gate-matrix program's .cu below its header, and of
its manifest's launch content (kernels, schedule, buffers, weights, tensors as the runtime reads
them), against the table in emitted_digests.json.

A refactor keeps the table. A deliberate change of the emitted text updates it in the same commit
(with the reason in the message):

    python tests/test_emitted_digests.py --update
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

if __name__ == "__main__":   # run as a script from the checkout
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from qwen38gen.config import PRESETS
from qwen38gen.emit import emit_program
from qwen38gen.gate import HEADER_END
from qwen38gen.matrix import matrix_lanes

TABLE = Path(__file__).with_name("emitted_digests.json")


def _launch_view(manifest: dict) -> dict:
    """The manifest as a launch reads it: fields added later for other readers (structured
    descriptions of a launch) do not change it."""
    kernels = {n: {k: e[k] for k in ("block", "smem", "cluster", "params", "call")}
               for n, e in manifest["kernels"].items()}
    sched = {}
    for name, s in manifest["schedule"].items():
        sched[name] = ([{k: x[k] for k in ("k", "grid", "args")} for x in s]
                       if isinstance(s, list) else s)
    return {"kernels": kernels, "schedule": sched, "buffers": manifest["buffers"],
            "weights": manifest["weights"], "tensors": manifest["tensors"]}


def digests(model: str, lanes) -> dict:
    prog = emit_program(PRESETS[model], lanes)
    body = prog.source.split(HEADER_END, 1)[1]
    man = json.dumps(_launch_view(prog.manifest), sort_keys=True, separators=(",", ":"))
    return {"cu": hashlib.sha256(body.encode()).hexdigest(),
            "manifest": hashlib.sha256(man.encode()).hexdigest()}


def current() -> dict:
    return {f"{m}/{lanes.name}": digests(m, lanes) for m, lanes in matrix_lanes()}


def test_table_covers_the_gate_matrix():
    table = json.loads(TABLE.read_text())
    want = {f"{m}/{lanes.name}" for m, lanes in matrix_lanes()}
    assert set(table) == want, "run: python tests/test_emitted_digests.py --update"
    assert len(want) == 66


@pytest.mark.parametrize("model,lanes", matrix_lanes(), ids=lambda v: getattr(v, "name", v))
def test_emitted_bytes_are_pinned(model, lanes):
    table = json.loads(TABLE.read_text())
    assert digests(model, lanes) == table[f"{model}/{lanes.name}"], (
        "the emitted program changed; if that is deliberate, run "
        "python tests/test_emitted_digests.py --update and say why in the commit")


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit("usage: python tests/test_emitted_digests.py --update")
    TABLE.write_text(json.dumps(current(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {TABLE}")
