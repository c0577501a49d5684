"""A generation request and the JSON-lines file `run --prompts` reads (docs/RUN_FORMAT.md).

One request a line: ``{"id", "prompt" or "prompt_ids", "max_tokens", "temperature", "top_k",
"top_p", "min_p", "seed", "stop_token_ids", "ignore_eos"}``; only the prompt is required. Every
problem is a ``UserError`` naming the line; nothing is run before the whole file is read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UserError, field_error
from ..sampling import DEFAULTS, SamplingParams

FIELDS = ("id", "prompt", "prompt_ids", "max_tokens", "temperature", "top_k", "top_p", "min_p",
          "seed", "stop_token_ids", "ignore_eos")
DEFAULT_MAX_TOKENS = 16   # vLLM's default
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p")   # defaults: sampling.DEFAULTS


@dataclass(frozen=True)
class Request:
    """What to generate: token ids of the prompt, when to stop, how to choose tokens.

    Stops at ``max_tokens`` new tokens ("length"), or after a token of ``stop_ids`` or (unless
    ``ignore_eos``) of the engine's end-of-sequence ids ("stop"; the stop token is kept).
    """

    id: object
    prompt: tuple[int, ...]
    max_tokens: int = DEFAULT_MAX_TOKENS
    stop_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    sampling: SamplingParams = field(default_factory=SamplingParams)
    text: str | None = None   # the prompt as given, when it was text

    def __post_init__(self):
        if not self.prompt:
            raise UserError(f"request {self.id!r}: the prompt is empty; give at least one token")
        if self.max_tokens < 1:
            raise UserError(f"request {self.id!r}: max_tokens {self.max_tokens} must be ≥ 1")


def _mix64(x: int) -> int:
    """splitmix64's finaliser: a request's default seed from (run seed, request number)."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def default_seed(run_seed: int, number: int) -> int:
    """The seed of request ``number`` (0-based, in file order) that gives none."""
    return _mix64((_mix64(run_seed & 0xFFFFFFFFFFFFFFFF) + number) & 0xFFFFFFFFFFFFFFFF)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_request(obj, where: str, number: int, vocab: int, run_seed: int = 0,
                  tokenizer=None) -> Request:
    """One decoded JSON value -> Request; ``where`` names it in errors (e.g. "line 3")."""
    if not isinstance(obj, dict):
        raise UserError(f"{where}: a request must be a JSON object, got {type(obj).__name__}")
    unknown = sorted(set(obj) - set(FIELDS))
    if unknown:
        raise UserError(f"{where}: unknown field {unknown[0]!r}; known fields: {', '.join(FIELDS)}")
    rid = obj.get("id", number)
    if not (isinstance(rid, str) or _int(rid)):
        raise UserError(f"{where}: id must be a string or an integer, got {rid!r}")
    text = None
    if ("prompt" in obj) == ("prompt_ids" in obj):
        raise UserError(f"{where}: give exactly one of \"prompt\" (text) and \"prompt_ids\"")
    if "prompt_ids" in obj:
        ids = obj["prompt_ids"]
        if not isinstance(ids, list) or not ids or not all(_int(t) for t in ids):
            raise UserError(f"{where}: prompt_ids must be a non-empty list of token ids")
    else:
        text = obj["prompt"]
        if not isinstance(text, str) or not text:
            raise UserError(f"{where}: prompt must be a non-empty string")
        if tokenizer is None:
            raise UserError(f"{where}: the prompt is text but no tokenizer is available for this "
                            "model; give prompt_ids, or a --model folder with a tokenizer")
        ids = encode_prompt(text, tokenizer, where)
    bad = [t for t in ids if not 0 <= t < vocab]
    if bad:
        raise UserError(f"{where}: token id {bad[0]} is outside the vocabulary 0..{vocab - 1}")
    mt = obj.get("max_tokens", DEFAULT_MAX_TOKENS)
    if not _int(mt) or mt < 1:
        raise field_error("max_tokens", f"{mt!r} must be an integer ≥ 1", where)
    stops = obj.get("stop_token_ids", [])
    if not isinstance(stops, list) or not all(_int(t) and 0 <= t < vocab for t in stops):
        raise UserError(f"{where}: stop_token_ids must be a list of token ids in 0..{vocab - 1}")
    ign = obj.get("ignore_eos", False)
    if not isinstance(ign, bool):
        raise UserError(f"{where}: ignore_eos must be true or false, got {ign!r}")
    seed = obj.get("seed")
    if seed is None:
        seed = default_seed(run_seed, number)
    try:
        sp = SamplingParams(**{f: obj.get(f, getattr(DEFAULTS, f)) for f in SAMPLING_FIELDS},
                            seed=seed)
    except UserError as e:
        raise UserError(f"{where}: {e}", field=e.field, reason=e.reason) from None
    return Request(rid, tuple(ids), mt, frozenset(stops), ign, sp, text)


def read_requests(path: Path, vocab: int, run_seed: int = 0, tokenizer=None) -> list[Request]:
    """The requests of a JSON-lines file (blank lines skipped); ids must be unique."""
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        raise UserError(f"prompts file {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"prompts file {str(path)!r} cannot be read: {e}") from None
    reqs: list[Request] = []
    seen: dict = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}, line {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise UserError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
        except (ValueError, RecursionError) as e:   # a 5000-digit number; nesting 100 000 deep
            raise UserError(f"{where}: not a request JSON can hold ({type(e).__name__}: "
                            f"{str(e)[:120]})") from None
        r = parse_request(obj, where, len(reqs), vocab, run_seed, tokenizer)
        if r.id in seen:
            raise UserError(f"{where}: id {r.id!r} repeats the request of line {seen[r.id]}")
        seen[r.id] = n
        reqs.append(r)
    if not reqs:
        raise UserError(f"prompts file {str(path)!r} holds no requests (one JSON object a line)")
    return reqs


def encode_prompt(text: str, tokenizer, where: str, chat: bool = False,
                  think: bool = False) -> list[int]:
    """The one rule from a prompt's text to token ids (a request line's "prompt", `run --prompt`,
    `generate --prompt`): rendered with the model's chat template when ``chat`` (``think``: its
    enable_thinking), then encoded; an empty text, or one that encodes to nothing, is refused,
    and any error names ``where``."""
    if not text:
        raise UserError(f"{where}: the prompt is empty; give some text")
    try:
        if chat:
            text = tokenizer.render_chat([{"role": "user", "content": text}],
                                         enable_thinking=think)
        ids = list(tokenizer.encode(text))
    except UserError as e:
        raise UserError(f"{where}: {e}") from None
    if not ids:
        raise UserError(f"{where}: the prompt encodes to no tokens")
    return ids


def prompt_requests(texts, vocab: int, tokenizer, run_seed: int = 0, chat: bool = False,
                    think: bool = False, **params) -> list[Request]:
    """`run --prompt TEXT ...`: one request per text (ids 0, 1, … in order), encoded with the
    model folder's tokenizer, rendered first with its chat template when ``chat`` (``think``:
    the template's enable_thinking). ``params``: the request fields the command line sets
    (max_tokens, temperature, top_k, top_p, min_p, ignore_eos; None: the field's default)."""
    if tokenizer is None:
        raise UserError("--prompt is text, and this model has no tokenizer.json to encode it; "
                        "give a model folder with one (--model DIR), or token ids in a file "
                        "(--prompts FILE with \"prompt_ids\")")
    unknown = sorted(set(params) - set(FIELDS))
    if unknown:
        raise ValueError(f"prompt_requests: unknown request fields {unknown}")
    fields = {k: v for k, v in params.items() if v is not None}
    reqs = []
    for n, text in enumerate(texts):
        where = f"--prompt number {n + 1}"
        if not text:
            raise UserError(f"{where} is empty; give some text")
        ids = encode_prompt(text, tokenizer, where, chat, think)
        reqs.append(parse_request({"prompt_ids": ids, **fields}, where, n, vocab, run_seed,
                                  tokenizer))
    return reqs
