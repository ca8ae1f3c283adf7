"""N:M sparse retraining: AST (annealed SR-STE, distillation, SLoRB) and the one-shot baselines.

Huang et al., "Pruning Large Language Models with Semi-Structural Adaptive Sparse Training"
(AST), with SR-STE from Zhou et al. (2021) and Wanda from Sun et al. (2023). The N:M masks, the
straight-through masked layers, SLoRB and Wanda's scores are :mod:`trainmap.methods.sparse_layers`;
this module trains with them:

* SR-STE (sec. 3.2): the update of W uses g + lambda_W * (1 - m) * W, so pruned weights decay while
  kept weights' updates are unchanged. (1 - m) on a float mask, never a bitwise not on an int mask:
  the authors' code computes ~mask on int tensors (-2 / -1), which flips the sign and decays kept
  weights too.
* Annealed SR-STE (sec. 4.3): lambda_t = lambda * t / T0 for t < T0, then lambda (default T0 = all
  retraining steps); ``decay: static`` keeps lambda throughout, ``none`` disables it.
* Where retraining starts (setting ``start``): AST retrains the converged dense model (``final``,
  the paper's recipe); ``{step: N}`` prunes the dense run's checkpoint at step N instead (``init``:
  its initialisation, N:M sparse training from the start), while the teacher distilled from stays
  the converged model. On a task whose dense runs are past the accuracy threshold when they
  converge, this is what lets the methods' paths differ at all.
* Masks are recomputed from the dense weights every ``mask_every`` optimiser steps; the flip rate
  r_t = ||m_t - m_{t-1}||_1 / D and the initial flip rate i_t = ||m_t - m_0||_1 / D (sec. 3.3, D the
  weights of all sparse layers) are recorded at each refresh.
* Distillation (sec. 4.2): loss = task loss + alpha * T^2 * KL(teacher || student) on logits softened
  by temperature T, the dense teacher frozen in eval mode; the KL is averaged per token (per
  example for (batch, classes) logits, per position for (batch, sequence, vocabulary) logits).

Methods (``trainmap.methods``): ``ast`` (annealed SR-STE + distillation, AST-Naive), ``ast_slorb``
(AST-Boosted), ``ast_static`` (static lambda), ``oneshot`` (magnitude, no retraining), ``oneshot_ft``
(magnitude, then fine-tuning with the mask frozen) and ``wanda`` (Wanda scores, no retraining).
Retraining runs through ``trainmap.training.loop.train_block`` with :class:`SparseHooks`, a block of seeds at
once (each seed with its own masks and its own teacher); its trajectory records every layer's
effective weight under the dense architecture's names.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from trainmap.data import TaskData
from trainmap.io import save_json, write_atomic
from trainmap.methods.sparse_layers import (
    SparseLayer,
    check_nm,
    effective_state,
    expand_slorb,
    nm_mask_from_scores,
    save_sparse,
    sparse_layers,
    sparsifiable_layers,
    sparsify,
    wanda_scores,
)
from trainmap.schema import check_section, section_defaults
from trainmap.training.archive import ArchivePolicy
from trainmap.training.augment import Augmentation, evaluation_inputs, recipe_of
from trainmap.training.loop import (
    BlockCheckpointHook,
    TrainConfig,
    TrainHooks,
    TrainPaths,
    evaluate_split,
    metric_structure,
    train_block,
)
from trainmap.training.record import CheckpointRecorder
from trainmap.training.seed_block import SeedBlock

#: Defaults of the ``sparse.<task>`` settings: the schema's (``$defs/sparse_settings``), where each
#: setting's type, allowed values and default are declared once.
DEFAULT_SETTINGS: dict[str, Any] = section_defaults("sparse")
START_CHOICES = ("final", "init")


def check_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The settings completed with :data:`DEFAULT_SETTINGS`. Raises ValueError naming the key, the
    value and what is allowed: for an unknown key or a value the schema refuses
    (:func:`trainmap.schema.check_section`), for ``n >= m``, for a ``start`` that is no start
    (:func:`start_step`) and for a ``train`` key the retraining does not read."""
    check_section("sparse", settings, what="sparse")
    cfg = {**DEFAULT_SETTINGS, **settings}
    if not cfg["n"] < cfg["m"]:
        raise ValueError(f"n: {cfg['n']!r} is not below m: {cfg['m']!r}; allowed: 1 <= n < m (N:M "
                         "keeps n of every m weights, e.g. n: 2, m: 4)")  # fmt: skip
    start_step(cfg["start"])  # a bad start is named there
    # The retraining reads TrainConfig's keys only: one the schema allows in train.<task> but the
    # retraining never reads (seed_block: seed ranges come from train.<task>) is refused here.
    TrainConfig.from_dict(cfg["train"])
    return cfg


def start_step(start: str | Mapping[str, Any]) -> int | None:
    """The step of the dense run's checkpoint a student is pruned from (setting ``start``): None
    for ``final`` (the converged model, AST's recipe), 0 for ``init``, N for ``{step: N}``."""
    if isinstance(start, str) and start in START_CHOICES:
        return None if start == "final" else 0
    if isinstance(start, Mapping) and set(start) == {"step"}:
        step = start["step"]
        if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
            return step
        raise ValueError(f"start.step: {step!r} is not a step; allowed: an integer >= 0, a "
                         "checkpoint step of the dense run")  # fmt: skip
    raise ValueError(f"start: {start!r} is not a start; allowed: final, init or {{step: N}}")


# --- training hooks -----------------------------------------------------------------------------


def srste_lambda(step: int, base: float, t0: int, decay: str) -> float:
    """Annealed SR-STE: lambda * t / T0 until T0, then lambda; static: lambda; none: 0."""
    if decay == "none":
        return 0.0
    if decay == "static":
        return base
    return base * min(step, t0) / t0


def distillation_loss(
    student: torch.Tensor, teacher: torch.Tensor, temperature: float
) -> torch.Tensor:
    """T^2 * KL(teacher || student) of temperature-softened distributions, averaged per token.

    Logits are (..., classes): (batch, classes) averages over the batch, (batch, sequence, vocab)
    over batch * sequence tokens, as the paper's per-token loss and the authors' code do (a plain
    ``batchmean`` on 3-D logits would divide by the batch only, S times too large).
    """
    classes = student.shape[-1]
    log_student = F.log_softmax(student.reshape(-1, classes) / temperature, dim=-1)
    log_teacher = F.log_softmax(teacher.reshape(-1, classes) / temperature, dim=-1)
    kl = F.kl_div(log_student, log_teacher, log_target=True, reduction="batchmean")
    return temperature**2 * kl


def seed_distillation_losses(
    student: torch.Tensor, teacher: torch.Tensor, temperature: float
) -> torch.Tensor:
    """:func:`distillation_loss` of each seed of a block: ``(S, B, ..., classes)`` logits give
    ``(S,)``, each the per-token average of T^2 * KL(teacher || student) of that seed."""
    classes = student.shape[-1]
    log_student = F.log_softmax(student / temperature, dim=-1).reshape(
        student.shape[0], -1, classes
    )
    log_teacher = F.log_softmax(teacher / temperature, dim=-1).reshape(
        teacher.shape[0], -1, classes
    )
    kl = F.kl_div(log_student, log_teacher, log_target=True, reduction="none").sum(dim=-1)
    return temperature**2 * kl.mean(dim=1)


def block_mask_vectors(block: SeedBlock, names: Iterable[str]) -> torch.Tensor:
    """Each seed's masks of the named sparse layers, flattened and concatenated: ``(S, D)``."""
    return torch.cat(
        [block.tensor(f"{name}.weight_mask").reshape(block.size, -1).cpu() for name in names],
        dim=1,
    )


class SparseHooks(TrainHooks):
    """AST's additions to the training loop (marked ``# hook:`` in ``train_block``), for a block of
    seeds: each seed has its own masks, its own teacher and its own flip history."""

    def __init__(self, teachers: SeedBlock | None, settings: Mapping[str, Any],
                 options: Mapping[str, Any], total_steps: int,
                 log_metrics: BlockCheckpointHook | None = None) -> None:  # fmt: skip
        self.teachers = teachers.eval() if teachers is not None else None
        self.settings, self.options = settings, options
        self.t0 = settings["srste_t0"] or total_steps
        self.log_metrics = log_metrics
        self.frozen = bool(options.get("frozen_mask"))

    def attach(self, block: SeedBlock) -> None:
        """The block's sparse layers, their straight-through mode, and the masks m_0."""
        super().attach(block)
        self.layers = list(sparse_layers(block.models[0]))
        for module in (block.module, *block.models):
            for layer in sparse_layers(module).values():
                layer.straight_through = not self.frozen
        self.initial_mask = block_mask_vectors(block, self.layers).clone()
        self.previous_mask = self.initial_mask.clone()
        self.flips: list[list[dict[str, float]]] = [[] for _ in range(block.size)]

    def extra_loss(self, logits: torch.Tensor, inputs: torch.Tensor,
                   targets: torch.Tensor) -> torch.Tensor | None:  # fmt: skip
        """alpha * T^2 * KL(teacher || student) per seed, each seed's own teacher (AST sec. 4.2)."""
        if not self.options.get("distill") or self.teachers is None:
            return None
        with torch.no_grad():
            teacher_logits = self.teachers(inputs)
        return self.settings["distill_alpha"] * seed_distillation_losses(
            logits, teacher_logits, self.settings["temperature"]
        )

    @torch.no_grad()
    def after_backward(self, step: int) -> None:
        """SR-STE: g += lambda_t * (1 - m) * W on every sparse layer (pruned weights decay)."""
        lam = srste_lambda(step, self.settings["srste_lambda"], self.t0, self.options["decay"])
        if lam == 0.0 or self.frozen:
            return
        for name in self.layers:
            grad = self.block.grad(f"{name}.weight")
            if grad is not None:
                weight = self.block.tensor(f"{name}.weight")
                grad.add_(lam * (1 - self.block.tensor(f"{name}.weight_mask")) * weight)

    @torch.no_grad()
    def after_step(self, step: int) -> None:
        """Every ``mask_every`` steps: each seed's new masks from its dense weights, its flip rates."""
        done = step + 1
        if self.frozen or done % self.settings["mask_every"]:
            return
        template = sparse_layers(self.block.models[0])
        for name in self.layers:
            layer, weight = template[name], self.block.tensor(f"{name}.weight")
            rows = weight.abs().reshape(-1, *weight.shape[2:])  # seeds folded into the rows
            mask = nm_mask_from_scores(rows, layer.n, layer.m, layer.group_layout)
            self.block.tensor(f"{name}.weight_mask").copy_(mask.reshape(weight.shape))
        current = block_mask_vectors(self.block, self.layers)
        total = current.shape[1]
        flip_rates = ((current - self.previous_mask).abs().sum(dim=1) / total).tolist()
        initial_rates = ((current - self.initial_mask).abs().sum(dim=1) / total).tolist()
        for index in range(self.block.size):
            row = {"step": done, "flip_rate": flip_rates[index],
                   "initial_flip_rate": initial_rates[index]}  # fmt: skip
            self.flips[index].append(row)
            if self.log_metrics is not None:
                self.log_metrics(index, {k: v for k, v in row.items() if k != "step"}, done)
        self.previous_mask = current.clone()

    @torch.no_grad()
    def snapshot(self, block: SeedBlock) -> dict[str, torch.Tensor]:
        """The dense architecture's state-dict keys, each sparse layer's weight = its effective
        weight (what the layer computes); masks and SLoRB factors are not separate entries."""
        template = sparse_layers(block.models[0])
        state = {}
        for key, value in block.state().items():
            owner, _, leaf = key.rpartition(".")
            if owner in template and leaf in ("weight_mask", "slorb_weight"):
                continue
            if owner in template and leaf == "weight":
                value = block_effective_weight(block, owner, template[owner])
            state[key] = value.detach()
        return state

    def save_model(self, model: nn.Module, path: Path, model_info: dict[str, Any]) -> None:
        """The ``sparse`` checkpoint."""
        save_sparse(model, path, **model_info)

    def state_dict(self) -> dict[str, Any]:
        """m_0, m_{t-1} and the flip histories, per seed (the masks are the block's buffers)."""
        return {"initial_mask": self.initial_mask, "previous_mask": self.previous_mask,
                "flips": [list(rows) for rows in self.flips]}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`."""
        self.initial_mask = state["initial_mask"]
        self.previous_mask = state["previous_mask"]
        self.flips = [list(rows) for rows in state["flips"]]

    def flip_history(self, index: int = 0) -> pd.DataFrame:
        """step, flip_rate, initial_flip_rate at each mask refresh of seed ``index``."""
        return pd.DataFrame(self.flips[index], columns=["step", "flip_rate", "initial_flip_rate"])


def block_effective_weight(block: SeedBlock, name: str, layer: SparseLayer) -> torch.Tensor:
    """Each seed's W * m (+ S P) of the sparse layer ``name``, seed dimension first."""
    weight = block.tensor(f"{name}.weight") * block.tensor(f"{name}.weight_mask")
    if layer.slorb_weight is None:
        return weight
    slorb = block.tensor(f"{name}.slorb_weight")
    rows = slorb.reshape(-1, slorb.shape[-1])  # seeds folded into the rows
    expanded = expand_slorb(rows, layer.slorb_k, (rows.shape[0], *weight.shape[2:]))
    return weight + expanded.reshape(weight.shape)


# --- the sparse stage -----------------------------------------------------------------------------


def run_sparse_method(
    teacher: nn.Module,
    data: TaskData,
    options: Mapping[str, Any],
    settings: Mapping[str, Any],
    seed: int,
    out_dir: str | os.PathLike,
    *,
    log_metrics: Callable[[dict, int], None] | None = None,
    progress: bool = False,
    fingerprint: str = "",
    description: str = "sparse",
    model_info: Mapping[str, Any] | None = None,
    start: nn.Module | None = None,
) -> dict[str, Any]:
    """Make ``teacher`` (a trained dense model) N:M sparse by the method ``options``: one seed,
    :func:`run_sparse_block` with a block of one (``start``: the dense checkpoint to prune instead
    of the teacher itself, see there).

    Writes to ``out_dir``: ``model.pt`` (format ``sparse``), ``history.csv``, ``train.json``,
    ``checkpoint_metrics.csv``, ``checkpoints/`` (the archive) and ``flips.csv``. One-shot methods (no retraining) record a single checkpoint,
    the pruned model at step 0, and an empty flip table.
    """
    hook = None if log_metrics is None else (lambda _, metrics, step: log_metrics(metrics, step))
    out = Path(out_dir)
    return run_sparse_block([teacher], data, options, settings, [seed], [out],
                            resume_path=out / "resume.pt", log_metrics=hook, progress=progress,
                            fingerprint=fingerprint, description=description,
                            model_info=[model_info or {}],
                            starts=None if start is None else [start])[0]  # fmt: skip


def run_sparse_block(
    teachers: list[nn.Module],
    data: TaskData,
    options: Mapping[str, Any],
    settings: Mapping[str, Any],
    seeds: list[int],
    out_dirs: list[Path],
    *,
    resume_path: Path,
    log_metrics: BlockCheckpointHook | None = None,
    progress: bool = False,
    fingerprint: str = "",
    description: str = "sparse",
    model_info: list[Mapping[str, Any]] | None = None,
    starts: list[nn.Module] | None = None,
) -> list[dict[str, Any]]:
    """Make each of ``teachers`` (trained dense models of one architecture, one per seed) N:M sparse
    by the method ``options``; retraining methods retrain the whole block at once (each seed
    distilled from its own teacher). ``starts``: per seed, the dense model that is pruned and
    retrained (setting ``start``: an earlier checkpoint of the teacher's run); default the
    teacher itself. Writes each seed's files to its ``out_dirs`` entry (see
    :func:`run_sparse_method`); returns the per-seed summaries."""
    cfg = check_settings(settings)
    infos = [dict(info) for info in (model_info or [{} for _ in seeds])]
    teachers = [teacher.eval() for teacher in teachers]
    starts = teachers if starts is None else [start.eval() for start in starts]
    layout = cfg["conv_groups"]
    names = sparsifiable_layers(starts[0], cfg["m"], cfg["dense_layers"], layout)
    if not names:
        weight_layers = sum(isinstance(m, nn.Linear | nn.Conv2d) for m in starts[0].modules())
        raise ValueError(
            f"sparse setting dense_layers: {cfg['dense_layers']!r} leaves no layer of this "
            f"{weight_layers}-layer network to make {cfg['n']}:{cfg['m']} sparse (or no layer's "
            f"inputs divide into groups of {cfg['m']}); set sparse.<task>.dense_layers: none"
        )
    slorb_k = cfg["slorb_k"] if options.get("slorb") else None
    recipe = recipe_of(cfg["train"].get("augment"))  # the retraining's (the dense runs', inherited)
    prepare = evaluation_inputs(recipe, data.x_train.dtype)
    students = []
    for start in starts:
        scores = None
        if options["mask"] == "wanda":  # calibration inputs as the model evaluates them
            calibration = data.x_train[: cfg["calibration_batch"]]
            scores = wanda_scores(start, names,
                                  calibration if prepare is None else prepare(calibration))  # fmt: skip
        students.append(sparsify(start, cfg["n"], cfg["m"], slorb_k, scores, names, layout))
    paths = [TrainPaths.in_directory(out) for out in out_dirs]
    if options.get("retrain"):
        train_cfg = TrainConfig.from_dict(cfg["train"])
        teacher_block = SeedBlock(teachers).to(train_cfg.device) if options.get("distill") else None
        hooks = SparseHooks(teacher_block, cfg, options, train_cfg.steps, log_metrics)
        summaries = train_block(students, data, train_cfg, seeds, paths, resume_path=resume_path,
                                on_checkpoint=log_metrics, progress=progress,
                                fingerprint=fingerprint, description=description,
                                model_info=infos, hooks=hooks)  # fmt: skip
        flips = [hooks.flip_history(index) for index in range(len(seeds))]
    else:
        policy = ArchivePolicy.from_value(cfg["train"].get("archive"))
        summaries = [_prune_without_training(student, data, seed_paths, info, policy, recipe)
                     for student, seed_paths, info in zip(students, paths, infos, strict=True)]  # fmt: skip
        flips = [pd.DataFrame(columns=["step", "flip_rate", "initial_flip_rate"]) for _ in seeds]
    for student, out, seed_paths, summary, table in zip(students, out_dirs, paths, summaries,
                                                         flips, strict=True):  # fmt: skip
        write_atomic(Path(out) / "flips.csv", lambda tmp, t=table: t.to_csv(tmp, index=False))
        summary |= {"nm_valid": check_nm(student), "sparse_layers": names, "n": cfg["n"],
                    "m": cfg["m"], "group_layout": layout, "slorb_k": slorb_k}  # fmt: skip
        save_json(summary, seed_paths.summary)
    return summaries


def _prune_without_training(
    model: nn.Module, data: TaskData, paths: TrainPaths, info: Mapping[str, Any],
    policy: ArchivePolicy, recipe: Augmentation | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One-shot pruning: the pruned model is the result, and its only checkpoint (step 0: its
    metrics, and its archive file unless ``policy`` keeps none); evaluated as ``recipe`` (the
    training's augmentation, recorded in the summary) prepares inputs."""
    prepare = evaluation_inputs(recipe, data.x_test.dtype)
    test_loss, test_acc = evaluate_split(model, data.x_test, data.y_test, prepare)
    row = {"step": 0, "train_loss": math.nan, "train_acc": math.nan, "test_loss": test_loss,
           "test_acc": test_acc, "lr": 0.0}  # fmt: skip
    history = pd.DataFrame([row])
    write_atomic(paths.history, lambda tmp: history.to_csv(tmp, index=False))
    recorder = CheckpointRecorder(metric_structure(model, info), [paths.metrics],
                                  [paths.archive.parent], [0], policy)  # fmt: skip
    recorder.start_fresh()
    recorder.capture(0, {k: v.unsqueeze(0) for k, v in effective_state(model).items()}, [0])
    recorder.finish(0)
    save_sparse(model, paths.model, **info)
    return {"status": "completed", "diverged_step": None, "steps": 0, "steps_done": 0,
            "n_checkpoints": 1, "wall_time_s": 0.0, "steps_per_s": math.nan,
            "resumed_from_step": None, "final": row,
            **({"augment": recipe.record()} if recipe is not None else {})}  # fmt: skip


def plot_flip_rates(histories: Mapping[str, pd.DataFrame], path: str | os.PathLike,
                    title: str = "") -> str:  # fmt: skip
    """Flip rate and initial flip rate against step, one line per run/method (AST fig. 4)."""
    from trainmap.figures import plt, save_png

    figure, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for label, history in histories.items():
        if len(history):
            axes[0].plot(history["step"], history["flip_rate"], lw=1, label=label)
            axes[1].plot(history["step"], history["initial_flip_rate"], lw=1, label=label)
    axes[0].set(xlabel="step", ylabel="flip rate r_t", yscale="symlog", title="mask changes")
    axes[1].set(xlabel="step", ylabel="initial flip rate i_t", title="distance from the first mask")
    for axis in axes:
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=7)
    figure.suptitle(title or "N:M mask flips", fontsize=10)
    figure.tight_layout()
    save_png(figure, path)
    return ("Flip rate (fraction of mask entries that changed since the previous refresh) and "
            "initial flip rate (changed since the first mask) at every mask refresh.")  # fmt: skip
