"""The training loop: one function, read top to bottom (after nanoGPT's ``train.py``).

``train_block`` trains a **block of seeds** of one grid cell family (task, arch, method) at once: S
networks whose state is stacked along a leading seed dimension and run as one vectorised model
(:class:`trainmap.training.seed_block.SeedBlock`: ``torch.func.vmap`` over ``functional_call``). A tiny network is
bound by per-operation overhead, so S seeds cost little more than one. Each seed keeps everything a
run alone has: its own initialisation, its own batch order (its own seeded sampler), its own
BatchNorm statistics, its own gradient clipping (each run's own norm), its own outputs. A single
seed is a block of one (``train_model``), which runs the module itself, without vmap: there is one
loop, and a seed trained in a block equals the same seed trained alone up to floating-point
summation order (tests: float64 to 1e-10, float32 loss curves to 1e-4).

Every ``checkpoint_every`` optimiser steps (step 0 and the last included) the loop takes a
**checkpoint**: it evaluates the test set, records the mean training loss/accuracy since the previous
checkpoint, and hands the block's weights to a :class:`~trainmap.training.record.CheckpointRecorder`,
which computes the 14 weight metrics of every convention from them at once (as Hu et al., "Latent
state models of training dynamics", do inside their training loop), appends them to each run's
``checkpoint_metrics.csv``, and writes the checkpoint to the run's archive when
``train.<task>.archive`` keeps it (:mod:`trainmap.training.archive`). No checkpoint stays in memory.

Resume: every ``resume_every`` steps the whole training state of the block (stacked model and
optimiser state, every seed's batch order, RNG, histories so far and how many rows each metric
table holds: no checkpoint weights and no metric rows) is written atomically to one
resume file (the wall time so far beside it, in its timing sidecar: ``trainmap.io.timing_path``). A
rerun after a kill continues from it and ends with weights bit-identical (CPU) to an uninterrupted
run. The file is removed once the block's outputs are written. A stop request (SIGTERM in a
job process, :mod:`trainmap.stopping`) ends the step in progress as a resume point, saves the
resume file and raises ``JobStopped``: the step loop's one stop point.

Every output is the same bytes when its content is: the summary's wall time and steps/s go to
``train.timing.json`` beside ``train.json`` (``trainmap.io.save_json``), so rerunning a cell rewrites
metric table, archive, model, history and summary byte for byte.

The step makes no round-trip to the host on an accelerator: each epoch's batch indices of every
seed go to the device once (:class:`~trainmap.training.step.BlockBatches`), losses stay there
until a checkpoint, and finiteness is checked at checkpoints and resume points (an interval in
which a seed diverged runs again step by step from a copy kept in memory, so the files are those
of a check at every step, which is what the CPU does, where reading a loss costs nothing).

Divergence, per seed: a seed whose loss turns NaN/inf is recorded as ``diverged`` at that step and
frozen (its weights and statistics stay those of the step it diverged at; it no longer contributes
gradients), while the other seeds of the block go on. Its outputs are still written, so the rest of
the workflow completes and analysis can exclude the run visibly.

Augmentation (``train.<task>.augment``, :mod:`.augment`): each seed's per-example draws are made
per epoch beside its batch order (from a generator of its own, kept in the resume state) and
applied to the gathered batch on the device, outside vmap; evaluation normalises only. uint8
pixels (an image folder's cache) reach the model in [0, 1].

Methods that change training itself (AST's distillation, SR-STE decay and mask refresh) plug in
through :class:`TrainHooks`, called from the places marked ``# hook:`` in the loop; the plain loop
is the hooks' defaults, which do nothing. Hooks see the block's stacked tensors.

Models vmap cannot vectorise (a user's architecture with data-dependent control flow, ``.item()``,
dropout, or state vmap does not see): when the block is built, one trial step compares it with each
seed's own module (:func:`trainmap.training.seed_block.vectorisation_problem`); on a problem the
block's seeds train one after another, each as a block of one (this same loop), with an
:class:`~trainmap.training.seed_block.UnvectorisableWarning` naming the architecture and the
reason. Each seed's files are then those it gives trained alone. A block of one seeds torch's
global RNG from its seed before its first step, so a model that draws random numbers gives the
same run alone and in such a block.

The loop's pieces live beside it, one concern each: :mod:`.hooks` (``TrainHooks``), :mod:`.config`
(``TrainConfig``, ``TrainPaths``), :mod:`.augment` (batch augmentation), :mod:`.param_groups` (the
optimiser's parameter groups), :mod:`.setup` (device, derived seeds, a cell's initial model),
:mod:`.step` (batch order, optimiser, schedule, per-seed loss and clipping), :mod:`.precision`
(the arithmetic: fp32, tf32, bf16 autocast, deterministic kernels), :mod:`.scores` (test
evaluation, running training means), :mod:`.divergence` (per-seed records, frozen seeds) and
:mod:`.resume` (the resume file). This module re-exports their public names:
``from trainmap.training.loop import X`` gives the object its own module defines.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from trainmap.data import TaskData
from trainmap.io import save_json, timing_path, write_atomic
from trainmap.models import count_parameters
from trainmap.stopping import JobStopped, listening, stop_requested
from trainmap.training.augment import Augmentation, evaluation_inputs, recipe_of, to_unit
from trainmap.training.config import TrainConfig, TrainPaths
from trainmap.training.divergence import SeedRecord, freeze, restore_frozen, zero_frozen_grads
from trainmap.training.hooks import BlockCheckpointHook, CheckpointHook, TrainHooks
from trainmap.training.precision import arithmetic, autocast
from trainmap.training.record import CheckpointRecorder
from trainmap.training.resume import load_resume, save_resume, training_state
from trainmap.training.scores import EVAL_BATCH, RunningMeans, evaluate_block, evaluate_split
from trainmap.training.seed_block import SeedBlock, UnvectorisableWarning, vectorisation_problem
from trainmap.training.setup import (
    build_cell_model,
    derive_seed,
    metric_structure,
    on_device,
    resolve_device,
)
from trainmap.training.step import (
    BatchSampler,
    BlockBatches,
    clip_seed_grad_norms,
    lr_factor,
    make_block_optimizer,
    make_optimizer,
    seed_cross_entropy,
)

__all__ = [
    "EVAL_BATCH",
    "HISTORY_COLUMNS",
    "BatchSampler",
    "BlockCheckpointHook",
    "CheckpointHook",
    "RunningMeans",
    "SeedRecord",
    "TrainConfig",
    "TrainHooks",
    "TrainPaths",
    "build_cell_model",
    "clip_seed_grad_norms",
    "derive_seed",
    "evaluate_block",
    "evaluate_split",
    "lr_factor",
    "make_optimizer",
    "metric_structure",
    "on_device",
    "resolve_device",
    "seed_cross_entropy",
    "train_block",
    "train_model",
]

HISTORY_COLUMNS = ["step", "train_loss", "train_acc", "test_loss", "test_acc", "lr"]


def train_model(
    model: nn.Module,
    data: TaskData,
    cfg: TrainConfig,
    seed: int,
    paths: TrainPaths,
    *,
    on_checkpoint: CheckpointHook | None = None,
    progress: bool = True,
    fingerprint: str = "",
    description: str = "train",
    model_info: dict[str, Any] | None = None,
    hooks: TrainHooks | None = None,
) -> dict[str, Any]:
    """Train one seed: :func:`train_block` with a block of one (the module itself, no vmap)."""
    hook = (
        None if on_checkpoint is None else (lambda _, metrics, step: on_checkpoint(metrics, step))
    )
    return train_block(
        [model], data, cfg, [seed], [paths], resume_path=paths.resume, on_checkpoint=hook,
        progress=progress, fingerprint=fingerprint, description=description,
        model_info=[model_info or {}], hooks=hooks,
    )[0]  # fmt: skip


def train_block(
    models: Sequence[nn.Module],
    data: TaskData,
    cfg: TrainConfig,
    seeds: Sequence[int],
    paths: Sequence[TrainPaths],
    *,
    resume_path: Path,
    on_checkpoint: BlockCheckpointHook | None = None,
    progress: bool = True,
    fingerprint: str = "",
    description: str = "train",
    model_info: Sequence[dict[str, Any]] | None = None,
    hooks: TrainHooks | None = None,
    check_every_step: bool | None = None,
) -> list[dict[str, Any]]:
    """Train ``models`` (one per seed of ``seeds``, same architecture) together as one block; write
    each seed's metric table, archive, final model, history and summary to its ``paths``; the
    models end up holding their trained weights. Returns the per-seed summaries.

    ``fingerprint`` identifies the configuration: a resume file written under another fingerprint is
    ignored (and replaced), so a changed config never continues a stale run. ``model_info`` (arch,
    options, data meta; one per seed) is stored beside the final weights so each model can be rebuilt
    from its file; its ``arch``/``meta``/``model_options`` also give the architecture whose layout
    the streamed metrics count (a sparse run's checkpoints hold the dense architecture's entries);
    without them, the first model's. ``hooks`` are a method's additions to the loop (see
    :class:`TrainHooks`).

    A block whose model vmap cannot vectorise (a trial step when the block is built) trains its
    seeds one after another instead, each as a block of one, with an ``UnvectorisableWarning``.

    ``check_every_step``: whether the seeds' losses are read on the host after every step to find
    a divergence (None: on the CPU, where that read costs nothing). Otherwise the losses stay on the
    device and are checked at each checkpoint, resume point and the end; an interval in which a
    seed diverged runs again, step by step, from its start (kept in memory), so the seed is frozen
    at the step it diverged at and every file is what per-step checks give.
    """
    device = resolve_device(cfg.device)
    # listening(): SIGTERM only requests a stop, which the loop's stop point honours
    with arithmetic(cfg.precision, device, cfg.deterministic), listening():
        size = len(models)
        seed_settings = [cfg.seed_settings(seed) for seed in seeds]  # recorded in the summaries
        if size == 1:  # a block of one trains with its seed's values of per-seed settings
            cfg = cfg.for_seed(seeds[0])
        if not (len(seeds) == len(paths) == size):
            raise ValueError(f"a block of {size} models needs as many seeds and paths")
        hooks = hooks or TrainHooks()
        cfg.archive.check_device(device)
        block = SeedBlock(models).to(device)
        data = on_device(data, device)
        recipe = recipe_of(cfg.augment)
        if recipe is not None:
            recipe.check(data.meta.get("input_kind", "image"), list(data.x_train.shape[1:]),
                         "train.<task>.augment")  # fmt: skip
        problem = (
            None if size == 1
            else vectorisation_problem(block, _first_batches(data, cfg, seeds, recipe))
        )  # fmt: skip
        if problem is not None:
            del block  # its stacked copy of the seeds' state: each seed trains from its own model
            return _train_seeds_apart(
                problem, models, data, cfg, seeds, paths, resume_path=resume_path,
                on_checkpoint=on_checkpoint, progress=progress, fingerprint=fingerprint,
                description=description, model_info=model_info, hooks=hooks,
                check_every_step=check_every_step,
            )  # fmt: skip
        if check_every_step is None:
            check_every_step = device.type == "cpu"
        hooks.attach(block)
        seed_configs = [cfg.for_seed(seed) for seed in seeds]  # per-seed settings at their values
        optimizer = make_block_optimizer(block, seed_configs, device)
        base_lrs = [group["lr"] for group in optimizer.param_groups]
        forward_context = autocast(cfg.precision, device)
        lr_varies = cfg.schedule != "constant" or cfg.warmup_steps > 0
        shape = tuple(data.x_train.shape[1:])
        batches = BlockBatches([_sampler(len(data.x_train), cfg, seed, recipe, shape)
                                for seed in seeds], device)  # fmt: skip
        structure = metric_structure(models[0], model_info[0] if model_info else None)
        recorder = CheckpointRecorder(structure, [p.metrics for p in paths],
                                      [p.archive.parent for p in paths], cfg.checkpoint_steps,
                                      cfg.archive)  # fmt: skip
        running = RunningMeans(size)
        records = [SeedRecord() for _ in range(size)]
        start_step, elapsed_before, resumed_from = 0, 0.0, None

        def restore(state: dict[str, Any]) -> None:
            """Continue from a training state (a resume file's, or the one kept in memory)."""
            nonlocal running
            block.load_state(state["block"])
            optimizer.load_state_dict(state["optimizer"])
            batches.load_state_dict(state["samplers"])
            torch.set_rng_state(state["torch_rng"])
            if device.type == "cuda" and state.get("cuda_rng") is not None:
                torch.cuda.set_rng_state_all(state["cuda_rng"])
            running = RunningMeans(**state["running"])
            for record, fields in zip(records, state["records"], strict=True):
                vars(record).update(fields)
            hooks.load_state_dict(state["hooks"])

        saved = load_resume(resume_path, fingerprint)
        if saved is not None and not recorder.load_state_dict(saved["recorder"]):
            saved = None  # a metric table lost rows the resume file counts: start over
        if saved is not None:
            restore(saved)
            start_step = resumed_from = saved["step"]
            elapsed_before = saved["elapsed_s"]  # from the resume file's timing sidecar
        else:
            recorder.start_fresh()
            if size == 1:  # random numbers a model draws (dropout) come from its own seed
                torch.manual_seed(derive_seed(seeds[0], "train"))

        def active_seeds() -> list[int]:
            return [index for index, record in enumerate(records) if record.active]

        def checkpoint(step: int) -> None:
            with forward_context:
                test_losses, test_accs = evaluate_block(
                    block,
                    data.x_test,
                    data.y_test,
                    prepare=evaluation_inputs(recipe, data.x_test.dtype),
                )
            active = active_seeds()
            for index in active:
                train_loss, train_acc = running.pop(index)
                row = {
                    "step": step,
                    "train_loss": train_loss,
                    "train_acc": train_acc,
                    "test_loss": test_losses[index],
                    "test_acc": test_accs[index],
                    "lr": seed_configs[index].lr * lr_factor(step, cfg),  # of the next step
                }
                records[index].history.append(row)
                if on_checkpoint is not None:
                    # lr is logged only when it changes (a constant is a run parameter, not a
                    # metric).
                    logged = {
                        k: v for k, v in row.items() if k != "step" and (k != "lr" or lr_varies)
                    }
                    on_checkpoint(index, logged, step)
            recorder.capture(step, hooks.snapshot(block), active)

        def take_step(check: bool) -> None:
            """One optimiser step of every active seed; with ``check``, a seed whose loss is not
            finite is frozen first (read on the host), else its losses are kept for
            :func:`check_interval`."""
            nonlocal step, active, active_mask
            with forward_context:
                logits, inputs, targets, task_losses = _forward_step(block, batches, data, recipe)
                extra = None
                if hooks.adds_loss:  # hook: e.g. distillation, on (S, B, ...) tensors
                    if size == 1:  # a block of one steps on (B, ...) tensors and a scalar loss
                        logits, inputs, targets = logits[None], inputs[None], targets[None]
                        task_losses = task_losses.reshape(1)
                    extra = hooks.extra_loss(logits, inputs, targets)
            losses = task_losses if extra is None else task_losses + extra
            if check:
                finite = (torch.isfinite(task_losses) & torch.isfinite(losses)).reshape(-1).tolist()
                if not all(finite[index] for index in active):
                    for index in active:
                        if not finite[index]:
                            freeze(records[index], block, index, step)  # diverged here, frozen
                    active = active_seeds()
                    active_mask = _seed_mask(size, active, losses.device)
                    if not active:
                        return
            else:  # kept as they are: no work on the device until the interval is checked
                unchecked.extend([losses.detach()] if extra is None else
                                 [task_losses.detach(), losses.detach()])  # fmt: skip
            optimizer.zero_grad(set_to_none=True)
            if lr_varies:  # the schedule is a function of the step: nothing to save for resume
                for group, base_lr in zip(optimizer.param_groups, base_lrs, strict=True):
                    group["lr"] = base_lr * lr_factor(step, cfg)
            if active_mask is None:  # a block of one's scalar loss is the plain loop's graph
                (losses if losses.dim() == 0 else losses.sum()).backward()
            else:  # frozen seeds add nothing (their NaN must not reach the sum)
                torch.where(active_mask, losses, torch.zeros_like(losses)).sum().backward()
                zero_frozen_grads(block, active_mask)
            if cfg.grad_clip is not None:
                clip_seed_grad_norms(block, cfg.grad_clip)
            hooks.after_backward(step)  # hook: e.g. SR-STE decay of pruned weights
            optimizer.step()
            if active_mask is not None:
                restore_frozen(block, records)
            hooks.after_step(step)  # hook: e.g. N:M mask refresh
            step += 1
            running.add(active, task_losses, logits, targets)

        def kept_state() -> dict[str, Any]:
            """The training state at this step, held in memory: what an interval runs again from."""
            state = training_state(block, optimizer, batches, running, records, hooks, kept=True)
            return {**state, "step": step}

        def check_interval() -> None:
            """If an active seed's loss since the last check was not finite, run the interval
            again from its start, checking every step (one host read per interval)."""
            nonlocal step, active, active_mask
            if check_every_step or not unchecked:
                return
            losses = torch.stack([values.reshape(-1) for values in unchecked])[:, active]
            unchecked.clear()
            if bool(torch.isfinite(losses).all()):
                return
            target, step = step, kept["step"]
            restore(kept)
            active = active_seeds()
            active_mask = None if len(active) == size else _seed_mask(size, active, device)
            while step < target and active:
                take_step(check=True)

        started = time.perf_counter()
        if start_step == 0:
            checkpoint(0)
        block.train()
        bar = tqdm(total=cfg.steps, initial=start_step, desc=description, disable=not progress)
        step = start_step
        active = active_seeds()
        active_mask = None if len(active) == size else _seed_mask(size, active, device)
        unchecked: list[torch.Tensor] = []
        kept = None if check_every_step else kept_state()
        while step < cfg.steps and active:
            # --- the step (every seed of the block at once) --------------------------------------
            take_step(check=check_every_step)
            at_checkpoint = step % cfg.checkpoint_every == 0 or step == cfg.steps
            at_resume = step % cfg.resume_every == 0 and step < cfg.steps
            # --- stop point: SIGTERM asked the job to stop (trainmap.stopping). This step ends as
            # a resume point does (losses checked, checkpoint if due, resume state saved), then
            # JobStopped; a rerun continues from this step, bit-identical. At the last step the
            # run just finishes.
            at_stop = stop_requested() and step < cfg.steps
            if not (at_checkpoint or at_resume or at_stop) and active:
                continue
            check_interval()  # the losses since the last check, before anything is recorded
            if not active:
                break
            # --- checkpointing and resume state -----------------------------------------------
            if at_checkpoint:
                checkpoint(step)
                bar.update(step - bar.n)
                accs = [records[i].history[-1]["test_acc"] for i in active]
                if accs:
                    bar.set_postfix(test_acc=f"{sum(accs) / len(accs):.3f}", refresh=False)
            if at_resume or at_stop:
                elapsed = elapsed_before + time.perf_counter() - started
                save_resume(resume_path, fingerprint, step, block, optimizer, batches,
                            recorder, running, records, hooks, elapsed)  # fmt: skip
            if at_stop:  # the stop point (above): the resume state of this step is saved
                bar.close()
                raise JobStopped(f"stopped by SIGTERM after step {step} of {cfg.steps}; its "
                                 f"resume state is saved in {resume_path}: a rerun continues "
                                 "from it")  # fmt: skip
            if not check_every_step:
                kept = kept_state()
        bar.close()
        wall_time = elapsed_before + time.perf_counter() - started
        summaries = []
        for index in range(size):
            record = records[index]
            if record.active:
                record.steps_done = step
            if record.frozen_state is not None:
                block.set_seed_state(index, record.frozen_state)
            summaries.append({
                "status": "completed" if record.active else "diverged",
                "diverged_step": record.diverged_step,
                "steps": cfg.steps,
                "steps_done": record.steps_done,
                "n_checkpoints": len(record.history),
                "n_params": count_parameters(models[index]),
                "wall_time_s": wall_time,
                "steps_per_s": step / wall_time if wall_time > 0 else math.nan,
                # the block's seconds on streamed metrics and archive writes (this process's share
                # after a resume; timing sidecar only)
                "metrics_s": recorder.metrics_s,
                "archive_s": recorder.archive_s,
                "seed_block": size,
                **({"seed_settings": seed_settings[index]} if seed_settings[index] else {}),
                **({"augment": recipe.record()} if recipe is not None else {}),
                "resumed_from_step": resumed_from,
                "final": record.history[-1],
            })  # fmt: skip
        block.write_back()
        infos = list(model_info) if model_info is not None else [{} for _ in range(size)]
        for index in range(size):
            recorder.finish(index)
            _write_outputs(paths[index], block.model_of(index), records[index].history,
                           summaries[index], infos[index], hooks)  # fmt: skip
        resume_path.unlink(missing_ok=True)
        timing_path(resume_path).unlink(missing_ok=True)
        return summaries


def _sampler(
    n_examples: int,
    cfg: TrainConfig,
    seed: int,
    recipe: Augmentation | None = None,
    shape: tuple[int, ...] = (),
) -> BatchSampler:
    """Seed ``seed``'s batch order (and augmentation draws): generators of their own, seeded from
    the seed."""
    generator = torch.Generator().manual_seed(derive_seed(seed, "batches"))
    if recipe is None:
        return BatchSampler(n_examples, cfg.batch_size, generator)
    augment_generator = torch.Generator().manual_seed(derive_seed(seed, "augment"))
    return BatchSampler(n_examples, cfg.batch_size, generator, augment=recipe,
                        augment_generator=augment_generator, shape=shape)  # fmt: skip


def _first_batches(
    data: TaskData, cfg: TrainConfig, seeds: Sequence[int], recipe: Augmentation | None = None
) -> torch.Tensor:
    """Each seed's first training batch, ``(S, B, ...)``, as the model evaluates it (from fresh
    samplers: the loop's own samplers are not touched)."""
    indices = [_sampler(len(data.x_train), cfg, seed).next_indices() for seed in seeds]
    batch = data.x_train[torch.stack(indices).to(data.x_train.device)]
    if recipe is None:
        return to_unit(batch)
    return recipe.prepare(batch.flatten(0, 1)).reshape(
        len(seeds), -1, *recipe.output_shape(batch.shape[2:])
    )


def _train_seeds_apart(
    problem: str,
    models: Sequence[nn.Module],
    data: TaskData,
    cfg: TrainConfig,
    seeds: Sequence[int],
    paths: Sequence[TrainPaths],
    *,
    resume_path: Path,
    on_checkpoint: BlockCheckpointHook | None,
    description: str,
    model_info: Sequence[dict[str, Any]] | None,
    hooks: TrainHooks,
    **common: Any,
) -> list[dict[str, Any]]:
    """A block vmap cannot vectorise (``problem`` says why): its seeds trained one after another,
    each as a block of one with its resume file in its own directory; the block's summaries."""
    infos = list(model_info) if model_info is not None else [{} for _ in models]
    arch = infos[0].get("arch")
    what = f"architecture {arch!r}" if arch else f"model {type(models[0]).__name__}"
    seed_hooks = [hooks.for_seed(index) for index in range(len(models))]
    if None in seed_hooks:
        raise ValueError(
            f"{what} cannot be vectorised over the seeds of block {description!r} ({problem}), "
            f"and the method's training hooks ({type(hooks).__name__}) train a block only as a "
            "whole; train its seeds one per job (train.<task>.seed_block: 1)"
        )
    warnings.warn(
        f"{what} cannot be vectorised over the seeds of block {description!r} ({problem}); its "
        f"{len(models)} seeds train one at a time, each as a block of one (the same results, "
        "without the block's speed-up)",
        UnvectorisableWarning,
        stacklevel=3,
    )
    summaries = []
    for index, seed in enumerate(seeds):
        hook = None if on_checkpoint is None else _for_index(on_checkpoint, index)
        summaries += train_block(
            [models[index]], data, cfg, [seed], [paths[index]], resume_path=paths[index].resume,
            on_checkpoint=hook, description=f"{description} seed {seed}",
            model_info=[infos[index]], hooks=seed_hooks[index], **common,
        )  # fmt: skip
    resume_path.unlink(missing_ok=True)  # one a vectorised run of this block may have left
    timing_path(resume_path).unlink(missing_ok=True)
    return summaries


def _for_index(hook: BlockCheckpointHook, index: int) -> BlockCheckpointHook:
    """``hook`` of a block, called by a block of one that trains the block's seed ``index``."""
    return lambda _, metrics, step: hook(index, metrics, step)


def _seed_mask(size: int, active: Sequence[int], device: torch.device) -> torch.Tensor:
    """``(S,)`` on ``device``: True for the ``active`` seeds of a block of ``size``."""
    mask = torch.zeros(size, dtype=torch.bool)
    mask[list(active)] = True
    return mask.to(device)


def _forward_step(
    block: SeedBlock, batches: BlockBatches, data: TaskData, recipe: Augmentation | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One training batch per seed and the block's forward pass: logits, inputs, targets and the
    loss. A block of S > 1 gives ``(S, B, ...)`` tensors and each seed's mean cross-entropy
    ``(S,)``; a block of one gives the plain loop's ``(B, ...)`` tensors and its scalar loss, so its
    graph is the plain loop's (model, cross-entropy; ``flatten`` is a no-op on 2-D logits).

    With an augmentation ``recipe`` the batch is augmented between the gather and the forward pass
    (outside vmap, :meth:`~trainmap.training.augment.Augmentation.apply`) and the inputs returned
    are the augmented ones; under MixUp the loss is ``lam CE(y) + (1 - lam) CE(y_partner)`` and
    the targets returned are each example's own labels. uint8 pixels reach the model in [0, 1]."""
    indices = batches.next_indices()
    inputs, targets = data.x_train[indices], data.y_train[indices]
    partner = lam = None
    if recipe is not None:
        inputs, partner, lam = recipe.apply(inputs, targets, batches.draws)
    elif inputs.dtype == torch.uint8:
        inputs = to_unit(inputs)
    if block.size > 1:
        logits = block(inputs)
        losses = seed_cross_entropy(logits, targets)
        if partner is not None:
            losses = lam * losses + (1 - lam) * seed_cross_entropy(logits, partner)
        return logits, inputs, targets, losses
    output = block.module(inputs)
    loss = F.cross_entropy(output.flatten(0, -2), targets.flatten())
    if partner is not None:
        loss = lam * loss + (1 - lam) * F.cross_entropy(output.flatten(0, -2), partner.flatten())
    return output, inputs, targets, loss


def _write_outputs(
    paths: TrainPaths,
    model: nn.Module,
    history: list[dict[str, float]],
    summary: dict[str, Any],
    model_info: dict[str, Any],
    hooks: TrainHooks,
) -> None:
    hooks.save_model(model, paths.model, model_info)
    frame = pd.DataFrame(history, columns=HISTORY_COLUMNS)
    write_atomic(paths.history, lambda tmp: frame.to_csv(tmp, index=False))
    save_json(summary, paths.summary)
