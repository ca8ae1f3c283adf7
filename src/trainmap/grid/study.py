"""Which config files make the study: ``params.yaml``, the default study unless the user's files
bring their own, then the user's files, merged as Snakemake merges them; and the directory the
study writes under (:func:`results_root`). Not validated here (:mod:`trainmap.grid.validate`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from trainmap.grid.files import merge_config, read_config_file
from trainmap.schema import schema_validator

#: The default study's config file, relative to the project.
DEFAULT_STUDY = "config/config.yaml"


def _is_default_study(path: str | os.PathLike) -> bool:
    return Path(path).as_posix().endswith(DEFAULT_STUDY)


def is_own_study(layers: Sequence[tuple[str, dict]]) -> bool:
    """Whether the user's config files ``layers`` (path, contents) are a study of their own: one
    of them sets ``grid`` or ``external:`` and none is :data:`DEFAULT_STUDY` (:func:`own_study`)."""
    if any(_is_default_study(path) for path, _ in layers):
        return False
    return any("grid" in contents or "external" in contents for _, contents in layers)


def study_files(layers: Sequence[tuple[str, dict]]) -> list[str]:
    """The config files a run of the user's files ``layers`` (path, contents; ``--configfile``)
    merges, in order: ``params.yaml``, :data:`DEFAULT_STUDY` unless they are a study of their own
    (:func:`is_own_study`), then the user's files; each once (``--configfile config/config.yaml``
    is the default study itself)."""
    user = [str(path) for path, _ in layers]
    return list(dict.fromkeys(["params.yaml", *([] if is_own_study(layers) else [DEFAULT_STUDY]),
                               *user]))  # fmt: skip


def user_layers(user_files: Sequence[str | os.PathLike]) -> list[tuple[str, dict]]:
    """The user's config files (``--configfile``) as (path, contents), each read once."""
    return [(str(path), read_config_file(path)) for path in user_files]


def own_study(
    config: dict,
    layers: Sequence[tuple[str, dict]],
    base: dict,
    overrides: dict | None = None,
) -> dict:
    """Your config file is your study. ``config`` is merged from ``params.yaml`` (``base``), the
    default study (:data:`DEFAULT_STUDY`), the user's files ``layers`` (path, contents; Snakemake's
    ``--configfile`` files) and ``overrides`` (``--config key=value``). When the user's files bring
    their own grid or ``external:`` run sets, the study is theirs: ``config`` becomes ``base``
    merged with ``layers`` and ``overrides`` alone, so none of the default study's sections apply
    (its grid, joint comparisons, model widths, sparse recipe, quantised methods and analysis
    choices); ``params.yaml``'s hyperparameters and analysis settings do. Such a study has no joint
    comparisons unless a user file sets them, and files with ``external:`` but no ``grid`` run
    those sets alone (no grid). User files with neither (hyperparameter tweaks) change the default
    study. Listing :data:`DEFAULT_STUDY` among the user's files says "start from the default study"
    and keeps it whole. Returns ``config``, changed in place."""
    if not is_own_study(layers):
        return config
    mine = base
    for _, contents in layers:
        mine = merge_config(mine, contents)
    mine = merge_config(mine, overrides or {})
    config.clear()
    config.update(mine)
    config.setdefault("grid", [])
    config.setdefault("analysis", {}).setdefault("joint", [])
    return config


def merged_config(*paths: str | os.PathLike) -> dict:
    """YAML files merged left to right as the workflow merges them: ``params.yaml`` first, then
    :data:`DEFAULT_STUDY` (when second), then the user's files, which make a study of their own
    when they bring a grid or external run sets (:func:`own_study`). Not validated."""
    config: dict = {}
    base: dict = {}
    layers = []
    for index, path in enumerate(paths):
        contents = read_config_file(path)
        config = merge_config(config, contents)
        if index == 0:
            base = contents
        elif not (index == 1 and _is_default_study(path)):
            layers.append((str(path), contents))
    return own_study(config, layers, base=base)


def results_root(config: dict) -> str:
    """The directory every rule of ``config`` writes under: config key ``results``, else the
    schema's default (``results``). The one place a rule path's root is read; the workflow's rules,
    its unfinished-block scan and the Makefile's digest check all ask it."""
    default = schema_validator().schema["properties"]["results"]["default"]
    return config.get("results", default)
