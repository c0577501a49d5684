"""The tensor-core rate of the warpgroup MMA shapes a 64-row int4 GEMV can be built on
(kernels in scripts/wgmma_rate.cuh): m64nNk16 with A from registers (wgmma_q4's layout, the
weights as A) or from shared memory (the activations as A, the dequantized weights as B), in
wgmma_q4's per-group structure (8 k-steps into a partial from zero, wait, scale into acc) or as
one accumulating chain (no per-group scale), with and without wgmma_q4's unpacking of the code
words. It answers one design question (docs/PERFORMANCE.md, version 16): whether the 64-row GEMV's
compute is bound by the m64n64k16 instruction shape, by its per-group drain or by the
unpacking; and the same for the narrow shapes (N = 8 … 32) of the 8- to 32-row tiles
(version 22: is the 16-row wgmma_sk_q4 bound by the rate of m64n16k16?). Not a speed figure of the program: those come from `qwen38gen bench`.

  python3 scripts/wgmma_rate.py build OUT.cubin        # CPU machine
  python3 scripts/wgmma_rate.py run OUT.cubin          # GPU machine
"""

from __future__ import annotations

import shutil
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from qwen38gen.gate import compile_kernels  # noqa: E402

SMS = 132
# (kernel, N) in scripts/wgmma_rate.cuh's entry points
KERNELS = [("wr_n8_rs_chain", 8), ("wr_n8_rs_drain_dq", 8), ("wr_n16_rs_chain", 16),
           ("wr_n16_rs_drain", 16), ("wr_n16_rs_drain_dq", 16), ("wr_n24_rs_chain", 24),
           ("wr_n24_rs_drain_dq", 24), ("wr_n32_rs_chain", 32), ("wr_n32_rs_drain_dq", 32),
           ("wr_n64_rs_drain", 64), ("wr_n64_rs_chain", 64), ("wr_n64_rs_drain_dq", 64),
           ("wr_n64_ss_drain", 64), ("wr_n64_ss_chain", 64), ("wr_n128_rs_chain", 128),
           ("wr_n128_ss_drain", 128), ("wr_n128_ss_chain", 128), ("wr_n256_ss_chain", 256),
           ("wr_n256_rs_chain", 256),
           # docs/GEMV_MAINLOOP.md step 0: the conversion and scale in flight, one chain
           ("wr_n8_rs_cv2", 8), ("wr_n16_rs_cv2", 16), ("wr_n32_rs_cv2", 32), ("wr_n64_rs_cv2", 64),
           ("wr_n64_rs_cv4", 64), ("wr_n8_mma_cv", 8), ("wr_n16_mma_cv", 16),
           ("wr_n8_mma_dq", 8), ("wr_n16_mma_dq", 16)]
BLOCKS_PER_SM = (1, 2, 3, 4)


def smem_of(n: int) -> int:
    """Dynamic shared memory of an instance: 8 k-steps of B and of A, and the code words."""
    return 8 * n * 32 + 8 * 2048 + 4 * 64 * 16


def build(cubin: str):
    src = (ROOT / "scripts" / "wgmma_rate.cuh").read_text()
    res = compile_kernels(src, "wgmma_rate.cu", arch="sm_90a")
    shutil.copyfile(res.cubin, cubin)
    print(f"{len(res.kernels)} kernels -> {cubin}: "
          + ", ".join(f"{k.name} {k.registers} registers" for k in res.kernels))
    return res


def run(cubin: str, groups: int = 2000, reps: int = 5):
    import numpy as np
    import pycuda.autoinit  # noqa: F401
    import pycuda.driver as drv

    from qwen38gen.runtime import allow_dynamic_smem

    mod = drv.module_from_file(cubin)
    sink = drv.mem_alloc(4 * 128 * SMS * max(BLOCKS_PER_SM))
    dev = pycuda.autoinit.device
    clock = dev.get_attribute(drv.device_attribute.CLOCK_RATE) * 1e3
    print(f"{groups} groups of 8 k-steps per block; SM clock attribute {clock / 1e9:.2f} GHz; "
          "dense bf16 TFLOP/s (2 flops per multiply-add), cycles per m64nNk16 per SM at that clock, and "
          "the int4 weight bytes an SM gets through per ns (64 x 16 weights of 0.5 B per m64nNk16)")
    print(f"  {'kernel':22s}" + "".join(f"  {w}/SM: TFLOP/s  clk  B/ns" for w in BLOCKS_PER_SM))
    rows = []
    for name, n in KERNELS:
        f = mod.get_function(name)
        line = f"  {name:22s}"
        for w in BLOCKS_PER_SM:
            smem = max(smem_of(n), (228 * 1024) // w - 2048)
            allow_dynamic_smem(f, smem)
            times = []
            for i in range(reps + 1):
                e0, e1 = drv.Event(), drv.Event()
                e0.record()
                f(sink, np.int32(groups), grid=(SMS * w, 1, 1), block=(128, 1, 1), shared=smem)
                e1.record()
                e1.synchronize()
                if i:
                    times.append(e1.time_since(e0) / 1e3)
            t = statistics.median(times)
            mmas = SMS * w * groups * 8
            tflops = mmas * 64 * n * 16 * 2 / t / 1e12
            clk = t * clock / (mmas / SMS)
            bns = (mmas / SMS) * 64 * 16 * 0.5 / t / 1e9
            rows.append((name, w, tflops, clk, bns))
            line += f"  {tflops:13.1f} {clk:5.1f} {bns:5.1f}"
        print(line)
    return rows


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(sys.argv[2])
    else:
        run(sys.argv[2])
