"""The launch schedule of a decode step or a prefill chunk, built as a sequence of layer steps:
embed, then per layer the linear (GDN) or attention mixer and the MLP, then the final norm and
the lm_head. Each launch is {"k": entry name, "grid": [x, y, z], "args": [...]} plus typed fields
the manifest's consumers read (qwen38gen/manifest.py): a GEMV's "role", "weight", "epi", "btg" and
"tiles" (the n-tiles of the tile order it reads its input in, 0 for rows), and "up" for gate_up
with SwiGLU in its epilogue.
"""

from __future__ import annotations

from ..config import ModelConfig
from ..lanes import Lanes
from .arch import arch_facts
from .attention import attn_blocks, attn_entry, attn_grid_x, attn_prep_entry
from .elementwise import (advance_entry, argmax_entry, embed_entry, gather_last_entry,
                          rmsnorm_entry, swiglu_entry, swiglu_grid)
from .entries import Plan, buf, cdiv, pad16, weight_role
from .gdn import gdn_entry, gdn_launch
from .gemv import (EPI_ADD, EPI_STORE, EPI_SWIGLU, gemm_entry, gemm_launch, gemm_part_floats,
                   gemv_config, gemv_entry, gemv_split, gemv_swiglu_config, gemv_tile,
                   swiglu_fuses)
from .wgmma import (sk_entry, sk_grid, sk_launch, sk_pub_floats, sk_small_launch, wgmma_entry,
                    wgmma_launch, wgmma_part_floats, wgmma_resident)

EMBED = "model.language_model.embed_tokens.weight"


class ScheduleBuilder:
    """The context of one program's schedules (model, lanes, plan) and its layer steps; every
    step adds the entries it launches to the plan and returns its launches."""

    def __init__(self, cfg: ModelConfig, lanes: Lanes, plan: Plan, btg: int | None = None):
        """btg: the batch tile of the schedules this builder emits, if not the lane's (the
        prefill chunks of Tuning.chunk_btg)."""
        self.cfg, self.lanes, self.plan = cfg, lanes, plan
        self.tuning, self.arch = lanes.tuning, arch_facts(lanes.arch)
        self.B, self.btg, self.K = lanes.batch, btg or lanes.btg, lanes.mtp
        self.KP = self.K + 1                 # verify rows per sequence
        self.H, self.F, self.V = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
        self.eps = cfg.rms_norm_eps
        self.wgmma = self.arch.wgmma
        self.n_in = max(w["rows"] for n, w in plan.weights.items() if n.endswith(".in"))
        kc = cfg.linear_conv_kernel_dim - 1
        # mtp: conv ring by position with K extra slots, K + 1 recurrent-state slots (gdn.cuh)
        self.RS, self.SLOTS = (kc + self.K, self.KP) if self.K else (kc, 1)
        self.linear_index = {i: n for n, i in enumerate(cfg.linear_layers)}
        self.attn_index = {i: n for n, i in enumerate(cfg.full_layers)}
        self.scratch = {"part": 1, "arrivals": 1}   # split-K scratch, the most any launch needs

    # ------------------------------------------------------------------------- GEMV choice
    def role(self, wname: str) -> str:
        return weight_role(wname)

    def tiled_input(self, wname: str, R: int) -> int:
        """The n-tiles of the activation tile order the GEMV of wname over R rows reads its
        input in (wgmma_q4 with XT = 1, or wgmma_sk_q4 at 16 or 8 rows), or 0 for rows; its
        producer writes exactly that."""
        if not self.wgmma:
            return 0
        w, role = self.plan.weights[wname], self.role(wname)
        wl = wgmma_launch(role, w["rows"], w["k"], self.btg, R, self.tuning, self.arch, xt=True)
        small = sk_small_launch(role, self.btg, self.tuning)
        return self.btg // 8 if (wl and wl[5]) or small else 0

    def row_tile(self, wname: str, R: int) -> int:
        """gemv_q4's batch tile for wname over R rows: gemv_tile's, or the multi-row tile where R
        is more than the lane's btg (a prefill chunk or verify pass: fewer weight passes and
        unpackings per row). That tile is Tuning.multi_tile, by default 32 where the lane's tile
        is at most 16 rows (version 28, H100: a 1 024-row chunk of the 27B at B = 16 419 -> 363
        ms, TTFT of 1 024 tokens at B = 1 620 -> 410 ms); 0 keeps the lane's tile. A row's bits
        do not depend on the tile (gemv_q4's NT)."""
        t = gemv_tile(self.role(wname), self.btg)
        mt = self.tuning.multi_tile
        if mt is None:
            mt = 32 if self.btg <= 16 else 0
        return mt if mt and R > self.btg else t

    def tensor_launch(self, wname: str, R: int, xt: bool = False):
        """(wgmma_q4 config, gemm_q4 config) of this weight over R rows, at most one of them set;
        both None where gemv_q4 serves it."""
        w, role = self.plan.weights[wname], self.role(wname)
        wl = (wgmma_launch(role, w["rows"], w["k"], self.btg, R, self.tuning, self.arch, xt=xt)
              if self.wgmma else None)
        return wl, None if wl else gemm_launch(role, w["rows"], w["k"], self.btg, R, self.arch)

    def _gemv_fields(self, wname: str, epi: int, tiles: int, btg: int, **kw) -> dict:
        return {"role": self.role(wname), "weight": wname, "epi": epi, "tiles": tiles,
                "btg": btg, **kw}

    def sk_gemv(self, wname: str, sk: tuple[int, int, int], epi: int, args: list,
                up: int = 0) -> dict:
        """The wgmma_sk_q4 launch (config sk = (CW, XS, PP)) of weight wname with gemv_q4's
        arguments args (its R rows last), the scratch it needs counted in."""
        w, btg = self.plan.weights[wname], self.btg
        cw, xs, pp = sk
        e = self.plan.entry(sk_entry(w["k"], btg, epi, cw, xs, pp))
        G, TB = sk_grid(w["rows"], w["k"], cw, self.arch)
        gy = cdiv(args[7][1], btg)
        self.scratch["part"] = max(self.scratch["part"], sk_pub_floats(btg, cw) * TB * gy)
        self.scratch["arrivals"] = max(self.scratch["arrivals"], TB * gy)
        extra = {"up": up} if up else {}
        return {"k": e.name, "grid": [G, gy, 1],
                "args": args + [buf("gemm_part"), buf("gemm_arrivals")],
                **self._gemv_fields(wname, epi, btg // 8, btg, **extra)}

    def gemv(self, wname: str, x: str, y: str, ldy: int, R: int, epi: int,
             ldx: int | None = None, xt: bool = False) -> dict:
        """y[:R, :rows] (=, or += for EPI_ADD) W x[:R]; the grid's y tiles the rows by btg.
        xt: x may be given in tile order (the caller's producer writes it so when
        tiled_input(wname, R) says). (Bigger tiles for the multi-row passes were tried: a 32-row
        tile made the B = 16 mtp verify step 8 % slower on an H200, one block per SM at
        grid.y = 1; docs/PERFORMANCE.md.)"""
        w, btg, role = self.plan.weights[wname], self.btg, self.role(wname)
        n_out, k = w["rows"], w["k"]
        args = [["w", wname, "qweight"], ["w", wname, "scales"], buf(x), ["i32", ldx or k],
                buf(y), ["i32", ldy], ["i32", n_out], ["i32", R]]
        sk = sk_launch(role, btg, self.tuning) if self.wgmma and xt else None
        if sk:
            return self.sk_gemv(wname, sk, epi, args)
        # wgmma_q4 (sm_90a) or gemm_q4: (entry, row tiles per block, part floats per row block)
        wl, gl = self.tensor_launch(wname, R, xt)
        if wl:
            wg, mw, xs, zs, mb, xt_, pp = wl
            res = wgmma_resident(role, btg, xt_, zs)
            e, tiles, pf = (wgmma_entry(k, btg, epi, wg, mw, xs, zs, mb, xt_, pp, res),
                            4 * wg * mw, wgmma_part_floats(k, btg // 8, wg, mw))
        elif gl:
            mt, wr, st, zs, mb = gl
            xt_ = 0
            e, tiles, pf = (gemm_entry(k, btg, epi, mt, wr, st, zs, mb), mt * wr,
                            gemm_part_floats(k, mt, btg // 8, wr))
        if wl or gl:
            gx, gy = cdiv(cdiv(n_out, 16), tiles), cdiv(R, btg)
            e = self.plan.entry(e)
            if zs > 1:
                self.scratch["part"] = max(self.scratch["part"], pf * gx * gy)
                self.scratch["arrivals"] = max(self.scratch["arrivals"], gx * gy)
            return {"k": e.name, "grid": [gx, gy, zs],
                    "args": args + [buf("gemm_part"), buf("gemm_arrivals")],
                    **self._gemv_fields(wname, epi, btg // 8 if xt_ else 0, btg)}
        tile = self.row_tile(wname, R)
        mt, st, xs, a = gemv_config(role, n_out, tile, self.arch)
        zs = gemv_split(n_out, k, mt, tile, R, self.tuning, self.arch)
        e = self.plan.entry(gemv_entry(k, tile, epi, mt, st, xs, a, zs=zs))
        return {"k": e.name, "grid": [n_out // (16 * mt) * zs, cdiv(R, tile), 1], "args": args,
                **self._gemv_fields(wname, epi, 0, tile)}

    # ------------------------------------------------------------------------- layer parts
    def norm_to_h(self, wnorm: str, R: int, tnt: int = 0) -> dict:
        """h = RMS1p(x; wnorm), in tile order for 8·tnt-row tiles where tnt > 0."""
        norm = self.plan.entry(rmsnorm_entry(self.H, tnt))
        return {"k": norm.name, "grid": [R, 1, 1],
                "args": [buf("x"), ["t", wnorm], buf("h"), ["f32", self.eps]]}

    def normed_gemv(self, wnorm: str, wname: str, y: str, ldy: int, R: int) -> list[dict]:
        """h = RMS1p(x; wnorm) (in tile order where the GEMV reads it so), then y = W h."""
        tnt = self.tiled_input(wname, R)
        return [self.norm_to_h(wnorm, R, tnt),
                self.gemv(wname, "h", y, ldy, R, EPI_STORE, xt=bool(tnt))]

    def mlp(self, wnorm: str, gu: str, down: str, R: int) -> list[dict]:
        """x += W_down SwiGLU(W_gate_up RMS1p(x)). Where gemv_q4 serves gate_up and the down
        GEMV reads its input in rows, SwiGLU is gate_up's epilogue (EPI_SWIGLU): one launch and
        the gu buffer's round trip fewer, the same bits; so it is where wgmma_sk_q4 serves
        gate_up and the down GEMV reads the tile order (version 19)."""
        w, btg, H, F = self.plan.weights[gu], self.btg, self.H, self.F
        n_out, k = w["rows"], w["k"]
        (_, up_off, _) = w["parts"][1]
        fuse = self.tuning.swiglu_fuse
        # a fused launch's arguments: act = SwiGLU(W_gate_up h), F features
        args = [["w", gu, "qweight"], ["w", gu, "scales"], buf("h"), ["i32", k],
                buf("act"), ["i32", F], ["i32", F], ["i32", R]]
        sk = (sk_launch(self.role(gu), btg, self.tuning)
              if self.wgmma and self.tiled_input(gu, R) else None)
        if fuse and sk and self.tiled_input(down, R) == btg // 8:
            assert up_off % 16 == 0 and n_out == 2 * up_off and up_off == F, w
            return [self.norm_to_h(wnorm, R, btg // 8),
                    self.sk_gemv(gu, sk, EPI_SWIGLU, args, up=up_off),
                    self.gemv(down, "act", "x", H, R, EPI_ADD, xt=True)]
        tile = self.row_tile(gu, R)
        if not (fuse and swiglu_fuses(tile, R) and self.tensor_launch(gu, R) == (None, None)
                and not self.tiled_input(gu, R) and not self.tiled_input(down, R)):
            return (self.normed_gemv(wnorm, gu, "gu", 2 * F, R)
                    + self.swiglu_down(down, R))
        assert up_off % 16 == 0 and n_out == 2 * up_off, w
        st, xs, a = gemv_swiglu_config(tile)
        e = self.plan.entry(gemv_entry(k, tile, EPI_SWIGLU, 2, st, xs, a, ms=up_off // 16))
        return [self.norm_to_h(wnorm, R),
                {"k": e.name, "grid": [up_off // 16, cdiv(R, tile), 1], "args": args,
                 **self._gemv_fields(gu, EPI_SWIGLU, 0, tile, up=up_off)},
                self.gemv(down, "act", "x", H, R, EPI_ADD)]

    def swiglu_down(self, wname: str, R: int) -> list[dict]:
        """act = SwiGLU(gu) (in tile order where the down GEMV reads it so), then x += W act."""
        tnt = self.tiled_input(wname, R)
        sw = self.plan.entry(swiglu_entry(self.F, tnt))
        return [{"k": sw.name, "grid": swiglu_grid(self.F, R, tnt),
                 "args": [buf("gu"), buf("act"), ["i32", R]]},
                self.gemv(wname, "act", "x", self.H, R, EPI_ADD, xt=bool(tnt))]

    def out_tiles(self, wname: str, R: int) -> int:
        """The n-tiles of the tile order the GDN or attention kernel writes o in for the out
        projection wname over R rows (tiled_input), 0 for rows (Tuning.out_xt off)."""
        return self.tiled_input(wname, R) if self.tuning.out_xt else 0

    def attention(self, pt: int, R: int, sa: str, kc: list, vc: list, ntok: str = "ntok",
                  pos: str = "pos", tnt: int = 0, packed: bool = False) -> list[dict]:
        """attn_prep + attn_tc of one gated-attention layer over proj (q|k|v), into o (in tile
        order for 8·tnt-row tiles where tnt > 0); packed: over a packed chunk of R rows."""
        cfg, B, n_in = self.cfg, self.B, self.n_in
        Hq, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
        ap = self.plan.entry(attn_prep_entry(cfg, pt, packed))
        at = self.plan.entry(attn_entry(cfg, pt, self.tuning, self.arch, tnt, packed))
        gx = attn_grid_x(B * Hkv * pt, attn_blocks(self.tuning, self.arch))
        return [{"k": ap.name, "grid": [R, cdiv(Hq + 2 * Hkv, 8), 1],
                 "args": [buf("proj"), ["i32", n_in], ["t", sa + "q_norm.weight"],
                          ["t", sa + "k_norm.weight"], ["f32", self.eps],
                          ["f32", cfg.rope_theta], buf(pos), buf(ntok), buf("qbuf"),
                          kc, vc, ["tmax"]] + ([buf("rowseq"), buf("row0")] if packed else [])},
                {"k": at.name, "grid": [gx, B * Hkv, pt],
                 "args": [buf("qbuf"), buf("proj"), ["i32", n_in], kc, vc,
                          ["tmax"], buf(pos), buf(ntok), buf("attn_part"),
                          buf("attn_arrivals"), buf("o")] + ([buf("row0")] if packed else [])}]

    # ------------------------------------------------------------------------- layer steps
    def embed(self, tokens: str, R: int) -> dict:
        e = self.plan.entry(embed_entry(self.H))
        return {"k": e.name, "grid": [R, 1, 1], "args": [["t", EMBED], buf(tokens), buf("x")]}

    def linear_mixer(self, i: int, pt: int, verify: bool, tnt: int, packed: bool = False) -> dict:
        """The GDN launch of linear-attention layer i over proj, into o (packed: a packed
        chunk)."""
        cfg, B = self.cfg, self.B
        C, Cv, hv = cfg.conv_dim, cfg.linear_value_dim, cfg.linear_num_value_heads
        dkv = cfg.linear_key_head_dim * cfg.linear_value_head_dim
        la_ = f"model.language_model.layers.{i}.linear_attn."
        if self.K:
            g = self.plan.entry(gdn_entry(cfg, pt, self.tuning, self.arch, self.RS, int(verify),
                                          self.SLOTS, tnt=tnt, packed=packed))
            L = gdn_launch(cfg, pt, self.RS)
        else:
            g = self.plan.entry(gdn_entry(cfg, pt, self.tuning, self.arch, batch=B, tnt=tnt,
                                          packed=packed))
            L = gdn_launch(cfg, pt)
        n = self.linear_index[i]
        return {"k": g.name, "grid": [B * L["blocks_per_seq"], 1, 1],
                "args": [buf("proj"), ["i32", self.n_in], buf("proj", C + Cv),
                         ["i32", self.n_in], ["i32", pad16(hv)], ["t", la_ + "conv1d.weight"],
                         ["t", la_ + "A_log"], ["t", la_ + "dt_bias"],
                         ["t", la_ + "norm.weight"], ["f32", self.eps],
                         buf("conv", n * B * self.RS * C), buf("ring_arrivals"),
                         buf("rec", n * B * self.SLOTS * hv * dkv),
                         buf("pos"), buf("ntok"), buf("o")]
                + ([buf("slot")] if self.K else []) + ([buf("row0")] if packed else [])}

    def layer(self, i: int, pt: int, verify: bool, rows: int | None = None) -> list[dict]:
        """Decoder layer i over R = B·pt rows (or a packed chunk of R = rows rows): norm + in
        projection, the mixer (GDN or gated attention) into o, x += out projection, the MLP."""
        cfg, R, packed = self.cfg, rows or self.B * pt, rows is not None
        p = f"model.language_model.layers.{i}."
        s = self.normed_gemv(p + "input_layernorm.weight", f"L{i}.in", "proj", self.n_in, R)
        tnt = self.out_tiles(f"L{i}.out", R)
        linear = i in self.linear_index
        if linear:
            s.append(self.linear_mixer(i, pt, verify, tnt, packed))
        else:
            kv = self.B * cfg.num_key_value_heads * cfg.head_dim   # per cached position
            n = self.attn_index[i]
            s += self.attention(pt, R, p + "self_attn.", buf("kc", 0, n * kv),
                                buf("vc", 0, n * kv), tnt=tnt, packed=packed)
        # o is written densely by its producer: [R, Cv] after GDN, [R, H·D] after attention
        # (or in the tile order of the out GEMV, where it reads it so).
        s.append(self.gemv(f"L{i}.out", "o", "x", self.H, R, EPI_ADD,
                           ldx=cfg.linear_value_dim if linear else cfg.q_dim, xt=bool(tnt)))
        s += self.mlp(p + "post_attention_layernorm.weight", f"L{i}.gate_up", f"L{i}.down", R)
        return s

    def final_norm_and_head(self, pt: int, verify: bool, rows: int | None = None) -> list[dict]:
        """The final norm, the lm_head and argmax: over every row into vnext (verify), else over
        each sequence's last row into next (after gathering it, pt > 1; rows: of a packed
        chunk of that many rows)."""
        B, H, V = self.B, self.H, self.V
        R, packed = rows or B * pt, rows is not None
        # A decode step of a lane without mtp feeds the final norm straight to the lm_head,
        # so it may write the tile order; elsewhere the gather or the mtp layer reads it in rows.
        tnt = self.tiled_input("lm_head", B) if pt == 1 and not verify and not self.K else 0
        fnorm = self.plan.entry(rmsnorm_entry(H, tnt))
        s = [{"k": fnorm.name, "grid": [R, 1, 1],
              "args": [buf("x"), ["t", "model.language_model.norm.weight"], buf("h"),
                       ["f32", self.eps]]}]
        am = self.plan.entry(argmax_entry(V))
        if verify:
            s.append(self.gemv("lm_head", "h", "logits", V, R, EPI_STORE))
            s.append({"k": am.name, "grid": [R, 1, 1],
                      "args": [buf("logits"), buf("vnext"), buf("vnextval")]})
            return s
        src = "h"
        if pt > 1:
            gl = self.plan.entry(gather_last_entry(H, pt, packed))
            s.append({"k": gl.name, "grid": [B, 1, 1],
                      "args": [buf("h"), buf("ntok"), buf("hlast")]
                      + ([buf("row0")] if packed else [])})
            src = "hlast"
        s.append(self.gemv("lm_head", src, "logits", V, B, EPI_STORE, xt=bool(tnt)))
        s.append({"k": am.name, "grid": [B, 1, 1],
                  "args": [buf("logits"), buf("next"), buf("nextval")]})
        return s

    def advance_step(self, ntok: str) -> dict:
        adv = self.plan.entry(advance_entry())
        return {"k": adv.name, "grid": [cdiv(self.B, 128), 1, 1],
                "args": [buf("pos"), buf(ntok), ["i32", self.B]]}

    def step(self, pt: int, tokens: str = "tokens", verify: bool = False,
             advance: bool = True, rows: int | None = None) -> list[dict]:
        """The target over pt rows per sequence. verify: lm_head and argmax over every row
        (into vnext), the GDN writing a state slot per row. rows: a packed chunk of that many
        rows (at most pt per sequence; docs/KERNELS.md "Packed chunks")."""
        s = [self.embed(tokens, rows or self.B * pt)]
        for i in range(self.cfg.num_hidden_layers):
            s += self.layer(i, pt, verify, rows)
        s += self.final_norm_and_head(pt, verify, rows)
        if advance:
            s.append(self.advance_step("ntok"))
        return s
