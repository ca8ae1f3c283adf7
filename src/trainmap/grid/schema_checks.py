"""The schema layer of the config check: the JSON schema (``workflow/schemas/config.schema.yaml``)
checks types and ranges and refuses unknown keys at every level, its errors formatted with the key
and a "did you mean"; NaN and infinity are refused, and so are task keys no ``data`` entry
defines."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import jsonschema

from trainmap.errors import ConfigError, did_you_mean, key_path
from trainmap.schema import schema_name, schema_validator

REPO_ROOT = Path(__file__).resolve().parents[3]


def validate_schema(config: dict) -> None:
    """Check ``config`` against the JSON schema (``workflow/schemas/config.schema.yaml``).

    Raises :class:`ConfigError` whose first line leads with ``config key <path>:`` and names the bad
    value and what is allowed. Unknown top-level keys are reported first, then keys naming a task
    that ``data`` does not define (``train.digitz``), then the remaining errors in key order.
    """
    errors = sorted(schema_validator().iter_errors(config), key=_error_order)
    if errors and not errors[0].absolute_path:
        raise ConfigError(_schema_message(errors[0]))
    _refuse_non_finite(config, [])
    _check_task_names(config)
    if errors:
        raise ConfigError(_schema_message(errors[0]))


#: Training settings a stage that does not train refuses with a pointer to ``train.<task>``.
_TRAINING_ONLY = ("augment", "param_groups")

#: At one key, an unknown key is reported before a missing one (``grdi:`` is why ``grid`` is
#: missing), and both before a bad value.
_ERROR_RANK = {"additionalProperties": 0, "required": 1}


def _refuse_non_finite(value: Any, path: list) -> None:
    """NaN and infinity anywhere in the config (``.nan``, ``.inf`` in YAML): every range check
    compares false with NaN, so they would pass and reach the arithmetic."""
    if isinstance(value, float) and not math.isfinite(value):
        hint = ""
        if path and path[-1] == "grad_clip" and value > 0:
            hint = "; for no gradient clipping write grad_clip: null"
        raise ConfigError(
            f"config key {key_path(path)}: {value!r} is not a finite number; allowed: a finite "
            f"number within the key's range{hint}"
        )
    if isinstance(value, dict):
        for key, item in value.items():
            _refuse_non_finite(item, [*path, key])
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _refuse_non_finite(item, [*path, index])


def _error_order(error: jsonschema.ValidationError) -> tuple:
    path = tuple(str(part) for part in error.absolute_path)
    return (path, _ERROR_RANK.get(str(error.validator), 2))


def _schema_message(error: jsonschema.ValidationError) -> str:
    path = list(error.absolute_path)
    source = f" (schema: {schema_name()})"
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = sorted(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - set(allowed), key=str)
        level = "top-level key" if not path else "key"
        inside = f" in {key_path(path)}" if path else ""
        hint = ""
        if unknown[0] in _TRAINING_ONLY and path:  # a training setting under a stage that does not
            hint = (f"; {unknown[0]} is a training setting: set it in train.<task> (the method "
                    "stages that draw training batches, GradInit and AST's retraining, take it "
                    "from there)")  # fmt: skip
        return (
            f"config key {key_path([*path, unknown[0]])}: unknown {level} {unknown[0]!r}{inside}; "
            f"allowed: {', '.join(allowed)}{did_you_mean(str(unknown[0]), allowed)}{hint}{source}"
        )
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [key for key in error.validator_value if key not in error.instance]
        return (
            f"config key {key_path([*path, missing[0]])}: missing; {key_path(path) or 'the top level'} "
            f"requires {', '.join(map(repr, missing))}{source}"
        )
    if error.validator == "anyOf" and error.context:
        return _alternative_message(error)
    if error.validator == "oneOf" and _required_choices(error) and isinstance(error.instance, dict):
        choices = _required_choices(error)
        given = [key for key in choices if key in error.instance]
        said = "neither" if not given else "both " + " and ".join(given)
        return (f"config key {key_path(path)}: give exactly one of {', '.join(choices)} (it has "
                f"{said}){source}")  # fmt: skip
    message = f"config key {key_path(path) or '(top level)'}: {error.message}"
    if error.validator == "type" and isinstance(error.instance, str) and _is_number(error.instance):
        message += (
            f" (YAML read {error.instance!r} as text: write numbers without quotes, and an exponent "
            "with a decimal point and a sign, e.g. 1.0e-3 or 0.001)"
        )
    if error.validator == "pattern" and "description" in error.schema:
        message += f"; allowed: {error.schema['description']}"
    if error.validator == "maximum" and "description" in error.schema:  # a bound says its reason
        message += f" ({error.schema['description']})"
    return message + source


def _required_choices(error: jsonschema.ValidationError) -> list[str]:
    """The keys of a ``oneOf`` whose options each require one key (``runs`` or ``hub``); empty
    for any other ``oneOf``."""
    options = error.validator_value
    keys = [option.get("required") for option in options if isinstance(option, dict)]
    if len(keys) != len(options) or any(not k or len(k) != 1 for k in keys):
        return []
    return [k[0] for k in keys]


def _alternative_message(error: jsonschema.ValidationError) -> str:
    """A value that fits none of a key's forms (a number, or a list of numbers one per seed): the
    problem with the form it was written in, and the other form named."""
    kinds = [choice.get("type") for choice in error.validator_value]
    written = "array" if isinstance(error.instance, list) else None
    chosen = kinds.index(written) if written in kinds else next(
        (index for index, kind in enumerate(kinds) if kind != "array"), 0)  # fmt: skip
    inner = [e for e in error.context if e.schema_path and e.schema_path[0] == chosen]
    message = _schema_message(min(inner, key=_error_order) if inner else error.context[0])
    if "array" in kinds and written is None:
        text, _, source = message.rpartition(" (schema: ")
        message = (f"{text}; or a list of such values, one per seed (seed s takes position s mod "
                   f"the list's length) (schema: {source}")  # fmt: skip
    return message


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


#: Sections keyed by task; a task is defined by its ``data`` entry.
TASK_SECTIONS = ("model", "train", "evaluate", "gradinit", "sparse")


def _check_task_names(config: dict) -> None:
    """A task key that ``data`` does not define is a typo (``train.digitz``): its settings would
    never be used, so the study would silently run with the defaults."""
    data = config.get("data")
    if not isinstance(data, dict):
        return
    for section in TASK_SECTIONS:
        settings = config.get(section)
        for task in settings if isinstance(settings, dict) else ():
            if task not in data:
                raise ConfigError(
                    f"config key {section}.{task}: unknown task {task!r} (no data.{task} defines "
                    f"it); tasks: {', '.join(sorted(data))}{did_you_mean(str(task), data)}"
                )
