"""PyCUDA runtime: load the cubin and manifest, upload weights, allocate per-sequence state,
capture each step as one CUDA graph, and run prefill + greedy decode.

PyCUDA has no graph API: capture goes through the driver API (libcuda via ctypes) on PyCUDA's
stream. Everything a step needs (token ids, positions, chunk lengths)
lives in device buffers that the graph reads, so a step is one `cuGraphLaunch`.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import launch
from .compare import nonfinite_where
from .config import ModelConfig
from .errors import UserError
from .inputs import fused_parts, pack_weights, put_chunk
from .manifest import check_format
from .plan.program import resolve_shape
from .upload import Upload
from .weights import BF16

DT = {"bfloat16": BF16, "float32": np.dtype(np.float32), "int32": np.dtype(np.int32)}


def cuda_driver():
    """The GPU probe: pycuda.driver, initialised, or a UserError that says what is missing (PyCUDA,
    libcuda or a GPU). Commands call it before a build so that a machine without a GPU says so
    first."""
    try:
        import pycuda.driver as drv
    except Exception as e:  # not installed, or no libcuda
        raise UserError(f"PyCUDA is not available ({type(e).__name__}: {e}); the GPU runtime needs "
                        "an NVIDIA GPU with PyCUDA installed (pip install '.[gpu]')") from None
    try:
        drv.init()
        n = drv.Device.count()
    except Exception as e:
        raise UserError(f"no CUDA GPU is available ({e})") from None
    if n == 0:
        raise UserError("no CUDA GPU is available (cuDeviceGetCount = 0)")
    return drv


def allow_dynamic_smem(fn, nbytes: int):
    """Opt a PyCUDA function in to nbytes of dynamic shared memory. Needed whenever static plus
    dynamic passes 48 KiB, which the dynamic size alone does not tell, so it is set for any."""
    if nbytes > 0:
        import pycuda.driver as drv

        fn.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)


def _host(arr: np.ndarray) -> np.ndarray:
    """Contiguous bytes PyCUDA can copy (it cannot buffer ml_dtypes' bfloat16: view as uint16)."""
    a = np.ascontiguousarray(arr)
    return a.view(np.uint16) if a.dtype == BF16 else a


def weight_parts(manifest: dict, packed: dict) -> list[tuple[tuple, list[np.ndarray]]]:
    """What Runtime uploads for the weights, in order: (key, arrays whose bytes follow one
    another in that device buffer): each fused weight's qweight and scales parts, then the other
    tensors in the program's dtype (as they are where the dtype already matches)."""
    todo = []
    for name, spec in manifest["weights"].items():
        qs, ss = fused_parts(spec, packed)
        todo += [(("w", name, "qweight"), qs), (("w", name, "scales"), ss)]
    for name, dt in manifest["tensors"].items():
        a = packed[name]
        if np.asarray(a).dtype != DT[dt]:
            a = np.asarray(a, dtype=np.float32).astype(DT[dt])
        todo.append((("t", name), [a]))
    return todo


class _Graphs:
    """Stream capture and replay through libcuda."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        for f in ("cuStreamBeginCapture_v2", "cuStreamEndCapture", "cuGraphInstantiateWithFlags",
                  "cuGraphLaunch", "cuGraphExecDestroy", "cuGraphDestroy"):
            getattr(self.lib, f).restype = ctypes.c_int

    def _ok(self, rc: int, what: str):
        if rc != 0:
            raise RuntimeError(f"{what} failed with CUresult {rc}")

    def capture(self, stream, launch_all) -> ctypes.c_void_p:
        h = ctypes.c_void_p(stream.handle)
        self._ok(self.lib.cuStreamBeginCapture_v2(h, 0), "cuStreamBeginCapture")  # global mode
        try:
            launch_all()
        finally:
            graph = ctypes.c_void_p()
            rc = self.lib.cuStreamEndCapture(h, ctypes.byref(graph))
        self._ok(rc, "cuStreamEndCapture")
        exe = ctypes.c_void_p()
        self._ok(self.lib.cuGraphInstantiateWithFlags(ctypes.byref(exe), graph, ctypes.c_ulonglong(0)),
                 "cuGraphInstantiateWithFlags")
        self.lib.cuGraphDestroy(graph)
        return exe

    def launch(self, exe, stream):
        self._ok(self.lib.cuGraphLaunch(exe, ctypes.c_void_p(stream.handle)), "cuGraphLaunch")

    def destroy(self, exe):
        self.lib.cuGraphExecDestroy(exe)


@dataclass
class Launch:
    fn: object
    grid: tuple
    block: tuple
    smem: int
    args: list
    prep: object = None   # launch.Prepared when the step is launched with PDL (fn is None then)


@dataclass(frozen=True)
class DeviceFill:
    """Weights made on the GPU from a seed (kernels/fill.cuh): the benchmark's 13 GB of int4
    weights need no checkpoint and no host copy. Codes are uniform; scales keep y = W x O(|x|)."""

    seed: int = 0


def _fill_module():
    from pycuda.compiler import SourceModule

    from .emit import inline_headers

    src = inline_headers(["fill.cuh"])
    src += (
        'extern "C" __global__ void __launch_bounds__(256) q38_fill_u32(uint32_t* p, size_t n, '
        "uint64_t s) { q38::fill_u32(p, n, s); }\n"
        'extern "C" __global__ void __launch_bounds__(256) q38_fill_bf16(q38::bf16* p, size_t n, '
        "uint64_t s, float lo, float hi) { q38::fill_bf16(p, n, s, lo, hi); }\n"
        'extern "C" __global__ void __launch_bounds__(256) q38_fill_f32(float* p, size_t n, '
        "uint64_t s, float lo, float hi) { q38::fill_f32(p, n, s, lo, hi); }\n")
    return SourceModule(src, no_extern_c=True, arch="sm_90", options=["-std=c++17"])


class Runtime:
    """One emitted program on one GPU, with its weights and the state of B sequences.

    ``tensors``: HF-named arrays (float, bf16 or `QuantizedTensor`), or a `DeviceFill`.
    """

    def __init__(self, cubin: str | Path, manifest: dict, cfg: ModelConfig, tensors: dict,
                 tmax: int):
        check_format(manifest, f"the manifest of {Path(cubin).name}")
        drv = self.drv = cuda_driver()
        if manifest["model"]["hash"] != cfg.hash:
            raise UserError(f"the program was emitted for model hash {manifest['model']['hash']}, "
                            f"but the weights' config has hash {cfg.hash}; emit it for this model")
        self.cfg, self.manifest, self.tmax = cfg, manifest, int(tmax)
        if self.tmax < 1 or self.tmax > cfg.max_position_embeddings:
            raise UserError(f"max context {tmax} must be in 1..{cfg.max_position_embeddings}")
        self.B = manifest["lanes"]["batch"]
        self.pt = manifest["schedule"]["prefill_pt"]
        self.mtp = int(manifest["lanes"].get("mtp", 0))
        self.ctx = drv.Device(0).make_context()
        try:
            self.stream = drv.Stream()
            # The cubin is loaded once: through libcuda where launches carry the PDL attribute
            # (launch.py), else through PyCUDA.
            self.pdl, self.fns = None, {}
            if launch.enabled():
                self.pdl = launch.PdlModule(Path(cubin).read_bytes(), manifest["kernels"])
            else:
                self.mod = drv.module_from_file(str(cubin))
                for name, k in manifest["kernels"].items():
                    fn = self.mod.get_function(name)
                    allow_dynamic_smem(fn, k["smem"])
                    self.fns[name] = fn
            self.upload = None    # the staged upload's stats (upload.py), where weights went up
            self._fill = None     # the fill kernels, built on first use (fill)
            if isinstance(tensors, DeviceFill):
                self._alloc_filled(tensors.seed)
            else:
                self._alloc(pack_weights(cfg, tensors, mtp=self.mtp))
            self._alloc_buffers()
            self.graphs = _Graphs()
            self.launches = {ph: self._resolve(sched)
                             for ph, sched in manifest["schedule"].items()
                             if isinstance(sched, list)}   # decode, prefill, topk (, verify)
            self.exe = {}
        except drv.MemoryError as e:
            self.close()
            raise UserError(f"out of GPU memory ({e}); use a smaller --batch or max context") from None
        except BaseException:
            self.close()
            raise

    # ----------------------------------------------------------------------- memory
    def _alloc(self, packed: dict):
        """The weights to the GPU by the staged upload (upload.py): each fused weight's parts
        to their offsets, straight from the arrays (mapped files stay unread until copied)."""
        drv, man = self.drv, self.manifest
        self.mem: dict[str, object] = {}   # keep allocations alive
        self.ptr: dict[tuple, int] = {}
        todo = weight_parts(man, packed)
        up = Upload(drv, self.stream, sum(a.nbytes for _, arrs in todo for a in arrs))
        try:
            for key, arrs in todo:
                g = drv.mem_alloc(max(16, sum(a.nbytes for a in arrs)))
                self.mem[key], self.ptr[key] = g, int(g)
                off = 0
                for a in arrs:
                    off += up.copy(int(g) + off, a)
        finally:
            self.upload = up.finish()

    def fill(self, g, n: int, dtype: str, seed: int, lo: float = 0.0, hi: float = 1.0):
        """Fill n elements at device pointer g with seeded uniform values (u32: random bits). The
        fill kernels are built on first use: device-filled weights, or bench's state over given
        tensors (tests/gpu/test_trace.py's mtp variant)."""
        if self._fill is None:
            self._fill = _fill_module()
        f = self._fill.get_function({"u32": "q38_fill_u32", "bfloat16": "q38_fill_bf16",
                                     "float32": "q38_fill_f32"}[dtype])
        args = [np.uintp(int(g)), np.uint64(n), np.uint64(seed)]
        if dtype != "u32":
            args += [np.float32(lo), np.float32(hi)]
        f(*args, grid=(1024, 1, 1), block=(256, 1, 1), stream=self.stream)

    def _alloc_filled(self, seed: int):
        drv, man = self.drv, self.manifest
        self.mem, self.ptr = {}, {}
        for i, (name, spec) in enumerate(sorted(man["weights"].items())):
            tiles, k = spec["rows"] // 16, spec["k"]
            q = drv.mem_alloc(tiles * (k // 64) * 512)
            sc = drv.mem_alloc(tiles * (k // 128) * 16 * 2)
            self.fill(q, tiles * (k // 64) * 128, "u32", seed * 7919 + 2 * i)
            s = 1.0 / (4.6 * np.sqrt(k))  # q has std ~4.6: keep |W x| ~ |x|
            self.fill(sc, tiles * (k // 128) * 16, "bfloat16", seed * 7919 + 2 * i + 1, 0.5 * s, 1.5 * s)
            for part, g in (("qweight", q), ("scales", sc)):
                self.mem[("w", name, part)] = g
                self.ptr[("w", name, part)] = int(g)
        shapes = self.cfg.tensor_shapes(mtp=self.mtp > 0)
        for i, (name, dt) in enumerate(sorted(man["tensors"].items())):
            n = int(np.prod(shapes[name]))
            g = drv.mem_alloc(n * DT[dt].itemsize)
            lo, hi = ((-1.0, 1.0) if name.endswith("A_log") else
                      (0.5, 1.5) if name.endswith("linear_attn.norm.weight") else (-0.5, 0.5))
            self.fill(g, n, dt, seed * 104729 + i, lo, hi)
            self.mem[("t", name)] = g
            self.ptr[("t", name)] = int(g)
        self.stream.synchronize()

    def _alloc_buffers(self):
        drv, man = self.drv, self.manifest
        self.bufs = {}
        for name, spec in man["buffers"].items():
            shape = resolve_shape(spec["shape"], self.tmax)
            dt = DT[spec["dtype"]]
            nbytes = int(np.prod(shape)) * dt.itemsize
            g = drv.mem_alloc(max(nbytes, 16))
            drv.memset_d8(g, 0, nbytes)
            self.bufs[name] = (g, shape, dt)
            self.mem[("buf", name)] = g

    def _arg(self, a: list):
        kind = a[0]
        if kind == "buf":
            g, _, dt = self.bufs[a[1]]
            return np.uintp(int(g) + (a[2] + a[3] * self.tmax) * dt.itemsize)
        if kind in ("w", "t"):
            return np.uintp(self.ptr[tuple(a)])
        if kind == "i32":
            return np.int32(a[1])
        if kind == "f32":
            return np.float32(a[1])
        if kind == "tmax":
            return np.int32(self.tmax)
        raise ValueError(f"unknown manifest argument {a!r}")

    def _resolve(self, sched: list[dict]) -> list[Launch]:
        out = []
        for s in sched:
            k = self.manifest["kernels"][s["k"]]
            L = Launch(self.fns.get(s["k"]), tuple(s["grid"]), tuple(k["block"]), k["smem"],
                       [self._arg(a) for a in s["args"]])
            if self.pdl is not None:
                L.prep = self.pdl.prepare(s["k"], L.grid, L.block, L.smem, L.args)
            out.append(L)
        return out

    # ----------------------------------------------------------------------- steps
    def _launch_all(self, phase: str):
        self.launch_list(self.launches[phase])

    def launch_list(self, launches: list[Launch]):
        """Enqueue launches on the stream (with PDL when it is on)."""
        for L in launches:
            self.launch_one(L)

    def launch_one(self, L: Launch, pdl: bool = True):
        """Enqueue one launch; pdl=False: without the PDL attribute even when it is on."""
        if L.prep is not None:
            self.pdl.launch(L.prep, self.stream.handle, pdl)
        else:
            L.fn(*L.args, grid=L.grid, block=L.block, shared=L.smem, stream=self.stream)

    def run_phase(self, phase: str, graph: bool = True):
        """One decode step, prefill chunk or top-k pass, as a graph replay (captured once)."""
        if not graph:
            self._launch_all(phase)
            return
        if phase not in self.exe:
            self.exe[phase] = self.graphs.capture(self.stream, lambda: self._launch_all(phase))
        self.graphs.launch(self.exe[phase], self.stream)

    def symbol(self, name: str) -> tuple[int, int]:
        """Device address and size of a __device__ variable of the program (trace.py)."""
        if self.pdl is not None:
            return self.pdl.symbol(name)
        ptr, size = self.mod.get_global(name)
        return int(ptr), int(size)

    def put(self, name: str, arr: np.ndarray):
        g, shape, dt = self.bufs[name]
        a = _host(np.asarray(arr).astype(dt))
        assert a.size <= int(np.prod(shape)), name
        self.drv.memcpy_htod(g, a)  # synchronous: the host array may be freed after return

    def get(self, name: str) -> np.ndarray:
        g, shape, dt = self.bufs[name]
        out = np.empty(shape, dt)
        self.stream.synchronize()
        self.drv.memcpy_dtoh(_host(out), g)
        return out

    def reset(self):
        """Fresh sequences: zero the state and the positions."""
        for name, spec in self.manifest["buffers"].items():
            if spec.get("state") or name == "pos":
                g, shape, dt = self.bufs[name]
                self.drv.memset_d8_async(g, 0, int(np.prod(shape)) * dt.itemsize, self.stream)

    def reset_slot(self, b: int):
        """A fresh sequence in slot b alone (continuous batching, engine.py): zero its recurrent
        state, conv ring and position (and an mtp program's GDN state slot). Its KV caches (the
        MTP's too) are left as they are: attention reads only the positions below pos, which the
        new sequence writes before it reads them."""
        if not 0 <= b < self.B:
            raise ValueError(f"slot {b} is outside 0..{self.B - 1}")
        for name, spec in self.manifest["buffers"].items():
            if not (spec.get("state") or name == "pos") or name in ("kc", "vc", "mkc", "mvc"):
                continue
            g, shape, dt = self.bufs[name]
            if name in ("pos", "slot"):                      # [B]
                self.drv.memset_d8_async(int(g) + b * dt.itemsize, 0, dt.itemsize, self.stream)
            elif name in ("conv", "rec"):                    # [layers, B, ...]: one 2D memset,
                per = int(np.prod(shape[2:])) * dt.itemsize  # a row per layer
                self.drv.memset_d2d8_async(int(g) + b * per, self.B * per, 0, per, shape[0],
                                           self.stream)
            else:
                raise ValueError(f"reset_slot does not know the state buffer {name!r}")

    # ----------------------------------------------------------------------- generation
    def generate(self, prompts: list[list[int]], steps: int, topk: bool = True,
                 forced: list[list[int]] | None = None) -> list[dict]:
        """Greedy: prefill each prompt in chunks of pt, then decode; `steps` new tokens per
        sequence (the first from the prefill's last row, then steps − 1 decode steps), like
        `Reference.generate`.

        ``forced[b]`` (teacher forcing): decode step s is fed ``forced[b][s]`` instead of the
        program's own previous argmax; the outputs are still the program's. Returns per sequence
        {"tokens": [steps ids], "topk": [[[id, logit] × TOPK] per token], "nonfinite": None or
        where the first non-finite logit of the sequence's rows was}: every row a step chose a
        token from is scanned whole (the top k alone could hide a NaN elsewhere in the row).
        """
        B, pt = self.B, self.pt
        if not 1 <= len(prompts) <= B:
            raise ValueError(f"{len(prompts)} prompts for a batch of {B}")
        lens = [len(p) for p in prompts]
        if min(lens) < 1:
            raise UserError("every prompt needs at least one token")
        if steps < 1:
            raise UserError(f"steps must be ≥ 1, got {steps}")
        if max(lens) + steps > self.tmax:
            raise UserError(f"prompt {max(lens)} + {steps} steps exceeds the max context "
                            f"{self.tmax}; pass a larger --ctx")
        n = len(prompts)
        padded = prompts + [[0]] * (B - n)   # idle slots decode a dummy sequence
        self.reset()
        res = [{"tokens": [], "topk": [], "nonfinite": None} for _ in range(n)]
        first = [None] * B

        def scan(rows: list[int], step: int):
            lg = self.get("logits")
            for b in rows:
                if b < n and res[b]["nonfinite"] is None:
                    res[b]["nonfinite"] = nonfinite_where(
                        np.asarray(lg[b], dtype=np.float32), f"sequence {b} step {step} logits")

        nchunks = max(-(-len(p) // pt) for p in padded)
        for c in range(nchunks):
            self.run_phase(put_chunk(self.put, self.manifest["schedule"],
                                     [p[c * pt:(c + 1) * pt] for p in padded]))
            ends = [b for b, p in enumerate(padded) if -(-len(p) // pt) == c + 1]
            if ends:
                if topk:
                    self.run_phase("topk")
                nxt = self.get("next")
                scan(ends, 0)
                tv, ti = (self.get("topk_val"), self.get("topk_idx")) if topk else (None, None)
                for b in ends:
                    first[b] = int(nxt[b])
                    if b < n:
                        res[b]["tokens"].append(first[b])
                        if topk:
                            res[b]["topk"].append([[int(i), float(v)] for i, v in zip(ti[b], tv[b])])
        self.put("ntok", np.ones(B, np.int32))
        cur = np.array(first, np.int32)
        for s in range(steps - 1):
            if forced is not None:
                for b in range(n):
                    cur[b] = forced[b][s]
            self.put("tokens", cur)
            self.run_phase("decode")
            if topk:
                self.run_phase("topk")
            cur = self.get("next").copy()
            scan(list(range(n)), s + 1)
            tv, ti = (self.get("topk_val"), self.get("topk_idx")) if topk else (None, None)
            for b in range(n):
                res[b]["tokens"].append(int(cur[b]))
                if topk:
                    res[b]["topk"].append([[int(i), float(v)] for i, v in zip(ti[b], tv[b])])
        return res

    def close(self):
        ctx = getattr(self, "ctx", None)
        if ctx is not None:
            self.mem = {}
            self.bufs = {}
            if getattr(self, "pdl", None) is not None:
                self.pdl.close()
            ctx.pop()
            self.ctx = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
