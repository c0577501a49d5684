"""The model's own tokenizer and chat template, from its folder.

``load_tokenizer(model_dir)`` reads ``tokenizer.json`` with the ``tokenizers`` library (the HF
ecosystem's own), the chat template from ``tokenizer_config.json`` (``chat_template``, a string or
a list of named templates) or ``chat_template.jinja``, and the end-of-sequence ids from
``generation_config.json`` (``eos_token_id``, an id or a list), else ``tokenizer_config.json``'s
``eos_token``. The template is rendered with jinja2 the way transformers renders it: a sandboxed
environment with ``trim_blocks``/``lstrip_blocks``, the ``loopcontrols`` extension, a ``tojson``
that keeps non-ASCII text, and ``raise_exception`` / ``strftime_now`` as globals.

Needs the ``text`` extra (``pip install 'qwen38gen[text]'``); only this module imports it.
"""

from __future__ import annotations

import contextlib
import json
from datetime import datetime
from pathlib import Path

from .errors import UserError

INSTALL = "pip install 'qwen38gen[text]'"

# A rendered chat prompt longer than this is a template fault (a loop or a repeat run away), not
# a prompt: rendering stops there. Far above any context the programs take.
MAX_RENDERED_CHARS = 1 << 24
# Operands of * and ** in a template are bounded: 'x' * 10**12 stops before it allocates.
MAX_REPEAT = 1 << 20
MAX_EXPONENT = 4096
MAX_RENDER_SECONDS = 10.0   # a template's loops that print nothing are bounded in time only


def _read_json(p: Path) -> dict:
    if not p.is_file():
        return {}
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"{str(p)!r} is not valid JSON: {e}") from None
    if not isinstance(d, dict):
        raise UserError(f"{str(p)!r}: expected a JSON object")
    return d


def _token_text(v) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


class Tokenizer:
    """Text <-> ids and the chat template of one model folder (see the module docstring)."""

    def __init__(self, model_dir: Path, backend, config: dict, template: str | None,
                 eos_ids: tuple[int, ...], template_file: Path | None = None):
        self.model_dir = model_dir
        self.template_file = template_file or Path(model_dir) / "tokenizer_config.json"
        self._tok = backend
        self._config = config
        self.chat_template = template
        self.eos_ids = eos_ids

    def encode(self, text: str) -> list[int]:
        """Ids of ``text`` as written (special tokens in it are recognised; none is added).
        Text that is not Unicode (bytes of a command line that are not UTF-8, which Python keeps
        as lone surrogates) is a UserError."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raw = text[e.start:e.end].encode("utf-8", "surrogateescape")
            raise UserError(f"the text is not valid UTF-8 (byte 0x{raw[0]:02x} at character "
                            f"{e.start}); give UTF-8 text, or token ids") from None
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids``, special tokens included."""
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def render_chat(self, messages: list[dict], enable_thinking: bool = False,
                    add_generation_prompt: bool = True) -> str:
        """The prompt text of ``messages`` ([{"role", "content"}, ...]) under the chat template."""
        if not self.chat_template:
            raise UserError(f"model folder {str(self.model_dir)!r} has no chat template "
                            "(chat_template in tokenizer_config.json or chat_template.jinja)")
        import jinja2
        import jinja2.ext

        where = f"chat template {str(self.template_file)!r}"

        def raise_exception(message):
            raise UserError(f"{where}: {message}")

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        env = _bounded_env()(trim_blocks=True, lstrip_blocks=True,
                             extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        specials = {k: _token_text(self._config.get(k))
                    for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
        try:
            with _deadline(MAX_RENDER_SECONDS, where):
                chunks, n = [], 0
                for c in env.from_string(self.chat_template).generate(
                        messages=messages, add_generation_prompt=add_generation_prompt,
                        enable_thinking=enable_thinking, **specials):
                    n += len(c)
                    if n > MAX_RENDERED_CHARS:
                        raise UserError(f"{where}: the rendered prompt passes "
                                        f"{MAX_RENDERED_CHARS:,} characters; the template runs "
                                        "away (check its loops)")
                    chunks.append(c)
                return "".join(chunks)
        except UserError:
            raise
        except jinja2.TemplateError as e:
            raise UserError(f"{where}: {e}") from None
        except (Exception, RecursionError, MemoryError) as e:   # {{1/0}}, {{'a'+1}}, include …
            raise UserError(f"{where} fails while rendering: {type(e).__name__}: {e}") from None


class _Overtime(Exception):
    pass


@contextlib.contextmanager
def _deadline(seconds: float, where: str):
    """A UserError if the block runs longer than ``seconds`` (SIGALRM's real-time timer; on the
    main thread only, where Python can deliver it: elsewhere the block runs unbounded)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or not hasattr(signal,
                                                                                 "setitimer"):
        yield
        return

    def overtime(signum, frame):
        raise _Overtime()

    old = signal.signal(signal.SIGALRM, overtime)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except _Overtime:
        raise UserError(f"{where}: rendering took over {seconds:g} s; the template runs away "
                        "(check its loops)") from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _bounded_env():
    """jinja2's ImmutableSandboxedEnvironment with * and ** bounded (MAX_REPEAT, MAX_EXPONENT):
    the sandbox already bounds range() and blocks attribute escapes, not a huge repeat."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

    class Env(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+"})

        def call_binop(self, context, operator, left, right):
            if operator == "**" and isinstance(right, (int, float)) and abs(right) > MAX_EXPONENT:
                raise SecurityError(f"exponent {right} is over {MAX_EXPONENT}")
            if operator == "*":
                for seq, k in ((left, right), (right, left)):
                    if (isinstance(seq, (str, list, tuple)) and isinstance(k, int)
                            and len(seq) * k > MAX_REPEAT):
                        raise SecurityError(f"a repeat of {len(seq) * k:,} items is over "
                                            f"{MAX_REPEAT:,}")
            if (operator == "+" and isinstance(left, (str, list, tuple))
                    and isinstance(right, (str, list, tuple))
                    and len(left) + len(right) > MAX_RENDERED_CHARS):
                raise SecurityError(f"a sum of {len(left) + len(right):,} items is over "
                                    f"{MAX_RENDERED_CHARS:,}")
            return super().call_binop(context, operator, left, right)

    return Env


def _chat_template(d: Path, config: dict) -> tuple[str | None, Path | None]:
    """(the template, the file it is in)."""
    t = config.get("chat_template")
    if isinstance(t, list):   # [{"name": "default", "template": ...}, ...]
        named = {x.get("name"): x.get("template") for x in t if isinstance(x, dict)}
        t = named.get("default")
    if isinstance(t, str):
        return t, d / "tokenizer_config.json"
    f = d / "chat_template.jinja"
    if not f.is_file():
        return None, None
    try:
        return f.read_text(encoding="utf-8"), f
    except UnicodeDecodeError as e:
        raise UserError(f"chat template {str(f)!r} is not UTF-8 text ({e.reason} at byte "
                        f"{e.start})") from None
    except OSError as e:
        raise UserError(f"chat template {str(f)!r} cannot be read: {e.strerror or e}") from None


def load_tokenizer(model_dir: Path) -> Tokenizer | None:
    """The tokenizer of ``model_dir``, or None when it has no tokenizer.json."""
    d = Path(model_dir)
    if not (d / "tokenizer.json").is_file():
        return None
    try:
        import jinja2  # noqa: F401
        from tokenizers import Tokenizer as Backend
    except ImportError:
        raise UserError(f"reading {str(d / 'tokenizer.json')!r} needs the tokenizers and jinja2 "
                        f"packages: {INSTALL}") from None
    try:
        backend = Backend.from_file(str(d / "tokenizer.json"))
    except Exception as e:  # tokenizers raises a plain Exception on a malformed file
        raise UserError(f"cannot read {str(d / 'tokenizer.json')!r}: {e}") from None
    config = _read_json(d / "tokenizer_config.json")
    gen = _read_json(d / "generation_config.json")
    eos = gen.get("eos_token_id")
    if eos is None:
        text = _token_text(config.get("eos_token"))
        tid = backend.token_to_id(text) if text is not None else None
        eos = [] if tid is None else [tid]
    eos = [eos] if isinstance(eos, int) else eos
    if not isinstance(eos, list) or not all(isinstance(i, int) and not isinstance(i, bool)
                                            for i in eos):
        raise UserError(f"{str(d / 'generation_config.json')!r}: eos_token_id {eos!r} must be "
                        "an id or a list of ids")
    template, template_file = _chat_template(d, config)
    return Tokenizer(d, backend, config, template, tuple(eos), template_file)
