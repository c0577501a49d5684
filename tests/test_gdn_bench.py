"""scripts/gdn_bench.py, the measurements behind version 17's GDN change: its entries are the
program's GDN instances plus the GE variants (the same kernel, state loads issued later), and
its kernels, with the state-traffic stand-ins of scripts/gdn_stream.cuh, compile without spills
(nvcc, no GPU needed)."""

import json
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import gdn_bench  # noqa: E402


def test_entries_are_the_program_instances_and_ge_variants():
    e = gdn_bench.entries()
    assert e["chunk"].call.endswith(", 0, 0, -1, 0>") and e["chunk_sr12"].name == "q38_gdn_pt1_sr12"
    for ge in gdn_bench.GE_ROWS:
        assert e[f"chunk_ge{ge}"].call.endswith(f", 0, 0, {ge}, 0>")
    assert e["chunk_b16"].name == "q38_gdn_pt1_ge4_w264"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_kernels_compile_without_spills(tmp_path):
    out = tmp_path / "gdn.cubin"
    gdn_bench.build(str(out))
    regs = json.loads(Path(str(out) + ".json").read_text())["regs"]
    assert {"gs_c0_b0", "gs_c1024_b6", "q38_gdn_pt1", "q38_gdn_pt1_ge4", "q38_gdn_pt1_ge4_w264"} <= set(regs)
    assert all(v.endswith(" 0 B spilled") for v in regs.values()), regs
