"""What `qwen38gen run` puts together: requests, a backend, the engine, the output lines and
the throughput summary (docs/RUN_FORMAT.md). cli.py parses the options and prints.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

from ..config import ModelConfig
from ..errors import UserError
from ..outputs import Target
from .engine import Result, Stats, check_request

BACKENDS = ("gpu", "emu", "reference")
FORMAT = "qwen38gen-run"
VERSION = 4   # 3: prompt_rows, decode_rows; decode_occupancy counts waiting decoders; 4: cold_start
# Above this many bytes of int4, synthetic weights for the GPU are made on the GPU (DeviceFill,
# kernels/fill.cuh, as `bench` does): the host's float tensors of the 27B take minutes.
DEVICE_FILL_BYTES = 1e9


def eos_ids(cfg: ModelConfig, tokenizer) -> tuple[int, ...]:
    if tokenizer is not None:
        return tuple(tokenizer.eos_ids)
    return () if cfg.eos_token_id is None else (cfg.eos_token_id,)


def default_ctx(requests) -> int:
    """Room for every request: its prompt and all but its last new token are fed."""
    return max(len(r.prompt) + r.max_tokens - 1 for r in requests)


def check_requests(requests, cfg: ModelConfig, ctx: int, mtp: int,
                   ctx_given: bool = True) -> None:
    """What no backend may start with: a context the model cannot hold (with --mtp K, the 2K
    positions a verify step may write past it too). Where the context was not given
    (``default_ctx``), a request too long is named with its fields, not blamed on a --ctx the
    user never wrote."""
    from .spec_engine import spec_headroom

    room = cfg.max_position_embeddings - (spec_headroom(mtp) if mtp else 0)
    if not ctx_given and ctx > room:
        r = max(requests, key=lambda r: len(r.prompt) + r.max_tokens)
        raise UserError(f"request {r.id!r}: a prompt of {len(r.prompt)} tokens and max_tokens "
                        f"{r.max_tokens} need {len(r.prompt) + r.max_tokens - 1} positions; "
                        f"{cfg.name!r} holds {room} (max_position_embeddings"
                        + (f", less --mtp {mtp}'s headroom" if mtp else "")
                        + "): lower max_tokens or shorten the prompt")
    if not 1 <= ctx <= room:
        raise UserError(f"--ctx {ctx} must be in 1..{room}"
                        + (f" with --mtp {mtp}" if mtp else ""))
    for r in requests:
        check_request(r, ctx, cfg.vocab_size)


def host_path_note(lanes, requests) -> str | None:
    """The line `run --mtp K` prints where sampled requests will be judged on the host (the mtp
    program built with --tune spec_sample=0): correct, but it reads B·(K+1)·V logits a step."""
    n = sum(not r.sampling.greedy for r in requests)
    if not lanes.mtp or lanes.spec_sample or not n:
        return None
    return (f"note: {n} sampled request{'s' if n > 1 else ''} will have {'their' if n > 1 else 'its'}"
            f" drafts judged on the host (the verify step's logits read back, slow at large "
            f"vocabularies); without --tune spec_sample=0 the program judges them (same tokens)")


def float_tensors(cfg: ModelConfig, weights_dir: Path | None, seed: int,
                  mtp: bool = False, mapped: bool = False) -> dict:
    """The weights the backend starts from: a checkpoint folder, or seeded synthetic (with the
    MTP layer's for an mtp program). ``mapped``: a quantized folder's arrays are views of its
    files, read as the GPU upload copies them (upload.py)."""
    from ..quantize import QUANT_JSON, load_any, load_quantized
    from ..weights import default_tensors

    if weights_dir is None:
        return default_tensors(cfg, seed, mtp=mtp)
    if not Path(weights_dir).is_dir():
        raise UserError(f"weights folder {str(weights_dir)!r} does not exist or is not a folder")
    if (Path(weights_dir) / QUANT_JSON).exists():
        return load_quantized(weights_dir, cfg, mapped=mapped)
    return load_any(weights_dir, cfg)


def synthetic_on_device(cfg: ModelConfig) -> bool:
    """Whether the gpu backend makes this model's synthetic weights on the GPU."""
    return cfg.int4_weight_bytes() > DEVICE_FILL_BYTES


def backend_tensors(cfg: ModelConfig, weights_dir: Path | None, seed: int, mtp: bool,
                    backend: str):
    """The weights a backend starts from: ``float_tensors``, except that a model's synthetic
    weights above ``DEVICE_FILL_BYTES`` of int4 are made on the GPU from the seed for the gpu
    backend (other values than the host's synthetic tensors: README, limitations)."""
    if backend == "gpu" and weights_dir is None and synthetic_on_device(cfg):
        from ..runtime import DeviceFill

        return DeviceFill(seed=seed)
    return float_tensors(cfg, weights_dir, seed, mtp=mtp, mapped=backend == "gpu")


def reference_backend(cfg: ModelConfig, tensors: dict, slots: int, chunk: int, ctx: int):
    """The numpy reference on the int4 g128 weights the program computes with."""
    import numpy as np

    from .backends import ReferenceBackend
    from ..quantize import QuantizedTensor, dequantized_weights, int4_weights
    from ..reference import Reference

    if any(isinstance(v, QuantizedTensor) for v in tensors.values()):
        w = dequantized_weights(tensors)
    else:
        w = int4_weights(cfg, tensors)
    return ReferenceBackend(Reference(cfg, w, dtype=np.float32), slots, chunk, ctx)


@contextmanager
def gpu_backend(cfg: ModelConfig, lanes, tensors: dict, ctx: int):
    """The emitted program (built and gated, cached) on the GPU; closed on exit."""
    from ..build import build
    from .backends import RuntimeBackend
    from ..runtime import Runtime, cuda_driver

    cuda_driver()   # no GPU: say so before the build
    cubin, manifest = build(cfg, lanes)
    if lanes.mtp:
        from .spec_engine import RuntimeSpecBackend, spec_headroom

        with Runtime(cubin, manifest, cfg, tensors, ctx + spec_headroom(lanes.mtp)) as rt:
            yield RuntimeSpecBackend(rt, ctx)
        return
    with Runtime(cubin, manifest, cfg, tensors, ctx) as rt:
        yield RuntimeBackend(rt)


def emu_backend(cfg: ModelConfig, lanes, tensors: dict, ctx: int):
    """The emitted program's schedule in numpy (the plain or the mtp program)."""
    if lanes.mtp:
        from ..emu.spec_backend import EmuSpecBackend

        return EmuSpecBackend(cfg, lanes, tensors, ctx)
    from ..emu.backend import EmuBackend

    return EmuBackend(cfg, lanes, tensors, ctx)


def make_engine(backend, eos: tuple[int, ...] = ()):
    """The engine for the backend: speculative over an mtp program, else plain."""
    if getattr(backend, "k", 0):
        from .spec_engine import SpecEngine

        return SpecEngine(backend, eos)
    from .engine import Engine

    return Engine(backend, eos)


def record(res: Result, tokenizer) -> dict:
    """One output line."""
    d = {"id": res.id, "token_ids": res.token_ids}
    if tokenizer is not None:
        d["text"] = tokenizer.decode(res.token_ids)
    d.update(finish_reason=res.finish_reason, prompt_tokens=len(res.prompt),
             output_tokens=len(res.token_ids))
    if hasattr(res, "drafts_proposed"):     # spec_engine.MtpResult (run --mtp K)
        acc = res.acceptance
        d.update(drafts_proposed=res.drafts_proposed, drafts_accepted=res.drafts_accepted,
                 acceptance=None if acc is None else round(acc, 4))
    return d


def summary(stats: Stats, seconds: float, cfg: ModelConfig, backend: str, lane: str,
            cold_start: dict | None = None) -> dict:
    """The run's figures (`--json`, and the closing line). ``cold_start``: seconds from the
    command's start to the weights on the host (``weights_s``), to the backend ready (program
    built, weights on the device: ``ready_s``) and to the first token chosen (``first_token_s``),
    where the weights came from (``weights``), and for weights uploaded from the host the staged
    upload's figures (``upload``: upload.Upload.stats(), with ``h2d_gbs`` and ``bound_s``, the
    slower of reading and copying at that bandwidth, above 256 MiB)."""
    s = max(seconds, 1e-9)
    return {"format": FORMAT + "-summary", "version": VERSION, "model": cfg.name,
            "config_hash": cfg.hash, "backend": backend, "lane": lane,
            "seconds": round(seconds, 4),
            "requests_per_s": round(stats.requests / s, 4),
            "output_tokens_per_s": round(stats.output_tokens / s, 4),
            **stats.as_dict(), "cold_start": cold_start}


H2D_MIN_BYTES = 256 << 20   # uploads this large get the host-to-device bandwidth measured beside


def upload_figures(backend) -> dict:
    """``{"upload": ...}`` for a backend whose weights went up by the staged upload, else {}.
    Above ``H2D_MIN_BYTES`` a pinned copy of that size is timed alone after the upload (a tenth
    of a second, counted in the first token's time) and the upload's bound is the slower of the
    host's reading and the bytes at that bandwidth."""
    rt = getattr(backend, "rt", None)
    u = getattr(rt, "upload", None)
    if not u:
        return {}
    u = dict(u)
    if u["bytes"] >= H2D_MIN_BYTES:
        from ..upload import h2d_bandwidth

        bw = h2d_bandwidth(rt.drv, rt.stream, H2D_MIN_BYTES)
        u["h2d_gbs"] = round(bw / 1e9, 2)
        u["bound_s"] = round(max(u["fill_s"], u["bytes"] / bw), 3)
    return {"upload": u}


def cold_start_line(c: dict) -> str:
    line = (f"Cold start: first token {c['first_token_s']:.2f} s after the command (weights "
            f"{c['weights']}: {c['weights_s']:.2f} s; program and weights on the "
            f"{c['where']}: {c['ready_s']:.2f} s")
    u = c.get("upload")
    if u:   # the staged upload (upload.py): where its time went, beside what PCIe allows
        gb = u["bytes"] / 1e9
        line += (f", of which the weights' upload {u['seconds']:.2f} s: {gb:.2f} GB at "
                 f"{gb / max(u['seconds'], 1e-9):.1f} GB/s, the host reading them "
                 f"{u['fill_s']:.2f} s, waiting on the copies {u['wait_s']:.2f} s")
        if u.get("h2d_gbs"):
            line += (f"; host to device alone {u['h2d_gbs']:.1f} GB/s, so the upload's bound "
                     f"is {u['bound_s']:.2f} s")
    return line + ")"


def summary_line(d: dict) -> str:
    mtp = d.get("mtp", 0)
    line = (f"Throughput: {d['requests_per_s']:.2f} requests/s, {d['output_tokens_per_s']:.2f} "
            f"output tokens/s ({d['requests']} requests, {d['output_tokens']} output tokens in "
            f"{d['seconds']:.2f} s, {d['backend']} backend); steps {d['steps']} (prefill "
            f"{d['prefill_steps']}, {'verify' if mtp else 'decode'} {d['decode_steps']}), slot "
            f"occupancy {d['occupancy']:.2f} ({'verify' if mtp else 'decode'} "
            f"{d['decode_occupancy']:.2f}) of {d['slots']} slots; lockstep batches: "
            f"{d['lockstep_steps']} steps")
    if mtp:
        line += (f"; mtp {mtp}: acceptance {d['acceptance']:.2f} ({d['drafts_accepted']} of "
                 f"{d['drafts_proposed']} drafts), {d['tokens_per_verify']:.2f} tokens per "
                 "slot-verify")
    return line


class LineSink:
    """Output lines, each written whole and flushed: to stdout, or to an ``outputs.Target`` (a
    file that appears only complete, at ``commit``; its temp removed on ``discard``; a FIFO or
    character device written in place). The target's temp file is made here, before the run, so
    an unwritable folder is an error before any work."""

    def __init__(self, path: Path | None, stdout):
        self.target = None
        if path is None:
            self.f = stdout
        else:
            self.target = Target(path)
            self.f = self.target.open()

    def write(self, obj: dict) -> None:
        if self.target is not None:
            self.target.write(json.dumps(obj) + "\n")
            self.target.flush()
        else:
            self.f.write(json.dumps(obj) + "\n")
            self.f.flush()

    def commit(self) -> None:
        if self.target is not None:
            self.target.commit()

    def discard(self) -> None:
        if self.target is not None:
            self.target.discard()
