"""Typed reads of an HF config.json's keys, for config.ModelConfig.from_hf_dict."""

from __future__ import annotations

import json
import math

from .errors import UserError


class HfFields:
    """Typed reads of an HF config's keys: a wrong type or range is a UserError naming the key,
    the value as JSON and what is expected; a missing key without a default names the key."""

    _MISSING = object()

    def __init__(self, d: dict, name: str, prefix: str = ""):
        self.d, self.name, self.prefix = d, name, prefix

    def wrong(self, key: str, v, expected: str) -> UserError:
        shown = json.dumps(v, default=str)
        return UserError(f"config {self.name!r}: {self.prefix}{key} is {shown}; "
                         f"expected {expected}")

    def _get(self, key, default):
        if key in self.d:
            return self.d[key]
        if default is self._MISSING:
            raise UserError(f"config {self.name!r}: missing key {self.prefix + key!r} in the "
                            "text config")
        return default

    # Every size the kernels index is an int32; a larger one is a typo, not a model (and a list
    # built from it would take the machine's memory).
    MOST = 2**31 - 1

    def integer(self, key: str, default=_MISSING, least: int = 1, most: int = MOST) -> int:
        v = self._get(key, default)
        if not isinstance(v, int) or isinstance(v, bool) or v < least:
            raise self.wrong(key, v, "a positive integer" if least == 1
                             else f"an integer ≥ {least}")
        if v > most:
            raise self.wrong(key, v, f"an integer ≤ {most}")
        return v

    def number(self, key: str, default=_MISSING) -> float:
        v = self._get(key, default)
        if (not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v)
                or v <= 0):
            raise self.wrong(key, v, "a positive number")
        return float(v)

    def flag(self, key: str, default=_MISSING) -> bool:
        v = self._get(key, default)
        if not isinstance(v, bool):
            raise self.wrong(key, v, "true or false")
        return v

    def int_list(self, key: str) -> list[int]:
        v = self._get(key, self._MISSING)
        if not (isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool)
                                            and x >= 0 for x in v)):
            raise self.wrong(key, v, "a list of non-negative integers")
        return v

    def token_id(self, key: str) -> int | None:
        v = self.d.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise self.wrong(key, v, "a token id (an integer ≥ 0) or null")
        return v
