"""qwen38gen command line: parse options, call the package, print with rich, set the exit code.

Exit codes: 0 ok; 1 a check or the gate failed; 2 a user's mistake (one line, no traceback).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

# The numpy reference multiplies small matrices: one BLAS thread is fastest, and several processes
# (the reference runs of `check`) must not oversubscribe the cores. Set before numpy loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import click
from rich.console import Console
from rich.table import Table

from qwen38gen import __version__
from qwen38gen import report as R
from qwen38gen.errors import UserError
from qwen38gen.lanes import DEFAULT_ARCH

# Piped or logged output (no terminal to size it by) gets 200 columns rather than rich's 80, so
# that the bench and gate tables keep every digit in a log; a terminal keeps its own width.
out = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
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
              help="Copy bandwidth in bytes/s for the floor (PERF.md's H200 figure).")
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
    parts = [t.strip() for t in s.split(",")]
    if any(not t.lstrip("-").isdigit() for t in parts if t) or any(" " in t for t in parts):
        raise UserError(f"{opt} {s!r} is not a comma-separated list of token ids "
                        "(e.g. 1,2,3)")
    ids = [int(t) for t in parts if t]
    if not ids:
        raise UserError(f"{opt} is empty; give at least one token id, e.g. {opt} 1,2,3")
    return ids


def _memory_available() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _check_reference_fits(cfg, what: str) -> None:
    """The CPU reference holds every text tensor in fp32 (plus the bf16 or int4 source while it
    converts): refuse before building anything a model whose weights will not fit in memory."""
    need = cfg.text_params * 6 + cfg.mtp_params * 6
    have = _memory_available()
    if have is not None and need > have:
        raise UserError(f"{what} of {cfg.name!r} would need about {need / 1e9:.0f} GB of memory "
                        f"for the CPU reference ({cfg.text_params / 1e9:.1f} B parameters in fp32 plus "
                        f"their source); {have / 1e9:.0f} GB is available. Use a smaller model "
                        "(e.g. --model tiny, or `qwen38gen info --list`)")


@cli.command()
@click.option("--model", default=None,
              help="Preset, config.json or model folder [default: the --weights folder's "
                   "config.json, else tiny].")
@click.option("--weights", "weights_dir", type=click.Path(path_type=Path), default=None,
              help="A checkpoint folder (HF safetensors or `quantize` output); its config.json "
                   "is the model unless --model says otherwise; default: seeded synthetic weights.")
@click.option("--seed", default=0, show_default=True, help="Seed of the synthetic weights (≥ 0).")
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
    from qwen38gen.reference import Reference
    from qwen38gen.weights import synthetic_weights

    if seed < 0:
        raise UserError(f"--seed {seed} must be ≥ 0")
    if steps < 0:
        raise UserError(f"--steps {steps} must be ≥ 0")
    cfg, weights_dir, tok, tok_dir = _model_weights_tokenizer(model, weights_dir)
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
        else:
            msgs = [{"role": "user", "content": p}]
            text = tok.render_chat(msgs, enable_thinking=think) if chat else p
            ids.append(tok.encode(text))
    if not ids:
        ids = [[1, 2, 3, 4, 5]]
    for p in ids:
        bad = [t for t in p if not 0 <= t < cfg.vocab_size]
        if bad:
            raise UserError(f"token id {bad[0]} is outside the vocabulary 0..{cfg.vocab_size - 1}")
    _check_reference_fits(cfg, "generate")
    if weights_dir is not None:
        tensors = load_any(weights_dir, cfg)
    else:
        tensors = synthetic_weights(cfg, seed)
        if use_int4:
            tensors = int4_weights(cfg, tensors)
    ref = Reference(cfg, tensors, dtype=np.float32)
    from qwen38gen.serve import eos_ids

    gen = ref.generate(ids, steps, stop=() if ignore_eos else eos_ids(cfg, tok))
    t = Table(title=f"reference greedy generation, {cfg.name}, up to {steps} steps")
    t.add_column("seq", justify="right")
    t.add_column("prompt")
    t.add_column("generated")
    for i, (p, g) in enumerate(zip(ids, gen)):
        t.add_row(str(i), ",".join(map(str, p)), ",".join(map(str, g)))
    out.print(t)
    if tok is not None:
        for i, g in enumerate(gen):
            out.print(f"[{i}] {tok.decode(g)}", markup=False)


# ---------------------------------------------------------------------------------------- lanes
@cli.command("lanes")
def lanes_cmd():
    """The supported set of lane choices, model dimensions and tuning settings."""
    from qwen38gen.lanes import supported_table
    from qwen38gen.tuning import ROLES, tuning_table

    t = Table(title="supported lanes")
    t.add_column("field")
    t.add_column("supported")
    for k, v in supported_table():
        t.add_row(k, v)
    out.print(t)
    t = Table(title="tuning (--tune KEY=VALUE; a non-default value is part of the lane name)")
    for c in ("key", "supported", "default", "what"):
        t.add_column(c)
    for row in tuning_table():
        t.add_row(*row)
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


# ----------------------------------------------------------------------------------------- emit
@cli.command()
@click.option("--batch", type=int, required=True, help="B: sequences per step.")
@click.option("--btg", type=int, default=None, help="Batch tile of the GEMV (default from B).")
@click.option("--pt", type=int, default=None,
              help="Prefill chunk width (default: $QWEN38_PT, else 16).")
@click.option("--mtp", type=int, default=0, show_default=True, is_flag=False, flag_value=1,
              help="MTP draft tokens per verify pass, 1..4 (0: off; --mtp alone: 1): the "
                   "speculative-decoding program (verify, accept, MTP drafter).")
@click.option("--arch", default=DEFAULT_ARCH, show_default=True)
@click.option("--lm-head", default="int4", show_default=True, help="lm_head precision.")
@click.option("--model", default="tiny", show_default=True,
              help="Preset, config.json or checkpoint folder (its config.json is the geometry).")
@click.option("-o", "--output", type=click.Path(path_type=Path), default=None,
              help="The .cu to write (default: the lane's name in the current folder).")
@click.option("--stdout", "to_stdout", is_flag=True, help="Print the program instead.")
@_tune_options
def emit(batch, btg, pt, mtp, arch, lm_head, model, output, to_stdout, tune, tune_file):
    """Write the self-contained .cu decode program and its launch manifest."""
    from qwen38gen.config import resolve_model
    from qwen38gen.emit import emit_program, write_program
    from qwen38gen.lanes import Lanes

    cfg = resolve_model(model).config
    lanes = Lanes.make(batch, btg=btg, pt=pt, mtp=mtp, arch=arch, lm_head=lm_head,
                       tuning=_tuning(tune, tune_file))
    prog = emit_program(cfg, lanes)
    if to_stdout:
        sys.stdout.write(prog.source)
        return
    cu, man = write_program(prog, output)
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
        t = Table(title="gate matrix")
        for c in ("lane", "kernels", "max regs", "spills", "stack", "cached", "status"):
            t.add_column(c)
        for name, res, problem in results:
            if res is None:
                failed = True
                t.add_row(name, "-", "-", "-", "-", "-", f"[red]{problem}[/red]")
                continue
            bad = res.problems
            failed |= bool(bad)
            t.add_row(name, str(len(res.kernels)), str(max(k.registers for k in res.kernels)),
                      str(sum(k.spill_stores + k.spill_loads for k in res.kernels)),
                      str(sum(k.stack for k in res.kernels)), "yes" if res.cached else "no",
                      "[red]" + "; ".join(bad) + "[/red]" if bad else "[green]pass[/green]")
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
def _lanes_options(f):
    for opt in reversed([
        click.option("--batch", type=int, default=16, show_default=True, help="B."),
        click.option("--btg", type=int, default=None, help="Batch tile (default from B)."),
        click.option("--pt", type=int, default=None, help="Prefill chunk ($QWEN38_PT, else 16)."),
        click.option("--mtp", type=int, default=0, show_default=True, is_flag=False,
                     flag_value=1, help="MTP draft tokens (run, check: speculative decoding)."),
        click.option("--arch", default=DEFAULT_ARCH, show_default=True),
        click.option("--lm-head", default="int4", show_default=True),
    ]):
        f = opt(f)
    return _tune_options(f)


def _make_lanes(batch, btg, pt, mtp, arch, lm_head, tune=(), tune_file=None):
    from qwen38gen.lanes import Lanes

    return Lanes.make(batch, btg=btg, pt=pt, mtp=mtp, arch=arch, lm_head=lm_head,
                      tuning=_tuning(tune, tune_file))


@cli.command()
@click.option("--model", default=None,
              help="Preset, config.json or checkpoint folder (its weights and tokenizer) "
                   "[default: the --weights folder's config.json, else tiny].")
@click.option("--weights", "weights_dir", type=click.Path(path_type=Path), default=None,
              help="Checkpoint folder (HF or `quantize` output); default: the --model folder's "
                   "weights, else synthetic, seeded.")
@click.option("--seed", default=0, show_default=True, help="Seed of the synthetic weights.")
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

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from qwen38gen import serve as S
    from qwen38gen.emit import atomic_write

    cfg, weights_dir, tok, _ = _model_weights_tokenizer(model, weights_dir)
    lanes = _make_lanes(**lane_kw)
    reqs = _run_requests(prompts_file, prompt_texts, cfg, tok, sampling_seed, chat=chat,
                         think=think, max_tokens=max_tokens, temperature=temperature, top_k=top_k,
                         top_p=top_p, min_p=min_p, ignore_eos=ignore_eos or None)
    ctx = S.default_ctx(reqs) if ctx is None else ctx
    S.check_requests(reqs, cfg, ctx, lanes.mtp)
    if backend == "reference" and lanes.mtp:
        raise UserError("--mtp runs the emitted mtp program: use --backend gpu or emu (the "
                        "reference backend computes the plain model)")
    tensors = S.float_tensors(cfg, weights_dir, seed, mtp=bool(lanes.mtp))
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
    with be_ctx as be:
        eng = S.make_engine(be, S.eos_ids(cfg, tok))
        sink = S.LineSink(output, sys.stdout)
        try:
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                          TextColumn("{task.fields[toks]} tokens"), console=err,
                          transient=True, disable=not err.is_terminal) as prog:
                task = prog.add_task(f"run ({backend})", total=len(reqs), toks=0)

                def done(res):
                    sink.write(S.record(res, tok))
                    prog.update(task, advance=1, toks=eng.stats.output_tokens)

                t0 = time.perf_counter()
                eng.run(reqs, on_finish=done)   # checks every request before the first step
                seconds = time.perf_counter() - t0
        except BaseException:
            sink.discard()
            raise
        sink.commit()
    d = S.summary(eng.stats, seconds, cfg, backend, lanes.name)
    err.print(S.summary_line(d), markup=False)
    if json_out:
        atomic_write(Path(json_out), json.dumps(d, indent=1) + "\n")


def _model_weights_tokenizer(model, weights_dir):
    """generate's and run's model: (config, the weights folder or None, the tokenizer or None,
    the folder it was looked for in or None). --model DIR with weights is the weights unless
    --weights says otherwise; --weights alone takes its folder's config.json; both must be the
    same geometry."""
    from qwen38gen.config import DEFAULT_PRESET, load_config, resolve_model

    if weights_dir is not None and not (weights_dir / "config.json").is_file():
        raise UserError(f"--weights {str(weights_dir)!r} is not a checkpoint folder with a "
                        "config.json")
    resolved = resolve_model(model if model is not None else (weights_dir or DEFAULT_PRESET))
    cfg = resolved.config
    if weights_dir is None and resolved.has_weights:
        weights_dir = resolved.model_dir
    elif weights_dir is not None and model is not None:
        own = load_config(weights_dir)
        if own.hash != cfg.hash:
            raise UserError(f"--model {model!r} (config {cfg.hash}) is not the geometry of "
                            f"--weights {str(weights_dir)!r} (config {own.hash}); leave --model "
                            "out to use the folder's config.json")
    from qwen38gen.tokenizer import load_tokenizer

    tok = None
    for d in (weights_dir, resolved.model_dir):   # the weights' own tokenizer first
        if d is not None and tok is None:
            tok = load_tokenizer(d)
    return cfg, weights_dir, tok, weights_dir or resolved.model_dir


_PROMPT_ONLY = ("chat", "think", "max_tokens", "temperature", "top_k", "top_p", "min_p",
                "ignore_eos")


def _run_requests(prompts_file, texts, cfg, tok, sampling_seed, **opts):
    """The requests of `run`: the --prompts file's lines, or one per --prompt with the
    command line's parameters (which a file's lines set for themselves)."""
    from qwen38gen.requests import prompt_requests, read_requests

    given = [k for k in _PROMPT_ONLY if opts[k]]   # flags False, options None when not given
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
    except UserError as e:   # "--prompt number 1: top_k -3 is ...": name the option instead
        msg = str(e)
        for k in params:
            head = f"--prompt number 1: {k} "
            if msg.startswith(head):
                raise UserError(f"--{k.replace('_', '-')} {msg[len(head):]}") from None
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
    from qwen38gen import golden as G
    from qwen38gen.check import update_golden, validate_golden

    cols = ("seq", "prompt", "steps", "max |Δlogit|", "argmax", "status")
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
    t = Table(title=title)
    for c in cols:
        t.add_column(c)
    for r in res.rows:
        t.add_row(*r)
    out.print(t)
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
    from qwen38gen import golden as G
    from qwen38gen.check import check_gpu, check_model, validate_golden
    from qwen38gen.config import PRESETS
    from qwen38gen.runtime import _drv

    cfg = PRESETS[G.MODEL] if model is None else check_model(model, golden_dir)
    lanes = _make_lanes(**lane_kw)
    if ref_model is not None and serve:
        raise UserError("check: give --reference MODEL or --serve, not both")
    if ref_model is not None:
        if model is not None:
            raise UserError("check: give --model (a model with golden runs) or --reference MODEL "
                            "(a geometry checked against the numpy reference), not both")
        _check_reference(ref_model, lanes)
    try:
        _drv()
        have_gpu = True
    except UserError as e:
        have_gpu, why = False, str(e)
    if serve:
        _check_serve(cfg, lanes, have_gpu, None if have_gpu else why)
    g = G.load_golden(cfg=cfg, folder=golden_dir)
    if not have_gpu:
        res = validate_golden(g)
        _outcome_table("golden vs numpy reference (CPU)",
                       ("seq", "prompt", "steps", "max |Δlogit|", "argmax", "status"), res)
        from rich.markup import escape

        out.print(f"[yellow]GPU part NOT run[/yellow]: {escape(why)}. Only the golden files were "
                  "validated against the numpy reference.")
        sys.exit(0 if res.ok else 1)
    if lanes.mtp:
        from qwen38gen.check import check_spec

        res = check_spec(lanes, g, cfg)
        _verdict(f"check {lanes.name}: speculative streams vs the golden greedy streams",
                 ("mode", "slot", "golden", "prompt", "tokens", "acceptance", "target passes",
                  "status"), res, "runs")
    res = check_gpu(lanes, g, cfg)
    _verdict(f"check {lanes.name}: {len(res.rows)} sequences vs golden + reference",
             ("slot", "golden", "prompt", "bitwise", "max |Δlogit|", "argmax", "state err",
              "status"), res, "sequences")


def _check_reference(model: str, lanes) -> None:
    """`check --reference MODEL`: exits 0 or 1 (0 with a note where no GPU answers)."""
    from rich.markup import escape

    from qwen38gen.check import check_reference
    from qwen38gen.config import load_config
    from qwen38gen.lanes import check_model
    from qwen38gen.runtime import _drv

    cfg = load_config(model)
    check_model(cfg)
    if lanes.mtp:
        raise UserError("check --reference runs the plain decode program; drop --mtp (the mtp "
                        "lock is `check --mtp K` on the golden streams)")
    try:
        _drv()
    except UserError as e:
        out.print(f"[yellow]GPU part NOT run[/yellow]: {escape(str(e))}. Nothing was compared.")
        sys.exit(0)
    res = check_reference(cfg, lanes)
    _verdict(f"check --reference {cfg.name} {lanes.name}: the program's greedy streams vs the "
             "numpy reference", ("slot", "prompt", "length", "same as first", "σ",
                                 "max |Δlogit| / σ", "argmax", "state err", "status"),
             res, "sequences")


def _check_serve(cfg, lanes, have_gpu: bool, why: str | None):
    """check --serve: the continuous-batching lock on the GPU, else on the emulated schedule."""
    from qwen38gen import serve_lock as SL

    if have_gpu:
        backends, where = SL.gpu_backends, "GPU"
    else:
        from rich.markup import escape

        out.print(f"[yellow]no GPU[/yellow] ({escape(why)})")
        out.print("The serve lock runs on the emu backend: the program's schedule in numpy, not "
                  "the CUDA kernels.")
        backends, where = SL.emu_backends, "emu"
    if lanes.mtp:
        import dataclasses

        plain = dataclasses.replace(lanes, mtp=0)
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
    n_ok = sum(r[-1] == "ok" for r in res.rows)
    out.print(f"{'[green]PASS' if res.ok else '[red]FAIL'}[/] {n_ok}/{len(res.rows)} {unit}")
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
              help="PNG of tok/s and the floor against B.")
@click.option("--peers", is_flag=True, default=False,
              help="Also time torch's cuBLAS bf16 and int4 _weight_int4pack_mm over the step's "
                   "linear layers (needs torch with CUDA; runs after our own runs).")
@click.option("--mtp", type=int, default=0, is_flag=False, flag_value=1,
              help="Instead: the speculative step with K drafts (verify + drafter graph) against "
                   "the plain decode step, tok/s measured and implied at acceptance 0.5/0.7/0.9 "
                   "(--mtp alone: K = 1).")
@click.option("--trace", is_flag=True, default=False,
              help="Also replay each B's trace variant once (every block's start, wait and end "
                   "on %globaltimer) and print where the step's time goes launch by launch.")
@_tune_options
def bench(model, batches, ctx, reps, json_out, plot_out, peers, mtp, trace, tune, tune_file):
    """Time the decode step (graph replay) beside the floor and the copy bandwidth of this run."""
    from qwen38gen import bench as Bm
    from qwen38gen.config import load_config
    from qwen38gen.emit import atomic_write

    cfg = load_config(model)
    bs = _int_list(batches, "--batch")
    if reps < 20:
        raise UserError(f"--reps {reps}: the median needs at least 20 timed replays")
    if ctx < 1:
        raise UserError(f"--ctx {ctx} must be ≥ 1")
    tuning = _tuning(tune, tune_file)
    if mtp:
        _bench_mtp(cfg, bs, ctx, reps, mtp, json_out, tuning)
        return
    with err.status("bench") as st:
        bw, rows = Bm.bench(cfg, bs, ctx, reps=reps, progress=lambda m: st.update(m),
                            trace=trace, tuning=tuning)
    from qwen38gen import launch

    pdl = "on" if launch.enabled() else "off (QWEN38_PDL=0)"
    for t in R.bench_tables(cfg, ctx, bw, rows, pdl):
        out.print(t)
    if trace:
        for t in R.trace_tables(rows):
            out.print(t)
    pr = _bench_peers(cfg, bs, bw, reps, rows) if peers else None
    import subprocess

    dev = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    if json_out:
        d = Bm.to_json(cfg, ctx, bw, rows, dev)
        d["pdl"] = launch.enabled()
        if pr is not None:
            d["peers"] = pr
        atomic_write(Path(json_out), json.dumps(d, indent=1) + "\n")
    if plot_out:
        Bm.plot(plot_out, cfg, ctx, bw, rows)


def _bench_mtp(cfg, bs, ctx, reps, k, json_out, tuning):
    """`bench --mtp K`: table of the speculative step against the plain step (bench_mtp.py)."""
    import subprocess

    from qwen38gen import bench_mtp as Mm
    from qwen38gen.emit import atomic_write
    from qwen38gen.lanes import Lanes

    Lanes.make(1, mtp=k)  # a bad K fails here, before any GPU work
    with err.status("bench --mtp") as st:
        rows = Mm.bench_mtp(cfg, bs, ctx, k=k, reps=reps, progress=lambda m: st.update(m),
                            tuning=tuning)
    t = Table(title=f"{cfg.name}: speculative step (mtp={k}: verify {k + 1} rows + accept + MTP "
                    f"drafter) vs plain decode step, T = {ctx}")
    for c in ("B", "plain ms", "spec ms", "spec/plain", "emitted/step", "plain tok/s",
              "spec tok/s", *(f"tok/s @α={a}" for a in Mm.ALPHAS)):
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(str(r.batch), f"{r.plain_ms:.3f}", f"{r.spec_ms:.3f}", f"{r.ratio:.2f}",
                  f"{r.emitted:.2f}", f"{r.plain_tok_s:,.0f}", f"{r.spec_tok_s:,.0f}",
                  *(f"{r.implied_tok_s[a]:,.0f}" for a in Mm.ALPHAS))
    out.print(t)
    out.print("spec tok/s = B · mean emitted per step / spec step (synthetic weights: acceptance "
              f"≈ 0); implied = B · (1 + α + … + α^{k}) / spec step.")
    if json_out:
        dev = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True).stdout.strip()
        atomic_write(Path(json_out), json.dumps(Mm.to_json(cfg, ctx, rows, dev), indent=1) + "\n")


def _bench_peers(cfg, bs, bw, reps, rows) -> dict:
    """`bench --peers`: time torch's peers after our runs, print their table; the JSON object."""
    from qwen38gen import peers as Pm

    with err.status("peers") as st:
        pr = Pm.run(cfg, bs, bw, reps=reps, progress=lambda m: st.update(m))
    if pr["available"]:
        ours = {r.batch: r.step_ms for r in rows}
        t = Table(title=f"peers: the {pr['layers']} linear layers of one step only "
                        f"({pr['params'] / 1e9:.3f} B params), graph replay, {pr['device']}, "
                        f"{pr['torch']}")
        for c in ("B", "our whole step ms", *(f"{Pm.SHORT[k]} ms (× int4 floor)" for k in Pm.PEERS),
                  "int4 W floor ms", "bf16 W floor ms"):
            t.add_column(c, justify="right")
        for B in bs:
            cells = []
            for k in Pm.PEERS:
                p = pr["peers"][k]
                ms = next((r["ms"] for r in p["rows"] if r["batch"] == B), None)
                cells.append("failed" if not p["ok"] else
                             f"{ms:.3f} ({ms / pr['int4_floor_ms']:.2f}×)")
            t.add_row(str(B), f"{ours[B]:.3f}" if B in ours else "", *cells,
                      f"{pr['int4_floor_ms']:.3f}", f"{pr['bf16_floor_ms']:.3f}")
        out.print(t)
    for line in Pm.summary(pr):
        out.print(line, markup=False)
    return pr


# ---------------------------------------------------------------------------------------- perf
@cli.command("perf")
@click.option("--model", default="qwen3.8-27b", show_default=True, help="Preset or config.json.")
@click.option("--batch", "batches", default="1,16,64", show_default=True,
              help="Comma-separated batch sizes.")
@click.option("--ctx", type=int, default=1024, show_default=True, help="Cached tokens T.")
@click.option("--design", default="both", show_default=True,
              help="today (the emitted program), persistent (issue 34 item 2) or both.")
@click.option("--measured", "measured_file", type=click.Path(path_type=Path), default=None,
              help="A `bench --json` file whose step times to print beside the predictions.")
@click.option("--calibration", "calibration_file", type=click.Path(path_type=Path),
              default=None, help="The `bench --json` file to calibrate on (default: the "
                                 "committed bench/2026-12-04-h200-v20.json).")
@click.option("--json", "json_out", type=click.Path(path_type=Path), default=None)
def perf_cmd(model, batches, ctx, design, measured_file, calibration_file, json_out):
    """The timing model of the decode step (qwen38gen/perfmodel.py): its fit on the measured
    run, then predictions for today's program and the persistent step. Model, not measurement."""
    from qwen38gen import perfmodel as P
    from qwen38gen.config import load_config
    from qwen38gen.emit import atomic_write

    bs = P.parse_batches(batches)
    if design not in P.DESIGNS:
        raise UserError(f"--design {design!r} is unknown; choose one of {', '.join(P.DESIGNS)}")
    cfg = load_config(model)
    if calibration_file is None and not P.DEFAULT_CALIBRATION.is_file():
        raise UserError(f"the committed calibration run {P.DEFAULT_CALIBRATION} is not here (an "
                        "installed package has no bench/); give --calibration F.json")
    fit = P.calibrate(P.load_measured(calibration_file or P.DEFAULT_CALIBRATION))
    meas = P.load_measured(measured_file) if measured_file else None
    preds = P.predict(cfg, bs, ctx, fit, design, meas)
    out.print(f"timing model against its calibration run ({fit.model}, T = {fit.ctx})")
    f = Table()
    for c in ("B", "measured ms", "model ms", "error", "used"):
        f.add_column(c, justify="right")
    for r in fit.rows:
        f.add_row(str(r["batch"]), f"{r['measured_ms']:.3f}", f"{r['predicted_ms']:.3f}",
                  f"{100 * r['error']:+.1f}%", "held out" if r["held_out"] else "calibration")
    out.print(f)
    out.print(f"calibrated on B = {', '.join(map(str, fit.calibration))}; max |error|: "
              f"calibration {100 * fit.max_error(False):.1f}%, held out "
              f"{100 * fit.max_error(True):.1f}%")
    t = Table(title=f"{cfg.name} decode step, T = {ctx}: model predictions (not measurements); "
                    f"floor at the calibration run's copy bandwidth "
                    f"{fit.params.R_copy / 1e12:.3f} TB/s")
    for c in ("B", "floor ms", "today ms", "today, item 1 ms", "measured ms",
              "persistent ms", "binds (share)", "persistent, item 1 ms", "no overlap ms"):
        t.add_column(c, justify="right")

    def ms(x, floor=None):
        pct = f" ({100 * floor / x:.0f}%)" if floor and x else ""
        return "-" if x is None else f"{x * 1e3:.3f}{pct}"

    for p in preds:
        per, i1 = p.persistent or {}, p.item1 or {}
        t.add_row(str(p.batch), ms(p.floor), ms(p.today, p.floor),
                  ms(i1.get("rate_and_overlap"), p.floor), ms(p.measured, p.floor),
                  ms(per.get("step"), p.floor),
                  " / ".join(f"{k} {100 * v:.0f}%" for k, v in
                             sorted(per["share"].items(), key=lambda kv: -kv[1])[:2])
                  if per else "-",
                  ms(per.get("step_item1"), p.floor), ms(per.get("serial"), p.floor))
    out.print(t)
    if json_out:
        d = {"model": cfg.name, "ctx": ctx, "design": design, "prediction_unit": "s",
             "fit": fit.to_json(),
             "predictions": [p.to_json() for p in preds]}
        atomic_write(Path(json_out), json.dumps(d, indent=1) + "\n")


def main(argv=None):
    try:
        rv = cli.main(args=argv, prog_name="qwen38gen", standalone_mode=False)
        sys.exit(rv if isinstance(rv, int) else 0)
    except UserError as e:
        err.print(f"error: {e}", markup=False)
        sys.exit(2)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except click.UsageError as e:
        err.print(f"error: {e.format_message()}", markup=False)
        sys.exit(2)
    except click.Abort:
        err.print("aborted")
        sys.exit(130)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
