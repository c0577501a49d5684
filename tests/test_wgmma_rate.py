"""scripts/wgmma_rate.py, the measurement behind version 16's 64-row analysis: its kernels compile
(nvcc, no GPU needed) without ptxas serializing their wgmmas, and the table it prints covers the
shapes the notes quote."""

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import wgmma_rate  # noqa: E402


def test_kernels_cover_the_quoted_shapes():
    names = dict(wgmma_rate.KERNELS)
    for n in ("wr_n64_rs_drain", "wr_n64_rs_chain", "wr_n64_rs_drain_dq", "wr_n256_ss_chain",
              "wr_n16_rs_chain", "wr_n16_rs_drain", "wr_n16_rs_drain_dq"):
        assert n in names
    assert all(wgmma_rate.smem_of(n) <= 227 * 1024 for n in names.values())


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_kernels_compile(tmp_path):
    out = tmp_path / "rate.cubin"
    res = wgmma_rate.build(str(out))
    assert out.stat().st_size > 0
    assert {k.name for k in res.kernels} == {n for n, _ in wgmma_rate.KERNELS}
    assert not any(k.spill_stores or k.spill_loads for k in res.kernels)
    log = (Path(res.cubin).parent / "ptxas.log").read_text()
    assert "C7514" not in log and "C7513" not in log, log
