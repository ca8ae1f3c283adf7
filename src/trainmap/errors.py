"""Configuration errors: the message's first line leads with ``config key <path>:`` (or ``config
file <path>, line N:``), names the bad value and what is allowed."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


class ConfigError(ValueError):
    """A configuration value that cannot run; the message names key, value and the fix."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the choice closest to ``word`` (difflib), or ``""``."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def key_path(path: Any) -> str:
    """``train.digits.lr``, ``grid[0].seeds``: a config key written as the messages write it."""
    parts = []
    for part in path:
        parts.append(f"[{part}]" if isinstance(part, int) else f".{part}")
    return "".join(parts).lstrip(".")
