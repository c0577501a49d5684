"""ModelConfig: the geometry of a Qwen3.5/3.6-family dense hybrid decoder.

Presets (docs/MODEL.md §1): ``qwen3.8-27b`` (the 27B numbers of §1.1), ``tiny`` (27B per-head geometry,
small widths, so the production kernels run unchanged) and ``toy`` (every dimension different, to
catch transposes in the numpy reference).

Loading: an HF ``config.json`` of either ``Qwen3_5ForCausalLM`` (a text config) or
``Qwen3_5ForConditionalGeneration`` (the text config sits under ``text_config``).

Derived figures: tensor shapes under the checkpoint names, parameter counts, int4 bytes,
per-sequence state bytes and the docs/PERFORMANCE.md floor model.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from .errors import UserError
from .hf_fields import HfFields
from .presets import FULL, LINEAR, PRESET_FIELDS, PUBLISHED, hybrid as _hybrid  # noqa: F401 (re-exported)

LAYER_TYPES = (LINEAR, FULL)
# More decoder layers than any checkpoint has (the 27B has 64): a larger count is a typo, and the
# per-layer lists built from it would take the machine's memory.
MAX_LAYERS = 4096

# int4 g128: 4 bits per weight plus one bf16 scale per 128 weights (docs/PERFORMANCE.md).
INT4_GROUP = 128
INT4_BYTES_PER_PARAM = 0.5 + 2.0 / INT4_GROUP

# Checkpoint prefixes (docs/MODEL.md §2).
DECODER = "model.language_model."
MTP = "mtp."
# Qwen3_5ForCausalLM.save_pretrained spells the decoder ``model.X`` (no language_model); the
# multimodal wrapper's vision tower is ``model.visual.*``.
CAUSAL_LM = "model."
VISUAL = "model.visual."
EMBED = DECODER + "embed_tokens.weight"
LM_HEAD = "lm_head.weight"


def canonical_name(name: str) -> str:
    """A checkpoint tensor name in the released (multimodal) spelling: ``model.X`` (the
    ``Qwen3_5ForCausalLM`` names) -> ``model.language_model.X``; every other name as it is."""
    if name.startswith(CAUSAL_LM) and not name.startswith((DECODER, VISUAL)):
        return DECODER + name[len(CAUSAL_LM):]
    return name


@dataclass(frozen=True)
class ModelConfig:
    """Geometry of the text decoder. Field names follow the HF text config."""

    name: str
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int
    layer_types: tuple[str, ...]
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e7
    partial_rotary_factor: float = 0.25
    mrope_section: tuple[int, ...] = (11, 11, 10)
    mtp_num_hidden_layers: int = 1
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 262144
    attn_output_gate: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    _checked: bool = field(default=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        object.__setattr__(self, "mrope_section", tuple(self.mrope_section))
        self.validate()

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        """Raise UserError naming the first inconsistent field."""
        ints = (
            "hidden_size num_hidden_layers intermediate_size vocab_size num_attention_heads "
            "num_key_value_heads head_dim linear_num_key_heads linear_num_value_heads "
            "linear_key_head_dim linear_value_head_dim linear_conv_kernel_dim"
        ).split()
        for k in ints:
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise UserError(f"config {self.name!r}: {k} must be a positive integer, got {v!r}")
        if len(self.layer_types) != self.num_hidden_layers:
            raise UserError(
                f"config {self.name!r}: layer_types has {len(self.layer_types)} entries but "
                f"num_hidden_layers is {self.num_hidden_layers}; they must be equal"
            )
        for i, t in enumerate(self.layer_types):
            if t not in LAYER_TYPES:
                raise UserError(
                    f"config {self.name!r}: layer_types[{i}] is {t!r}; "
                    f"supported layer types are {', '.join(LAYER_TYPES)}"
                )
        if self.num_attention_heads % self.num_key_value_heads:
            raise UserError(
                f"config {self.name!r}: num_attention_heads ({self.num_attention_heads}) must be a "
                f"multiple of num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.linear_num_value_heads % self.linear_num_key_heads:
            raise UserError(
                f"config {self.name!r}: linear_num_value_heads ({self.linear_num_value_heads}) must "
                f"be a multiple of linear_num_key_heads ({self.linear_num_key_heads})"
            )
        rd = self.head_dim * self.partial_rotary_factor
        if not (0 < self.partial_rotary_factor <= 1) or rd != int(rd) or int(rd) % 2:
            raise UserError(
                f"config {self.name!r}: partial_rotary_factor {self.partial_rotary_factor} gives "
                f"rotary dim {rd} of head_dim {self.head_dim}; it must be an even integer"
            )
        if sum(self.mrope_section) != int(rd) // 2:
            raise UserError(
                f"config {self.name!r}: mrope_section {list(self.mrope_section)} sums to "
                f"{sum(self.mrope_section)}, but rotary dim {int(rd)} needs {int(rd) // 2}"
            )
        if self.mtp_num_hidden_layers not in (0, 1):
            raise UserError(
                f"config {self.name!r}: mtp_num_hidden_layers is {self.mtp_num_hidden_layers}; "
                "supported: 0 or 1"
            )
        if self.rms_norm_eps <= 0 or self.rope_theta <= 0:
            raise UserError(f"config {self.name!r}: rms_norm_eps and rope_theta must be positive")

    # ------------------------------------------------------------------ geometry
    @property
    def rotary_dim(self) -> int:
        """R: rotated dims at the front of each attention head (64 for 27B)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def gqa_group(self) -> int:
        """G: query heads per kv head."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def linear_ratio(self) -> int:
        """r: GDN v-heads per k-head (v-head h reads k-head h // r)."""
        return self.linear_num_value_heads // self.linear_num_key_heads

    @property
    def linear_key_dim(self) -> int:
        """Hk·dk: width of the GDN q block and of the k block."""
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        """Cv = Hv·dv: width of the GDN v block, of z and of the out_proj input."""
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """C = 2·Hk·dk + Hv·dv: channels of the causal conv (rows of in_proj_qkv)."""
        return 2 * self.linear_key_dim + self.linear_value_dim

    @property
    def q_dim(self) -> int:
        """H·D: attention output width (o_proj input)."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Hkv·D: rows of k_proj and of v_proj."""
        return self.num_key_value_heads * self.head_dim

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR)

    @property
    def full_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL)

    # ------------------------------------------------------------------ tensors
    def _attn_shapes(self, prefix: str) -> dict[str, tuple[int, ...]]:
        h, d = self.hidden_size, self.head_dim
        qrows = self.q_dim * (2 if self.attn_output_gate else 1)
        return {
            prefix + "self_attn.q_proj.weight": (qrows, h),
            prefix + "self_attn.k_proj.weight": (self.kv_dim, h),
            prefix + "self_attn.v_proj.weight": (self.kv_dim, h),
            prefix + "self_attn.o_proj.weight": (h, self.q_dim),
            prefix + "self_attn.q_norm.weight": (d,),
            prefix + "self_attn.k_norm.weight": (d,),
        }

    def _mlp_shapes(self, prefix: str) -> dict[str, tuple[int, ...]]:
        h, f = self.hidden_size, self.intermediate_size
        return {
            prefix + "mlp.gate_proj.weight": (f, h),
            prefix + "mlp.up_proj.weight": (f, h),
            prefix + "mlp.down_proj.weight": (h, f),
        }

    def layer_shapes(self, i: int) -> dict[str, tuple[int, ...]]:
        """Tensor shapes of decoder layer i under the released-checkpoint names."""
        h = self.hidden_size
        p = f"{DECODER}layers.{i}."
        s: dict[str, tuple[int, ...]] = {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
        if self.layer_types[i] == LINEAR:
            la = p + "linear_attn."
            hv = self.linear_num_value_heads
            s.update({
                la + "in_proj_qkv.weight": (self.conv_dim, h),
                la + "in_proj_z.weight": (self.linear_value_dim, h),
                la + "in_proj_b.weight": (hv, h),
                la + "in_proj_a.weight": (hv, h),
                la + "conv1d.weight": (self.conv_dim, 1, self.linear_conv_kernel_dim),
                la + "A_log": (hv,),
                la + "dt_bias": (hv,),
                la + "norm.weight": (self.linear_value_head_dim,),
                la + "out_proj.weight": (h, self.linear_value_dim),
            })
        else:
            s.update(self._attn_shapes(p))
        s.update(self._mlp_shapes(p))
        return s

    def mtp_shapes(self) -> dict[str, tuple[int, ...]]:
        if not self.mtp_num_hidden_layers:
            return {}
        h = self.hidden_size
        p = MTP + "layers.0."
        s = {
            MTP + "pre_fc_norm_embedding.weight": (h,),
            MTP + "pre_fc_norm_hidden.weight": (h,),
            MTP + "fc.weight": (h, 2 * h),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
        s.update(self._attn_shapes(p))
        s.update(self._mlp_shapes(p))
        s[MTP + "norm.weight"] = (h,)
        return s

    def tensor_shapes(self, mtp: bool = True) -> dict[str, tuple[int, ...]]:
        """Every text tensor of the checkpoint, in a fixed order, name -> shape."""
        h = self.hidden_size
        s: dict[str, tuple[int, ...]] = {DECODER + "embed_tokens.weight": (self.vocab_size, h)}
        for i in range(self.num_hidden_layers):
            s.update(self.layer_shapes(i))
        s[DECODER + "norm.weight"] = (h,)
        s["lm_head.weight"] = (self.vocab_size, h)
        if mtp:
            s.update(self.mtp_shapes())
        return s

    @staticmethod
    def is_int4(name: str, shape: tuple[int, ...]) -> bool:
        """Linear weights (2-D, not the embedding) are stored int4 g128; the rest stay bf16/fp32."""
        return len(shape) == 2 and not name.endswith("embed_tokens.weight")

    # ------------------------------------------------------------------ counts
    @staticmethod
    def _numel(shape) -> int:
        n = 1
        for d in shape:
            n *= d
        return n

    @property
    def text_params(self) -> int:
        """Parameters of the text decoder (embedding, 64 layers, final norm, lm_head); no MTP.
        A tied lm_head is the embedding, counted once."""
        return sum(self._numel(s) for n, s in self.tensor_shapes(mtp=False).items()
                   if not (self.tie_word_embeddings and n == LM_HEAD))

    def checkpoint_optional(self, mtp: bool = True) -> frozenset[str]:
        """Tensors of ``tensor_shapes()`` a checkpoint may leave out: a tied lm_head (it is
        ``embed_tokens``) and, with ``mtp=False``, the MTP layer."""
        opt = set() if mtp else set(self.mtp_shapes())
        if self.tie_word_embeddings:
            opt.add(LM_HEAD)
        return frozenset(opt)

    @property
    def mtp_params(self) -> int:
        return sum(self._numel(s) for s in self.mtp_shapes().values())

    @property
    def linear_params(self) -> int:
        """Linear weights read every decode step: the layers' projections plus lm_head (docs/PERFORMANCE.md)."""
        return sum(
            self._numel(s) for n, s in self.tensor_shapes(mtp=False).items() if self.is_int4(n, s)
        )

    def int4_weight_bytes(self, lm_head_bf16: bool = False) -> float:
        """W: bytes of the linear weights in int4 g128 (optionally lm_head in bf16)."""
        w = self.linear_params * INT4_BYTES_PER_PARAM
        if lm_head_bf16:
            lm = self.vocab_size * self.hidden_size
            w += lm * (2.0 - INT4_BYTES_PER_PARAM)
        return w

    @property
    def recurrent_state_bytes(self) -> int:
        """fp32 GDN recurrent state per sequence: layers × Hv × dk × dv × 4 B."""
        return (len(self.linear_layers) * self.linear_num_value_heads
                * self.linear_key_head_dim * self.linear_value_head_dim * 4)

    @property
    def conv_state_bytes(self) -> int:
        """bf16 conv ring per sequence: layers × C × (K−1) × 2 B."""
        return len(self.linear_layers) * self.conv_dim * (self.linear_conv_kernel_dim - 1) * 2

    @property
    def kv_bytes_per_token(self) -> int:
        """bf16 K and V of all full-attention layers for one cached token (64 KiB for 27B)."""
        return len(self.full_layers) * 2 * self.kv_dim * 2

    @property
    def mtp_kv_bytes_per_token(self) -> int:
        return self.mtp_num_hidden_layers * 2 * self.kv_dim * 2

    def state_bytes(self, ctx: int) -> int:
        """Per-sequence state at ctx cached tokens: recurrent + conv + KV (MTP KV excluded)."""
        return self.recurrent_state_bytes + self.conv_state_bytes + ctx * self.kv_bytes_per_token

    def floor_parts(self, batch: int, ctx: int, lm_head_bf16: bool = False) -> dict[str, float]:
        """The floor's bytes per decode step by what moves them: the int4 weights, the GDN state
        (recurrent + conv ring, read and written) and the KV cache read."""
        return {"weights": self.int4_weight_bytes(lm_head_bf16),
                "state": batch * 2 * (self.recurrent_state_bytes + self.conv_state_bytes),
                "kv": batch * ctx * self.kv_bytes_per_token}

    def floor_bytes(self, batch: int, ctx: int, lm_head_bf16: bool = False) -> float:
        """docs/PERFORMANCE.md: W + B·(recurrent r+w + conv r+w + T·KV) bytes per decode step."""
        return sum(self.floor_parts(batch, ctx, lm_head_bf16).values())

    def floor_seconds(self, batch: int, ctx: int, bandwidth: float, lm_head_bf16: bool = False) -> float:
        """Floor of one decode step at a copy bandwidth in bytes/s."""
        return self.floor_bytes(batch, ctx, lm_head_bf16) / bandwidth

    def step_flops(self, batch: int) -> float:
        """Linear-layer flops of one decode step: 2 · linear params · B."""
        return 2.0 * self.linear_params * batch

    # ------------------------------------------------------------------ identity
    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("_checked", None)
        d["layer_types"] = list(self.layer_types)
        d["mrope_section"] = list(self.mrope_section)
        return d

    def geometry_dict(self) -> dict:
        """The fields that change the math (name and token ids excluded)."""
        d = self.to_dict()
        for k in ("name", "bos_token_id", "eos_token_id", "max_position_embeddings"):
            d.pop(k)
        return d

    @property
    def hash(self) -> str:
        """12 hex digits of sha256 over the canonical geometry; names golden files and caches."""
        blob = json.dumps(self.geometry_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def to_hf_dict(self) -> dict:
        """A ``Qwen3_5ForCausalLM`` text config.json that HF transformers loads."""
        d = {
            "architectures": ["Qwen3_5ForCausalLM"],
            "model_type": "qwen3_5_text",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "linear_num_key_heads": self.linear_num_key_heads,
            "linear_num_value_heads": self.linear_num_value_heads,
            "linear_key_head_dim": self.linear_key_head_dim,
            "linear_value_head_dim": self.linear_value_head_dim,
            "linear_conv_kernel_dim": self.linear_conv_kernel_dim,
            "layer_types": list(self.layer_types),
            "rms_norm_eps": self.rms_norm_eps,
            "hidden_act": "silu",
            "attn_output_gate": self.attn_output_gate,
            "attention_bias": False,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "mtp_num_hidden_layers": self.mtp_num_hidden_layers,
            "mtp_use_dedicated_embeddings": False,
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor,
                "mrope_section": list(self.mrope_section),
                "mrope_interleaved": True,
            },
            "partial_rotary_factor": self.partial_rotary_factor,
            "dtype": "bfloat16",
            "mamba_ssm_dtype": "float32",
        }
        if self.bos_token_id is not None:
            d["bos_token_id"] = self.bos_token_id
        if self.eos_token_id is not None:
            d["eos_token_id"] = self.eos_token_id
        return d

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_hf_dict(cls, raw: dict, name: str = "hf") -> "ModelConfig":
        """Build from a parsed HF config.json (text config, or one with ``text_config``)."""
        if not isinstance(raw, dict):
            raise UserError(f"config {name!r}: expected a JSON object, got {type(raw).__name__}")
        cfg = raw.get("text_config", raw)
        if not isinstance(cfg, dict):
            raise UserError(f"config {name!r}: text_config must be a JSON object")
        arch = raw.get("architectures") or []
        mt = cfg.get("model_type", raw.get("model_type"))
        if mt is not None and mt not in ("qwen3_5_text", "qwen3_5"):
            raise UserError(
                f"config {name!r}: model_type {mt!r} is not supported; "
                "supported: qwen3_5_text (Qwen3_5ForCausalLM) or qwen3_5 with a text_config"
            )
        del arch

        f = HfFields(cfg, name)
        n_layers = f.integer("num_hidden_layers", most=MAX_LAYERS)
        layer_types = cfg.get("layer_types")
        if layer_types is None:
            interval = f.integer("full_attention_interval", 4)
            layer_types = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(n_layers)]
        elif not (isinstance(layer_types, list) and all(isinstance(t, str) for t in layer_types)):
            raise f.wrong("layer_types", layer_types,
                          f"a list of layer type names ({', '.join(LAYER_TYPES)})")
        rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
        if not isinstance(rope, dict):
            raise UserError(f"config {name!r}: rope_parameters must be a JSON object")
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise UserError(
                f"config {name!r}: rope_type {rope_type!r} is not supported; supported: default"
            )
        r = HfFields(rope, name, "rope_parameters.")
        if "rope_theta" in rope:
            theta = r.number("rope_theta")
        elif "rope_theta" in cfg:
            theta = f.number("rope_theta")
        else:
            raise UserError(f"config {name!r}: missing key 'rope_parameters.rope_theta'")
        prf = (r.number("partial_rotary_factor") if "partial_rotary_factor" in rope
               else f.number("partial_rotary_factor", 0.25))
        head_dim = f.integer("head_dim")
        if "mrope_section" in rope:
            section = r.int_list("mrope_section")
        else:
            section = [int(head_dim * prf) // 2]
        eos = cfg.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        return cls(
            name=name,
            hidden_size=f.integer("hidden_size"),
            num_hidden_layers=n_layers,
            intermediate_size=f.integer("intermediate_size"),
            vocab_size=f.integer("vocab_size"),
            num_attention_heads=f.integer("num_attention_heads"),
            num_key_value_heads=f.integer("num_key_value_heads"),
            head_dim=head_dim,
            linear_num_key_heads=f.integer("linear_num_key_heads"),
            linear_num_value_heads=f.integer("linear_num_value_heads"),
            linear_key_head_dim=f.integer("linear_key_head_dim"),
            linear_value_head_dim=f.integer("linear_value_head_dim"),
            linear_conv_kernel_dim=f.integer("linear_conv_kernel_dim", 4),
            layer_types=tuple(layer_types),
            rms_norm_eps=f.number("rms_norm_eps", 1e-6),
            rope_theta=theta,
            partial_rotary_factor=prf,
            mrope_section=tuple(section),
            mtp_num_hidden_layers=f.integer("mtp_num_hidden_layers", 0, least=0),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings",
                                             raw.get("tie_word_embeddings", False))),
            max_position_embeddings=f.integer("max_position_embeddings", 262144),
            attn_output_gate=f.flag("attn_output_gate", True),
            bos_token_id=f.token_id("bos_token_id"),
            eos_token_id=HfFields({"eos_token_id": eos}, name).token_id("eos_token_id"),
        )

    @classmethod
    def from_json_file(cls, path: str | Path) -> "ModelConfig":
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        if not p.is_file():
            what = "is not a regular file" if p.exists() else "does not exist"
            raise UserError(f"config file {str(p)!r} {what}; pass a preset "
                            f"({', '.join(PRESETS)}), a config.json or a model folder holding one")
        try:
            raw = json.loads(p.read_text())
        except OSError as e:
            raise UserError(f"config file {str(p)!r} cannot be read: {e.strerror or e}") from None
        except (ValueError, RecursionError) as e:   # bad JSON, bad UTF-8, a 5000-digit number
            raise UserError(f"config file {str(p)!r} is not valid JSON: {e}") from None
        name = p.parent.name or p.stem
        try:
            return cls.from_hf_dict(raw, name=name)
        except UserError as e:   # name the file the user gave, not the folder it is in
            msg, head = str(e), f"config {name!r}: "
            raise UserError(f"config file {str(p)!r}: "
                            f"{msg[len(head):] if msg.startswith(head) else msg}") from None


PRESETS: dict[str, ModelConfig] = {name: ModelConfig(name=name, **fields)
                                   for name, fields in PRESET_FIELDS.items()}

DEFAULT_PRESET = "tiny"


def load_config(spec: str | Path) -> ModelConfig:
    """A preset name, a config.json path, or a model folder holding config.json."""
    s = str(spec)
    if s in PRESETS:
        return PRESETS[s]
    p = Path(s)
    if p.exists():
        return ModelConfig.from_json_file(p)
    raise UserError(
        f"unknown model {s!r}: not a preset and no such file; presets are {', '.join(PRESETS)}, "
        "or pass a config.json / model folder"
    )


@dataclass(frozen=True)
class ResolvedModel:
    """What a ``--model`` argument names: the geometry, and the folder that holds the
    checkpoint (weights, tokenizer) when it names one (None for a preset)."""

    config: ModelConfig
    model_dir: Path | None

    @property
    def has_weights(self) -> bool:
        d = self.model_dir
        return d is not None and ((d / "model.safetensors").is_file()
                                  or (d / "model.safetensors.index.json").is_file())


def resolve_model(spec: str | Path) -> ResolvedModel:
    """A ``--model`` argument: a preset name, a config.json, or a checkpoint folder holding one
    (an HF checkpoint or a ``qwen38gen quantize`` output). A config.json's folder counts as the
    model folder. Raises UserError naming what is wrong."""
    s = str(spec)
    if s in PRESETS:
        return ResolvedModel(PRESETS[s], None)
    p = Path(s)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise UserError(f"model folder {s!r} has no config.json; pass a preset "
                            f"({', '.join(PRESETS)}), a config.json or a checkpoint folder")
        return ResolvedModel(ModelConfig.from_json_file(p), p)
    if p.is_file():
        return ResolvedModel(ModelConfig.from_json_file(p), p.parent)
    return ResolvedModel(load_config(s), None)   # raises the unknown-model error
