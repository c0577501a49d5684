"""Run an emitted program's manifest schedule in numpy, each launch by the numpy op of its
kernel (emu/ops.py), on the manifest's own buffers, offsets and strides. It runs the program's
schedule, not its CUDA kernels: buffers are fp64 (no bf16 rounding), weights the dequantized int4
codes the program reads.

It checks the emitter's plan (argument order, buffer offsets, strides, grids) on the CPU, where no
kernel can run: if the schedule is wired right, the emulated program computes what the numpy
reference computes; and it is the engine's CPU backend (emu/backend.py). Each launch is dispatched by its kernel's "family" and read through the
manifest's typed fields (format 2: qwen38gen/manifest.py), never through the kernel's name.
"""

from __future__ import annotations

import numpy as np

from ..inputs import fused_arrays, pack_weights
from ..manifest import check_format
from ..plan.attention import attn_part_floats, attn_stride
from ..plan.families import family
from ..plan.program import resolve_shape
from ..sampling import FPAR_COLUMNS, UPAR_COLUMNS, sample, unpack_params
from ..spec_sampling import draw_weighted, judge_draft, keyed_u64, target_weights
from ..weights import dequantize, xtile_index
from . import ops as R


class Emu:
    def __init__(self, man: dict, cfg, tensors: dict, tmax: int):
        check_format(man)
        self.man, self.cfg, self.tmax = man, cfg, tmax
        self.manifest = man   # the name Runtime gives it
        packed = pack_weights(cfg, tensors, mtp=bool(man["lanes"]["mtp"]))
        self.W = {}
        for name, spec in man["weights"].items():
            q, s = fused_arrays(spec, packed)
            self.W[name] = dequantize(q, s, (spec["rows"], spec["k"])).astype(np.float64)
        self.T = {n: np.asarray(packed[n], dtype=np.float64) for n in man["tensors"]}
        self.buf = {}
        for n, spec in man["buffers"].items():
            shape = resolve_shape(spec["shape"], tmax)
            dt = np.int64 if spec["dtype"] == "int32" else np.float64
            self.buf[n] = np.zeros(int(np.prod(shape)), dt)
        self.B = man["lanes"]["batch"]

    # -- the executor interface of qwen38gen.verify.spec_runtime (as qwen38gen.runtime.Runtime's)
    def _shape(self, name):
        return resolve_shape(self.man["buffers"][name]["shape"], self.tmax)

    def put(self, name: str, arr):
        a = np.asarray(arr).reshape(-1)
        assert a.size <= self.buf[name].size, name
        self.buf[name][:a.size] = a

    def get(self, name: str) -> np.ndarray:
        return self.buf[name].reshape(self._shape(name)).copy()

    def reset(self):
        for n, spec in self.man["buffers"].items():
            if spec.get("state") or n == "pos":
                self.buf[n][:] = 0

    def run_phase(self, phase: str):
        self.run(phase)

    def view(self, arg, shape):
        """A flat view of a buffer at the argument's element offset, reshaped."""
        _, name, off, per = arg
        o = off + per * self.tmax
        n = int(np.prod(shape))
        return self.buf[name][o:o + n].reshape(shape)

    def kernel(self, L) -> dict:
        return self.man["kernels"][L["k"]]

    def run(self, phase: str, start: int = 0, stop: int | None = None):
        """The phase's launches [start, stop) (default: all)."""
        for L in self.man["schedule"][phase][start:stop]:
            k = self.kernel(L)
            getattr(self, "k_" + family(k["family"]).emu)(L, k.get("pt", 1))

    # -- the kernel families' methods (plan/families.py's emu column: one may serve several)
    def k_embed(self, L, pt):
        E = self.T[L["args"][0][1]]
        R_ = L["grid"][0]
        tok = self.view(L["args"][1], (R_,))
        self.view(L["args"][2], (R_, E.shape[1]))[:] = E[tok]

    def put_rows(self, L, arg, y):
        """y [R, K] into the buffer of arg: as rows, or in wgmma_q4's tile order where the
        producer's "tiles" says so (the next GEMV reads it with XT = 1)."""
        tiles = self.kernel(L).get("tiles", 0)
        if tiles:
            _, name, off, _ = arg
            assert off == 0, L["k"]
            self.buf[name][xtile_index(*y.shape, tiles)] = y
        else:
            self.view(arg, y.shape)[:] = y

    def k_rmsnorm(self, L, pt):
        w = self.T[L["args"][1][1]]
        R_, H = L["grid"][0], w.shape[0]
        x = self.view(L["args"][0], (R_, H))
        self.put_rows(L, L["args"][2], R.rms1p(x, w, L["args"][3][1]))

    def k_rmsnormld(self, L, pt):
        a = L["args"]
        w = self.T[a[2][1]]
        R_, H = L["grid"][0], w.shape[0]
        ldx, ldy = a[1][1], a[4][1]
        for r in range(R_):
            x = self.view(["buf", a[0][1], a[0][2] + r * ldx, a[0][3]], (1, H))
            self.view(["buf", a[3][1], a[3][2] + r * ldy, a[3][3]], (1, H))[:] = \
                R.rms1p(x, w, a[5][1])

    def k_gemv(self, L, pt):
        a = L["args"]
        W = self.W[a[0][1]]
        ldx, ldy, N, R_ = a[3][1], a[5][1], a[6][1], a[7][1]
        K = W.shape[1]
        assert L["weight"] == a[0][1] and L["role"] == L["weight"].rpartition(".")[2], L
        nt = L["tiles"]
        assert nt == self.kernel(L)["xt"] * L["btg"] // 8, L   # only XT = 1 reads tiles
        if nt:   # x in wgmma_q4's tile order
            x = self.buf[a[2][1]][xtile_index(R_, K, nt)]
        else:
            x = self.view(a[2], (R_, ldx))[:, :K] if a[2][2] == 0 else None
        y = self.view(a[4], (R_, ldy))
        epi = L["epi"]
        if epi == 2:   # SwiGLU epilogue: gate rows [0, N), up rows from "up" on
            up = L["up"]
            gu = np.concatenate([x @ W[:N].T, x @ W[up:up + N].T], axis=1)
            if self.kernel(L)["family"] == "wgmma_sk_q4":   # act in the down GEMV's tile order
                self.buf[a[4][1]][xtile_index(R_, N, nt)] = R.swiglu(gu, N)
            else:
                y[:, :N] = R.swiglu(gu, N)
            return
        out = x @ W[:N].T
        if epi == 1:   # epilogue: add to y
            y[:, :N] += out
        else:
            y[:, :N] = out

    def k_swiglu(self, L, pt):
        R_ = L["args"][2][1]
        F = self.cfg.intermediate_size
        gu = self.view(L["args"][0], (R_, 2 * F))
        self.put_rows(L, L["args"][1], R.swiglu(gu, F))

    def k_gdn(self, L, pt):
        c = self.cfg
        a = L["args"]
        B, R_ = self.B, self.B * pt
        ld = a[1][1]
        C, hv = c.conv_dim, c.linear_num_value_heads
        proj = self.view(["buf", a[0][1], 0, 0], (R_, ld))
        mz = proj
        ba = proj[:, a[2][2]:]
        # the ring's slots, states per sequence, a state per token (GE, GW: schedule knobs,
        # the same arithmetic)
        k = self.kernel(L)
        rs, slots, each = k["ring"], k["slots"], k["each"]
        dk, dv = c.linear_key_head_dim, c.linear_value_head_dim
        ring = self.view(a[10], (B, rs, C))
        st_all = self.view(a[12], (B, slots, hv, dk, dv))
        packed = k.get("packed", 0)
        has_slot = len(a) > 16 + packed                 # the mtp lane's slot argument
        slot = self.view(a[16], (B,)) if has_slot else np.zeros(B, np.int64)
        st = st_all[np.arange(B), slot]
        pos = self.view(a[13], (B,))
        ntok = self.view(a[14], (B,))
        if packed:   # sequence b's rows from row0[b] on: into the B·pt layout and back below
            row0 = self.view(a[16 + has_slot], (B,))
            full = np.zeros_like(proj)
            for b in range(B):
                full[b * pt:b * pt + ntok[b]] = proj[row0[b]:row0[b] + ntok[b]]
            mz, ba = full, full[:, a[2][2]:]
        out, ring2, st2, per = R.gdn_chunk(
            mz, ba, a[4][1], self.T[a[5][1]][:, 0, :], self.T[a[6][1]], self.T[a[7][1]],
            self.T[a[8][1]], a[9][1], ring, st, pos, ntok, hk=c.linear_num_key_heads, hv=hv,
            dk=dk, dv=dv, pt=pt, per_token=True)
        ring[:] = ring2
        for b in range(B):
            if each:
                st_all[b, :ntok[b]] = per[b, :ntok[b]]
            else:
                st_all[b, slot[b]] = st2[b]
        if packed:   # only the sequences' rows (the rows after them are not written)
            out = np.concatenate([out[b * pt:b * pt + ntok[b]] for b in range(B)])
        self.put_rows(L, a[15], out)   # "tiles": in the out GEMV's tile order

    def k_attn(self, L, pt):
        c = self.cfg
        a = L["args"]
        B, R_ = self.B, self.B * pt
        H, HKV, D = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        packed = self.kernel(L).get("packed", 0)
        if self.kernel(L)["family"] == "attn_prep":
            R_ = L["grid"][0]
            qkv = self.view(a[0], (R_, a[1][1]))
            pos, ntok = self.view(a[6], (B,)), self.view(a[7], (B,))
            if packed:   # (sequence, token) of each row; (−1, 0) past the sequences' rows
                seq, row0 = self.view(a[12], (R_,)), self.view(a[13], (B,))
                bt = [(int(b), r - int(row0[b])) if b >= 0 else (-1, 0)
                      for r, b in enumerate(seq)]
            else:
                bt = [divmod(r, pt) for r in range(R_)]
            rows = np.array([pos[b] + t if b >= 0 else 0 for b, t in bt])
            q, k, v, _ = R.attn_prep(qkv, self.T[a[2][1]], self.T[a[3][1]], a[4][1], a[5][1],
                                     rows, H, HKV, D, c.rotary_dim)
            self.view(a[8], (R_, H, D))[:] = q
            kc = self.view(a[9], (B, HKV, self.tmax, D))
            vc = self.view(a[10], (B, HKV, self.tmax, D))
            for r, (b, t) in enumerate(bt):
                if b >= 0 and t < ntok[b]:
                    kc[b, :, pos[b] + t], vc[b, :, pos[b] + t] = k[r], v[r]
            return
        qb = self.view(a[0], (R_, H, D))
        qkv = self.view(a[1], (R_, a[2][1]))
        _, gate, _, _ = R.attn_split_qkv(qkv, H, HKV, D)
        kc = self.view(a[3], (B, HKV, self.tmax, D))
        vc = self.view(a[4], (B, HKV, self.tmax, D))
        pos, ntok = self.view(a[6], (B,)), self.view(a[7], (B,))
        # split-K scratch: the partials of every (row, kv head) fit; the counters are all zero
        # before and after (the kernel's merger resets them)
        self.view(a[8], (R_, HKV, attn_stride(self.tmax), attn_part_floats(c)))
        assert not self.view(a[9], (R_, HKV)).any()
        row0 = self.view(a[11], (B,)) if packed else np.arange(B) * pt
        # packed: only the sequences' rows are written (the rows after them are not)
        o = np.zeros((int(ntok.sum()) if packed else R_, H * D))
        for b in range(B):
            for t in range(ntok[b]):
                r, p = row0[b] + t, pos[b] + t
                o[r] = R.gated_attention_row(qb[r], gate[r], kc[b, :, :p + 1], vc[b, :, :p + 1])
        self.put_rows(L, a[10], o)   # "tiles": in the out GEMV's tile order

    def k_gather(self, L, pt):
        H = self.cfg.hidden_size
        x = self.view(L["args"][0], (self.B * pt, H))
        ntok = self.view(L["args"][1], (self.B,))
        y = self.view(L["args"][2], (self.B, H))
        row0 = (self.view(L["args"][3], (self.B,)) if self.kernel(L).get("packed", 0)
                else np.arange(self.B) * pt)
        for b in range(self.B):
            y[b] = x[row0[b] + max(ntok[b] - 1, 0)]

    def k_argmax(self, L, pt):
        R_ = L["grid"][0]
        lg = self.view(L["args"][0], (R_, self.cfg.vocab_size))
        i, v = R.argmax_rows(lg)
        self.view(L["args"][1], (R_,))[:] = i
        self.view(L["args"][2], (R_,))[:] = v

    def k_advance(self, L, pt):
        self.view(L["args"][0], (self.B,))[:] += self.view(L["args"][1], (self.B,))

    def k_topk(self, L, pt):
        pass

    def k_sample(self, L, pt):
        """kernels/sampling.cuh, by its numpy twin (sampling.sample) on the parameters unpacked
        from the kernel's arguments (sampling.unpack_params, the inverse of pack_params)."""
        a, R_ = L["args"], L["grid"][0]
        lg = self.view(a[0], (R_, self.cfg.vocab_size))
        if self.kernel(L).get("spec"):
            return self._spec_sample(a, R_, lg)
        fpar = self.view(a[1], (R_, len(FPAR_COLUMNS)))
        upar = self.view(a[2], (R_, len(UPAR_COLUMNS)))
        ctr, tok = self.view(a[3], (R_,)), self.view(a[4], (R_,))
        for r in range(R_):
            tok[r] = sample(lg[r], unpack_params(fpar[r], upar[r]), int(ctr[r]))

    def _spec_sample(self, a, R_, lg):
        """sampling.cuh with SPEC = 1 (a verify pass's rows, r = b·KP + j), by spec_sampling's
        integer rule: a draft row's judgement (acc, and the residual draw if rejected), the last
        row's plain draw; greedy slots' rows untouched."""
        kp = a[6][1]
        B = R_ // kp
        fpar = self.view(a[1], (B, len(FPAR_COLUMNS)))
        upar = self.view(a[2], (B, len(UPAR_COLUMNS)))
        ctr, tok = self.view(a[3], (B,)), self.view(a[4], (R_,))
        vtok, acc = self.view(a[5], (R_,)), self.view(a[7], (R_,))
        for r in range(R_):
            b, j = divmod(r, kp)
            prm = unpack_params(fpar[b], upar[b])
            if prm.greedy:
                continue
            position = int(ctr[b]) + 1 + j
            w = target_weights(lg[r], prm)
            if j < kp - 1:
                ok, t = judge_draft(w, int(vtok[r + 1]), prm.seed, position)
                acc[r] = int(ok)
                if not ok:
                    tok[r] = t
            else:
                tok[r] = draw_weighted(w, keyed_u64(prm.seed, position, 0))

    def _accept_sampled(self, a, B, kp):
        """speculative.cuh spec_accept_sampled: greedy slots as spec_accept; a sampled slot keeps
        drafts while sacc says so, then stok's token; its kept tokens also into vnext."""
        vtok, vnext = self.view(a[0], (B, kp)), self.view(a[1], (B, kp))
        ntok, sacc, stok = (self.view(a[2], (B,)), self.view(a[3], (B, kp)),
                            self.view(a[4], (B, kp)))
        fpar = self.view(a[5], (B, len(FPAR_COLUMNS)))
        emit = self.view(a[6], (B, kp))
        count, slot, ntok_m = (self.view(a[i], (B,)) for i in (7, 8, 9))
        for b in range(B):
            if ntok[b] <= 0 or not np.float32(fpar[b, 0]) >= np.float32(1e-5):
                self._accept_greedy(b, kp, vtok, vnext, ntok, emit, count, slot, ntok_m)
                continue
            n = 0
            while n < kp - 1 and sacc[b, n] == 1:
                n += 1
            toks = [int(vtok[b, j + 1]) for j in range(n)] + [int(stok[b, n])]
            vnext[b, :n + 1] = toks
            emit[b] = toks + [-1] * (kp - n - 1)
            count[b], slot[b], ntok_m[b] = n + 1, n, n + 1
            vtok[b, 0] = toks[-1]

    @staticmethod
    def _accept_greedy(b, kp, vtok, am, ntok, emit, count, slot, ntok_m):
        """speculative.cuh spec_accept for slot b: idle (ntok 0) keeps slot and vtok; else the
        drafts while d_j equals the argmax of row j−1, then the argmax of row n."""
        if ntok[b] <= 0:
            emit[b], count[b], ntok_m[b] = -1, 0, 0
            return
        n = 0
        while n < kp - 1 and vtok[b, n + 1] == am[b, n]:
            n += 1
        emit[b] = [am[b, j] if j <= n else -1 for j in range(kp)]
        count[b], slot[b], ntok_m[b] = n + 1, n, n + 1
        vtok[b, 0] = am[b, n]

    def k_spec(self, L, pt):
        """kernels/speculative.cuh."""
        a, B, kind = L["args"], self.B, self.kernel(L)["family"].partition("_")[2]
        if kind == "accept" and self.kernel(L).get("sampled"):
            self._accept_sampled(a, B, self.kernel(L)["kp"])
        elif kind == "accept":
            kp = self.kernel(L)["kp"]
            vtok = self.view(a[0], (B, kp))
            am = self.view(a[1], (B, kp))
            ntok = self.view(a[2], (B,))
            emit = self.view(a[3], (B, kp))
            count, slot, ntok_m = (self.view(a[i], (B,)) for i in (4, 5, 6))
            for b in range(B):
                self._accept_greedy(b, kp, vtok, am, ntok, emit, count, slot, ntok_m)
        elif kind == "tokens":
            R_ = a[3][1]
            mnext, nxt = self.view(a[0], (R_,)), self.view(a[1], (B,))
            seq = (self.view(a[4], (R_,)) if self.kernel(L).get("packed", 0)
                   else np.arange(R_) // pt)     # each row's sequence
            self.view(a[2], (R_,))[:] = np.where(mnext >= 0, mnext, nxt[np.maximum(seq, 0)])
        elif kind == "pos":
            self.view(a[2], (B,))[:] = self.view(a[0], (B,)) + a[1][1]
            self.view(a[3], (B,))[:] = 1
        elif kind == "put":
            j, stride = a[2][1], a[3][1]
            self.view(a[0], (B, stride))[:, j] = self.view(a[1], (B,))
        else:
            raise ValueError(L["k"])
