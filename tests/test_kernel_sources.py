"""Rules of the kernel sources that no compiler checks (docs/KERNELS.md, the PDL contract)."""

from pathlib import Path

KERNELS = Path(__file__).resolve().parents[1] / "kernels"

# An __ldg (ld.global.nc, an invariant load to the compiler) may be hoisted above
# griddepcontrol.wait (docs/PERFORMANCE.md, version 4), so it reads only data no kernel of the step
# writes: these loads, of weights. Activations go through q38::ld_after_wait16 or q38::ldg16.
LDG_ALLOWED = {
    ("elementwise.cuh", "dst[i] = __ldg(src + i)"),  # the embedding table
    ("gemv_q4.cuh", "__ldg(sp + g)"),                # int4 scales
}


def test_ldg_reads_only_weights():
    found = set()
    for f in sorted(KERNELS.glob("*.cuh")):
        for n, line in enumerate(f.read_text().splitlines(), 1):
            code = line.split("//")[0]
            if "__ldg(" not in code:
                continue
            hit = next((s for name, s in LDG_ALLOWED if name == f.name and s in code), None)
            assert hit, f"kernels/{f.name}:{n}: __ldg of data a kernel may write: {line.strip()}"
            found.add((f.name, hit))
    assert found == LDG_ALLOWED, f"allowed loads no longer in the sources: {LDG_ALLOWED - found}"
