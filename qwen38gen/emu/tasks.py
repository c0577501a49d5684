"""The tasks of the persistent decode step, cut from an emitted phase's launches, with their
footprints, and the sequential reference order over them (docs/PERSISTENT.md §4, "Footprints"
and "Reference order").

Each launch is measured as emu/taskgraph.py measures it (reads: the intervals it views, and the
whole buffer where it indexes one directly; writes: the elements it changes) and cut into tasks.
A task's footprint is the launch's restricted to the task's slice: R(t) = the launch's reads
within the slice's read cells, W(t) = the launch's writes within its write cells. Footprints are
per-buffer element runs over the manifest's flat buffers, at the offsets ``Emu.view`` uses.
Reads of int32 buffers that the launch does not write (pos, ntok, tokens, arrival counters) are
kept whole in every task of the launch: a coarser read is always legal. What a task reads of
the weights and tensors, which no task writes, is declared from the launch's arguments (not
measured), as element runs of pseudo-buffers: ``w:NAME.qweight`` in 512-byte tiles of 16 rows
× 64 columns, ``w:NAME.scales`` in 32-byte units (16 rows × one group of 128), ``t:NAME`` in the
tensor's elements (FORMAT.md).

L(t) ⊆ R(t), the loader's walk, is what does not depend on the step's results: a GEMV task's
words and scales, a norm's weight, GDN's conv weights and per-head parameters, attn_prep's q and
k norm weights, and attention's K/V slots below pos (written by earlier steps).

Cuts by family (the decode launches of the plain lanes):

* ``gemv_q4``/``gemm_q4`` with rows in and rows out (no tile order): one task per (batch tile of
  btg rows, row block of 16 output rows) over all K. Reads its tile's input rows (EPI 1: also its
  y cells), writes its y cells. Streams its row tile's words and scales; with the SwiGLU
  epilogue (EPI 2) the gate tile and the up tile of its 16 output columns.
* ``rmsnorm`` (rows out): one task per row; walks the norm weight.
* ``swiglu`` (rows out), ``embed``, ``argmax``: one task per row, walking nothing (embed's table
  rows depend on the tokens; the whole table is declared read).
* ``gdn`` in its decode form (one token per sequence, not packed, no state-slot argument, one
  state per sequence, rows out): one task per (sequence, key head), not per value head: the conv
  ring's q and k channels are shared by the key head's value heads (the kernel's ring_arrivals
  lets the last of them write them), so value-head tasks would conflict inside the launch. A
  task holds that merge. It walks the conv weight rows of its channels, A_log and dt_bias of its
  value heads and the norm weight; the state is read from memory (§2: it stays off the ring).
* ``attn_prep`` in its decode form: one task per (row, kv head); reads the row's q columns of
  the kv head's query heads and its k and v columns; writes their qbuf cells and the kv head's
  K/V slot at pos; walks q_norm and k_norm.
* ``attn_tc`` in its decode form: one task per (sequence, kv head), holding all its splits and
  their merge (the emulator does not model the split partials: it views attn_part, never
  writes it). Reads its query heads' q and gate, its K/V slots up to pos; writes its o columns.
* everything else (tile-order GEMVs and the wgmma families, packed or per-token forms,
  advance, sampling, the speculative families): the whole launch is one task that walks
  nothing. A coarser task is always legal; no finer footprint is claimed than the emulator's
  arithmetic shows (``cut_errors`` checks sampled tasks of every launch by poisoning what they
  do not read).

The reference order runs the tasks sequentially, launch by launch, then by canonical index.
The version of an element is 0 before the first step and afterwards the id of its last writer
(``version``); ``reference`` gives each task's expected versions of what it reads and the
conflicting pairs that generate the order (RAW and WAW with the element's last writer, WAR with
its next writer): if each of those pairs is ordered, every conflicting pair is, by transitivity.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..plan.attention import attn_part_floats, attn_stride
from ..plan.families import family
from .taskgraph import Footprint, TracingEmu, launch_footprint, run_launch

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "int32": 4}
QTILE, QSCALE = 512, 32            # bytes of one 16 × 64 code tile and of 16 rows' group scales
ROWS = 16                          # output rows of a GEMV row block (gemv_q4's block)


# -- element runs: int64 [k, 2] arrays of half-open [start, stop), sorted, disjoint

def runs_of(mask: np.ndarray) -> np.ndarray:
    """The runs of True in a boolean mask."""
    d = np.flatnonzero(np.diff(np.concatenate(([0], mask.view(np.int8), [0]))))
    return d.reshape(-1, 2).astype(np.int64)


def mask_of(runs: np.ndarray, size: int) -> np.ndarray:
    m = np.zeros(size, bool)
    for a, b in runs:
        m[a:b] = True
    return m


def gather(arr: np.ndarray, runs: np.ndarray) -> np.ndarray:
    """arr's elements over the runs, concatenated in order."""
    if len(runs) == 1:
        return arr[runs[0, 0]:runs[0, 1]]
    return np.concatenate([arr[a:b] for a, b in runs]) if len(runs) else arr[:0]


@dataclass(frozen=True)
class Task:
    launch: int          # index in the phase's schedule
    index: int           # canonical index inside its launch
    family: str
    label: str
    stream: bool         # consumes its walk page by page (GEMV); else needs all of it first


@dataclass
class StepFootprints:
    """One step's task footprints: R(t) = ``mem[t]`` ∪ ``walk[t]`` ∪ ``const[t]``.

    ``mem[t]``: buffer -> runs read from memory; ``walk[t]``: (name, start, stop) runs of L(t) in
    walk order (buffers and pseudo-buffers); ``const[t]``: pseudo-buffer runs read, walked or
    not; ``writes[t]``: buffer -> runs W(t). ``launches``: the measured launch footprints.
    """
    mem: list[dict[str, np.ndarray]]
    walk: list[list[tuple[str, int, int]]]
    const: list[dict[str, np.ndarray]]
    writes: list[dict[str, np.ndarray]]
    launches: list[Footprint]
    cells: list[tuple[dict, dict]] = field(default_factory=list)   # (read, write) slices

    def reads(self, t: int) -> dict[str, np.ndarray]:
        """R(t) over the buffers (memory reads and walked buffer runs)."""
        out = dict(self.mem[t])
        for name, a, b in self.walk[t]:
            if ":" not in name:
                r = np.array([[a, b]], np.int64)
                out[name] = r if name not in out else _union(out[name], r)
        return out


def _union(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    hi = int(max(x[:, 1].max(initial=0), y[:, 1].max(initial=0)))
    return runs_of(mask_of(x, hi) | mask_of(y, hi))


# -- slices by family

@dataclass
class _Slice:
    label: str
    stream: bool = False
    rd: dict[str, list] = field(default_factory=dict)     # buffer -> flat element indices
    wr: dict[str, list] = field(default_factory=dict)
    const: list[tuple[str, int, int]] = field(default_factory=list)
    walk: list[tuple[str, int, int]] = field(default_factory=list)   # pseudo runs walked
    walk_cells: dict[str, list] = field(default_factory=dict)       # buffer cells walked


def _cells(emu, arg, shape, idx) -> tuple[str, np.ndarray]:
    """The flat element indices of ``emu.view(arg, shape)[idx]``."""
    _, name, off, per = arg
    o = off + per * emu.tmax
    return name, np.asarray(np.arange(int(np.prod(shape))).reshape(shape)[idx]).ravel() + o


def _add(d: dict, cell: tuple[str, np.ndarray]) -> None:
    d.setdefault(cell[0], []).append(cell[1])


def _tensor(emu, name: str) -> tuple[str, int, int]:
    return ("t:" + name, 0, int(emu.T[name].size))


def _gemv(emu, L) -> list[_Slice] | None:
    k, a = emu.kernel(L), L["args"]
    if (k["family"] not in ("gemv_q4", "gemm_q4") or L["tiles"] or k.get("xt", 0)
            or L["epi"] not in (0, 1, 2) or a[2][2] != 0
            or (L["epi"] == 2 and L["up"] % ROWS)):
        return None
    ldx, ldy, N, R_ = a[3][1], a[5][1], a[6][1], a[7][1]
    K, btg, w = emu.man["weights"][L["weight"]]["k"], L["btg"], L["weight"]
    kq, ks = K // 64, K // 128
    # weight row tiles of row block rb: its own; with the SwiGLU epilogue, the gate tile and
    # the up tile at "up" (one task per gate+up pair, §2)
    tiles = [0] if L["epi"] != 2 else [0, L["up"] // ROWS]
    out = []
    for tile in range(-(-R_ // btg)):
        rows = slice(tile * btg, min(R_, (tile + 1) * btg))
        for rb in range(-(-N // ROWS)):
            cols = slice(rb * ROWS, min(N, (rb + 1) * ROWS))
            s = _Slice(f"{w} tile {tile} rows {cols.start}:{cols.stop}", stream=True)
            y = _cells(emu, a[4], (R_, ldy), (rows, cols))
            _add(s.rd, _cells(emu, a[2], (R_, ldx), (rows, slice(None))))
            _add(s.wr, y)
            if L["epi"] == 1:
                _add(s.rd, y)
            for t0 in tiles:
                s.walk += [(f"w:{w}.qweight", (t0 + rb) * kq, (t0 + rb + 1) * kq),
                           (f"w:{w}.scales", (t0 + rb) * ks, (t0 + rb + 1) * ks)]
            s.const = list(s.walk)
            out.append(s)
    return out


def _rows(emu, rd, shape_in, wr, shape_out, walk=(), label="") -> list[_Slice]:
    """One task per row: row r of the input view(s) and of the output view(s)."""
    out = []
    for r in range(shape_out[0][0]):
        s = _Slice(f"{label} row {r}")
        for arg, shp in zip(rd, shape_in):
            _add(s.rd, _cells(emu, arg, shp, (r,)))
        for arg, shp in zip(wr, shape_out):
            _add(s.wr, _cells(emu, arg, shp, (r,)))
        s.walk = list(walk)
        s.const = list(walk)
        out.append(s)
    return out


def _norm(emu, L):
    k, a = emu.kernel(L), L["args"]
    if k["family"] != "rmsnorm" or k.get("tiles", 0):
        return None
    R_, H = L["grid"][0], emu.T[a[1][1]].shape[0]
    return _rows(emu, [a[0]], [(R_, H)], [a[2]], [(R_, H)], [_tensor(emu, a[1][1])],
                 a[1][1].rpartition(".")[0].rpartition(".")[2] or "norm")


def _swiglu(emu, L):
    k, a = emu.kernel(L), L["args"]
    if k.get("tiles", 0):
        return None
    R_, F = a[2][1], emu.cfg.intermediate_size
    return _rows(emu, [a[0]], [(R_, 2 * F)], [a[1]], [(R_, F)], label="swiglu")


def _embed(emu, L):
    a, R_ = L["args"], L["grid"][0]
    out = _rows(emu, [], [], [a[2]], [(R_, emu.cfg.hidden_size)], label="embed")
    for s in out:
        s.const = [_tensor(emu, a[0][1])]
    return out


def _argmax(emu, L):
    a, R_ = L["args"], L["grid"][0]
    return _rows(emu, [a[0]], [(R_, emu.cfg.vocab_size)], [a[1], a[2]], [(R_,), (R_,)],
                 label="argmax")


def _gdn(emu, L):
    c, k, a = emu.cfg, emu.kernel(L), L["args"]
    pt = k.get("pt", 1)
    if (pt != 1 or k.get("packed", 0) or len(a) != 16 or k.get("each") or k.get("slots") != 1
            or k.get("tiles", 0)):
        return None
    B, ld = emu.B, a[1][1]
    hk, hv, dk, dv = (c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
                      c.linear_value_head_dim)
    C, Cv, r = 2 * hk * dk + hv * dv, hv * dv, hv // hk
    rs, kw = k["ring"], c.linear_conv_kernel_dim
    ba0, aoff = a[2][2], a[4][1]
    out = []
    for b in range(B):
        for g in range(hk):
            h0, h1 = g * r, (g + 1) * r
            chans = np.r_[g * dk:(g + 1) * dk, hk * dk + g * dk:hk * dk + (g + 1) * dk,
                          2 * hk * dk + h0 * dv:2 * hk * dk + h1 * dv]
            cols = np.r_[chans, C + h0 * dv:C + h1 * dv, ba0 + h0:ba0 + h1,
                         ba0 + aoff + h0:ba0 + aoff + h1]
            s = _Slice(f"gdn seq {b} key head {g}")
            _add(s.rd, _cells(emu, a[0], (B, ld), (b, cols)))
            ring = _cells(emu, a[10], (B, rs, C), (b, slice(None), chans))
            state = _cells(emu, a[12], (B, 1, hv, dk, dv), (b, 0, slice(h0, h1)))
            for d in (s.rd, s.wr):
                _add(d, ring)
                _add(d, state)
            _add(s.wr, _cells(emu, a[15], (B, Cv), (b, slice(h0 * dv, h1 * dv))))
            cw = "t:" + a[5][1]
            s.walk = [(cw, x * kw, y * kw) for x, y in _spans(chans)]
            s.walk += [("t:" + a[6][1], h0, h1), ("t:" + a[7][1], h0, h1),
                       _tensor(emu, a[8][1])]
            s.const = list(s.walk)
            out.append(s)
    return out


def _spans(idx: np.ndarray) -> list[tuple[int, int]]:
    """Sorted indices as (start, stop) spans."""
    return [(int(x), int(y)) for x, y in _runs_idx(np.unique(idx))]


def _attn(emu, L):
    c, k, a = emu.cfg, emu.kernel(L), L["args"]
    if k.get("packed", 0) or k.get("pt", 1) != 1 or k.get("tiles", 0):
        return None
    B, H, HKV, D = emu.B, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    G = H // HKV
    out = []
    if k["family"] == "attn_prep":
        R_, ld = L["grid"][0], a[1][1]
        pos, ntok = emu.view(a[6], (B,)), emu.view(a[7], (B,))
        for r in range(R_):
            for m in range(HKV):
                s = _Slice(f"attn_prep row {r} kv head {m}")
                q = np.concatenate([np.arange(h * 2 * D, h * 2 * D + D)
                                    for h in range(m * G, (m + 1) * G)])
                kv = np.r_[2 * H * D + m * D:2 * H * D + (m + 1) * D,
                           2 * H * D + (HKV + m) * D:2 * H * D + (HKV + m + 1) * D]
                _add(s.rd, _cells(emu, a[0], (R_, ld), (r, np.r_[q, kv])))
                _add(s.wr, _cells(emu, a[8], (R_, H, D), (r, slice(m * G, (m + 1) * G))))
                if ntok[r] > 0:
                    for arg in (a[9], a[10]):
                        _add(s.wr, _cells(emu, arg, (B, HKV, emu.tmax, D), (r, m, int(pos[r]))))
                s.walk = [_tensor(emu, a[2][1]), _tensor(emu, a[3][1])]
                s.const = list(s.walk)
                out.append(s)
        return out
    R_, ld = B, a[2][1]
    pos, ntok = emu.view(a[6], (B,)), emu.view(a[7], (B,))
    for b in range(B):
        for m in range(HKV):
            heads = range(m * G, (m + 1) * G)
            s = _Slice(f"attention seq {b} kv head {m}")
            _add(s.rd, _cells(emu, a[0], (R_, H, D), (b, slice(m * G, (m + 1) * G))))
            gate = np.concatenate([np.arange(h * 2 * D + D, (h + 1) * 2 * D) for h in heads])
            _add(s.rd, _cells(emu, a[1], (R_, ld), (b, gate)))
            n = int(pos[b] + ntok[b])
            for arg in (a[3], a[4]):
                _add(s.rd, _cells(emu, arg, (B, HKV, emu.tmax, D), (b, m, slice(0, n))))
                _add(s.walk_cells, _cells(emu, arg, (B, HKV, emu.tmax, D),
                                          (b, m, slice(0, int(pos[b])))))
            _add(s.rd, _cells(emu, a[8], (R_, HKV, _part_len(emu)), (b, m)))
            _add(s.wr, _cells(emu, a[10], (R_, H * D), (b, slice(m * G * D, (m + 1) * G * D))))
            out.append(s)
    return out


def _part_len(emu) -> int:
    """Floats of attn_part per (row, kv head): its split slots' partials."""
    return attn_stride(emu.tmax) * attn_part_floats(emu.cfg)


_CUTS = {"gemv": _gemv, "rmsnorm": _norm, "swiglu": _swiglu, "embed": _embed,
         "argmax": _argmax, "gdn": _gdn, "attn": _attn}


def _slices(emu, L) -> list[_Slice] | None:
    """The launch's task slices, or None: the whole launch is one task."""
    cut = _CUTS.get(family(emu.kernel(L)["family"]).emu)
    return cut(emu, L) if cut else None


def _whole(emu, L, fp: Footprint) -> _Slice:
    s = _Slice(f"{emu.kernel(L)['family']} (whole launch)")
    s.rd = {n: [np.flatnonzero(m)] for n, m in fp.reads.items()}
    s.wr = {n: [np.flatnonzero(m)] for n, m in fp.writes.items()}
    for arg in L["args"]:
        if arg[0] == "t":
            s.const.append(_tensor(emu, arg[1]))
        elif arg[0] == "w" and arg[2] == "qweight":
            spec = emu.man["weights"][arg[1]]
            n = -(-spec["rows"] // ROWS)
            s.const += [(f"w:{arg[1]}.qweight", 0, n * spec["k"] // 64),
                        (f"w:{arg[1]}.scales", 0, n * spec["k"] // 128)]
    return s


# -- one step

def cut_step(emu: TracingEmu, phase: str) -> tuple[list[Task], StepFootprints]:
    """Run ``phase`` once from the emulator's current state, launch by launch, measuring each
    launch and cutting it into tasks; the state is left as the phase leaves it."""
    tasks: list[Task] = []
    fps = StepFootprints([], [], [], [], [])
    for j, L in enumerate(emu.man["schedule"][phase]):
        slices = _slices(emu, L)         # cut on the state before the launch (pos)
        fp = launch_footprint(emu, L)
        fps.launches.append(fp)
        fam = emu.kernel(L)["family"]
        for i, s in enumerate(slices if slices is not None else [_whole(emu, L, fp)]):
            tasks.append(Task(j, i, fam, s.label, s.stream))
            _restrict(emu, fp, s, fps)
    return tasks, fps


def _runs_idx(idx: np.ndarray) -> np.ndarray:
    """Sorted distinct indices as runs."""
    if not len(idx):
        return np.zeros((0, 2), np.int64)
    cut = np.flatnonzero(np.diff(idx) != 1) + 1
    starts, ends = idx[np.r_[0, cut]], idx[np.r_[cut - 1, len(idx) - 1]] + 1
    return np.stack([starts, ends], axis=1).astype(np.int64)


def _within(cells: dict[str, list], name: str, m: np.ndarray) -> np.ndarray:
    """The slice's cells of buffer ``name`` that the launch mask m holds, sorted."""
    if name not in cells:
        return np.zeros(0, np.int64)
    idx = np.concatenate(cells[name])
    if not (np.diff(idx) > 0).all():
        idx = np.unique(idx)
    return idx[m[idx]]


def _restrict(emu, fp: Footprint, s: _Slice, out: StepFootprints) -> None:
    """The task's footprint: the launch's restricted to the slice (reads of int32 buffers the
    launch does not write kept whole)."""
    rd = {}
    for name, m in fp.reads.items():
        if emu.man["buffers"][name]["dtype"] == "int32" and name not in fp.writes:
            rd[name] = np.flatnonzero(m)
        else:
            rd[name] = _within(s.rd, name, m)
    wr = {n: _runs_idx(_within(s.wr, n, m)) for n, m in fp.writes.items()}
    walk = []
    for name in s.walk_cells:
        w = _within(s.walk_cells, name, fp.reads.get(name, np.zeros(0, bool)))
        w = w[np.isin(w, rd.get(name, w[:0]))]
        walk += [(name, int(a), int(b)) for a, b in _runs_idx(w)]
        rd[name] = np.setdiff1d(rd[name], w, assume_unique=True)
    const: dict[str, list] = {}
    for name, a, b in s.const:
        const.setdefault(name, []).append((a, b))
    out.mem.append({n: _runs_idx(r) for n, r in rd.items() if len(r)})
    out.walk.append(list(s.walk) + walk)
    out.const.append({n: np.array(v, np.int64) for n, v in const.items()})
    out.writes.append({n: r for n, r in wr.items() if len(r)})
    out.cells.append((s.rd, s.wr))


def elem_bytes(man: dict, name: str) -> int:
    """Bytes of one element of a buffer or pseudo-buffer."""
    if name.startswith("w:"):
        return QTILE if name.endswith(".qweight") else QSCALE
    if name.startswith("t:"):
        return DTYPE_BYTES[man["tensors"][name[2:]]]
    return DTYPE_BYTES[man["buffers"][name]["dtype"]]


def cut_errors(emu: TracingEmu, phase: str, tasks: list[Task], fps: StepFootprints,
               sample: int = 3, seed: int = 0, also: tuple[int, ...] = ()) -> list[str]:
    """Check the cut of each launch of ``phase``, run from the emulator's current state (the state
    ``cut_step`` measured ``fps`` from; it is left as the phase leaves it):

    * the tasks' writes are disjoint and their union is the launch's measured writes; their
      reads lie within the launch's measured reads;
    * for ``sample`` tasks t of each launch (the first, the last, random others; and the
      tasks ``also``): with every float element the launch reads outside R(t) poisoned (NaN),
      the launch still writes t's cells bit for bit as it does unpoisoned. So t's results
      depend on R(t) alone, and what the launch views but no task reads is unused.

    Returns what failed, one line each."""
    rng = np.random.default_rng(seed)
    errors = []
    for j, L in enumerate(emu.man["schedule"][phase]):
        ts = [i for i, t in enumerate(tasks) if t.launch == j]
        lf = fps.launches[j]
        names = sorted(set(lf.reads) | set(lf.writes))
        before = {n: dict.__getitem__(emu.buf, n).copy() for n in names}
        for name, m in lf.writes.items():
            seen = np.zeros(m.size, int)
            for i in ts:
                if name in fps.writes[i]:
                    seen += mask_of(fps.writes[i][name], m.size)
            if (seen > 1).any() or not np.array_equal(seen > 0, m):
                errors.append(f"launch {j} ({tasks[ts[0]].family}): the tasks' writes of "
                              f"{name} are not a partition of the launch's")
        for i in ts:
            for name, r in fps.reads(i).items():
                if not lf.reads.get(name, np.zeros(0, bool))[mask_of(r, before[name].size)].all():
                    errors.append(f"task {i} ({tasks[i].label}) reads {name} outside its launch")
        run_launch(emu, L)
        after = {n: dict.__getitem__(emu.buf, n).copy() for n in names}
        pick = {i for i in also if i in ts}
        if sample:
            pick |= {ts[0], ts[-1], *rng.choice(ts, min(len(ts), max(0, sample - 2)),
                                                replace=False).tolist()}
        for i in sorted(pick):
            for n in names:
                dict.__getitem__(emu.buf, n)[:] = before[n]
            R = fps.reads(i)
            for name, m in lf.reads.items():
                if emu.man["buffers"][name]["dtype"] == "int32":
                    continue
                keep = mask_of(R[name], m.size) if name in R else np.zeros(m.size, bool)
                dict.__getitem__(emu.buf, name)[m & ~keep] = np.nan
            run_launch(emu, L)
            for name, idx in fps.cells[i][1].items():
                cells = np.concatenate(idx)
                got, want = dict.__getitem__(emu.buf, name)[cells], after[name][cells]
                if not (np.isfinite(got).all() and np.array_equal(got, want)):
                    errors.append(f"task {i} ({tasks[i].label}): its {name} cells change when "
                                  f"what it does not read is poisoned")
        for n in names:
            dict.__getitem__(emu.buf, n)[:] = after[n]
    return errors


# -- the sequential reference order

def version(step: int, t: int, n: int) -> int:
    """The version task t of step ``step`` writes (n tasks a step; 0: before the first step)."""
    return 1 + step * n + t


def writer_of(v: int, n: int) -> tuple[int, int] | None:
    """(step, task) of a version; None for 0."""
    return None if v == 0 else divmod(v - 1, n)


@dataclass
class Reference:
    """One step of the reference order.

    ``pairs``: (p, c) -> (kind, buffer) for the generating conflicts, p before c: RAW and WAW
    with an element's last writer before c, WAR with the next writer after reader p. ``exp_mem``
    and ``exp_walk``: per task, buffer -> the versions it must see over its memory runs
    (``mem[t]``'s runs concatenated) and over its walked buffer runs (in walk order);
    ``final``: every buffer's versions after the step.
    """
    pairs: dict[tuple[int, int], tuple[str, str]]
    exp_mem: list[dict[str, np.ndarray]]
    exp_walk: list[dict[str, np.ndarray]]
    final: dict[str, np.ndarray]


def reference(steps: list[StepFootprints], sizes: dict[str, int]) -> list[Reference]:
    """Run the steps' tasks sequentially in reference order over element versions (versions
    carry over from step to step); pairs are within a step. ``sizes``: each buffer's
    elements."""
    n = len(steps[0].mem)
    last = {name: np.zeros(size, np.int64) for name, size in sizes.items()}
    out = []
    for step, fp in enumerate(steps):
        base = version(step, 0, n)
        pairs: dict[tuple[int, int], tuple[str, str]] = {}
        exp_mem, exp_walk = [], []
        cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}   # same runs, same writes
        epoch = dict.fromkeys(sizes, 0)
        for c in range(n):
            em = {}
            for name, runs in fp.mem[c].items():
                key = (name, runs.tobytes(), epoch[name])
                if key not in cache:
                    e = gather(last[name], runs).copy()
                    cache[key] = e, np.unique(e[e >= base])
                em[name], ps = cache[key]
                for p in ps:
                    pairs.setdefault((int(p) - base, c), ("RAW", name))
            ew: dict[str, list] = {}
            for name, a, b in fp.walk[c]:
                if ":" not in name:
                    ew.setdefault(name, []).append(last[name][a:b].copy())
            ew = {name: np.concatenate(v) for name, v in ew.items()}
            for name, e in ew.items():
                for p in np.unique(e[e >= base]):
                    pairs.setdefault((int(p) - base, c), ("RAW", name))
            for name, runs in fp.writes[c].items():
                prev = gather(last[name], runs)
                for p in np.unique(prev[prev >= base]):
                    pairs.setdefault((int(p) - base, c), ("WAW", name))
                for a, b in runs:
                    last[name][a:b] = base + c
                epoch[name] += 1
            exp_mem.append(em)
            exp_walk.append(ew)
        nxt = {name: np.full(size, -1, np.int64) for name, size in sizes.items()}
        cache, epoch = {}, dict.fromkeys(sizes, 0)
        for r in range(n - 1, -1, -1):
            for name, runs in fp.reads(r).items():
                key = (name, runs.tobytes(), epoch[name])
                if key not in cache:
                    nx = gather(nxt[name], runs)
                    cache[key] = np.unique(nx[nx >= 0])
                for c in cache[key]:
                    pairs.setdefault((r, int(c)), ("WAR", name))
            for name, runs in fp.writes[r].items():
                for a, b in runs:
                    nxt[name][a:b] = r
                epoch[name] += 1
        out.append(Reference(pairs, exp_mem, exp_walk, {k: v.copy() for k, v in last.items()}))
    return out
