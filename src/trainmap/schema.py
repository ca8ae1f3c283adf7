"""The config schema, ``workflow/schemas/config.schema.yaml``: the one declaration of each setting's
type, allowed values and default.

:func:`schema_validator` checks a whole config (:func:`trainmap.grid.validate_schema` formats its
errors). The code that completes one section of settings with defaults reads them here instead of
repeating them: :func:`section_defaults` builds ``DEFAULT_SETTINGS`` of
:mod:`trainmap.methods.sparse` and :mod:`trainmap.methods.gradinit`, ``ANALYSIS_DEFAULTS`` of
:mod:`trainmap.dynamics.maps.settings`, ``TRAIN_DEFAULTS`` of :mod:`trainmap.training.config`
(``TrainConfig``'s and, nested, ``ArchivePolicy``'s) and ``EVALUATE_DEFAULTS`` of
:mod:`trainmap.evaluation`; :func:`check_section` refuses a value the section's schema
refuses, so Python keeps only the checks that relate one setting to another (``n < m``).

A module of its own, outside :mod:`trainmap.grid` (whose package imports the model registry and
torch), because the analysis reads its defaults without torch. It imports PyYAML and, when a value
is checked, jsonschema.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    import jsonschema

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The config schema: the checkout's (the workflow validates against it), else the copy an
#: installed wheel carries inside the package (pyproject.toml: force-include).
SCHEMA_NAME = "config.schema.yaml"
_CHECKOUT_SCHEMA = REPO_ROOT / "workflow" / "schemas" / SCHEMA_NAME
SCHEMA_PATH = (_CHECKOUT_SCHEMA if _CHECKOUT_SCHEMA.is_file()
               else Path(__file__).resolve().parent / "schemas" / SCHEMA_NAME)  # fmt: skip


@functools.cache
def config_schema() -> dict[str, Any]:
    """The parsed schema (read once per process; treat it as read-only)."""
    return yaml.load(SCHEMA_PATH.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def _whole_number(checker: Any, instance: Any) -> bool:
    # JSON schema's "integer" accepts 2.0; a seed "2.0" or `steps: 100.0` breaks later (a cell
    # seed2.0 no rule matches, range() of a float), so an integer here has no decimal point.
    return isinstance(instance, int) and not isinstance(instance, bool)


@functools.cache
def schema_validator() -> jsonschema.protocols.Validator:
    """A validator of a whole config against the schema (draft 2020-12, with an ``integer`` that
    refuses ``2.0`` and ``true``)."""
    import jsonschema

    draft = jsonschema.Draft202012Validator
    validator = jsonschema.validators.extend(
        draft, type_checker=draft.TYPE_CHECKER.redefine("integer", _whole_number)
    )
    return validator(config_schema())


def section_schema(section: str) -> dict[str, Any]:
    """The schema of config section ``section``: ``analysis`` as it is; a section keyed by task
    (``sparse``, ``gradinit``) as one task's entry (``$defs/sparse_settings``)."""
    node = config_schema()["properties"][section]
    entry = node.get("additionalProperties")
    if "properties" not in node and isinstance(entry, dict) and "$ref" in entry:
        node = _resolve(entry["$ref"])
    elif "properties" not in node and isinstance(entry, dict) and "properties" in entry:
        node = entry  # a section keyed by task whose entry is written out in place (evaluate)
    return node


def _resolve(ref: str) -> dict[str, Any]:
    node: Any = config_schema()
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


def section_defaults(section: str, *keys: str) -> dict[str, Any]:
    """``{key: default}`` of every setting of ``section`` the schema gives a default, in the
    schema's order (a fresh copy: changing it changes nothing else); with ``keys``, of the mapping
    setting they lead to inside it (``section_defaults("train", "archive")``)."""
    node = section_schema(section)
    for key in keys:
        node = node["properties"][key]
    return {key: copy.deepcopy(spec["default"]) for key, spec in node["properties"].items()
            if "default" in spec}  # fmt: skip


def defaults_at(*keys: str) -> dict[str, Any]:
    """``{key: default}`` of the object the schema declares at ``keys``, property names from the
    top level, an array's items followed (``defaults_at("external", "hub")``: a suite's)."""
    node = config_schema()
    for key in keys:
        node = node["properties"][key]
        node = node.get("items", node)
    return {key: copy.deepcopy(spec["default"]) for key, spec in node["properties"].items()
            if "default" in spec}  # fmt: skip


#: Analysis settings that only a value of another setting reads: key -> (that setting, the values
#: under which the key is read). Elsewhere the key is left out of the settings the jobs receive
#: and record (their params and hashes: :func:`without_unread_keys`), so a study that ran before
#: the key existed, or that does not use it, stays up to date.
READ_ONLY_WITH = {"degrees_of_freedom": ("emission", ("student_t",))}


def without_unread_keys(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` (an ``analysis`` mapping) without the keys of :data:`READ_ONLY_WITH` whose
    setting (as given, else its schema default) does not read them."""
    defaults = section_defaults("analysis")
    return {key: value for key, value in settings.items()
            if key not in READ_ONLY_WITH
            or settings.get(READ_ONLY_WITH[key][0], defaults.get(READ_ONLY_WITH[key][0]))
            in READ_ONLY_WITH[key][1]}  # fmt: skip


def section_choices(section: str) -> dict[str, tuple[Any, ...]]:
    """``{key: allowed values}`` of every setting of ``section`` the schema lists values for
    (``enum``)."""
    properties = section_schema(section)["properties"]
    return {key: tuple(spec["enum"]) for key, spec in properties.items() if "enum" in spec}


def check_section(section: str, settings: Mapping[str, Any], what: str) -> None:
    """Raise ValueError when ``settings`` do not fit the schema of ``section``: an unknown key
    (``unknown <what> settings [...]; allowed: [...]``), or a value of the wrong type, out of range,
    not finite or not among the allowed values (``<key>: <value> is not allowed; allowed: ...``).
    The message names the schema file, where the allowed values are declared."""
    properties = section_schema(section)["properties"]
    unknown = sorted(set(settings) - set(properties), key=str)
    if unknown:
        raise ValueError(f"unknown {what} settings {unknown}; allowed: {sorted(properties)}")
    _refuse_non_finite(settings, [])
    validator = schema_validator().evolve(schema=section_schema(section))
    errors = sorted(validator.iter_errors(dict(settings)), key=_error_order)
    if errors:
        raise ValueError(_message(errors[0]))


def _error_order(error: jsonschema.ValidationError) -> tuple:
    rank = {"additionalProperties": 0, "required": 1}.get(str(error.validator), 2)
    return (tuple(str(part) for part in error.absolute_path), rank)


def _source() -> str:
    return f" (schema: {schema_name()})"


def schema_name() -> str:
    """The schema's path as messages name it: relative to the checkout, or the installed file."""
    if SCHEMA_PATH.is_relative_to(REPO_ROOT):
        return SCHEMA_PATH.relative_to(REPO_ROOT).as_posix()
    return SCHEMA_PATH.as_posix()


def _message(error: jsonschema.ValidationError) -> str:
    path = list(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed), key=str)
        return (f"{_key_path([*path, extra[0]])}: unknown key {extra[0]!r}; allowed: "
                f"{', '.join(allowed)}{_source()}")  # fmt: skip
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [key for key in error.validator_value if key not in error.instance]
        return f"{_key_path([*path, missing[0]])}: missing{_source()}"
    return (f"{_key_path(path)}: {error.instance!r} is not allowed; allowed: "
            f"{allowed_values(error.schema)}{_source()}")  # fmt: skip


def _key_path(path: Sequence[Any]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text


def _refuse_non_finite(value: Any, path: list) -> None:
    # NaN compares false with every bound, so a range check in the schema would let it pass.
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{_key_path(path)}: {value!r} is not allowed; allowed: a finite number")
    items = value.items() if isinstance(value, Mapping) else (
        enumerate(value) if isinstance(value, list | tuple) else ())  # fmt: skip
    for key, item in items:
        _refuse_non_finite(item, [*path, key])


_TYPE_NAMES = {"integer": "an integer", "number": "a number", "boolean": "true or false",
               "string": "a string", "array": "a list", "object": "a mapping"}  # fmt: skip
_BOUNDS = (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="),
           ("exclusiveMaximum", "<"))  # fmt: skip


def allowed_values(spec: Mapping[str, Any]) -> str:
    """What a schema node ``spec`` allows, in words: ``one of a, b``, ``an integer >= 1 (or
    null)``, ``a number > 0 and <= 1``, ``true or false``."""
    if "enum" in spec:
        return "one of " + ", ".join("null" if v is None else str(v) for v in spec["enum"])
    if "anyOf" in spec:  # a per-seed setting: a number, or a list of them (one per seed)
        words = [
            allowed_values(choice) for choice in spec["anyOf"] if choice.get("type") != "array"
        ]
        if any(choice.get("type") == "array" for choice in spec["anyOf"]):
            words.append("a list of them, one per seed")
        return ", or ".join(words)
    types = spec.get("type", [])
    types = [types] if isinstance(types, str) else list(types)
    text = " or ".join(_TYPE_NAMES[name] for name in types if name != "null") or "a value"
    bounds = [f"{sign} {spec[key]}" for key, sign in _BOUNDS if key in spec]
    if bounds:
        text += " " + " and ".join(bounds)
    if "pattern" in spec:
        text += f" matching {spec['pattern']}"
    return text + (" (or null)" if "null" in types else "")
