"""The architecture registry: architectures looked up by name, sized from a data set's metadata.

Every builder has the signature ``builder(meta, **options) -> nn.Module``. ``meta`` describes one
example (``input_kind``, ``input_shape``, ``num_classes`` and, for tokens, ``vocab_size``); the
options are the architecture's sizes and switches, starting from :attr:`ArchSpec.defaults`. Models
take ``(batch, *input_shape)`` inputs (tokens: int64 ``(batch, seq_len)``) and return logits
``(batch, num_classes)``. Builders never seed: the caller seeds torch before :func:`build_model`, so
one seed gives one set of parameters.

A family module (built-in or a user's) registers each of its architectures with one
:func:`register_architecture` call at module level, and checks its options with the public
checkers below (:func:`check_sizes`, :func:`check_positive`, :func:`check_flag`,
:func:`check_same_length`, :func:`image_shape`), so a user's entry is checked as strictly as a
built-in one. This module imports no family.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from trainmap.registry import Registry, caller_module

INPUT_KINDS = frozenset({"vector", "image", "tokens"})


@dataclass(frozen=True)
class ArchSpec:
    """A registered architecture: how to build it, its default options and the inputs it accepts.

    ``check_options`` (optional) receives the full option dict (defaults updated by the caller's
    options) and raises ValueError for values the builder cannot use, so that a configuration is
    rejected before any model is built. ``deploy_form``: a trained model of this architecture is
    re-parameterised into a plain deploy model after training (RepVGG's ``reparam`` rule).
    """

    name: str
    builder: Callable[..., nn.Module]
    defaults: dict
    input_kinds: frozenset[str]
    description: str
    check_options: Callable[[dict], None] | None = None
    deploy_form: bool = False


#: The registered architectures by name, each with the module that registered it.
ARCHITECTURES: Registry[ArchSpec] = Registry("architecture")


def register_architecture(spec: ArchSpec) -> ArchSpec:
    """Add an architecture to the registry (a name may be registered once: a second registration,
    e.g. a plugin reusing a built-in name, is an error naming both modules)."""
    unknown_kinds = spec.input_kinds - INPUT_KINDS
    if unknown_kinds:
        raise ValueError(
            f"architecture {spec.name!r} lists unknown input kinds {sorted(unknown_kinds)}; "
            f"known: {', '.join(sorted(INPUT_KINDS))}"
        )
    return ARCHITECTURES.register(spec.name, spec, caller_module())


def arch_names() -> list[str]:
    """The registered architecture names, sorted."""
    return ARCHITECTURES.names()


def registered_by(arch: str) -> str:
    """The module that registered ``arch`` (a built-in family or a plugin), for error messages."""
    return ARCHITECTURES.source_of(arch)


def check_arch(arch: str, input_kind: str | None = None, options: dict | None = None) -> None:
    """Raise a ValueError unless ``arch`` exists, accepts ``input_kind`` and takes ``options``:
    each a declared option, passing the family's ``check_options`` and of its default's type
    (:func:`option_type_problem`)."""
    spec = ARCHITECTURES.lookup(arch)
    if input_kind is not None and input_kind not in spec.input_kinds:
        raise ValueError(
            f"architecture {arch!r} does not accept input kind {input_kind!r}; "
            f"it accepts: {', '.join(sorted(spec.input_kinds))}"
        )
    options = options or {}
    unknown_keys = sorted(set(options) - set(spec.defaults))
    if unknown_keys:
        raise ValueError(
            f"architecture {arch!r} has no option(s) {', '.join(map(repr, unknown_keys))}; "
            f"allowed options: {', '.join(sorted(spec.defaults)) or 'none'}"
        )
    mistyped = option_type_problem(spec, options)
    if spec.check_options is not None:
        try:
            spec.check_options(_resolve_options(spec, options))
        except ValueError as error:  # the family's own message comes first
            raise ValueError(f"architecture {arch!r}: {error}") from None
        except TypeError:  # a check tripping over a wrong type: say which option
            if mistyped is None:
                raise
    if mistyped is not None:
        raise ValueError(f"architecture {arch!r}: {mistyped}")


def option_type_problem(spec: ArchSpec, options: dict) -> str | None:
    """The first of ``options`` whose value is not of its default's type, described, or None.

    A bool option takes only true or false, an int option only an int (a bool is not one), a
    float option an int or a float, a list option a list or tuple; an option whose default is
    None takes anything (the family checks it)."""
    for name, value in options.items():
        default = spec.defaults[name]
        if default is None:
            continue
        types, expected = _accepted_types(default)
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            return (f"option {name!r}: {value!r} is of type {type(value).__name__}; expected "
                    f"{expected}, as its default {default!r}")  # fmt: skip
    return None


def _accepted_types(default: object) -> tuple[tuple[type, ...], str]:
    """The types an option with ``default`` takes, and their name in a message."""
    if isinstance(default, bool):
        return (bool,), "true or false"
    if isinstance(default, int):
        return (int,), "an int"
    if isinstance(default, float):
        return (int, float), "a number"
    if isinstance(default, list | tuple):
        return (list, tuple), "a list"
    return (type(default),), f"a {type(default).__name__}"


def build_model(arch: str, meta: dict, **options) -> nn.Module:
    """Build ``arch`` for data described by ``meta``; ``options`` override the defaults."""
    check_arch(arch, meta["input_kind"], options)
    spec = ARCHITECTURES[arch]
    return spec.builder(meta, **_resolve_options(spec, options))


def _resolve_options(spec: ArchSpec, options: dict) -> dict:
    # Deep copy: defaults hold lists, and a builder or caller must never mutate the registry.
    resolved = copy.deepcopy(spec.defaults)
    resolved.update(copy.deepcopy(options))
    return resolved


# --- option and metadata checks, for every family's check_options and builder ----------------


def check_sizes(name: str, sizes: Sequence[int], allow_empty: bool = False) -> None:
    """Raise unless ``sizes`` is a list of positive ints (non-empty unless ``allow_empty``)."""
    if not isinstance(sizes, list | tuple):
        raise ValueError(f"option {name!r} must be a list of positive ints, got {sizes!r}")
    if not sizes and not allow_empty:
        raise ValueError(f"option {name!r} must not be empty")
    for size in sizes:
        check_positive(name, size)


def check_positive(name: str, value: int) -> None:
    """Raise unless ``value`` is a positive int (a bool is not one)."""
    # bool is an int subclass; True as a width is a config mistake, not a width of 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"option {name!r}: {value!r} is not a positive int")


def check_flag(name: str, value: bool) -> None:
    """Raise unless ``value`` is a bool."""
    # A YAML "no" that arrives as a string would otherwise be truthy and silently switch a part on.
    if not isinstance(value, bool):
        raise ValueError(f"option {name!r} must be true or false, got {value!r}")


def check_same_length(name: str, sizes: Sequence[int], other_name: str, other: Sequence) -> None:
    """Raise unless two per-stage options have one entry per stage each."""
    if len(sizes) != len(other):
        raise ValueError(
            f"options {name!r} ({len(sizes)} entries) and {other_name!r} ({len(other)} entries) "
            "must have the same length, one entry per stage"
        )


def image_shape(meta: dict) -> tuple[int, int, int]:
    """``(channels, height, width)`` of one image example."""
    shape = list(meta["input_shape"])
    if len(shape) != 3:
        raise ValueError(f"image input_shape must be [channels, height, width], got {shape}")
    channels, height, width = shape
    return channels, height, width


# --- helpers on any built model ---------------------------------------------------------------


def count_parameters(model: nn.Module) -> int:
    """The number of trainable parameters (elements of tensors with ``requires_grad``)."""
    return sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)


@torch.no_grad()
def eval_forward_with_hooks(model: nn.Module, inputs: torch.Tensor, handles: list) -> None:
    """One eval-mode forward pass of ``inputs`` for the hooks behind ``handles`` (e.g. forward
    pre-hooks capturing layer inputs); the hooks are removed and the model's mode is restored,
    also when the pass fails."""
    was_training = model.training
    model.eval()
    try:
        model(inputs)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
