"""Named registries: the one table of specs by name that architectures, methods and data kinds share.

Each of :data:`trainmap.models.ARCHITECTURES`, :data:`trainmap.methods.METHODS` and
:data:`trainmap.data.DATA_KINDS` is a :class:`Registry`: read like a dict (``name in registry``,
``registry[name]``, ``sorted(registry)``), added to once per name by a built-in module or a plugin,
which the registry records as the name's source. A second registration of a name and a lookup of an
unknown name raise ValueErrors worded the same way in all three.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

Spec = TypeVar("Spec")


def caller_module(depth: int = 1) -> str:
    """The module ``depth`` frames above the function calling this one (1: that function's
    caller), or ``"?"``: what a ``register_*`` function records as the source of a name."""
    return sys._getframe(depth + 1).f_globals.get("__name__", "?")


def already_registered(what: str, name: str, source: str, again: str) -> str:
    """The one message of a second registration: ``{what} {name!r} is already registered by
    {source}; {again} registers it again (rename one of them)``."""
    return (
        f"{what} {name!r} is already registered by {source}; {again} registers it again "
        "(rename one of them)"
    )


class Registry(Mapping[str, Spec], Generic[Spec]):
    """Specs of one kind of thing (``what``: ``"architecture"``, ``"method"``, ``"data kind"``) by
    name, each name registered once, with the module that registered it."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._specs: dict[str, Spec] = {}
        self._sources: dict[str, str] = {}

    def register(self, name: str, spec: Spec, source: str) -> Spec:
        """Add ``spec`` under ``name``, registered by module ``source``; a name already taken is a
        ValueError naming both modules (:func:`already_registered`). Returns ``spec``."""
        if name in self._specs:
            raise ValueError(already_registered(self.what, name, self.source_of(name), source))
        self._specs[name] = spec
        self._sources[name] = source
        return spec

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a test's or a reloaded plugin's entry); a KeyError if it is absent."""
        del self._specs[name]
        self._sources.pop(name, None)

    def lookup(self, name: str) -> Spec:
        """The spec of ``name``; an unknown name is a ValueError naming the registered ones."""
        if name not in self._specs:
            raise ValueError(f"unknown {self.what} {name!r}; allowed: {', '.join(self.names())}")
        return self._specs[name]

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._specs)

    def source_of(self, name: str) -> str:
        """The module that registered ``name`` (a built-in module or a plugin), or ``"?"``."""
        return self._sources.get(name, "?")

    def copy(self) -> Registry[Spec]:
        """A registry with the same entries and sources that registers apart from this one."""
        copied: Registry[Spec] = Registry(self.what)
        copied._specs = dict(self._specs)
        copied._sources = dict(self._sources)
        return copied

    def __getitem__(self, name: str) -> Spec:
        return self._specs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}: {', '.join(self._specs)})"
