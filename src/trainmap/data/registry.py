"""The data-kind registry: each kind's one declaration (:class:`DataKind`) and the lookups by name.

A kind declares how its data is made, what it feeds a model (known from its options without the
data) and, for a kind that reads local files, what its ``path`` option names and the checks the
config check runs on those files before any job. The built-in kinds register themselves in their
modules (:mod:`~trainmap.data.generated`, :mod:`~trainmap.data.packaged`,
:mod:`~trainmap.data.mnist`, :mod:`~trainmap.data.cifar`, :mod:`~trainmap.data.arrays`) with the
:func:`register_data_kind` that a plugin calls, so a plugin's kind is checked exactly as a built-in.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainmap.data.task import TaskData
from trainmap.registry import Registry, caller_module

#: Marks an option with no default in :func:`data_kind_options` (a reader's ``path``).
REQUIRED_OPTION = inspect.Parameter.empty

#: What a kind's inputs are: float vectors, float images (C, H, W) or int64 token ids.
INPUT_KIND_CHOICES = ("vector", "image", "tokens")
#: What a reader kind's ``path`` option names.
PATH_CHOICES = ("directory", "file")


@dataclass(frozen=True)
class DataKind:
    """A registered data kind: how its data is made, what it feeds a model, and its files.

    ``make(**options) -> TaskData``: its keyword parameters are the kind's options (defaults from
    the signature; one without a default is required). ``input_kind``: ``"vector"``, ``"image"`` or
    ``"tokens"``, or None when the options decide (``model_meta`` then says it).
    ``model_meta(options)`` -> ``input_shape``, ``num_classes`` (and ``vocab_size``), from the
    options alone (every option present, defaults filled in), without building or reading the data.

    A kind that reads local files names in ``reads`` what its ``path`` option is (``"directory"``
    or ``"file"``); the config check then refuses a grid task whose path is absent, or not a
    directory (a file), before any job. It may add two checks on the existing ``path``:
    ``missing_files(path)``, the names of the files it needs that ``path`` lacks, and
    ``damaged_files(path)``, ``(file, what is wrong)`` for each present file that cannot be the one
    it reads (a cheap look at headers and lengths: it runs on every config check).
    """

    name: str
    make: Callable[..., TaskData]
    input_kind: str | None
    model_meta: Callable[[Mapping[str, Any]], dict[str, Any]]
    reads: str | None = None
    missing_files: Callable[[Path], list[str]] | None = None
    damaged_files: Callable[[Path], list[tuple[str, str]]] | None = None


#: The registered data kinds by name, each with the module that registered it.
DATA_KINDS: Registry[DataKind] = Registry("data kind")


def register_data_kind(
    name: str,
    function: Callable[..., TaskData],
    input_kind: str | None,
    model_meta: Callable[[Mapping[str, Any]], dict[str, Any]],
    *,
    reads: str | None = None,
    missing_files: Callable[[Path], list[str]] | None = None,
    damaged_files: Callable[[Path], list[tuple[str, str]]] | None = None,
) -> Callable[..., TaskData]:
    """Add data kind ``name`` (a built-in's, a user's or a plugin's) as the :class:`DataKind` of
    these fields, ``function`` making its data; returns ``function``.

    A name may be registered once: a second registration is an error naming both modules. A kind
    that declares file checks must say what its ``path`` is (``reads``) and take a ``path``
    option."""
    if input_kind is not None and input_kind not in INPUT_KIND_CHOICES:
        raise ValueError(
            f"data kind {name!r}: unknown input kind {input_kind!r}; known: "
            f"{', '.join(sorted(INPUT_KIND_CHOICES))}"
        )
    if reads is not None and reads not in PATH_CHOICES:
        raise ValueError(
            f"data kind {name!r}: reads={reads!r}; allowed: {', '.join(PATH_CHOICES)} (what its "
            "path option names), or None for a kind that reads no files"
        )
    if reads is None and (missing_files or damaged_files):
        raise ValueError(
            f"data kind {name!r} declares file checks but reads no files; give reads='directory' "
            "or reads='file' (what its path option names)"
        )
    if reads is not None and "path" not in inspect.signature(function).parameters:
        raise ValueError(f"data kind {name!r} reads a {reads}, but its function takes no 'path'")
    spec = DataKind(name, function, input_kind, model_meta, reads, missing_files, damaged_files)
    DATA_KINDS.register(name, spec, caller_module())
    return function


def data_kind(kind: str) -> DataKind:
    """The :class:`DataKind` registered as ``kind``; a ValueError naming the known kinds."""
    return DATA_KINDS.lookup(kind)


def data_kind_options(kind: str) -> dict[str, object]:
    """Option names of ``kind`` mapped to their defaults; required ones map to REQUIRED_OPTION."""
    parameters = inspect.signature(data_kind(kind).make).parameters
    return {name: parameter.default for name, parameter in parameters.items()}


def make_task_data(kind: str, options: Mapping[str, object] | None = None) -> TaskData:
    """Build the data of ``kind`` from ``options``, rejecting unknown or missing option names."""
    options = dict(options or {})
    allowed = data_kind_options(kind)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(
            f"unknown option(s) {unknown} for data kind {kind!r}; allowed: {sorted(allowed)}"
        )
    missing = sorted(
        name
        for name, default in allowed.items()
        if default is REQUIRED_OPTION and name not in options
    )
    if missing:
        raise ValueError(f"data kind {kind!r} requires option(s) {missing}")
    return DATA_KINDS[kind].make(**options)


def model_meta(kind: str, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``kind``, ``input_kind``, ``input_shape``, ``num_classes`` (and ``vocab_size`` for tokens)
    of data ``kind`` with ``options`` (omitted options take their defaults), without the data."""
    resolved = {**data_kind_options(kind), **(options or {})}
    resolved.pop("kind", None)
    spec = DATA_KINDS[kind]
    return {"kind": kind, "input_kind": spec.input_kind, **spec.model_meta(resolved)}


def input_kind_of(kind: str, options: Mapping[str, Any] | None = None) -> str:
    """``"vector"``, ``"image"`` or ``"tokens"``: the input kind of data ``kind``; a kind with no
    fixed one (``arrays``: its option, else what the file holds) says it in its ``model_meta``."""
    spec = data_kind(kind)
    if spec.input_kind is not None:
        return spec.input_kind
    return model_meta(kind, options)["input_kind"]


def missing_data_files(kind: str, path: str | os.PathLike) -> list[str]:
    """The files data ``kind`` needs that ``path`` lacks (its ``missing_files``); ``[]`` for a
    kind that declares no such check (the generated kinds)."""
    check = data_kind(kind).missing_files
    return check(Path(path)) if check is not None else []


def damaged_data_files(kind: str, path: str | os.PathLike) -> list[tuple[str, str]]:
    """``(file, what is wrong)`` for each present file of data ``kind`` at ``path`` that cannot be
    the file it reads (its ``damaged_files``); ``[]`` for a kind that declares no such check and
    for absent files (see :func:`missing_data_files`)."""
    check = data_kind(kind).damaged_files
    return check(Path(path)) if check is not None else []
