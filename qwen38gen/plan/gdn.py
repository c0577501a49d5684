"""The Gated DeltaNet family (kernels/gdn.cuh): the conv, the gated delta rule and the gated norm
of one linear-attention layer per launch, its launch shape (a mirror of GdnLaunch) and its entry.
"""

from __future__ import annotations

from ..errors import UserError

from ..config import ModelConfig
from ..tuning import Tuning
from . import table
from .arch import ArchFacts
from .entries import BF, I32, Entry, cdiv

# Column slices per v-head. One for every batch: NS changes how the gated norm's sum is formed,
# and a fixed NS keeps a row's result bitwise the same at every B (the equivalence locks).
GDN_NS = 1


def _decode_instance(cfg: ModelConfig, pt: int, rs: int | None) -> bool:
    """The plain program's decode-step instance: where GE applies."""
    return pt == 1 and rs is None and cfg.linear_key_head_dim == 128


def gdn_state_rows_early(cfg: ModelConfig, pt: int, tuning: Tuning, rs: int | None = None,
                         batch: int = 0) -> int:
    """GE of the GDN instance (kernels/gdn.cuh): -1, every state row requested first (before the
    conv's copies, which then queue behind 64 KiB of state loads per block); else the conv's
    copies first, then GE of a thread's 16 state rows, the others once the conv is done: the
    table's rule (plan/table.py) or Tuning.gdn_ge. Scheduling only: the same bits
    (tests/gpu/test_gdn_kernels.py). It replaced SR, a thread's last state rows kept in shared
    memory (versions 12 to 16; the 64-row GDN launch 114.5 us against SR = 12's 127.5; the
    parameter is in dd8da46)."""
    if not _decode_instance(cfg, pt, rs):
        return -1
    if tuning.gdn_ge is not None:
        return tuning.gdn_ge
    rows = cfg.linear_key_head_dim // 8
    return rows if batch < table.GDN_GE_MIN_BATCH else table.GDN_GE_MANY


def gdn_launch(cfg: ModelConfig, pt: int, rs: int | None = None) -> dict:
    """Mirror of kernels/gdn.cuh GdnLaunch (the entry point static_asserts the two agree).
    rs: conv ring slots (None: K − 1, the non-mtp ring)."""
    dk, dv, hv, k = (cfg.linear_key_head_dim, cfg.linear_value_head_dim,
                     cfg.linear_num_value_heads, cfg.linear_conv_kernel_dim)
    rs = k - 1 if rs is None else rs
    cols = dv // GDN_NS
    threads = cdiv((cols // 4) * 8, 32) * 32
    groups = 2 * dk // 8 + cols // 8
    floats = (4 * rs * groups + 4 * groups * (2 * k - 1) + pt * (2 * dk + 3 * cols) + cols
              + 4 * 8 * cols + 6 * pt)
    return {"threads": threads, "smem": 4 * floats, "cluster": GDN_NS,
            "min_blocks": 1 if threads >= 512 else 512 // threads,
            "blocks_per_seq": hv * GDN_NS}


def gdn_entry(cfg: ModelConfig, pt: int, tuning: Tuning, arch: ArchFacts,
              rs: int | None = None, each: int = 0, slots: int = 1, batch: int = 0,
              tnt: int = 0, packed: bool = False) -> Entry:
    """rs=None: the plain program's instance (ring K − 1, one state, no slot argument). Else the
    mtp lane's: ring rs slots, `slots` states per sequence picked by a `slot` argument, and
    each=1 writing the state after every token into its own slot (the verify pass). batch: the
    lane's B (the GE and GW rules). tnt > 0: out in wgmma_q4's activation tile order for
    8·tnt-row tiles (the out projection's XT). packed: a packed chunk's instance (a `rows`
    argument: each sequence's first row; docs/KERNELS.md "Packed chunks")."""
    dk, dv, hk, hv, k = (cfg.linear_key_head_dim, cfg.linear_value_head_dim,
                         cfg.linear_num_key_heads, cfg.linear_num_value_heads,
                         cfg.linear_conv_kernel_dim)
    L = gdn_launch(cfg, pt, rs)
    if L["smem"] > arch.smem_per_block:
        top = max((p for p in range(1, pt) if gdn_launch(cfg, p, rs)["smem"] <= arch.smem_per_block),
                  default=0)
        raise UserError(f"pt {pt}: the GDN kernel then stages {L['smem']} bytes of shared memory "
                        f"per block for model {cfg.name!r}, more than the {arch.smem_per_block} a "
                        f"block of {arch.name} may have; use pt ≤ {top}")
    targs = f"{dk}, {dv}, {hk}, {hv}, {k}, {pt}, {GDN_NS}"
    params = ((BF, "mz"), ("int", "ld_mz"), (BF, "ba"), ("int", "ld_ba"), ("int", "ba_off"),
              (BF, "conv_w"), ("const float*", "A_log"), (BF, "dt_bias"),
              ("const float*", "norm_w"), ("float", "eps"), ("q38::bf16*", "ring"),
              ("int*", "ring_arrivals"), ("float*", "state"), (I32, "pos"), (I32, "ntok"),
              ("q38::bf16*", "out"))
    ring = k - 1 if rs is None else rs
    ge = gdn_state_rows_early(cfg, pt, tuning, rs, batch)
    gw = (arch.sms * L["min_blocks"]
          if 0 <= ge < dk // 8 and tuning.gdn_gw and batch <= table.GDN_GW_MAX_BATCH else 0)
    name = (f"q38_gdn_pt{pt}"
            + (f"_rs{rs}_s{slots}_e{each}" if rs is not None else "") + (f"_ge{ge}" if ge >= 0 else "")
            + (f"_w{gw}" if gw else "") + (f"_t{tnt}" if tnt else "") + ("_pk" if packed else ""))
    call = f"q38::gdn_chunk<{targs}, {ring}, {each}, {slots}, {tnt}, {ge}, {gw}>"
    ltargs = f"{targs}, {ring}"
    if rs is not None:
        params += ((I32, "slot"),)
    call_args = ()
    if packed:   # the slot argument (mtp lane) or nullptr, then rows
        slot_arg = () if rs is not None else ("nullptr",)
        call_args = tuple(n for _, n in params) + slot_arg + ("rows",)
        params += ((I32, "rows"),)
    return Entry(
        name, call, params,
        L["threads"], smem=L["smem"], cluster=L["cluster"], min_blocks=L["min_blocks"],
        waits=True,  # gdn_chunk loads state/pos/ntok/slot, then griddepcontrol.wait
        asserts=(f"q38::GdnLaunch<{ltargs}>::threads == {L['threads']}",
                 f"q38::GdnLaunch<{ltargs}>::smem_bytes == {L['smem']}",
                 f"q38::GdnLaunch<{ltargs}>::cluster == {L['cluster']}",
                 f"q38::GdnLaunch<{ltargs}>::min_blocks == {L['min_blocks']}"),
        family="gdn", meta=(("tiles", tnt), ("pt", pt), ("ring", ring), ("slots", slots),
                            ("each", each)) + ((("packed", 1),) if packed else ()),
        call_args=call_args)
