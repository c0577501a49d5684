"""Errors a user can cause. The CLI prints them on one line and exits with code 2."""

from __future__ import annotations


class UserError(Exception):
    """A mistake in the user's input: a bad option, config, checkpoint, shape or file.

    The message names what is wrong and what would be right. ``field``: the input field it is
    about where there is one (a request field such as ``top_k``), and ``reason`` what is wrong
    with its value; a caller that gave the field under another name (the command line's
    ``--top-k``) can say it in its own words from these two, never by reading the message.
    """

    def __init__(self, message: str = "", field: str | None = None, reason: str | None = None):
        super().__init__(message)
        self.field = field
        self.reason = message if reason is None else reason


def field_error(field: str, reason: str, where: str | None = None) -> UserError:
    """"[WHERE: ]FIELD REASON", carrying the field and the reason."""
    return UserError(f"{where + ': ' if where else ''}{field} {reason}", field=field, reason=reason)


class NonFiniteLogits(RuntimeError):
    """A row of logits a token was to be chosen from holds NaN or ±inf: the program is broken
    (the engine's guard raises it; `run` says it in one line and exits 1)."""
