"""Config files read strictly, as Snakemake reads them: a YAML syntax error names the file and line,
a key repeated in one mapping is refused (YAML would keep only its last value), an empty or
non-UTF-8 file is named in one line. Files merge as Snakemake merges ``configfile:`` directives and
``--configfile``: mappings key by key, lists (the grid) replaced whole."""

from __future__ import annotations

import copy
import json
import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from trainmap.errors import ConfigError, key_path


def merge_config(base: dict, override: dict) -> dict:
    """Snakemake's merge: mappings merge recursively, every other value (lists too) is replaced."""
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_config(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


# --- config files -------------------------------------------------------------------------------

#: Snakemake reads YAML config files with PyYAML's FullLoader (through YTE): the same here, so a file
#: is accepted exactly when Snakemake accepts it, in C where PyYAML was built with libyaml.
YAML_LOADER = getattr(yaml, "CFullLoader", yaml.FullLoader)
_YAML_MERGE_TAG = "tag:yaml.org,2002:merge"
_YAML_NULL_TAG = "tag:yaml.org,2002:null"


def read_config_file(path: str | os.PathLike) -> dict:
    """Read a JSON or YAML config file as Snakemake does, but strictly.

    A syntax error names the file and the line; a key repeated in one mapping (YAML would silently
    keep the last value) is refused naming both lines. A file with ``__use_yte__: true`` is
    rendered by YTE like Snakemake does (it runs the file's Python: trust it like a Snakefile).
    """
    text = _read_text(path)
    try:
        data = json.loads(text, object_pairs_hook=lambda pairs: _json_mapping(path, pairs))
    except json.JSONDecodeError:
        data = _read_yaml(path, text)
    if data is None:
        raise ConfigError(_empty_file_message(path))
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {path}: the top level is a {type(data).__name__}, not a mapping of keys "
            "(grid:, train:, ...)"
        )
    if data.get("__use_yte__") is True:
        import yte

        data = yte.process_yaml(text, require_use_yte=True)
    return data


def check_config_files(paths: Iterable[str | os.PathLike]) -> None:
    """:func:`read_config_file` every existing file of ``paths`` (the Snakefile's ``configfile:``
    files and ``--configfile`` ones), so a syntax error or a repeated key stops the workflow naming
    the file and line; missing files are left to Snakemake's own message."""
    for path in paths:
        if os.path.exists(path):
            _check_yaml_or_json(path)


def _check_yaml_or_json(path: str | os.PathLike) -> None:
    text = _read_text(path)
    try:
        data = json.loads(text, object_pairs_hook=lambda pairs: _json_mapping(path, pairs))
    except json.JSONDecodeError:
        data = _read_yaml(path, text, construct=False)
    if data is None:
        raise ConfigError(_empty_file_message(path))


def _read_text(path: str | os.PathLike) -> str:
    """The file's text; a file that is not UTF-8 is refused naming the first bad byte's place."""
    raw = Path(path).read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise ConfigError(
            f"config file {path}, line {line}: not UTF-8 text (byte 0x{raw[error.start]:02x} at "
            f"offset {error.start}); save the file as UTF-8"
        ) from None


def _empty_file_message(path: str | os.PathLike) -> str:
    # Snakemake refuses such a file too ("Config file must be given as JSON or YAML with keys at
    # top level"): one verdict in every entry point.
    return (
        f"config file {path}: empty (no keys, only blank lines or comments); a config file sets "
        "at least one key (e.g. grid:), or leave the file out"
    )


def _json_mapping(path: str | os.PathLike, pairs: list[tuple[str, Any]]) -> dict:
    keys = [key for key, _ in pairs]
    repeated = sorted(key for key, count in Counter(keys).items() if count > 1)
    if repeated:
        raise ConfigError(
            f"config file {path}: duplicate key {repeated[0]!r} in one JSON mapping; JSON would "
            "keep only the last value: each key may appear once per mapping"
        )
    return dict(pairs)


def _read_yaml(path: str | os.PathLike, text: str, construct: bool = True) -> Any:
    loader = YAML_LOADER(text)
    try:
        node = loader.get_single_node()
        if node is None or node.tag == _YAML_NULL_TAG:  # no document, or only "---" / "null"
            return None
        _refuse_duplicate_keys(path, node, ())
        return loader.construct_document(node) if construct else node
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        context = ""
        if error.context and error.context_mark:
            context = f" ({error.context} at line {error.context_mark.line + 1})"
        raise ConfigError(
            f"config file {path}{where}: not valid YAML: {error.problem}{context}"
        ) from None
    except yaml.YAMLError as error:
        raise ConfigError(f"config file {path}: not valid YAML: {error}") from None
    finally:
        loader.dispose()


def _refuse_duplicate_keys(path: str | os.PathLike, node: yaml.Node, where: tuple) -> None:
    """Walk the composed YAML and refuse a key repeated within one mapping (before YAML drops all
    but its last value). YTE's control keys (``?if``, ``?else``, ...) may repeat."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[tuple[str, str], int] = {}
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _YAML_MERGE_TAG:
                key = (key_node.tag, key_node.value)
                line = key_node.start_mark.line + 1
                if key in seen and not key_node.value.startswith("?"):
                    raise ConfigError(
                        f"config key {key_path([*where, key_node.value])} ({path}, line {line}): "
                        f"duplicate key {key_node.value!r}, already set at line {seen[key]}; YAML "
                        "would keep only the last value: each key may appear once per mapping"
                    )
                seen[key] = line
                _refuse_duplicate_keys(path, value_node, (*where, key_node.value))
            else:
                _refuse_duplicate_keys(path, value_node, where)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _refuse_duplicate_keys(path, item, (*where, index))
