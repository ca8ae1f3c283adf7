"""A broad probe, kept as a test: every number of the merged configuration replaced by a
value no setting takes (NaN, +-infinity, text, a boolean, a list) must be refused before any job,
the message's first line leading with that key (or, inside a model option's list, with the
option's key and its name). The documented exceptions: ``grad_clip: null`` (no clipping) and the
others in :data:`ALLOWED`, and a list for a per-seed training setting (one value per seed)."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from trainmap.grid import ConfigError, check_config, load_config, validate_schema
from trainmap.training.config import PER_SEED

BAD_VALUES = [float("nan"), float("inf"), float("-inf"), "text", True, None, [1]]
#: (key, value) pairs that are valid settings although they replace a number.
ALLOWED = {("grad_clip", None), ("srste_t0", None), ("n_train", None), ("half_size", None)}
# a per-seed setting's list (train.<task>.lr: [1]); momentum's [1] is still out of its range
ALLOWED |= {(key, repr([1])) for key in PER_SEED if key != "momentum"}


def numbers(value: Any, path: list) -> Iterator[tuple[list, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield from numbers(item, [*path, key])
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from numbers(item, [*path, index])
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield path, value


def dotted(path: list) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def names_the_key(first_line: str, path: list) -> bool:
    """The line leads with the key (or the element of the list written there), or (an element of a
    model option's list) with the option's mapping and then names the option."""
    if first_line.startswith((f"config key {dotted(path)}:", f"config key {dotted(path)}[")):
        return True  # the key, or the element of its list (a per-seed setting's) that is wrong
    option = next((p for p in reversed(path) if isinstance(p, str)), "")
    parent = path[: path.index(option)]
    return first_line.startswith(f"config key {dotted(parent)}:") and f"'{option}'" in first_line


@pytest.mark.slow  # in-process, seconds
def test_every_number_replaced_by_a_bad_value_is_refused_naming_its_key(repo_root: Path) -> None:
    base = load_config(repo_root / "params.yaml", repo_root / "config/config.yaml",
                       repo_root / "config/smoke.yaml", check_paths_from=repo_root)  # fmt: skip
    accepted, misnamed, right = [], [], 0
    for path, _ in numbers(base, []):
        for bad in BAD_VALUES:
            if (path[-1], bad if bad is None else repr(bad)) in ALLOWED:
                continue
            config = copy.deepcopy(base)
            target = config
            for part in path[:-1]:
                target = target[part]
            target[path[-1]] = bad
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    validate_schema(config)
                    check_config(config, base_dir=repo_root)
            except ConfigError as error:
                first = str(error).splitlines()[0]
                if names_the_key(first, path):
                    right += 1
                else:
                    misnamed.append((dotted(path), bad, first))
                continue
            accepted.append((dotted(path), bad))
    assert right > 1000, right  # the probe reaches every number of the study's settings
    assert not accepted, f"wrongly accepted: {accepted}"
    assert not misnamed, f"refused naming another key: {misnamed}"


@pytest.mark.parametrize("name", ["config.yaml", "smoke.yaml", "larger.yaml", "ablations.yaml",
                                  "paper/cpu.yaml", "paper/sparse_parities.yaml",
                                  "paper/modular_addition_stabilised.yaml", "paper/mnist_5k.yaml",
                                  "paper/modular_addition.yaml"])  # fmt: skip
def test_every_shipped_config_is_accepted(repo_root: Path, name: str) -> None:
    """No wrong rejection of the study's own settings (paper.yaml, paper/mnist.yaml and
    paper/cifar100*.yaml need the MNIST and CIFAR files)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        load_config(repo_root / "params.yaml", repo_root / "config/config.yaml",
                    repo_root / "config" / name, check_paths_from=repo_root)  # fmt: skip
