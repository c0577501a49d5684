"""The command line's tables (rich): what `info`, `generate`, `lanes`, `gate`, `quantize`, `check`,
`bench` and `perf` print.

Each function builds tables or lines from the package's results; cli.py prints them.
"""

from __future__ import annotations

from rich.table import Table

from .errors import UserError
from .plan.families import KINDS


def gb(x: float) -> str:
    return f"{x / 1e9:.2f} GB"


def mib(x: float) -> str:
    return f"{x / 2**20:.1f} MiB"


def info_tables(cfg, ctx: int, bandwidth: float) -> list[Table]:
    """`info`: the geometry, sizes and state of cfg, then the floor at B = 1, 16, 64."""
    t = Table(title=f"{cfg.name}  (config hash {cfg.hash})", show_header=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("layers", f"{cfg.num_hidden_layers}: {len(cfg.linear_layers)} Gated DeltaNet, "
                        f"{len(cfg.full_layers)} gated attention, {cfg.mtp_num_hidden_layers} MTP")
    t.add_row("hidden / intermediate / vocab",
              f"{cfg.hidden_size} / {cfg.intermediate_size} / {cfg.vocab_size}")
    t.add_row("attention", f"{cfg.num_attention_heads} q heads, {cfg.num_key_value_heads} kv heads, "
                           f"head_dim {cfg.head_dim}, rotary {cfg.rotary_dim}")
    t.add_row("GDN", f"{cfg.linear_num_key_heads} k heads × {cfg.linear_key_head_dim}, "
                     f"{cfg.linear_num_value_heads} v heads × {cfg.linear_value_head_dim}, "
                     f"conv {cfg.conv_dim} × {cfg.linear_conv_kernel_dim}")
    t.add_row("text parameters", f"{cfg.text_params / 1e9:.3f} B")
    t.add_row("MTP parameters", f"{cfg.mtp_params / 1e9:.3f} B")
    t.add_row("linear weights (int4 g128)",
              f"{cfg.linear_params / 1e9:.3f} B params = {gb(cfg.int4_weight_bytes())}")
    t.add_row("per-sequence state",
              f"recurrent {mib(cfg.recurrent_state_bytes)} fp32 + conv "
              f"{mib(cfg.conv_state_bytes)} bf16 + KV {cfg.kv_bytes_per_token // 1024} KiB/token")
    f = Table(title=f"floor of one decode step, T = {ctx}, copy bandwidth "
                    f"{bandwidth / 1e12:.3f} TB/s (docs/PERFORMANCE.md)")
    for c in ("B", "bytes", "step", "tok/s", "linear TFLOP"):
        f.add_column(c, justify="right")
    for b in (1, 16, 64):
        s = cfg.floor_seconds(b, ctx, bandwidth)
        f.add_row(str(b), gb(cfg.floor_bytes(b, ctx)), f"{s * 1e3:.2f} ms", f"{b / s:,.0f}",
                  f"{cfg.step_flops(b) / 1e12:.3f}")
    return [t, f]

def presets_table() -> Table:
    """The presets: geometry, size, and whether the kernels take them (`info --list`)."""
    from qwen38gen.config import PRESETS, PUBLISHED
    from qwen38gen.lanes import check_model

    size = {v: k for k, v in PUBLISHED.items()}
    t = Table(title="presets (`--model NAME`; a config.json or a model folder works too)")
    for c in ("name", "published", "layers", "hidden", "heads q/kv", "GDN heads k/v", "tied",
              "text params", "int4 weights", "kernels"):
        t.add_column(c, justify="left" if c in ("name", "kernels") else "right")
    for name, cfg in PRESETS.items():
        try:
            check_model(cfg)
            ok = "yes"
        except UserError as e:
            ok = str(e).split(": ", 1)[1].split(" is not")[0] + " not supported"
        t.add_row(name, size.get(name, "-"), str(cfg.num_hidden_layers), str(cfg.hidden_size),
                  f"{cfg.num_attention_heads}/{cfg.num_key_value_heads}",
                  f"{cfg.linear_num_key_heads}/{cfg.linear_num_value_heads}",
                  "yes" if cfg.tie_word_embeddings else "no", f"{cfg.text_params / 1e9:.3f} B",
                  gb(cfg.int4_weight_bytes()), ok)
    return t


def import_lines(rep: dict) -> list[str]:
    """What an import of a pre-quantized checkpoint took from it and what it quantized here, as
    plain lines."""
    lines = []
    got, here = rep["from_checkpoint"], rep["quantized_here"]
    lines.append(f"imported {rep['source_method']} int4: {len(got)} linear weights from the "
              f"checkpoint (codes exact, {rep['source_scale_dtype'] or 'no'} scales), "
              f"{len(here)} quantized here (int4 g128 of their float weights)")
    if rep["source_scale_dtype"] not in ("", "bfloat16"):
        lines.append(f"scales converted to bf16: largest relative change of any weight "
                  f"{rep['max_rel_weight_change']:.3e}")
    import re
    from collections import Counter

    for title, names in (("from the checkpoint", got), ("quantized here", here)):
        if names:  # one line per tensor kind, layers folded (the full list: quantization.json)
            kinds = Counter(re.sub(r"\.layers\.\d+\.", ".layers.*.", n) for n in names)
            lines.append(f"{title}:")
            for k, c in kinds.items():
                lines.append(f"  {k} ×{c}")
    return lines


def gate_table(res) -> Table:
    """One gated file's kernels: registers, threads, stack, spills, shared memory, problems."""
    t = Table(title=f"{res.source}{'  (cached)' if res.cached else ''}")
    for c in ("kernel", "regs", "threads", "stack", "spill st/ld", "smem", "status"):
        t.add_column(c, justify="right" if c not in ("kernel", "status") else "left",
                     no_wrap=c == "kernel", overflow="fold")
    for k in res.kernels:
        p = k.problems()
        t.add_row(k.name, str(k.registers), str(k.threads or "-"), str(k.stack),
                  f"{k.spill_stores}/{k.spill_loads}", str(k.smem),
                  "[red]" + "; ".join(p) + "[/red]" if p else "[green]ok[/green]")
    return t


def mtp_trace_rows(rows) -> list:
    """`bench --mtp K --trace`: per B, the plain step's and the speculative step's timelines as
    trace_tables' rows (batch label, trace, step_ms)."""
    from types import SimpleNamespace

    out = []
    for r in rows:
        out.append(SimpleNamespace(batch=f"{r.batch}, plain step", trace=r.plain_trace,
                                   step_ms=r.plain_ms))
        out.append(SimpleNamespace(batch=f"{r.batch}, speculative step (verify, mtp {r.k})",
                                   trace=r.trace, step_ms=r.spec_ms))
    return out


def trace_tables(rows) -> list[Table]:
    """`bench --trace`: per B, the step's advances by kind and by GEMV weight (trace.py)."""
    tables = []
    for r in rows:
        tr = r.trace
        t = Table(title=f"B = {r.batch}: one replay of the trace variant ({tr['variant_ms']:.3f} ms "
                        f"a replay, the program {r.step_ms:.3f}; timer step "
                        f"{tr['resolution_ns']:.0f} ns). Per launch: handover = its first block "
                        "out of the wait - the previous launch's last block done; advance = its "
                        "last block done - the previous one's; tail = its last block done - half "
                        "of its blocks done")
        for c in ("launches", "n", "advance ms", "handover ms", "run ms", "tail ms",
                  "µs per launch: advance", "handover", "tail", "weights GB/s over run"):
            t.add_column(c, justify="right")
        for part, label in (("by_kind", None), ("by_label", None)):
            for name, a in sorted(tr[part].items(), key=lambda kv: -kv[1]["advance"]):
                if part == "by_label" and name in tr["by_kind"]:
                    continue   # a kind without weights: already a row
                n = a["n"]
                t.add_row(name, str(n), f"{a['advance'] / 1e3:.3f}", f"{a['handover'] / 1e3:.3f}",
                          f"{a['run'] / 1e3:.3f}", f"{a['tail'] / 1e3:.3f}",
                          f"{a['advance'] / n:.1f}", f"{a['handover'] / n:.1f}",
                          f"{a['tail'] / n:.1f}",
                          f"{a['gbs_run']:,.0f}" if a.get("gbs_run") else "-")
            if part == "by_kind":
                t.add_section()
        t.add_row("step", "", f"{tr['step_us'] / 1e3:.3f}")
        tables.append(t)
    return tables


def bench_tables(cfg, ctx, bw, rows, pdl: str) -> list:
    """bench's two tables: the step against the floor with each kind's share, then each kind's
    launches as a graph of their own. Numeric cells fold rather than lose digits to an ellipsis
    when the console is narrower than the table."""
    t = Table(title=f"{cfg.name} decode step, T = {ctx}, copy bandwidth {bw / 1e12:.3f} TB/s "
                    f"(measured in this run), programmatic dependent launch {pdl}")
    for c in ("B", "step ms", "tok/s", "GB/s", "floor ms", "step/floor", "% of floor", *KINDS):
        t.add_column(c, justify="right", overflow="fold")
    for r in rows:
        sh = [f"{100 * r.share.get(k, 0):.0f}%" for k in KINDS]
        t.add_row(str(r.batch), f"{r.step_ms:.3f}", f"{r.tok_s:,.0f}", f"{r.gbs:,.0f}",
                  f"{r.floor_ms:.3f}", f"{r.ratio:.2f}", f"{100 / r.ratio:.0f}%", *sh)
    g = Table(title="each kind's launches of one step as a graph of their own: ms, and the kind's "
                    "floor bytes (weights / state / KV) over that time")
    for c in ("B", *KINDS, "sum", "step"):
        g.add_column(c, justify="right", overflow="fold")
    for r in rows:
        cells = []
        for k in KINDS:
            ms = r.graph_ms.get(k)
            gb = r.kind_gbs.get(k)
            cells.append("-" if ms is None else f"{ms:.3f}" + (f" ({gb:,.0f} GB/s)" if gb else ""))
        g.add_row(str(r.batch), *cells, f"{sum(r.graph_ms.values()):.3f}", f"{r.step_ms:.3f}")
    return [t, g]


def generate_table(cfg, steps: int, prompts, generated) -> Table:
    """`generate`: each sequence's prompt and generated ids."""
    t = Table(title=f"reference greedy generation, {cfg.name}, up to {steps} steps")
    t.add_column("seq", justify="right")
    t.add_column("prompt")
    t.add_column("generated")
    for i, (p, g) in enumerate(zip(prompts, generated)):
        t.add_row(str(i), ",".join(map(str, p)), ",".join(map(str, g)))
    return t


def lanes_tables(supported, tuning_rows) -> list[Table]:
    """`lanes`: the supported lane choices, then the tuning keys."""
    t = Table(title="supported lanes")
    t.add_column("field")
    t.add_column("supported")
    for k, v in supported:
        t.add_row(k, v)
    u = Table(title="tuning (--tune KEY=VALUE; a non-default value is part of the lane name)")
    for c in ("key", "supported", "default", "what"):
        u.add_column(c)
    for row in tuning_rows:
        u.add_row(*row)
    return [t, u]


def gate_matrix_table(results) -> tuple[Table, bool]:
    """`gate --matrix`: one row per lane; and whether any failed."""
    t = Table(title="gate matrix")
    for c in ("lane", "kernels", "max regs", "spills", "stack", "cached", "status"):
        t.add_column(c)
    failed = False
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
    return t, failed


def outcome_table(title: str, columns, res) -> Table:
    """A check's outcome (verify.check.Outcome): one row per sequence or request."""
    t = Table(title=title)
    for c in columns:
        t.add_column(c)
    for r in res.rows:
        t.add_row(*r)
    return t


def verdict_line(res, unit: str) -> str:
    """PASS or FAIL with the count of ok rows."""
    n_ok = sum(r[-1] == "ok" for r in res.rows)
    return f"{'[green]PASS' if res.ok else '[red]FAIL'}[/] {n_ok}/{len(res.rows)} {unit}"


def bench_mtp_table(cfg, ctx: int, k: int, rows, alphas) -> Table:
    """`bench --mtp K`: the speculative step against the plain decode step, per B."""
    t = Table(title=f"{cfg.name}: speculative step (mtp={k}: verify {k + 1} rows + accept + MTP "
                    f"drafter) vs plain decode step, T = {ctx}")
    for c in ("B", "plain ms", "spec ms", "spec/plain", "emitted/step", "plain tok/s",
              "spec tok/s", *(f"tok/s @α={a}" for a in alphas)):
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(str(r.batch), f"{r.plain_ms:.3f}", f"{r.spec_ms:.3f}", f"{r.ratio:.2f}",
                  f"{r.emitted:.2f}", f"{r.plain_tok_s:,.0f}", f"{r.spec_tok_s:,.0f}",
                  *(f"{r.implied_tok_s[a]:,.0f}" for a in alphas))
    return t


def prefill_table(cfg, bw: float, peak: float, rows) -> Table:
    """`bench --prefill`: time to first token per (prompt, B, pt), beside its two floors."""
    t = Table(title=f"{cfg.name}: time to first token, B prompts arriving together (copy "
                    f"{bw / 1e12:.2f} TB/s, tensor peak {peak / 1e12:.0f} TFLOP/s nominal)")
    for c in ("prompt", "B", "pt", "chunks", "TTFT ms", "prompt tok/s", "TFLOP/s",
              "flops floor ms", "weight-pass floor ms", "× floor"):
        t.add_column(c, justify="right")
    for r in sorted(rows, key=lambda r: (r.prompt, r.batch, r.pt)):
        floor = max(r.floor_flops_ms, r.floor_bytes_ms)
        t.add_row(str(r.prompt), str(r.batch), str(r.pt), str(r.chunks), f"{r.ttft_ms:,.1f}",
                  f"{r.tok_s:,.0f}", f"{r.tflops:.0f}", f"{r.floor_flops_ms:,.1f}",
                  f"{r.floor_bytes_ms:,.1f}", f"{r.ttft_ms / floor:.2f}")
    return t


def peers_table(pr: dict, batches, rows, peers, short) -> Table:
    """`bench --peers`: torch's kernels over the step's linear layers beside our whole step."""
    ours = {r.batch: r.step_ms for r in rows}
    t = Table(title=f"peers: the {pr['layers']} linear layers of one step only "
                    f"({pr['params'] / 1e9:.3f} B params), graph replay, {pr['device']}, "
                    f"{pr['torch']}")
    for c in ("B", "our whole step ms", *(f"{short[k]} ms (× int4 floor)" for k in peers),
              "int4 W floor ms", "bf16 W floor ms"):
        t.add_column(c, justify="right")
    for B in batches:
        cells = []
        for k in peers:
            p = pr["peers"][k]
            ms = next((r["ms"] for r in p["rows"] if r["batch"] == B), None)
            cells.append("failed" if not p["ok"] else f"{ms:.3f} ({ms / pr['int4_floor_ms']:.2f}×)")
        t.add_row(str(B), f"{ours[B]:.3f}" if B in ours else "", *cells,
                  f"{pr['int4_floor_ms']:.3f}", f"{pr['bf16_floor_ms']:.3f}")
    return t


def perf_tables(cfg, ctx: int, fit, preds) -> list:
    """`perf`: the timing model's fit on its calibration run, then its predictions per B."""
    head = f"timing model against its calibration run ({fit.model}, T = {fit.ctx})"
    f = Table()
    for c in ("B", "measured ms", "model ms", "error", "used"):
        f.add_column(c, justify="right")
    for r in fit.rows:
        f.add_row(str(r["batch"]), f"{r['measured_ms']:.3f}", f"{r['predicted_ms']:.3f}",
                  f"{100 * r['error']:+.1f}%", "held out" if r["held_out"] else "calibration")
    fit_line = (f"calibrated on B = {', '.join(map(str, fit.calibration))}; max |error|: "
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
    return [head, f, fit_line, t]


def serve_table(cfg, workload: str, rows) -> Table:
    """`bench --serve`: one row per (B, schedule) of perf/serve_bench.ServeRow."""
    rate = rows[0].rate if rows else 0.0
    arrive = f"{rate:g} requests/s (Poisson)" if rate else "all queued at once"
    mtp = f", mtp {rows[0].mtp}" if rows and rows[0].mtp else ""
    t = Table(title=f"serving {cfg.name}, {workload}; {arrive}{mtp}")
    for c in ("B", "pt", "schedule", "output tok/s", "steps (prefill / decode)", "rows (prompt / "
              "decode)", "ms/step", "occupancy", "decode occ.", "lockstep steps",
              "TTFT p50 / p99 ms", "TPOT p50 / p99 ms"):
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(str(r.batch), str(r.pt), r.schedule, f"{r.tok_s:,.0f}",
                  f"{r.steps} ({r.prefill_steps} / {r.decode_steps})",
                  f"{r.prompt_rows} / {r.decode_rows}", f"{r.ms_per_step:.3f}",
                  f"{r.occupancy:.2f}", f"{r.decode_occupancy:.2f}", str(r.lockstep_steps),
                  f"{r.ttft_p50_ms:,.0f} / {r.ttft_p99_ms:,.0f}",
                  f"{r.tpot_p50_ms:.2f} / {r.tpot_p99_ms:.2f}")
    return t


def serve_mtp_table(rows, alphas) -> Table:
    """`bench --serve --mtp K`: acceptance measured, and output tok/s implied at acceptance α
    (perf/serve_bench.implied_tok_s)."""
    t = Table(title="speculative serving: measured, and implied at acceptance α (verify steps' "
                    "time × measured tokens per slot-verify / (1 + α + … + α^K))")
    for c in ("B", "acceptance", "tokens / slot-verify", "output tok/s",
              *(f"tok/s @α={a}" for a in alphas)):
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(str(r.batch), f"{r.acceptance:.3f}", f"{r.tokens_per_verify:.3f}",
                  f"{r.tok_s:,.0f}", *(f"{r.implied_tok_s[str(a)]:,.0f}" for a in alphas))
    return t
