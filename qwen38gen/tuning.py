"""Tuning: the schedule choices of a program beyond its lanes, one frozen dataclass.

Every field only reschedules the arithmetic (a row's result stays the same bits), so the plain
program's choices come from the table in ``plan/table.py``; a field set away from its default
changes the emitted program, and then appears in its header, its manifest and its lane name.

Per-role fields (``sk16``, ``sk8``, ``sk_cfg``, ``wgmma_zs``) map a weight's role (``ROLES``) to
a value and are written ``ROLE.FIELD=VALUE`` on the command line, e.g. ``gate_up.sk16=3:6:1``.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, fields
from pathlib import Path

from .errors import UserError

# What a fused weight is (plan.entries.weight_role): the in / out projections of a layer (GDN or
# attention), the MLP's fused gate_up and its down projection, the lm_head, the MTP layer's fc.
ROLES = ("in", "out", "gate_up", "down", "lm_head", "fc")
TABLE = "table"   # a field's value meaning "the table's choice"


@dataclass(frozen=True)
class Knob:
    """One tuning field: its allowed set, spelled for messages, and its parser."""

    allowed: str
    kind: str                 # "int", "bool", "choice", "sk" (CW:XS:PP), "optint" (TABLE or int),
                              # "optbool" (TABLE or bool)
    values: tuple = ()        # choice / int / optint: the allowed values
    per_role: bool = False
    help: str = ""


_ZS = (1, 2, 4, 8)
KNOBS: dict[str, Knob] = {
    "gemv_zs": Knob("table, 1, 2, 4, 8", "optint", _ZS,
                    help="gemv_q4 cluster split: 1 none, else that split on every one-wave weight "
                         "at btg <= 16"),
    "swiglu_fuse": Knob("0, 1", "bool", help="SwiGLU in gate_up's epilogue where the rule says"),
    "out_xt": Knob("0, 1", "bool", help="GDN / attention write o in the out GEMV's tile order"),
    "wgmma_sk": Knob("table, off, all", "choice", ("table", "off", "all"),
                     help="wgmma_sk_q4: where the table says, never, or every tile-order launch"),
    "wgmma_zs": Knob("1, 2, 4, 8 (dividing the weight's parts of K)", "int", _ZS, per_role=True,
                     help="split of the role's tile-order wgmma_q4 launches"),
    "sk_cfg": Knob("CW:XS:PP, CW 1..4, XS 2..16, PP 0 or 1", "sk", per_role=True,
                   help="(CW, XS, PP) of the role's wgmma_sk_q4 launches"),
    "sk16": Knob("CW:XS:PP, CW 1..4, XS 2..16, PP 0 or 1", "sk", per_role=True,
                 help="the role's 16-row tiles on wgmma_sk_q4 (sm_90a)"),
    "sk8": Knob("CW:XS:PP, CW 1..4, XS 2..16, PP 0 or 1", "sk", per_role=True,
                help="the role's 8-row tiles on wgmma_sk_q4 (sm_90a)"),
    "gdn_ge": Knob("table, -1..16", "optint", tuple(range(-1, 17)),
                   help="decode GDN: state rows requested before the conv (-1: all first)"),
    "gdn_gw": Knob("0, 1", "bool", help="decode GDN up to 16 rows: the first wave loads early"),
    "attn_st": Knob("2, 3, 4", "int", (2, 3, 4), help="attn_tc K/V ring stages"),
    "attn_mb": Knob("0, 1", "int", (0, 1), help="attn_tc min blocks per SM (0: not given)"),
    "attn_grid": Knob("table, 1..1024", "optint", tuple(range(1, 1025)),
                      help="attn_tc grid.x target (table: one block per SM)"),
    "sample_split": Knob("0, 1", "bool",
                         help="the sampler's histogram sums by 32-bit shared atomics with a carry "
                              "(same tokens, 8.6-14.8x faster on an H100: version 28; "
                              "0: 64-bit atomics)"),
    "spec_sample": Knob("table, 0, 1", "optbool",
                        help="mtp programs: sampled slots' drafts accepted on the device (the "
                             "sampler judges each verify row, spec_accept_sampled keeps them); "
                             "table: on in mtp programs (version 31; the host path read "
                             "B·(K+1)·V logits a step, > 3 x slower at the 27B); 0: the host "
                             "reads the rows' logits"),
    "chunk_btg": Knob("table, 0, 64", "optint", (0, 64),
                      help="prefill chunks of at least that many rows built at that batch tile "
                           "(64: the B = 64 lane's GEMV kernels) where the lane's tile is smaller; "
                           "table: 64 where the lane's tile is at most 16 rows on sm_90a (version "
                           "31, H100: TTFT of 16 x 1 024 tokens 5.36 -> 3.09 s, B = 16 serving "
                           "383 -> 542 tok/s), else the lane's; 0: the lane's tile"),
    "verify_btg": Knob("table, 0, 32, 64", "optint", (0, 32, 64),
                       help="mtp programs: the verify pass (and its MTP rows) built at that batch "
                            "tile where the lane's is smaller (32: the B = 32 lane's GEMV kernels, "
                            "64: the B = 64 lane's); table: 32 at 16-row lanes whose verify pass "
                            "has more than 16 rows on sm_90a (version 31, H100, B = 16, mtp 1: "
                            "the speculative step 16.73 -> 12.18 ms), else the lane's; 0: the "
                            "lane's tile"),
    "multi_tile": Knob("table, 0, 8, 16, 32", "optint", (0, 8, 16, 32),
                       help="gemv_q4's batch tile on launches over more rows than the lane's "
                            "btg (prefill chunks, verify passes; table: 32 where the lane's tile "
                            "is at most 16 rows, else the lane's; 0: the lane's tile)"),
}


def _sk_ok(v) -> bool:
    return (isinstance(v, tuple) and len(v) == 3 and all(type(x) is int for x in v)
            and 1 <= v[0] <= 4 and 2 <= v[1] <= 16 and v[2] in (0, 1))


def _value_ok(knob: Knob, v) -> bool:
    if knob.kind == "bool":
        return type(v) is bool
    if knob.kind == "optbool":
        return v is None or type(v) is bool
    if knob.kind == "sk":
        return _sk_ok(v)
    if knob.kind == "optint" and v is None:
        return True
    if knob.kind == "choice":
        return v in knob.values
    return type(v) is int and v in knob.values


def _fmt(knob: Knob, v) -> str:
    if v is None:
        return TABLE
    if knob.kind in ("bool", "optbool"):
        return "1" if v else "0"
    if knob.kind == "sk":
        return ":".join(map(str, v))
    return str(v)


def _parse(key: str, knob: Knob, s: str):
    """The value of a KEY=VALUE setting, or a UserError naming the key, value and allowed set."""
    s = s.strip()
    v: object = s
    if knob.kind == "optbool" and s == TABLE:
        v = None
    elif knob.kind in ("bool", "optbool"):
        v = {"1": True, "0": False, "true": True, "false": False}.get(s.lower(), s)
    elif knob.kind == "sk":
        parts = s.split(":")
        if len(parts) == 3 and all(p.strip().lstrip("-").isdigit() for p in parts):
            v = tuple(int(p) for p in parts)
    elif knob.kind in ("int", "optint"):
        if knob.kind == "optint" and s == TABLE:
            v = None
        elif s.lstrip("-").isdigit():
            v = int(s)
    if not _value_ok(knob, v):
        raise UserError(f"tuning {key}={s!r} is not supported; supported {key}: {knob.allowed}")
    return v


@dataclass(frozen=True)
class Tuning:
    """The schedule choices; each default is the table's (plan/table.py). Per-role fields are
    sorted ((role, value), ...) tuples so that the dataclass stays hashable."""

    gemv_zs: int | None = None
    swiglu_fuse: bool = True
    out_xt: bool = True
    wgmma_sk: str = "table"
    wgmma_zs: tuple = ()
    sk_cfg: tuple = ()
    sk16: tuple = ()
    sk8: tuple = ()
    gdn_ge: int | None = None
    gdn_gw: bool = True
    attn_st: int = 2
    attn_mb: int = 0
    attn_grid: int | None = None
    multi_tile: int | None = None
    chunk_btg: int | None = None
    verify_btg: int | None = None
    sample_split: bool = True
    spec_sample: bool | None = None

    def __post_init__(self):
        for f in fields(self):
            knob, v = KNOBS[f.name], getattr(self, f.name)
            if not knob.per_role:
                if not _value_ok(knob, v):
                    raise UserError(f"tuning {f.name}={v!r} is not supported; "
                                    f"supported {f.name}: {knob.allowed}")
                continue
            items = dict(v) if isinstance(v, (tuple, dict)) else None
            if items is None or (isinstance(v, tuple) and len(items) != len(v)):
                raise UserError(f"tuning {f.name}={v!r} is not a mapping of role to value; "
                                f"give ROLE.{f.name}=VALUE settings")
            for role, x in items.items():
                if role not in ROLES:
                    raise UserError(f"tuning {role}.{f.name}: {role!r} is not a weight role; "
                                    f"roles: {', '.join(ROLES)}")
                if not _value_ok(knob, x):
                    raise UserError(f"tuning {role}.{f.name}={x!r} is not supported; "
                                    f"supported {f.name}: {knob.allowed}")
            object.__setattr__(self, f.name, tuple(sorted(items.items())))

    def of(self, field: str, role: str):
        """A per-role field's value for role, or None."""
        return dict(getattr(self, field)).get(role)

    def settings(self) -> list[tuple[str, str]]:
        """The non-default choices as sorted (KEY, VALUE) pairs, KEY=VALUE as --tune takes them."""
        out = []
        for f in fields(self):
            knob, v = KNOBS[f.name], getattr(self, f.name)
            if v == f.default:
                continue
            if knob.per_role:
                out += [(f"{r}.{f.name}", _fmt(knob, x)) for r, x in v]
            else:
                out.append((f.name, _fmt(knob, v)))
        return sorted(out)

    @property
    def is_default(self) -> bool:
        return not self.settings()

    def suffix(self) -> str:
        """The lane name's tuning part: '' for the table's choices, else '-t' and 8 hex digits of
        the sha256 of the settings (the header and the manifest spell them out)."""
        s = self.settings()
        if not s:
            return ""
        return "-t" + hashlib.sha256(";".join(f"{k}={v}" for k, v in s).encode()).hexdigest()[:8]

    def to_dict(self) -> dict:
        """Every field, JSON-ready (per-role fields as {role: value}): the manifest's "tuning"."""
        d = {}
        for f in fields(self):
            knob, v = KNOBS[f.name], getattr(self, f.name)
            d[f.name] = ({r: _fmt(knob, x) for r, x in v} if knob.per_role
                         else _fmt(knob, v) if knob.kind in ("sk", "optint", "optbool") else v)
        return d

    @classmethod
    def parse(cls, settings, base: "Tuning | None" = None) -> "Tuning":
        """Tuning from KEY=VALUE strings (later ones win) over base (default: the table's)."""
        kw = {f.name: getattr(base or cls(), f.name) for f in fields(cls)}
        for raw in settings:
            key, eq, val = str(raw).partition("=")
            key = key.strip()
            if not eq:
                raise UserError(f"tuning setting {raw!r} is not KEY=VALUE; e.g. gdn_ge=4 or "
                                "gate_up.sk16=3:6:1")
            role, dot, name = key.rpartition(".")
            knob = KNOBS.get(name)
            if knob is None or knob.per_role != bool(dot):
                raise UserError(f"tuning key {key!r} is not known; keys: {', '.join(keys())}")
            if role and role not in ROLES:
                raise UserError(f"tuning key {key!r}: {role!r} is not a weight role; "
                                f"roles: {', '.join(ROLES)}")
            v = _parse(key, knob, val)
            if knob.per_role:
                kw[name] = tuple(sorted({**dict(kw[name]), role: v}.items()))
            else:
                kw[name] = v
        return cls(**kw)


def keys() -> list[str]:
    """The KEY forms --tune takes."""
    return [f"ROLE.{n}" if k.per_role else n for n, k in KNOBS.items()]


def tuning_table() -> list[tuple[str, str, str, str]]:
    """(key, allowed, default, what) rows for `qwen38gen lanes`."""
    d = Tuning().to_dict()
    return [(f"ROLE.{n}" if k.per_role else n, k.allowed,
             TABLE if k.per_role else str(d[n] if k.kind != "bool" else int(d[n])), k.help)
            for n, k in KNOBS.items()]


def read_tune_file(path) -> list[str]:
    """KEY=VALUE settings of a --tune-file: one a line, '#' starts a comment."""
    p = Path(path)
    try:
        if not p.is_file():   # /dev/zero or a FIFO would be read forever
            raise UserError(f"tune file {str(path)!r} "
                            f"{'is not a regular file' if p.exists() else 'does not exist'}; "
                            "give a text file of KEY=VALUE lines")
        if p.stat().st_size > 1 << 20:
            raise UserError(f"tune file {str(path)!r} is over 1 MiB; give a text file of "
                            "KEY=VALUE lines")
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"tune file {str(path)!r} cannot be read ({e.__class__.__name__}); give a "
                        "text file of KEY=VALUE lines") from None
    return [ln.split("#", 1)[0].strip() for ln in text.splitlines()
            if ln.split("#", 1)[0].strip()]


# The environment variables of the A/B runs before --tune, read only when the CLI asks
# (tuning_from_env), each with its old spelling: kinds of the 27B's row classes name roles.
_ENV_KINDS = {"gate_up": ("gate_up",), "in": ("in",), "lm_head": ("lm_head",),
              "long": ("down", "fc"), "narrow": ("out",)}
_ENV_KIND_LIST = "gate_up, in, lm_head, long or narrow"


def _env_sk_items(var: str, value: str) -> list[str]:
    out = []
    for item in filter(None, (t.strip() for t in value.split(","))):
        k, _, v = item.partition("=")
        parts = v.split(":")
        ok = (k.strip() in _ENV_KINDS and len(parts) == 3 and all(x.strip().isdigit() for x in parts))
        cw, xs, pp = (int(x) for x in parts) if ok else (0, 0, 0)
        if not (ok and 1 <= cw <= 4 and 2 <= xs <= 16 and pp in (0, 1)):
            raise UserError(f"{var}={value!r}: {item!r} is not kind=CW:XS:PP; use items like "
                            f"gate_up=3:4:0 separated by commas (kind {_ENV_KIND_LIST}; CW 1-4, "
                            "XS 2-16, PP 0 or 1), or leave it unset")
        field = {"QWEN38_SK_CFG": "sk_cfg", "QWEN38_SK16": "sk16", "QWEN38_SK8": "sk8"}[var]
        out += [f"{r}.{field}={cw}:{xs}:{pp}" for r in _ENV_KINDS[k.strip()]]
    return out


def tuning_from_env(env=None) -> list[str]:
    """KEY=VALUE settings from the QWEN38_* variables of the A/B runs (at call time, by the CLI
    only), checked with messages naming the variable. Unset or empty: no setting."""
    env = os.environ if env is None else env
    out: list[str] = []
    v = env.get("QWEN38_GEMV_ZS", "")
    if v:
        if v not in ("1", "2", "4", "8"):
            raise UserError(f"QWEN38_GEMV_ZS={v!r}: use 1 (no cluster split), or 2, 4 or 8 "
                            "(that split on every one-wave weight at btg <= 16), or leave it unset")
        out.append(f"gemv_zs={v}")
    for var, key in (("QWEN38_SWIGLU_FUSE", "swiglu_fuse"), ("QWEN38_OUT_XT", "out_xt"),
                     ("QWEN38_GDN_GW", "gdn_gw")):
        v = env.get(var, "")
        if v not in ("", "0", "1"):
            raise UserError(f"{var}={v!r}: use 0 (off) or 1 (on, the default), or leave it unset")
        if v == "0":
            out.append(f"{key}=0")
    v = env.get("QWEN38_WGMMA_ZS", "")
    want = (f"use kind=ZS pairs separated by commas, kind one of {', '.join(_ENV_KINDS)}, "
            "ZS 1, 2, 4 or 8")
    for item in filter(None, (t.strip() for t in v.split(","))):
        name, _, val = item.partition("=")
        if name not in _ENV_KINDS or val not in ("1", "2", "4", "8"):
            raise UserError(f"QWEN38_WGMMA_ZS={v!r}: {want}")
        out += [f"{r}.wgmma_zs={val}" for r in _ENV_KINDS[name]]
    v = env.get("QWEN38_WGMMA_SK", "")
    if v:
        if v not in ("0", "1", "all"):
            raise UserError(f"QWEN38_WGMMA_SK={v!r}: use 1 (the default: wgmma_sk_q4 where "
                            "measured faster), 0 (never) or all (every tile-order launch), or "
                            "leave it unset")
        out.append("wgmma_sk=" + {"0": "off", "1": "table", "all": "all"}[v])
    for var in ("QWEN38_SK_CFG", "QWEN38_SK16", "QWEN38_SK8"):
        out += _env_sk_items(var, env.get(var, ""))
    v = env.get("QWEN38_GDN_SR", "")
    if v:
        raise UserError(f"QWEN38_GDN_SR={v!r}: removed (state rows in shared memory, replaced by "
                        "gdn_ge in version 17); use QWEN38_GDN_GE or --tune gdn_ge=N, or leave "
                        "it unset")
    v = env.get("QWEN38_GDN_GE", "")
    if v:
        if not (v == "-1" or v.isdigit() and int(v) <= 16):
            raise UserError(f"QWEN38_GDN_GE={v!r}: use -1 (every state row first) or 0 … 16 rows "
                            "before the conv, or leave it unset")
        out.append(f"gdn_ge={int(v)}")
    return out
