"""The checks of each task's settings sections: ``model.<task>.<arch>`` options and the models
the grid builds (and, for sparse methods, can sparsify), ``train.<task>`` values that must fit
together, the method stages' sections (``gradinit``, ``sparse``: :data:`STAGE_VALIDATORS`) and
``quantize``."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainmap import data as data_module
from trainmap import methods, models
from trainmap.errors import ConfigError, did_you_mean
from trainmap.grid.cells import (
    data_options,
    expand_grid,
    is_sparse,
    model_settings,
    with_train_defaults,
)
from trainmap.schema import section_defaults


def check_model_options(task: str, arch: str, options: dict) -> None:
    """``model.<task>.<arch>``: a known architecture and options its builder takes (every entry,
    in the grid or not: a misspelt architecture's options would otherwise be silently unused)."""
    where = f"config key model.{task}.{arch}"
    if arch not in models.ARCHITECTURES:
        raise ConfigError(
            f"{where}: unknown architecture {arch!r}; allowed: "
            f"{', '.join(sorted(models.ARCHITECTURES))}{did_you_mean(arch, models.ARCHITECTURES)}"
        )
    unknown = sorted(set(options) - set(models.ARCHITECTURES[arch].defaults))
    try:
        models.check_arch(arch, None, options)
    except (ValueError, TypeError) as error:
        hint = did_you_mean(unknown[0], models.ARCHITECTURES[arch].defaults) if unknown else ""
        raise ConfigError(f"{where}: {error}{hint}") from None


def check_train(where: str, settings: dict) -> None:
    """Values of one training mapping (``train.<task>``, ``sparse.<task>.train``) that must fit
    together: a trajectory needs a checkpoint, warm-up must end before training does."""
    if settings["checkpoint_every"] > settings["steps"]:
        raise ConfigError(
            f"config key {where}.checkpoint_every: {settings['checkpoint_every']} exceeds "
            f"{where}.steps = {settings['steps']}; allowed: at most steps (a trajectory needs "
            "checkpoints)"
        )
    from trainmap.dynamics.metrics.columns import METRIC_NAMES
    from trainmap.training.archive import MAX_CHECKPOINTS, n_checkpoints

    steps, every = settings["steps"], settings["checkpoint_every"]
    count = n_checkpoints(steps, every)
    if count > MAX_CHECKPOINTS:  # before anything lists the steps (a typo's 10^9 would not fit)
        least = -(-steps // (MAX_CHECKPOINTS - 2))
        raise ConfigError(
            f"config key {where}.checkpoint_every: {every} with {where}.steps = {steps} plans "
            f"{count:,} checkpoints per run (a metric table of "
            f"{count * len(METRIC_NAMES) * 8 / 1e9:,.1f} GB per "
            f"run before any analysis); allowed: at most {MAX_CHECKPOINTS:,} per run: set "
            f"checkpoint_every to {least} or more, or check steps for a typo"
        )
    import torch

    from trainmap.training.archive import ArchivePolicy

    try:  # a dtype this machine's CUDA device cannot hold, before any job
        policy = ArchivePolicy.from_value(settings.get("archive"))
        device = str(with_train_defaults(settings)["device"])
        if device.startswith("cuda") and torch.cuda.is_available():
            policy.check_device(torch.device(device))
    except ValueError as error:
        raise ConfigError(f"config key {where}.archive: {error}") from None
    from trainmap.training.precision import check_precision
    from trainmap.training.setup import resolve_device

    if device.startswith("cuda") and torch.cuda.is_available():  # more GPUs than this machine has
        try:
            resolve_device(device)
        except ValueError as error:
            raise ConfigError(f"config key {where}.device: {error}") from None

    try:  # tf32 on the CPU; tf32 or bf16 this machine's CUDA device cannot run, before any job
        if not device.startswith("cuda") or torch.cuda.is_available():
            check_precision(str(with_train_defaults(settings)["precision"]), torch.device(device))
    except ValueError as error:
        message = str(error).removeprefix("train.<task>.precision: ")
        raise ConfigError(f"config key {where}.precision: {message}") from None
    from trainmap.training.augment import augmentation

    try:  # a preset and options that fit together (the task's inputs: check_augment)
        augmentation(settings.get("augment"), f"config key {where}.augment")
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if with_train_defaults(settings)["warmup_steps"] >= settings["steps"]:
        raise ConfigError(
            f"config key {where}.warmup_steps: {settings['warmup_steps']} must be below "
            f"{where}.steps = {settings['steps']}"
        )


#: The function that validates (and completes with defaults) each method stage's settings.
STAGE_VALIDATORS = {
    "gradinit": "trainmap.methods.gradinit:check_settings",
    "sparse": "trainmap.methods.sparse:check_settings",
}


def check_stage_settings(config: dict, stage: str, task: str, method: str) -> None:
    """Grid method ``method`` on ``task`` has the settings of its stage ``stage``
    (``<stage>.<task>``); raises :class:`ConfigError` when they are missing."""
    if task not in config.get(stage, {}):
        raise ConfigError(
            f"config key {stage}.{task}: method {method!r} needs {stage} settings for task "
            f"{task!r}; add {stage}.{task} to params.yaml (an empty mapping takes the defaults)"
        )


def validate_stage_settings(config: dict, stage: str, task: str) -> None:
    """``<stage>.<task>`` passes its stage's validator (:data:`STAGE_VALIDATORS`), a sparse start
    is a checkpoint the dense runs keep, and a stage that retrains has training settings that fit
    together (:func:`check_train`); raises :class:`ConfigError` on the first problem."""
    if stage == "sparse":
        start = config[stage][task].get("start", section_defaults("sparse")["start"])
        _check_sparse_start(config, task, start)
    module_name, function_name = STAGE_VALIDATORS[stage].split(":")
    validate = getattr(importlib.import_module(module_name), function_name)
    try:
        resolved = validate(config[stage][task])
    except (ValueError, TypeError) as error:
        raise ConfigError(f"config key {stage}.{task}: {error}") from None
    if "train" in resolved:  # a stage that retrains: its steps and checkpoints fit like train's
        check_train(f"{stage}.{task}.train", with_train_defaults(resolved["train"]))


def _check_sparse_start(config: dict, task: str, start: Any) -> None:
    """``sparse.<task>.start`` is a start; where the grid has sparse cells of ``task``, its step is
    a checkpoint the dense runs record (train.<task>: every ``checkpoint_every`` steps and the
    last), else every sparse job would fail reading it. (A grid without them, such as a smoke
    test's short training, may inherit a start it never uses.)"""
    from trainmap.methods.sparse import start_step

    try:
        step = start_step(start)
    except ValueError as error:
        raise ConfigError(f"config key sparse.{task}.{error}") from None
    if step is None or not any(c.task == task and is_sparse(c) for c in expand_grid(config)):
        return
    train = with_train_defaults(config["train"][task])
    every, steps = train["checkpoint_every"], train["steps"]
    if step > steps or (step % every and step != steps):
        raise ConfigError(
            f"config key sparse.{task}.start.step: {step} is not a checkpoint of the dense runs "
            f"(train.{task}: every {every} steps up to {steps}); allowed: a multiple of {every} "
            f"from 0 to {steps}{'' if steps % every == 0 else f', or {steps}'}"
        )
    from trainmap.training.archive import ArchivePolicy, checkpoint_steps

    policy = ArchivePolicy.from_value(train.get("archive"))
    kept = policy.kept_steps(checkpoint_steps(steps, every))
    if step not in kept:
        raise ConfigError(
            f"config key train.{task}.archive.schedule: {policy.schedule!r} keeps no checkpoint "
            f"at step {step}, where sparse.{task}.start.step starts the sparse runs (it keeps "
            f"{len(kept)} checkpoints{f', {kept[0]} to {kept[-1]}' if kept else ''}); use "
            "schedule: all, an 'every N' whose checkpoints include it, or another start.step"
        )


def check_quantize(config: dict) -> None:
    from trainmap.methods.quantize import SCHEMES

    settings = config.get("quantize", {})
    for position, method in enumerate(settings.get("methods", [])):
        try:
            methods.check_method(method)
        except ValueError as error:
            raise ConfigError(f"config key quantize.methods[{position}]: {error}"
                              f"{did_you_mean(method, methods.METHODS)}") from None  # fmt: skip
    for position, arch in enumerate(settings.get("archs", [])):
        try:
            models.check_arch(arch)
        except ValueError as error:
            raise ConfigError(f"config key quantize.archs[{position}]: {error}"
                              f"{did_you_mean(arch, models.ARCHITECTURES)}") from None  # fmt: skip
    for position, scheme in enumerate(settings.get("schemes", [])):
        if scheme not in SCHEMES:
            raise ConfigError(f"config key quantize.schemes[{position}]: unknown scheme "
                              f"{scheme!r}; allowed: {', '.join(sorted(SCHEMES))}"
                              f"{did_you_mean(scheme, SCHEMES)}")  # fmt: skip


def check_buildable(config: dict, base_dir: Path) -> dict[tuple[str, str], Any]:
    """Each (task, arch) of the grid builds for the task's data (torch seeded, its RNG restored
    after) and gives an ``nn.Module``: a plugin's builder that raises or returns something else is
    refused here, naming the module that registered it, not in the first training job. Returns
    the models, for the checks that look inside them."""
    import torch

    from trainmap.models.registry import registered_by

    pairs = dict.fromkeys((cell.task, cell.arch) for cell in expand_grid(config))
    metas = {task: data_module.model_meta(config["data"][task]["kind"],
                                          data_options(config, task, base_dir))
             for task in dict.fromkeys(task for task, _ in pairs)}  # fmt: skip
    built = {}
    for task, arch in pairs:
        meta = metas[task]
        source = registered_by(arch)
        where = f"config key model.{task}.{arch}: architecture {arch!r} (registered by {source})"
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            try:
                model = models.build_model(arch, meta, **model_settings(config, task, arch))
            except Exception as error:  # a plugin's builder may raise anything
                line = (str(error).strip().splitlines() or [""])[0]
                raise ConfigError(
                    f"{where} failed to build: {type(error).__name__}: {line}; fix the builder "
                    f"in {source} or the options in model.{task}.{arch} (built for {meta})"
                ) from None
        if not isinstance(model, torch.nn.Module):
            kind, name = type(model), type(model).__qualname__
            if kind.__module__ != "builtins":
                name = f"{kind.__module__}.{name}"
            raise ConfigError(f"{where} returned a {name}, not a torch.nn.Module; its builder in "
                              f"{source} must return the model")  # fmt: skip
        built[(task, arch)] = model
    return built


def check_sparsifiable(config: dict, built: Mapping[tuple[str, str], Any]) -> None:
    """Each (task, arch) with a sparse method in the grid has a layer the N:M pattern fits, with
    the configured ``dense_layers`` (else sparse retraining would fail in its first job);
    ``built``: the grid's models (:func:`check_buildable`)."""
    from trainmap.methods import sparse
    from trainmap.methods.sparse_layers import grouped_input_sizes, sparsifiable_layers

    pairs = dict.fromkeys((c.task, c.arch) for c in expand_grid(config) if is_sparse(c))
    for task, arch in pairs:
        cfg = sparse.check_settings(config["sparse"][task])
        model = built[(task, arch)]
        if sparsifiable_layers(model, cfg["m"], cfg["dense_layers"], cfg["conv_groups"]):
            continue
        sizes = list(grouped_input_sizes(model, cfg["conv_groups"]).values())
        where, pattern = f"config key sparse.{task}", f"{cfg['n']}:{cfg['m']}"
        if cfg["dense_layers"] == "first_last" and len(sizes) <= 2:
            raise ConfigError(
                f"{where}.dense_layers: 'first_last' keeps all {len(sizes)} weight layers of "
                f"architecture {arch!r} on task {task!r} dense, so no layer is left to make "
                f"{pattern} sparse; set sparse.{task}.dense_layers: none"
            )
        candidates = sizes[1:-1] if cfg["dense_layers"] == "first_last" else sizes
        raise ConfigError(
            f"{where}.m: the {pattern} pattern fits no layer of architecture {arch!r} on task "
            f"{task!r}: the grouped input sizes of the layers it may sparsify "
            f"(dense_layers: {cfg['dense_layers']}) are {', '.join(map(str, candidates))}, none "
            f"divisible by m = {cfg['m']}; choose an m that divides one of them (e.g. 4)"
        )


def check_augment(config: dict, base_dir: Path, built: Mapping[tuple[str, str], Any]) -> None:
    """Each grid task's batch augmentation (``train.<task>.augment``, and a sparse stage's
    ``sparse.<task>.train.augment``) fits its inputs: an image task, a crop within the padded
    image, a cutout within the image, normalisation statistics per channel
    (:meth:`~trainmap.training.augment.Augmentation.check`); where it changes the image size the
    model sees (a crop smaller than the stored image), each of the task's models (``built``:
    :func:`check_buildable`) takes that size."""
    import torch

    from trainmap.training.augment import augmentation

    for task in dict.fromkeys(cell.task for cell in expand_grid(config)):
        meta = data_module.model_meta(config["data"][task]["kind"],
                                      data_options(config, task, base_dir))  # fmt: skip
        places = [(f"train.{task}.augment", config["train"][task].get("augment"))]
        if any(c.task == task and is_sparse(c) for c in expand_grid(config)):
            retrain = config.get("sparse", {}).get(task, {}).get("train", {})
            if "augment" in retrain:
                places.append((f"sparse.{task}.train.augment", retrain["augment"]))
        for where, settings in places:
            try:
                recipe = augmentation(settings, f"config key {where}")
                if recipe is None:
                    continue
                recipe.check(meta["input_kind"], meta["input_shape"], f"config key {where}")
            except ValueError as error:
                raise ConfigError(str(error)) from None
            shape = recipe.output_shape(meta["input_shape"])
            if shape == list(meta["input_shape"]):
                continue
            for (model_task, arch), model in built.items():
                if model_task != task:
                    continue
                try:
                    with torch.no_grad():
                        model.eval()(torch.zeros(2, *shape))
                except Exception as error:  # a model built for the stored size only
                    line = (str(error).strip().splitlines() or [""])[0]
                    raise ConfigError(
                        f"config key {where}: architecture {arch!r} on task {task!r} does not "
                        f"take the {shape[1]}x{shape[2]} crops the recipe makes of the "
                        f"{meta['input_shape'][1]}x{meta['input_shape'][2]} images "
                        f"({type(error).__name__}: {line}); use an architecture that pools "
                        "globally, or a crop of the stored size"
                    ) from None
