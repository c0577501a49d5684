"""qwen38gen command line: parse options, call the package, print with rich, set the exit code.

Exit codes: 0 ok; 1 a check or the gate failed; 2 a user's mistake or a file or stream that
cannot be used (one line, no traceback); 128 + the signal when interrupted (130 SIGINT, 129
SIGHUP, 143 SIGTERM: temp files removed, child processes killed; qwen38gen/interrupt.py).
"""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

# The numpy reference multiplies small matrices: one BLAS thread is fastest, and several processes
# (the reference runs of `check`) must not oversubscribe the cores. Set before numpy loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import click
from rich.console import Console, ConsoleDimensions

from qwen38gen import __version__
from qwen38gen import report as R
from qwen38gen.errors import UserError
from qwen38gen.lanes import DEFAULT_ARCH, SUPPORTED



def _isatty(f) -> bool:
    try:
        return f.isatty()
    except (AttributeError, ValueError, OSError):
        return False


class _StdoutConsole(Console):
    """The console of stdout, which it finds when it prints (stdout may be closed when this
    module is imported; pytest swaps it). Piped or logged output (no terminal to size it by)
    gets 200 columns rather than rich's 80, so that the bench and gate tables keep every digit
    in a log; a terminal keeps its own width."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self._set_width = None   # a width set on this object (a test), over COLUMNS and 200

    @property
    def size(self) -> ConsoleDimensions:
        size = Console.size.fget(self)
        if self._set_width is not None:
            return ConsoleDimensions(self._set_width, size.height)
        if not _isatty(sys.stdout):
            return ConsoleDimensions(200, size.height)
        return size

    @size.setter
    def size(self, new) -> None:
        Console.size.fset(self, new)
        self._set_width = new[0]

    @property
    def width(self) -> int:
        return self.size.width

    @width.setter
    def width(self, width: int) -> None:
        self._set_width = width


out = _StdoutConsole(highlight=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="qwen38gen")
def cli():
    """Emit, gate and check the batched CUDA decode program of Qwen3.8-27B."""


# ---------------------------------------------------------------------------------------- info
@cli.command()
@click.argument("model", required=False)
@click.option("--model", "model_opt", default=None,
              help="Preset, config.json or checkpoint folder (the same as the MODEL argument).")
@click.option("--ctx", default=1024, show_default=True, help="Context length T for the floor.")
@click.option("--bandwidth", default=4.149e12, show_default=True,
              help="Copy bandwidth in bytes/s for the floor (docs/PERFORMANCE.md's H200 figure).")
@click.option("--list", "list_presets", is_flag=True,
              help="List the presets (the published Qwen3.5 dense sizes and the test models).")
def info(model, model_opt, ctx, bandwidth, list_presets):
    """Geometry, parameters, int4 bytes, per-sequence state and the floor of MODEL
    (default qwen3.8-27b)."""
    import math

    from qwen38gen.config import resolve_model

    if ctx < 0:
        raise UserError(f"--ctx {ctx}: the context length must be ≥ 0 tokens")
    if not (math.isfinite(bandwidth) and bandwidth > 0):
        raise UserError(f"--bandwidth {bandwidth:g}: the copy bandwidth must be a positive number "
                        "of bytes/s, e.g. 4.149e12")
    if list_presets:
        out.print(R.presets_table())
        return
    if model is not None and model_opt is not None and model != model_opt:
        raise UserError(f"info got MODEL {model!r} and --model {model_opt!r}; give one")
    cfg = resolve_model(model or model_opt or "qwen3.8-27b").config
    for t in R.info_tables(cfg, ctx, bandwidth):
        out.print(t)


# ------------------------------------------------------------------------------------ quantize
@cli.command()
@click.argument("model_dir", type=click.Path(path_type=Path), required=False)
@click.option("--model", "model_opt", type=click.Path(path_type=Path), default=None,
              help="The checkpoint folder (the same as the MODEL_DIR argument).")
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(path_type=Path),
              help="Folder to write the packed int4 model into (must not exist or be empty).")
@click.option("--overwrite", is_flag=True, help="Replace an existing output folder.")
@click.option("--no-mtp", "no_mtp", is_flag=True,
              help="Leave the MTP layer out (for a checkpoint without mtp.* tensors, such as "
                   "one saved by Qwen3_5ForCausalLM).")
def quantize(model_dir, model_opt, out_dir, overwrite, no_mtp):
    """Quantize an HF checkpoint to int4 g128 in the kernels' packed layout, tensor by tensor.
    A GPTQ or compressed-tensors int4 checkpoint is imported (its codes kept)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from qwen38gen.config import load_config
    from qwen38gen.outputs import check_folder_pair
    from qwen38gen.quantize import quantize_checkpoint

    if model_dir is None and model_opt is None:
        raise UserError("quantize needs the checkpoint folder: qwen38gen quantize DIR -o OUT "
                        "(or --model DIR)")
    if model_dir is not None and model_opt is not None and model_dir != model_opt:
        raise UserError(f"quantize got MODEL_DIR {str(model_dir)!r} and --model "
                        f"{str(model_opt)!r}; give one")
    model_dir = model_dir or model_opt
    if not model_dir.is_dir():
        raise UserError(f"checkpoint folder {str(model_dir)!r} does not exist or is not a folder")
    check_folder_pair(model_dir, out_dir)   # before anything else: -o may not hold the source
    load_config(model_dir)  # a bad config.json fails here, before the progress bar starts
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[tensor]}"), console=err, transient=True) as prog:
        task = prog.add_task("quantize", total=None, tensor="")

        def progress(done, total, name):
            prog.update(task, completed=done, total=total, tensor=name)

        report: dict = {}
        quantize_checkpoint(model_dir, out_dir, progress=progress, overwrite=overwrite,
                            mtp=not no_mtp, report_to=report)
    if report:
        for line in R.import_lines(report):
            out.print(line, markup=False)
    out.print(f"wrote {out_dir}")


# ------------------------------------------------------------------------------------ generate
def _parse_ids(s: str, opt: str = "--prompt-ids") -> list[int]:
    import re

    parts = [t.strip() for t in s.split(",")]
    if not any(parts):
        raise UserError(f"{opt} is empty; give at least one token id, e.g. {opt} 1,2,3")
    # ASCII digits only ('１２' and '²' are digits to str.isdigit); no empty item ('1,,2')
    if not all(re.fullmatch(r"-?[0-9]{1,18}", t) for t in parts):
        raise UserError(f"{opt} {s!r} is not a comma-separated list of token ids "
                        "(e.g. 1,2,3)")
    return [int(t) for t in parts]


def _model_options(f):
    """--model, --weights and --seed, declared once for generate and run (qwen38gen.model_source
    says how they resolve)."""
    for opt in reversed([
        click.option("--model", default=None,
                     help="Preset, config.json or checkpoint folder (its weights and tokenizer) "
                          "[default: the --weights folder's config.json, else tiny]."),
        click.option("--weights", "weights_dir", type=click.Path(path_type=Path), default=None,
                     help="A checkpoint folder (HF safetensors or `quantize` output); its "
                          "config.json is the model unless --model says otherwise; default: the "
                          "--model folder's weights, else seeded synthetic weights."),
        click.option("--seed", default=0, show_default=True,
                     help="Seed of the synthetic weights (≥ 0)."),
    ]):
        f = opt(f)
    return f


@cli.command()
@_model_options
@click.option("--prompt", "prompts", multiple=True,
              help="Prompt text (needs the model folder's tokenizer.json); repeat for a batch. "
                   "Without a tokenizer, comma-separated token ids as --prompt-ids.")
@click.option("--prompt-ids", "prompt_ids", multiple=True,
              help="Token ids, comma-separated (e.g. 1,2,3); repeat for a batch.")
@click.option("--chat", is_flag=True, help="Wrap each --prompt in the model's chat template.")
@click.option("--think", is_flag=True, help="With --chat: the template's thinking mode "
                                           "(enable_thinking; off by default).")
@click.option("--ignore-eos", is_flag=True, help="Do not stop at the end-of-sequence ids.")
@click.option("--steps", default=8, show_default=True,
              help="Greedy decode steps at most (fewer when every sequence has stopped).")
@click.option("--int4", "use_int4", is_flag=True, help="Quantize the synthetic weights to int4 "
                                                      "first (the q4 program's oracle).")
def generate(model, weights_dir, seed, prompts, prompt_ids, chat, think, ignore_eos, steps,
             use_int4):
    """Greedy generation with the numpy reference (the oracle), on CPU."""
    import numpy as np

    from qwen38gen.quantize import int4_weights, load_any
    from qwen38gen.reference import Reference, check_fits
    from qwen38gen.weights import synthetic_weights

    if seed < 0:
        raise UserError(f"--seed {seed} must be ≥ 0")
    if steps < 0:
        raise UserError(f"--steps {steps} must be ≥ 0")
    from qwen38gen.model_source import resolve_model_source
    from qwen38gen.serve.requests import encode_prompt

    cfg, weights_dir, tok, tok_dir = resolve_model_source(model, weights_dir)
    if think and not chat:
        raise UserError("--think is the chat template's thinking mode; it needs --chat")
    if chat and tok is None:
        raise UserError("--chat needs the model folder's tokenizer.json and chat template")
    ids = [_parse_ids(p) for p in prompt_ids]
    for p in prompts:
        if tok is None:   # no tokenizer: ids, written with commas (never "1 2 3" -> 123)
            if any(not (c.isdigit() or c in ", -") for c in p):
                where = f"{str(tok_dir)!r} has" if tok_dir is not None else "synthetic weights have"
                raise UserError(f"--prompt {p!r} is not a comma-separated list of token ids, "
                                f"and {where} no tokenizer.json to read it as text; give a model "
                                "folder with one (--model DIR) or token ids (--prompt-ids 1,2,3)")
            ids.append(_parse_ids(p, "--prompt"))
        else:   # the rule run's prompts follow (serve.requests.encode_prompt)
            if not p:
                raise UserError("--prompt '' is empty; give some text")
            ids.append(encode_prompt(p, tok, f"--prompt {p[:40]!r}", chat, think))
    if not ids:
        ids = [[1, 2, 3, 4, 5]]
    for p in ids:
        bad = [t for t in p if not 0 <= t < cfg.vocab_size]
        if bad:
            raise UserError(f"token id {bad[0]} is outside the vocabulary 0..{cfg.vocab_size - 1}")
    check_fits(cfg, "generate")
    if weights_dir is not None:
        tensors = load_any(weights_dir, cfg)
    else:
        tensors = synthetic_weights(cfg, seed)
        if use_int4:
            tensors = int4_weights(cfg, tensors)
    ref = Reference(cfg, tensors, dtype=np.float32)
    from qwen38gen.serve.run import eos_ids

    gen = ref.generate(ids, steps, stop=() if ignore_eos else eos_ids(cfg, tok))
    out.print(R.generate_table(cfg, steps, ids, gen))
    if tok is not None:
        for i, g in enumerate(gen):
            out.print(f"[{i}] {tok.decode(g)}", markup=False)


# ---------------------------------------------------------------------------------------- lanes
@cli.command("lanes")
def lanes_cmd():
    """The supported set of lane choices, model dimensions and tuning settings."""
    from qwen38gen.lanes import supported_table
    from qwen38gen.tuning import ROLES, tuning_table

    for t in R.lanes_tables(supported_table(), tuning_table()):
        out.print(t)
    out.print(f"ROLE: {', '.join(ROLES)}; per-role defaults come from the schedule table "
              "(qwen38gen/plan/table.py)")


def _tune_options(f):
    for opt in reversed([
        click.option("--tune", "tune", multiple=True, metavar="KEY=VALUE",
                     help="A schedule choice away from the table's (repeatable; see `lanes`), "
                          "e.g. gdn_ge=4 or gate_up.sk16=3:6:1."),
        click.option("--tune-file", type=click.Path(path_type=Path), default=None,
                     help="A file of KEY=VALUE tuning lines ('#' comments), before --tune."),
    ]):
        f = opt(f)
    return f


def _tuning(tune=(), tune_file=None):
    """The Tuning of a command: the QWEN38_* variables of the A/B runs (read now), then
    --tune-file, then --tune, later settings winning."""
    from qwen38gen.tuning import Tuning, read_tune_file, tuning_from_env

    settings = tuning_from_env() + (read_tune_file(tune_file) if tune_file else []) + list(tune)
    return Tuning.parse(settings)


def _lanes_options(f=None, *, batch_required: bool = False):
    """The lane options, declared once: emit (--batch required), check, run and the others
    (--batch 16 by default), with the tuning options. ``_make_lanes`` turns them into Lanes."""
    def wrap(f):
        batch = (click.option("--batch", type=int, required=True, help="B: sequences per step.")
                 if batch_required else
                 click.option("--batch", type=int, default=16, show_default=True,
                              help="B: sequences per step."))
        for opt in reversed([
            batch,
            click.option("--btg", type=int, default=None,
                         help="Batch tile of the GEMV (default from B)."),
            click.option("--pt", type=int, default=None,
                         help="Prefill chunk width (default: $QWEN38_PT, else 16)."),
            click.option("--mtp", type=int, default=0, show_default=True, is_flag=False,
                         flag_value=1, help="MTP draft tokens per verify pass, 1..4 (0: off; "
                         "--mtp alone: 1): speculative decoding with the MTP drafter."),
            click.option("--arch", default=DEFAULT_ARCH, show_default=True),
            click.option("--lm-head", default="int4", show_default=True,
                         help="lm_head precision."),
        ]):
            f = opt(f)
        return _tune_options(f)

    return wrap if f is None else wrap(f)


# ----------------------------------------------------------------------------------------- emit
@cli.command()
@_lanes_options(batch_required=True)
@click.option("--model", default="tiny", show_default=True,
              help="Preset, config.json or checkpoint folder (its config.json is the geometry).")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="The .cu to write (default: the lane's name in the current folder).")
@click.option("--stdout", "to_stdout", is_flag=True, help="Print the program instead.")
def emit(model, output, to_stdout, **lane_kw):
    """Write the self-contained .cu decode program and its launch manifest."""
    from qwen38gen.config import resolve_model
    from qwen38gen.emit import emit_program, write_program

    if to_stdout and output is not None:
        raise UserError("emit: give --stdout (print the program) or -o FILE.cu (write it and its "
                        "manifest), not both")
    cfg = resolve_model(model).config
    lanes = _make_lanes(**lane_kw, model=cfg)
    prog = emit_program(cfg, lanes)
    if to_stdout:
        sys.stdout.write(prog.source)
        return
    cu, man = write_program(prog, output, {"--model": _model_path(model),
                                           "--tune-file": lane_kw.get("tune_file")})
    out.print(f"wrote {cu} ({len(prog.source):,} bytes, {len(prog.manifest['kernels'])} kernels) "
              f"and {man}")


# ----------------------------------------------------------------------------------------- gate
@cli.command()
@click.argument("files", nargs=-1, type=click.Path(path_type=Path))
@click.option("--matrix", is_flag=True, help="Emit and gate the whole lane matrix.")
@click.option("--jobs", "-j", type=int, default=None, help="Parallel nvcc processes.")
@click.option("--quiet", "-q", is_flag=True, help="Only the summary table.")
def gate(files, matrix, jobs, quiet):
    """Compile emitted programs with nvcc; fail on errors, spills, stack or too many registers."""
    from rich.markup import escape

    from qwen38gen import gate as G

    if not files and not matrix:
        raise UserError("give one or more .cu files, or --matrix")
    if jobs is not None and jobs < 1:
        raise UserError(f"--jobs {jobs}: give at least 1 parallel nvcc process")
    failed = False
    if matrix:
        from qwen38gen.matrix import run_matrix

        results = run_matrix(jobs=jobs or os.cpu_count() or 1, console=err)
        t, failed = R.gate_matrix_table(results)
        out.print(t)
    for f in files:
        try:
            res = G.gate_file(f)
        except G.CompileError as e:
            failed = True
            err.print(f"[red]compile error[/red] in {f}\ncommand: {' '.join(e.cmd)}\n"
                      f"source kept at {e.kept}")
            err.print(e.log, markup=False)
            continue
        except G.ResourceError as e:
            failed = True
            out.print(R.gate_table(e.result))
            for n in e.result.notes:
                out.print(f"[yellow]note[/yellow] {escape(str(f))}: {escape(n)}")
            continue
        if not quiet:
            out.print(R.gate_table(res))
        for n in res.notes:
            out.print(f"[yellow]note[/yellow] {escape(str(f))}: {escape(n)}")
        where = ("every entry point resolved on the GPU" if res.loaded
                 else "no GPU here: cubin not loaded")
        out.print(f"[green]pass[/green] {f}: {len(res.kernels)} kernels, 0 spills, 0 stack; {where}")
    sys.exit(1 if failed else 0)


# ------------------------------------------------------------------------------ run / golden
def _make_lanes(batch, btg, pt, mtp, arch, lm_head, tune=(), tune_file=None, model=None):
    from qwen38gen.lanes import Lanes

    return Lanes.make(batch, btg=btg, pt=pt, mtp=mtp, arch=arch, lm_head=lm_head,
                      tuning=_tuning(tune, tune_file), model=model)


@cli.command()
@_model_options
@click.option("--prompts", "prompts_file", type=click.Path(path_type=Path), default=None,
              help="JSON lines, one request each (docs/RUN_FORMAT.md).")
@click.option("--prompt", "prompt_texts", multiple=True,
              help="Instead of --prompts: prompt text, one request each (repeat for more), "
                   "encoded with the model folder's tokenizer.")
@click.option("--chat", is_flag=True, help="With --prompt: wrap each in the model's chat template.")
@click.option("--think", is_flag=True, help="With --chat: the template's thinking mode "
                                           "(enable_thinking; off by default).")
@click.option("--max-tokens", type=int, default=None,
              help="With --prompt: new tokens at most per request [default: 16].")
@click.option("--temperature", type=float, default=None,
              help="With --prompt: sampling temperature (0: greedy) [default: 0].")
@click.option("--top-k", type=int, default=None, help="With --prompt: top_k (-1: off).")
@click.option("--top-p", type=float, default=None, help="With --prompt: top_p in (0, 1].")
@click.option("--min-p", type=float, default=None, help="With --prompt: min_p in [0, 1].")
@click.option("--ignore-eos", is_flag=True,
              help="With --prompt: do not stop at the end-of-sequence ids.")
@click.option("--backend", type=click.Choice(["gpu", "emu", "reference"]), default="gpu",
              show_default=True, help="gpu: the emitted program (PyCUDA); emu: the emitted "
                                      "program's schedule executed in numpy on CPU (not the CUDA "
                                      "kernels), slowly; reference: the numpy reference on CPU, "
                                      "slowly, with the same scheduling.")
@click.option("--ctx", type=int, default=None,
              help="Positions per slot (default: the longest prompt + max_tokens - 1).")
@click.option("--sampling-seed", type=int, default=0, show_default=True,
              help="Seed from which a request without \"seed\" gets its own.")
@click.option("--output", "output", type=click.Path(path_type=Path), default=None,
              help="Write the output lines here (appears complete or not at all); default stdout.")
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None,
              help="Write the run's figures here (throughput, steps, slot occupancy).")
@_lanes_options
def run(model, weights_dir, seed, prompts_file, prompt_texts, chat, think, max_tokens,
        temperature, top_k, top_p, min_p, ignore_eos, backend, ctx, sampling_seed, output,
        json_out, **lane_kw):
    """Generate for every request of a JSON-lines file (or of each --prompt) with continuous
    batching over B slots.

    One JSON line per request as it finishes (stdout or --output; with "text" when the model
    folder has a tokenizer), a progress bar and the throughput on stderr."""
    import time

    from qwen38gen import outputs as O
    from qwen38gen.serve import run as S

    t_cmd = time.perf_counter()     # the cold start counts from here
    O.check_outputs({"--output": output, "--json": json_out},
                    {"--prompts": prompts_file, "--tune-file": lane_kw.get("tune_file"),
                     "--weights": weights_dir, "--model": _model_path(model)})
    from qwen38gen.model_source import resolve_model_source

    cfg, weights_dir, tok, _ = resolve_model_source(model, weights_dir)
    lanes = _make_lanes(**lane_kw, model=cfg)
    reqs = _run_requests(prompts_file, prompt_texts, cfg, tok, sampling_seed, chat=chat,
                         think=think, max_tokens=max_tokens, temperature=temperature, top_k=top_k,
                         top_p=top_p, min_p=min_p, ignore_eos=ignore_eos or None)
    ctx_given = ctx is not None
    ctx = ctx if ctx_given else S.default_ctx(reqs)
    S.check_requests(reqs, cfg, ctx, lanes.mtp, ctx_given)
    if backend == "reference" and lanes.mtp:
        raise UserError("--mtp runs the emitted mtp program: use --backend gpu or emu (the "
                        "reference backend computes the plain model)")
    # Both outputs' temp files exist before any work: an unwritable target fails now.
    sink = S.LineSink(output, sys.stdout)
    summary_out = O.Target(json_out) if json_out else None
    try:
        if summary_out is not None:
            summary_out.open()
        _run_engine(cfg, lanes, weights_dir, seed, backend, ctx, tok, reqs, sink, summary_out,
                    t_cmd)
    finally:
        sink.discard()
        if summary_out is not None:
            summary_out.discard()


def _model_path(model):
    """--model as a path, where it names an existing file or folder (else None: a preset)."""
    return model if model is not None and os.path.exists(model) else None


def _run_engine(cfg, lanes, weights_dir, seed, backend, ctx, tok, reqs, sink, summary_out, t_cmd):
    """run's work once its outputs are open: build the backend, run, commit the outputs."""
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from qwen38gen.serve import run as S

    tensors = S.backend_tensors(cfg, weights_dir, seed, bool(lanes.mtp), backend)
    cold = {"weights": ("made on the GPU from the seed" if not isinstance(tensors, dict) else
                        "synthetic, made on the host" if weights_dir is None else
                        f"read from {weights_dir}"),
            "where": "GPU" if backend == "gpu" else "host",
            "weights_s": round(time.perf_counter() - t_cmd, 3)}
    if backend == "reference":
        from contextlib import nullcontext

        be_ctx = nullcontext(S.reference_backend(cfg, tensors, lanes.batch, lanes.pt, ctx))
    elif backend == "emu":
        from contextlib import nullcontext

        from qwen38gen.emu.backend import NOTICE

        err.print(NOTICE, markup=False)
        be_ctx = nullcontext(S.emu_backend(cfg, lanes, tensors, ctx))
    else:
        be_ctx = S.gpu_backend(cfg, lanes, tensors, ctx)
    note = S.host_path_note(lanes, reqs)
    if note:
        err.print(note, markup=False)
    with be_ctx as be:
        cold["ready_s"] = round(time.perf_counter() - t_cmd, 3)
        cold.update(S.upload_figures(be))
        eng = S.make_engine(be, S.eos_ids(cfg, tok))
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                      TextColumn("{task.fields[toks]} tokens"), console=err,
                      transient=True, disable=not err.is_terminal) as prog:
            task = prog.add_task(f"run ({backend})", total=len(reqs), toks=0)

            def done(res):
                sink.write(S.record(res, tok))
                prog.update(task, advance=1, toks=eng.stats.output_tokens)

            def first_token(_done):
                if "first_token_s" not in cold and eng.stats.output_tokens:
                    cold["first_token_s"] = round(time.perf_counter() - t_cmd, 3)

            t0 = time.perf_counter()
            # checks every request before the first step
            eng.run(reqs, on_finish=done, on_step=first_token)
            seconds = time.perf_counter() - t0
    sink.commit()
    d = S.summary(eng.stats, seconds, cfg, backend, lanes.name, cold)
    err.print(S.cold_start_line(cold), markup=False)
    err.print(S.summary_line(d), markup=False)
    if summary_out is not None:
        summary_out.write(json.dumps(d, indent=1) + "\n")
        summary_out.commit()


_PROMPT_ONLY = ("chat", "think", "max_tokens", "temperature", "top_k", "top_p", "min_p",
                "ignore_eos")


def _run_requests(prompts_file, texts, cfg, tok, sampling_seed, **opts):
    """The requests of `run`: the --prompts file's lines, or one per --prompt with the
    command line's parameters (which a file's lines set for themselves)."""
    from qwen38gen.serve.requests import prompt_requests, read_requests

    # flags False, options None when not given (a 0 is given: it must not be dropped silently)
    given = [k for k in _PROMPT_ONLY if opts[k] is not None and opts[k] is not False]
    if texts and prompts_file is not None:
        raise UserError("give the prompts either as --prompt TEXT (repeatable) or as a "
                        "--prompts FILE of JSON lines, not both")
    if not texts:
        if prompts_file is None:
            raise UserError("run needs prompts: --prompts FILE (JSON lines, docs/RUN_FORMAT.md) "
                            "or --prompt TEXT (repeatable)")
        if given:
            opt = "--" + given[0].replace("_", "-")
            raise UserError(f"{opt} goes with --prompt; in a --prompts file each line sets its "
                            "own fields (docs/RUN_FORMAT.md)")
        return read_requests(prompts_file, cfg.vocab_size, sampling_seed, tok)
    if opts["think"] and not opts["chat"]:
        raise UserError("--think is the chat template's thinking mode; it needs --chat")
    params = {k: opts[k] for k in _PROMPT_ONLY if k not in ("chat", "think")}
    try:
        return prompt_requests(texts, cfg.vocab_size, tok, sampling_seed, chat=opts["chat"],
                               think=opts["think"], **params)
    except UserError as e:   # a field the command line set: name its option
        if e.field in params:
            raise UserError(f"--{e.field.replace('_', '-')} {e.reason}") from None
        raise


_golden_option = click.option(
    "--golden", "golden_dir", type=click.Path(path_type=Path), default=None,
    help="The folder of golden files (default: the one installed with qwen38gen).")


@cli.command("golden")
@click.option("--update", is_flag=True, help="Regenerate with the batch-1 program on the GPU.")
@click.option("--candidate", type=click.Path(path_type=Path), default=None,
              help="With --update: also write the new runs here, even if they fail validation.")
@_golden_option
def golden_cmd(update, candidate, golden_dir):
    """Show, validate (CPU) or regenerate (GPU) the golden single-sequence runs."""
    from qwen38gen.verify import golden as G
    from qwen38gen.verify.check import update_golden, validate_golden

    cols = ("seq", "prompt", "steps", "max |Δlogit| / σ", "argmax", "status")
    if candidate is not None and not update:
        raise UserError("--candidate is where --update also writes its new runs; give --update "
                        "with it")
    if update:
        res, path = update_golden(candidate=candidate, folder=golden_dir)
        _outcome_table("golden vs numpy reference", cols, res)
        if path is None:
            err.print("the batch-1 program disagrees with the reference; golden file NOT written")
            sys.exit(1)
        out.print(f"wrote {path}")
        return
    g = G.load_golden(folder=golden_dir)
    res = validate_golden(g)
    _outcome_table(f"golden {G.golden_path(folder=golden_dir)} vs numpy reference (CPU)", cols,
                   res)
    sys.exit(0 if res.ok else 1)


def _outcome_table(title, cols, res):
    out.print(R.outcome_table(title, cols, res))
    for n in res.notes:
        out.print(n)


@cli.command()
@click.option("--model", default=None,
              help="Preset, config.json or model folder; only a model with golden runs (tiny) "
                   "[default: tiny].")
@_lanes_options
@_golden_option
@click.option("--reference", "ref_model", default=None, metavar="MODEL",
              help="Instead: the program of MODEL (a preset such as qwen3.5-0.8b) on synthetic "
                   "int4 weights, its greedy streams against the numpy reference teacher-forced "
                   "on them, with the golden comparison's tolerances (logits in units of their "
                   "standard deviation; GPU).")

@click.option("--serve", is_flag=True,
              help="The continuous-batching lock instead: 2B+1 requests (greedy and sampled) "
                   "through B slots, each against itself run alone; without a GPU on the "
                   "emulated schedule (numpy).")
def check(model, golden_dir, ref_model, serve, **lane_kw):
    """The equivalence lock: the batched program teacher-forced on the golden streams."""
    from qwen38gen.verify import golden as G
    from qwen38gen.verify.check import check_gpu, check_model, validate_golden
    from qwen38gen.config import PRESETS
    from qwen38gen.runtime import cuda_driver

    cfg = PRESETS[G.MODEL] if model is None else check_model(model, golden_dir)
    lanes = _make_lanes(**lane_kw, model=cfg)
    if ref_model is not None and serve:
        raise UserError("check: give --reference MODEL or --serve, not both")
    if ref_model is not None:
        if model is not None:
            raise UserError("check: give --model (a model with golden runs) or --reference MODEL "
                            "(a geometry checked against the numpy reference), not both")
        _check_reference(ref_model, lanes)
    try:
        cuda_driver()
        have_gpu = True
    except UserError as e:
        have_gpu, why = False, str(e)
    if serve:
        _check_serve(cfg, lanes, have_gpu, None if have_gpu else why)
    g = G.load_golden(cfg=cfg, folder=golden_dir)
    if not have_gpu:
        res = validate_golden(g)
        _outcome_table("golden vs numpy reference (CPU)",
                       ("seq", "prompt", "steps", "max |Δlogit| / σ", "argmax", "status"), res)
        from rich.markup import escape

        out.print(f"[yellow]GPU part NOT run[/yellow]: {escape(why)}. Only the golden files were "
                  "validated against the numpy reference.")
        sys.exit(0 if res.ok else 1)
    if lanes.mtp:
        from qwen38gen.verify.check import check_spec

        res = check_spec(lanes, g, cfg)
        _verdict(f"check {lanes.name}: speculative streams vs the golden greedy streams",
                 ("mode", "slot", "golden", "prompt", "tokens", "acceptance", "target passes",
                  "status"), res, "runs")
    res = check_gpu(lanes, g, cfg)
    _verdict(f"check {lanes.name}: {len(res.rows)} sequences vs golden + reference",
             ("slot", "golden", "prompt", "bitwise", "max |Δlogit| / σ", "argmax", "state err / tol",
              "status"), res, "sequences")


# A check that compared nothing (its GPU part could not run) neither passes nor fails.
EXIT_NOT_RUN = 3


def _check_reference(model: str, lanes) -> None:
    """`check --reference MODEL`: exits 0 (pass), 1 (fail) or EXIT_NOT_RUN (no GPU answered:
    nothing was compared)."""
    from rich.markup import escape

    from qwen38gen.verify.check import check_reference
    from qwen38gen.config import load_config
    from qwen38gen.lanes import check_model
    from qwen38gen.runtime import cuda_driver

    cfg = load_config(model)
    check_model(cfg)
    if lanes.mtp:
        raise UserError("check --reference runs the plain decode program; drop --mtp (the mtp "
                        "lock is `check --mtp K` on the golden streams)")
    try:
        cuda_driver()
    except UserError as e:
        out.print(f"[yellow]GPU part NOT run[/yellow]: {escape(str(e))}. Nothing was compared "
                  f"(exit code {EXIT_NOT_RUN}).")
        sys.exit(EXIT_NOT_RUN)
    res = check_reference(cfg, lanes)
    _verdict(f"check --reference {cfg.name} {lanes.name}: the program's greedy streams vs the "
             "numpy reference", ("slot", "prompt", "length", "same as first", "σ",
                                 "max |Δlogit| / σ", "argmax", "state err / tol", "status"),
             res, "sequences")


def _check_serve(cfg, lanes, have_gpu: bool, why: str | None):
    """check --serve: the continuous-batching lock on the GPU, else on the emulated schedule."""
    from qwen38gen.verify import serve_lock as SL

    if have_gpu:
        backends, where = SL.gpu_backends, "GPU"
    else:
        from rich.markup import escape

        out.print(f"[yellow]no GPU[/yellow] ({escape(why)})")
        out.print("The serve lock runs on the emu backend: the program's schedule in numpy, not "
                  "the CUDA kernels.")
        backends, where = SL.emu_backends, "emu"
    if lanes.mtp:
        plain = lanes.plain()
        res, _ = SL.spec_serve_lock(backends(cfg, plain), backends(cfg, lanes), lanes.batch,
                                    lanes.pt, cfg)
        out.print(f"lane {lanes.name}; {res.notes.pop()}")
        _verdict(f"speculative serve lock ({where}): batched --mtp {lanes.mtp} vs the plain "
                 "program alone (greedy) and vs alone on the mtp program (sampled)",
                 ("request", "prompt", "max_tokens", "mode", "tokens", "acceptance", "status"),
                 res, "requests")
    res, _ = SL.serve_lock(backends(cfg, lanes), lanes.batch, lanes.pt, cfg)
    out.print(f"lane {lanes.name}; {res.notes.pop()}")
    _verdict(f"serve lock ({where}): batched vs alone",
             ("request", "prompt", "max_tokens", "mode", "tokens", "status"), res, "requests")


def _verdict(title: str, columns: tuple, res, unit: str):
    """The outcome table, then PASS/FAIL with the count of ok rows; exit 0 or 1."""
    _outcome_table(title, columns, res)
    out.print(R.verdict_line(res, unit))
    sys.exit(0 if res.ok else 1)


# ---------------------------------------------------------------------------------------- bench
def _int_list(s: str, what: str) -> list[int]:
    try:
        v = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{what} {s!r} is not a comma-separated list of integers") from None
    if not v or min(v) < 1:
        raise UserError(f"{what} {s!r} needs positive integers, e.g. 1,16,64")
    return v


@cli.command()
@click.option("--model", default="qwen3.8-27b", show_default=True)
@click.option("--batch", "batches", default="1,2,4,8,16,32,64", show_default=True,
              help="Comma-separated batch sizes.")
@click.option("--ctx", type=int, default=1024, show_default=True, help="Cached tokens T.")
@click.option("--reps", type=int, default=30, show_default=True, help="Timed replays (≥ 20).")
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None)
@click.option("--plot", "plot_out", type=click.Path(path_type=Path), default=None,
              help="PNG of tok/s and the floor against B (with --serve: output tok/s, time to "
                   "first token and per output token against B).")
@click.option("--peers", is_flag=True, default=False,
              help="Also time torch's cuBLAS bf16 and int4 _weight_int4pack_mm over the step's "
                   "linear layers (needs torch with CUDA; runs after our own runs).")
@click.option("--mtp", type=int, default=0, is_flag=False, flag_value=1,
              help="Instead: the speculative step with K drafts (verify + drafter graph) against "
                   "the plain decode step, tok/s measured and implied at acceptance 0.5/0.7/0.9 "
                   "(--mtp alone: K = 1).")
@click.option("--trace", is_flag=True, default=False,
              help="Also replay each B's trace variant once (every block's start, wait and end "
                   "on %globaltimer) and print where the step's time goes launch by launch; "
                   "with --mtp K, the speculative step's (its verify phase) beside the plain "
                   "one's.")
@click.option("--serve", "serve", default=None, metavar="WORKLOAD",
              help="Instead: a seeded synthetic workload (short, long, realistic: serve/workload.py) "
                   "through run's engine on the GPU program at each B.")
@click.option("--prefill", "prefill", default=None, metavar="P,...",
              help="Instead: time to first token for B prompts of P tokens arriving together, "
                   "at each prefill chunk width of --pt (comma-separated), beside the flops and "
                   "weight-pass floors.")
@click.option("--requests", "n_requests", type=int, default=None,
              help="With --serve: the workload's first N requests.")
@click.option("--rate", type=float, default=0.0, show_default=True,
              help="With --serve: requests arrive as a Poisson process of this many per second "
                   "(0: all queued at once).")
@click.option("--pt", "pts", default="16", show_default=True,
              help="With --serve: the prefill chunk width; with --prefill: the widths to try, "
                   "comma-separated.")
@click.option("--btg", type=int, default=None,
              help="The GEMV batch tile at every B (capped at what B needs; default: from B, "
                   "as emit chooses it).")
@click.option("--schedule", type=click.Choice(["ride", "wait", "both"]), default="ride",
              show_default=True, help="With --serve: decoding slots ride in prefill chunks, wait "
                                      "behind them (the engine before version 25), or both.")
@_tune_options
def bench(model, batches, ctx, reps, json_out, plot_out, peers, mtp, trace, serve, prefill,
          n_requests, rate, pts, btg, schedule, tune, tune_file):
    """Time the decode step (graph replay) beside the floor and the copy bandwidth of this run."""
    from qwen38gen.perf import bench as Bm
    from qwen38gen.config import load_config
    from qwen38gen.outputs import check_outputs, write_text

    check_outputs({"--json": json_out, "--plot": plot_out},
                  {"--model": _model_path(model), "--tune-file": tune_file})
    cfg = load_config(model)
    bs = _int_list(batches, "--batch")
    if reps < 20:
        raise UserError(f"--reps {reps}: the median needs at least 20 timed replays")
    if ctx < 1:
        raise UserError(f"--ctx {ctx} must be ≥ 1")
    tuning = _tuning(tune, tune_file)
    pt = _int_list(pts, "--pt")
    if btg is not None and btg not in SUPPORTED["btg"]:
        raise UserError(f"--btg {btg} is not a supported batch tile; give one of "
                        f"{', '.join(map(str, SUPPORTED['btg']))}")
    if serve and prefill:
        raise UserError("--serve and --prefill are two benchmarks: give one")
    if serve:
        if len(pt) != 1:
            raise UserError(f"--pt {pts!r}: --serve runs one prefill chunk width")
        _bench_serve(cfg, bs, serve, n_requests, pt[0], schedule, json_out, rate, mtp, plot_out,
                     tuning, btg)
        return
    if prefill:
        _bench_prefill(cfg, bs, _int_list(prefill, "--prefill"), pt, json_out, tuning, btg)
        return
    if mtp:
        _bench_mtp(cfg, bs, ctx, reps, mtp, json_out, tuning, btg, trace)
        return
    with err.status("bench") as st:
        bw, rows = Bm.bench(cfg, bs, ctx, reps=reps, progress=lambda m: st.update(m),
                            trace=trace, tuning=tuning, btg=btg)
    from qwen38gen import launch

    pdl = "on" if launch.enabled() else "off (QWEN38_PDL=0)"
    for t in R.bench_tables(cfg, ctx, bw, rows, pdl):
        out.print(t)
    if trace:
        for t in R.trace_tables(rows):
            out.print(t)
    pr = _bench_peers(cfg, bs, bw, reps, rows) if peers else None

    dev = _device_name()
    if json_out:
        d = Bm.to_json(cfg, ctx, bw, rows, dev)
        d["pdl"] = launch.enabled()
        if pr is not None:
            d["peers"] = pr
        write_text(json_out, json.dumps(d, indent=1) + "\n", name="--json")
    if plot_out:
        Bm.plot(plot_out, cfg, ctx, bw, rows)


def _device_name() -> str:
    """The GPU's name as nvidia-smi gives it (the bench json's "device")."""
    import subprocess

    return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.strip()


def _bench_serve(cfg, bs, name, n, pt, schedule, json_out, rate, mtp, plot_out, tuning, btg):
    """`bench --serve WORKLOAD [--mtp K] [--rate R]`: the serving table (perf/serve_bench.py)."""
    from qwen38gen.lanes import Lanes
    from qwen38gen.outputs import write_text
    from qwen38gen.perf import serve_bench as Sb
    from qwen38gen.serve.workload import arrival_times, requests, workload

    w = workload(name)
    requests(w, cfg.vocab_size, 0, n)            # a bad --requests fails here, before the GPU
    arrival_times(1, rate)                       # a bad --rate
    Lanes.make(max(bs), pt=pt, mtp=mtp, tuning=tuning)   # a bad --pt or --mtp
    if mtp and schedule != "ride":
        raise UserError("--schedule goes with the plain program; under --mtp prefill chunks "
                        "and verify steps alternate")
    def row(r):   # a line per B: a run cut short keeps what it printed
        err.print(f"serve {w.name}: B={r.batch} {r.schedule}: {r.tok_s:,.0f} output tok/s, "
                  f"{r.steps} steps, {r.ms_per_step:.3f} ms/step, TTFT p50 {r.ttft_p50_ms:,.0f} ms",
                  markup=False)
        if r.phase_ms:   # where the step goes: the GPU's phases timed alone, the rest the host's
            ph = ", ".join(f"{k} {r.phase_runs[k]}×{v:.3f}" for k, v in r.phase_ms.items())
            err.print(f"  GPU {r.gpu_ms_per_step:.3f} ms/step ({ph} ms)", markup=False)

    rows = []
    with err.status("bench --serve") as st:
        for ride in {"ride": (True,), "wait": (False,), "both": (False, True)}[schedule]:
            rows += Sb.serve_bench(cfg, bs, w, pt, n, ride=ride, progress=lambda m: st.update(m),
                                   rate=rate, mtp=mtp, on_row=row, tuning=tuning, btg=btg)
    out.print(R.serve_table(cfg, w.describe(), rows))
    if mtp:
        out.print(R.serve_mtp_table(rows, Sb.ALPHAS))
    if plot_out:
        Sb.plot(plot_out, cfg, w, rows)
    if json_out:
        dev = _device_name()
        write_text(json_out, json.dumps(Sb.to_json(cfg, w, rows, dev), indent=1) + "\n",
                   name="--json")


def _bench_prefill(cfg, bs, prompts, pts, json_out, tuning, btg):
    """`bench --prefill P,...`: time to first token (perf/prefill_bench.py)."""
    from qwen38gen.lanes import Lanes
    from qwen38gen.outputs import write_text
    from qwen38gen.perf import prefill_bench as Pb

    for pt in pts:
        Lanes.make(max(bs), pt=pt)               # a bad --pt fails here, before the GPU
    if max(prompts) + 1 > cfg.max_position_embeddings:
        raise UserError(f"--prefill {max(prompts)}: {cfg.name!r} holds "
                        f"{cfg.max_position_embeddings} positions; give shorter prompts")
    def row(r):   # a line per measured row: a run cut short keeps what it printed
        err.print(f"prefill: {r.prompt} tokens, B={r.batch}, pt={r.pt}: TTFT {r.ttft_ms:,.1f} ms "
                  f"({r.tok_s:,.0f} prompt tok/s, {r.tflops:.0f} TFLOP/s)", markup=False)

    with err.status("bench --prefill") as st:
        bw, rows = Pb.prefill_bench(cfg, bs, prompts, pts, progress=lambda m: st.update(m),
                                    tuning=tuning, on_row=row, btg=btg)
    out.print(R.prefill_table(cfg, bw, Pb.TENSOR_PEAK, rows))
    if json_out:
        dev = _device_name()
        write_text(json_out, json.dumps(Pb.to_json(cfg, bw, rows, dev), indent=1) + "\n",
                   name="--json")


def _bench_mtp(cfg, bs, ctx, reps, k, json_out, tuning, btg, trace=False):
    """`bench --mtp K`: table of the speculative step against the plain step (bench_mtp.py);
    --trace: each step's timeline by kind and by weight, the plain one and the speculative one."""
    from qwen38gen.perf import bench_mtp as Mm
    from qwen38gen.lanes import Lanes
    from qwen38gen.outputs import write_text

    Lanes.make(1, mtp=k)  # a bad K fails here, before any GPU work
    with err.status("bench --mtp") as st:
        rows = Mm.bench_mtp(cfg, bs, ctx, k=k, reps=reps, progress=lambda m: st.update(m),
                            tuning=tuning, btg=btg, trace=trace)
    out.print(R.bench_mtp_table(cfg, ctx, k, rows, Mm.ALPHAS))
    out.print("spec tok/s = B · mean emitted per step / spec step (synthetic weights: acceptance "
              f"≈ 0); implied = B · (1 + α + … + α^{k}) / spec step.")
    if trace:
        for t in R.trace_tables(R.mtp_trace_rows(rows)):
            out.print(t)
    if json_out:
        dev = _device_name()
        write_text(json_out, json.dumps(Mm.to_json(cfg, ctx, rows, dev), indent=1) + "\n",
                   name="--json")


def _bench_peers(cfg, bs, bw, reps, rows) -> dict:
    """`bench --peers`: time torch's peers after our runs, print their table; the JSON object."""
    from qwen38gen.perf import peers as Pm

    from qwen38gen.perf import peers_gdn as Pg

    with err.status("peers") as st:
        pr = Pm.run(cfg, bs, bw, reps=reps, progress=lambda m: st.update(m))
        if pr["available"]:
            pr["delta_rule"] = Pg.run(cfg, bs, reps=reps, progress=lambda m: st.update(m))
    if pr["available"]:
        out.print(R.peers_table(pr, bs, rows, Pm.PEERS, Pm.SHORT))
    for line in Pm.summary(pr) + (Pg.lines(pr["delta_rule"], rows) if pr["available"] else []):
        out.print(line, markup=False)
    return pr


# ---------------------------------------------------------------------------------------- perf
@cli.command("perf")
@click.option("--model", default="qwen3.8-27b", show_default=True, help="Preset or config.json.")
@click.option("--batch", "batches", default="1,16,64", show_default=True,
              help="Comma-separated batch sizes.")
@click.option("--ctx", type=int, default=1024, show_default=True, help="Cached tokens T.")
@click.option("--design", default="both", show_default=True,
              help="today (the emitted program), persistent (item 2, docs/TIMING_MODEL.md) or both.")
@click.option("--measured", "measured_file", type=click.Path(path_type=Path), default=None,
              help="A `bench --json` file whose step times to print beside the predictions.")
@click.option("--calibration", "calibration_file", type=click.Path(path_type=Path),
              default=None, help="The `bench --json` file to calibrate on (default: the "
                                 "committed bench/2026-12-04-h200-v20.json).")
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None)
def perf_cmd(model, batches, ctx, design, measured_file, calibration_file, json_out):
    """The timing model of the decode step (qwen38gen/perf/perfmodel.py): its fit on the measured
    run, then predictions for today's program and the persistent step. Model, not measurement."""
    from qwen38gen.perf import perfmodel as P
    from qwen38gen.config import load_config
    from qwen38gen.outputs import check_outputs, write_text

    check_outputs({"--json": json_out},
                  {"--model": _model_path(model), "--measured": measured_file,
                   "--calibration": calibration_file})
    bs = P.parse_batches(batches)
    if design not in P.DESIGNS:
        raise UserError(f"--design {design!r} is unknown; choose one of {', '.join(P.DESIGNS)}")
    cfg = load_config(model)
    if calibration_file is None:
        from qwen38gen.resources import calibration_file as committed

        calibration_file = committed()   # packaged with the wheel; a UserError if missing
    fit = P.calibrate(P.load_measured(calibration_file))
    meas = P.load_measured(measured_file) if measured_file else None
    preds = P.predict(cfg, bs, ctx, fit, design, meas)
    for part in R.perf_tables(cfg, ctx, fit, preds):
        out.print(part)
    if json_out:
        d = {"model": cfg.name, "ctx": ctx, "design": design, "prediction_unit": "s",
             "fit": fit.to_json(),
             "predictions": [p.to_json() for p in preds]}
        write_text(json_out, json.dumps(d, indent=1) + "\n", name="--json")


class _ClosedStdout:
    """sys.stdout when file descriptor 1 was closed before the start (Python gives None): a
    command that writes nothing there still runs; one that does stops with a one-line error."""

    def write(self, text):
        raise OSError(errno.EBADF, "standard output is closed")

    def flush(self):
        pass

    def isatty(self):
        return False


def _say(line: str) -> None:
    """One line on stderr, even where stderr is closed or broken (then nothing)."""
    try:
        err.print(line, markup=False)
    except (OSError, ValueError):
        pass


def _drop_stdout() -> None:
    """After a failed write to stdout: point it at /dev/null, so that Python's last flush at
    exit finds nothing to fail on (no 'Exception ignored' after our one line)."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError, AttributeError):
        pass


def _os_error_line(e: OSError) -> str:
    what = e.strerror or str(e)
    if e.filename is not None:
        return f"error: {str(e.filename)!r}: {what}"
    return f"error: cannot write to standard output: {what}"


def _interrupted_line(e) -> str:
    from qwen38gen.outputs import written

    done = written()
    if not done:
        return f"interrupted by {e.name}; nothing was written"
    return (f"interrupted by {e.name} after {', '.join(repr(p) for p in done)} "
            f"{'was' if len(done) == 1 else 'were'} written completely")


def _negative_value(token: str, argv) -> str | None:
    """`--mtp -1`: click reads the -1 of an option whose value is optional as an option of its
    own ("No such option '-1'"); say which option got a negative number instead."""
    import re

    if not re.fullmatch(r"-[0-9.]+", token or ""):
        return None
    args = list(sys.argv[1:] if argv is None else argv)
    for i, a in enumerate(args):
        opt = a.split("=", 1)[0] if a.endswith("=" + token) else (
            args[i - 1] if a == token and i > 0 else None)
        if opt is not None and opt.startswith("--"):
            return (f"{opt} {token}: a negative value is not accepted; see `qwen38gen "
                    f"{args[0] if args and not args[0].startswith('-') else 'COMMAND'} -h`")
    return None


def _run(argv):
    """The command's exit code; every failure a user can meet is one line on stderr: a
    UserError, a usage error, an OSError (a full disk, a closed or broken stdout, an unreadable
    file) or a signal (interrupt.py)."""
    from qwen38gen.interrupt import Interrupted
    from qwen38gen.errors import NonFiniteLogits

    stdout = sys.stdout
    try:
        try:
            rv = cli.main(args=argv, prog_name="qwen38gen", standalone_mode=False)
            code = rv if isinstance(rv, int) else 0
        except SystemExit as e:
            code = e.code
            if sys.stdout is not stdout and code == 1:
                # click's answer to EPIPE on stdout: wrap the streams, exit 1 with nothing said
                raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE)) from None
        sys.stdout.flush()   # a full disk or a closed pipe on stdout shows here, not at exit
        return code
    except UserError as e:
        _say(f"error: {e}")
        return 2
    except NonFiniteLogits as e:   # the program is broken, not the user's input: a lock's 1
        _say(f"error: the program computed {e}; nothing of the run was written")
        return 1
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.NoSuchOption as e:
        _say(f"error: {_negative_value(e.option_name, argv) or e.format_message()}")
        return 2
    except click.UsageError as e:
        _say(f"error: {e.format_message()}")
        return 2
    except Interrupted as e:
        _say(_interrupted_line(e))
        return e.exit_code
    except click.Abort:
        _say("aborted")
        return 130
    except KeyboardInterrupt:
        return 130
    except OSError as e:   # BrokenPipeError and ENOSPC on stdout included
        _drop_stdout()
        _say(_os_error_line(e))
        return 2


def main(argv=None):
    from qwen38gen import interrupt
    from qwen38gen.outputs import forget_written

    if sys.stdout is None:
        sys.stdout = _ClosedStdout()
    forget_written()
    try:
        with interrupt.handling():
            code = _run(argv)
    except interrupt.Interrupted as e:   # a signal between the command's end and here
        code = e.exit_code
    sys.exit(code)


if __name__ == "__main__":
    main()
