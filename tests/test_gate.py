"""The gate: nvcc compile, the resource report, typed failures, the cache."""

import shutil

import pytest

from qwen38gen import gate as G
from qwen38gen.config import PRESETS
from qwen38gen.emit import emit_program, write_program
from qwen38gen.lanes import Lanes

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")

GOOD = """
extern "C" __global__ void __launch_bounds__(128) ok(float* y) { y[threadIdx.x] = 1.f; }
"""
# A local array indexed at run time lives in local memory: a stack frame the gate must refuse.
STACK = """
extern "C" __global__ void __launch_bounds__(32) bad(float* y, int i) {
  float a[64];
#pragma unroll 1
  for (int j = 0; j < 64; ++j) a[j] = y[j * i];
  y[threadIdx.x] = a[(i + threadIdx.x) & 63];
}
"""


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("QWEN38_CACHE", str(tmp_path / "cache"))


def test_parse_ptxas():
    log = """ptxas info    : Compiling entry function 'k1' for 'sm_90'
ptxas info    : Function properties for k1
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 16 bytes cumulative stack size, 4096 bytes smem, 368 bytes cmem[0]
"""
    (k,) = G.parse_ptxas(log)
    assert (k.name, k.registers, k.stack, k.spill_stores, k.spill_loads, k.smem) == (
        "k1", 40, 16, 8, 4, 4096)
    k.threads = 2048
    assert len(k.problems()) == 3  # spills, stack, registers × threads > 65536


def test_serialized_wgmma_fails_the_gate():
    """ptxas reports serialized warpgroup MMAs before the entries' resources (nvcc 13.0)."""
    log = """ptxas info    : (C7513) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non wgmma instructions defining input registers of a wgmma between start and end of the pipeline stage in the function 'k2'
ptxas info    : Compiling entry function 'k1' for 'sm_90a'
ptxas info    : Function properties for k1
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 128 registers, used 2 barriers
ptxas info    : Compiling entry function 'k2' for 'sm_90a'
ptxas info    : Function properties for k2
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 128 registers, used 2 barriers
"""
    k1, k2 = G.parse_ptxas(log)
    assert (k1.serialized, k1.problems()) == ("", [])
    assert k2.serialized == "C7513"
    assert k2.problems() == ["wgmma instructions serialized by ptxas (C7513)"]


# Two partials in flight whose accumulators are read between a wgmma's start and its wait: ptxas
# serializes the kernel's wgmmas (C7514); with the wait first it does not.
SERIAL = """#include "wgmma_q4.cuh"
extern "C" __global__ void __launch_bounds__(128, 1) serial(float* y, unsigned long long desc, int n) {
  float d[2][1][4] = {};
  uint32_t a[2][4] = {{threadIdx.x, 1u, 2u, 3u}, {threadIdx.x, 5u, 6u, 7u}};
  q38::wgmma_fence();
  q38::Wgmma<1>::mma(d[0], a[0], desc, 0);
  q38::wgmma_commit();
  for (int i = 0; i < n; ++i) {
    a[1][0] += i;
    q38::wgmma_fence();
    q38::Wgmma<1>::mma(d[1], a[1], desc, 1);
    q38::wgmma_commit();
    q38::wgmma_wait<1>();
    q38::wgmma_fence_regs<1>(d[0]);
    y[i * 128 + threadIdx.x] = d[0][0][0];
    a[0][0] += i;
    q38::wgmma_fence();
    q38::Wgmma<1>::mma(d[0], a[0], desc, 1);
    q38::wgmma_commit();
    q38::wgmma_wait<1>();
    q38::wgmma_fence_regs<1>(d[1]);
    y[i * 128 + threadIdx.x + 64] = d[1][0][0];
  }
  q38::wgmma_wait<0>();
  q38::wgmma_fence_regs<1>(d[0]);
  y[threadIdx.x] = d[0][0][0] + d[1][0][1];
}
extern "C" __global__ void __launch_bounds__(128, 1) fine(float* y, unsigned long long desc, int n) {
  float d[1][4] = {};
  uint32_t a[4] = {threadIdx.x, 1u, 2u, 3u};
  for (int i = 0; i < n; ++i) {
    q38::wgmma_fence();
    q38::Wgmma<1>::mma(d, a, desc, i);
    q38::wgmma_commit();
    q38::wgmma_wait<0>();
    q38::wgmma_fence_regs<1>(d);
    a[0] = a[0] * 3u + 1u;
  }
  y[threadIdx.x] = d[0][0] + d[0][1] + d[0][2] + d[0][3];
}
"""


def test_nvcc_serialized_wgmma_fails_the_gate():
    """The same check on what this nvcc prints for a kernel whose wgmmas it serializes."""
    from qwen38gen.resources import kernels_dir

    res = G.compile_source(SERIAL, "serial.cu", arch="sm_90a", include_dirs=(str(kernels_dir()),))
    ks = {k.name: k for k in res.kernels}
    assert ks["fine"].problems() == [] and ks["serial"].serialized.startswith("C75")
    assert res.problems == [f"serial: wgmma instructions serialized by ptxas ({ks['serial'].serialized})"]


def test_good_then_cached():
    r1 = G.compile_source(GOOD, "good.cu")
    assert not r1.cached and [k.name for k in r1.kernels] == ["ok"] and not r1.problems
    r2 = G.compile_source(GOOD, "good.cu")
    assert r2.cached and r2.cubin == r1.cubin


def test_header_comment_does_not_change_the_key():
    a = "// lanes b1\n" + G.HEADER_END + GOOD
    b = "// lanes b17\n" + G.HEADER_END + GOOD
    assert not G.compile_source(a, "a.cu").cached
    assert G.compile_source(b, "b.cu").cached


def test_an_included_header_is_part_of_the_key(tmp_path):
    """A translation unit over an include directory (compile_kernels: the sweep scripts) is not
    served the cubin of the headers before an edit."""
    inc = tmp_path / "inc"
    inc.mkdir()
    src = '#include "k.cuh"\n'
    (inc / "k.cuh").write_text(GOOD)
    r1 = G.compile_source(src, "k.cu", include_dirs=(str(inc),))
    assert G.compile_source(src, "k.cu", include_dirs=(str(inc),)).cached
    (inc / "k.cuh").write_text(GOOD.replace("1.f", "2.f"))
    r2 = G.compile_source(src, "k.cu", include_dirs=(str(inc),))
    assert not r2.cached and r2.cubin != r1.cubin


def test_compile_error_is_typed():
    with pytest.raises(G.CompileError) as e:
        G.compile_source("this is not C++", "broken.cu")
    assert "nvcc" in e.value.cmd[0] and "error" in e.value.log
    assert open(e.value.kept).read() == "this is not C++"


def test_stack_frame_fails_the_gate(tmp_path):
    p = tmp_path / "bad.cu"
    p.write_text(STACK)
    with pytest.raises(G.ResourceError, match="local-memory stack frame"):
        G.gate_file(p)


def test_emitted_program_passes(tmp_path):
    prog = emit_program(PRESETS["tiny"], Lanes.make(16))
    cu, _ = write_program(prog, tmp_path / "t.cu")
    res = G.gate_file(cu)
    assert not res.problems and {k.name for k in res.kernels} == set(prog.manifest["kernels"])
    assert all(k.threads for k in res.kernels)  # launch bounds from the manifest


def test_resident_blocks_per_sm():
    """An entry whose schedule needs N blocks per SM resident (ops Entry.resident: the split
    24/32-row GEMVs, measured at five) fails the gate when its registers or shared memory allow
    fewer: version 20's merge at 109 registers left four and cost B = 24 0.48 ms."""
    k = G.KernelResources("q38_gemv_split", registers=95, smem=128, threads=128, dyn_smem=20736,
                          resident=5)
    assert k.blocks_per_sm() == 5 and not k.problems()   # 96 a thread x 128 = 12288 of 65536
    k.registers = 109                                      # 112 x 128: four
    assert k.blocks_per_sm() == 4
    assert k.problems() == ["4 blocks per SM (109 registers, 20864 B shared); its schedule needs 5"]
    k.registers, k.dyn_smem = 64, 60 * 1024               # shared memory: 228 KiB / 62.1 KiB
    assert k.blocks_per_sm() == 3 and k.problems()
    k.resident = 0                                         # not checked
    assert not k.problems()


def test_more_shared_memory_than_a_block_may_have_fails():
    """A launch over the opt-in maximum fails on the device when its function attribute is set
    (CUresult 1, found by bench --prefill at pt 128 on the 27B): the gate fails it first."""
    k = G.KernelResources("q38_gdn_pt128", registers=64, smem=0, threads=256, dyn_smem=355328)
    assert k.problems() == ["355328 B of shared memory per block > the 232448 B a block of "
                            "sm_90 may have"]
    k.dyn_smem = 232448
    assert not k.problems()


RESIDENT = """
extern "C" __global__ void __launch_bounds__(1024) wide(float* y) { y[threadIdx.x] = 1.f; }
"""


def test_the_manifest_gives_the_gate_its_resident_blocks():
    """compile_source reads threads, dynamic shared memory and resident blocks from the
    manifest: a 1024-thread block cannot have three an SM (2048 threads)."""
    kernels = {"wide": {"block": [1024, 1, 1], "smem": 0, "resident": 3}}
    res = G.compile_source(RESIDENT, "wide.cu", manifest={"kernels": kernels})
    (k,) = res.kernels
    assert (k.threads, k.resident, k.blocks_per_sm()) == (1024, 3, 2)
    assert res.problems and "its schedule needs 3" in res.problems[0]
    kernels["wide"]["resident"] = 2
    assert not G.compile_source(RESIDENT, "wide.cu", manifest={"kernels": kernels}).problems


def test_the_device_limits_are_the_archs_facts():
    """blocks_per_sm and the register check read the arch's facts (plan/arch.py), not constants
    of the gate: an SM with half the register file holds half the blocks; an arch without facts
    is refused before anything is compiled."""
    from dataclasses import replace

    from qwen38gen.errors import UserError
    from qwen38gen.plan.arch import arch_facts

    h200 = arch_facts("sm_90a")
    k = G.KernelResources("k", registers=96, smem=0, threads=128, resident=5)
    assert k.blocks_per_sm(h200) == k.blocks_per_sm() == 5
    half = replace(h200, regs_per_sm=h200.regs_per_sm // 2)
    assert k.blocks_per_sm(half) == 2
    assert k.problems(half) == ["2 blocks per SM (96 registers, 0 B shared); its schedule needs 5"]
    k.threads, k.resident = 512, 0
    assert k.problems(half) == ["96 registers × 512 threads > 32768"] and not k.problems(h200)
    with pytest.raises(UserError, match=r"^arch 'sm_89' has no device facts; known: sm_90a, "
                                        r"sm_90$"):
        G.compile_source(RESIDENT, "wide.cu", arch="sm_89")
