"""Damaged reader files: what the reader kinds' structural file checks raise, and how they word it.

A reader kind's ``damaged_files`` check (:class:`trainmap.data.registry.DataKind`) reads only
headers, lengths and trailers (well under a millisecond a file; nothing is decompressed or
unpickled in full), so a truncated, empty or wrong file (an HTML error page saved under the name, a
gzip download cut short) is found when the config is checked instead of when a job reads it.
"""

from __future__ import annotations

GZIP_MAGIC = b"\x1f\x8b"


class DamagedFile(Exception):
    """A data file cannot be the standard file; the message says why, after the file's name."""


def problem_text(error: Exception) -> str:
    """What is wrong with a file, from the :class:`DamagedFile` or OSError a check raised on it."""
    return str(error) if isinstance(error, DamagedFile) else f"cannot be read: {error}"


def content_hint(head: bytes) -> str:
    """What ``head`` looks like, for files that are not what their name says (or ``''``)."""
    if head.startswith(GZIP_MAGIC):
        return " (a gzip file: unpack it)"
    if head.lstrip()[:1] == b"<":
        return " (an HTML or XML page: a saved error page?)"
    return ""
