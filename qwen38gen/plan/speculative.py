"""The mtp lane (docs/MODEL.md §8): the bookkeeping kernels of kernels/speculative.cuh and the MTP
passes of its prefill and verify schedules (a ScheduleBuilder with the MTP layer's steps).
"""

from __future__ import annotations

from .builder import EMBED, ScheduleBuilder
from .elementwise import argmax_entry, gather_last_entry, rmsnorm_entry, rmsnorm_ld_entry
from .entries import I32, Entry, buf, cdiv
from .gemv import EPI_ADD, EPI_STORE
from .sampling import spec_sample_entry

# 128 threads each, grid ceil(n / 128).
SPEC_THREADS = 128


def spec_accept_entry(kp: int) -> Entry:
    return Entry(f"q38_spec_accept_k{kp - 1}", f"q38::spec_accept<{kp}>",
                 (("int*", "vtok"), (I32, "a"), (I32, "ntok"), ("int*", "emit"),
                  ("int*", "count"), ("int*", "slot"), ("int*", "ntok_m"), ("int", "B")),
                 SPEC_THREADS,
                 asserts=(f"q38::SpecLaunch::threads == {SPEC_THREADS}",), family="spec_accept",
                 meta=(("kp", kp),))


def spec_accept_sampled_entry(kp: int) -> Entry:
    return Entry(f"q38_spec_accept_s_k{kp - 1}", f"q38::spec_accept_sampled<{kp}>",
                 (("int*", "vtok"), ("int*", "a"), (I32, "ntok"), (I32, "sacc"), (I32, "stok"),
                  ("const float*", "fpar"), ("int*", "emit"), ("int*", "count"), ("int*", "slot"),
                  ("int*", "ntok_m"), ("int", "B")), SPEC_THREADS,
                 asserts=(f"q38::SpecLaunch::threads == {SPEC_THREADS}",),
                 family="spec_accept", meta=(("kp", kp), ("sampled", 1)))


def spec_tokens_entry(pt: int, packed: bool = False) -> Entry:
    """packed: a packed chunk's instance (rowseq: each row's sequence; docs/KERNELS.md)."""
    return Entry(f"q38_spec_tokens_pt{pt}" + ("_pk" if packed else ""), f"q38::spec_tokens<{pt}>",
                 ((I32, "mnext"), (I32, "next"), ("int*", "mtok"), ("int", "R"))
                 + (((I32, "rowseq"),) if packed else ()), SPEC_THREADS,
                 family="spec_tokens", meta=(("pt", pt),) + ((("packed", 1),) if packed else ()))


def spec_pos_entry() -> Entry:
    return Entry("q38_spec_pos", "q38::spec_pos",
                 ((I32, "pos"), ("int", "off"), ("int*", "mpos"), ("int*", "one"), ("int", "B")),
                 SPEC_THREADS, family="spec_pos")


def spec_put_entry() -> Entry:
    return Entry("q38_spec_put", "q38::spec_put",
                 (("int*", "dst"), (I32, "src"), ("int", "j"), ("int", "stride"), ("int", "B")),
                 SPEC_THREADS, family="spec_put")


class SpecBuilder(ScheduleBuilder):
    """The mtp lane's schedules: the target's steps and the MTP layer's passes."""

    def mtp_layer(self, pt: int, R: int, ntok: str, pos: str, hid: str, out: str,
                  gather: bool, packed: bool = False) -> list[dict]:
        """MTP rows (§8.1) over R = B·pt rows (packed: a packed chunk of R rows): token
        embeddings in x, hiddens in `hid`; h' into `out` (gather: of row ntok[b] − 1 of each
        sequence, else every row), then the shared lm_head, argmax into dnext and the draft into
        its verify row (by the caller)."""
        B, H, V, eps = self.B, self.H, self.V, self.eps
        mp = "mtp.layers.0."
        nld = self.plan.entry(rmsnorm_ld_entry(H))
        norm = self.plan.entry(rmsnorm_entry(H))
        s = [{"k": nld.name, "grid": [R, 1, 1],
              "args": [buf("x"), ["i32", H], ["t", "mtp.pre_fc_norm_embedding.weight"],
                       buf("mcat"), ["i32", 2 * H], ["f32", eps]]},
             {"k": nld.name, "grid": [R, 1, 1],
              "args": [buf(hid), ["i32", H], ["t", "mtp.pre_fc_norm_hidden.weight"],
                       buf("mcat", H), ["i32", 2 * H], ["f32", eps]]},
             self.gemv("M.fc", "mcat", "x", H, R, EPI_STORE)]
        s += self.normed_gemv(mp + "input_layernorm.weight", "M.in", "proj", self.n_in, R)
        tnt = self.out_tiles("M.out", R)
        s += self.attention(pt, R, mp + "self_attn.", buf("mkc"), buf("mvc"), ntok=ntok,
                            pos=pos, tnt=tnt, packed=packed)
        s.append(self.gemv("M.out", "o", "x", H, R, EPI_ADD, ldx=self.cfg.q_dim, xt=bool(tnt)))
        s += self.mlp(mp + "post_attention_layernorm.weight", "M.gate_up", "M.down", R)
        s.append({"k": norm.name, "grid": [R, 1, 1],
                  "args": [buf("x"), ["t", "mtp.norm.weight"], buf(out if not gather else "h"),
                           ["f32", eps]]})
        if gather:
            gl = self.plan.entry(gather_last_entry(H, pt, packed))
            s.append({"k": gl.name, "grid": [B, 1, 1],
                      "args": [buf("h"), buf(ntok), buf(out)] + ([buf("row0")] if packed else [])})
        am = self.plan.entry(argmax_entry(V))
        s.append(self.gemv("lm_head", out, "mlogits", V, B, EPI_STORE))
        s.append({"k": am.name, "grid": [B, 1, 1],
                  "args": [buf("mlogits"), buf("dnext"), buf("dval")]})
        return s

    def put_row(self, src: str, j: int) -> dict:
        e = self.plan.entry(spec_put_entry())
        return {"k": e.name, "grid": [cdiv(self.B, SPEC_THREADS), 1, 1],
                "args": [buf("vtok"), buf(src), ["i32", j], ["i32", self.KP], ["i32", self.B]]}

    def mtp_pass(self, pt: int, tok: str, ntok: str, rows: int | None = None) -> list[dict]:
        """§8.2 step 1: MTP rows over the pass just run (row t: token `tok`[t], the target's
        post-norm hidden of row t in h, position pos[b] + t, ntok[b] rows real; rows: a packed
        chunk of that many rows) → d1; then pos += ntok and §8.2 step 2, the K − 1 one-row
        draft steps → d2 … dK, each written into its verify row."""
        B = self.B
        s = [self.embed(tok, rows or B * pt)]
        e = s[0]["k"]
        s += self.mtp_layer(pt, rows or B * pt, ntok, "pos", "h", "mh", gather=True,
                            packed=rows is not None)
        s.append(self.put_row("dnext", 1))
        s.append(self.advance_step(ntok))
        for j in range(2, self.K + 1):   # row (d_{j−1}, h' of the previous row, position t + j − 1)
            sp = self.plan.entry(spec_pos_entry())
            s.append({"k": sp.name, "grid": [cdiv(B, SPEC_THREADS), 1, 1],
                      "args": [buf("pos"), ["i32", j - 2], buf("mpos"), buf("one"),
                               ["i32", B]]})
            s.append({"k": e, "grid": [B, 1, 1],
                      "args": [["t", EMBED], buf("dnext"), buf("x")]})
            s += self.mtp_layer(1, B, "one", "mpos", "mh", "mh", gather=False)
            s.append(self.put_row("dnext", j))
        return s

    def prefill(self, pt: int, rows: int | None = None) -> list[dict]:
        """A prefill chunk + MTP rows over it (fills the MTP cache; after a prompt's last chunk
        its verify rows are [next, d1 … dK]). rows: a packed chunk of that many rows
        (docs/KERNELS.md "Packed chunks"), as the plain program's."""
        R, packed = rows or self.B * pt, rows is not None
        tk = self.plan.entry(spec_tokens_entry(pt, packed))
        return (self.step(pt, advance=False, rows=rows)
                + [{"k": tk.name, "grid": [cdiv(R, SPEC_THREADS), 1, 1],
                    "args": [buf("mnext"), buf("next"), buf("mtok"), ["i32", R]]
                    + ([buf("rowseq")] if packed else [])},
                   self.put_row("next", 0)]
                + self.mtp_pass(pt, "mtok", "ntok", rows))

    def verify(self) -> list[dict]:
        """Verify [x, d1 … dK] + accept + MTP rows over the accepted rows + drafts for the next
        verify. Tuning.spec_sample: the sampler judges every row of the sampled slots first, and
        the accept kernel keeps their drafts by it."""
        B, KP = self.B, self.KP
        s = self.step(KP, tokens="vtok", verify=True, advance=False)
        grid = [cdiv(B, SPEC_THREADS), 1, 1]
        if not self.lanes.spec_sample:
            ac = self.plan.entry(spec_accept_entry(KP))
            s.append({"k": ac.name, "grid": grid,
                      "args": [buf("vtok"), buf("vnext"), buf("ntok"), buf("emit"), buf("count"),
                               buf("slot"), buf("ntok_m"), ["i32", B]]})
        else:
            sm = self.plan.entry(spec_sample_entry(self.V, self.tuning.sample_split))
            ac = self.plan.entry(spec_accept_sampled_entry(KP))
            s.append({"k": sm.name, "grid": [B * KP, 1, 1],
                      "args": [buf("logits"), buf("samp_fpar"), buf("samp_upar"), buf("pos"),
                               buf("stok"), buf("vtok"), ["i32", KP], buf("sacc")]})
            s.append({"k": ac.name, "grid": grid,
                      "args": [buf("vtok"), buf("vnext"), buf("ntok"), buf("sacc"), buf("stok"),
                               buf("samp_fpar"), buf("emit"), buf("count"), buf("slot"),
                               buf("ntok_m"), ["i32", B]]})
        return s + self.mtp_pass(KP, "vnext", "ntok_m")
