"""GradInit's report: one model rescaled with its layer diagnostics before and after, and figures.

:func:`rescale_with_diagnostics` rescales one model (:func:`trainmap.methods.gradinit.run_gradinit`)
and measures it before and after on the same seeded minibatches
(:func:`trainmap.methods.gradinit.layer_diagnostics`: GradInit appendix, figures 4-8); its
:class:`GradInitReport` holds the run, the diagnostics and the summary (the gradinit rule's work).
The plots draw the diagnostics, the iterations of one run and a block of seeds.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
from torch import nn

from trainmap.data import TaskData
from trainmap.methods.gradinit import (
    GradInitResult,
    check_settings,
    draws_for,
    layer_diagnostics,
    run_gradinit,
)
from trainmap.training.augment import Augmentation
from trainmap.training.loop import derive_seed


def diagnostics_table(
    before: pd.DataFrame, after: pd.DataFrame, scales: Mapping[str, float]
) -> pd.DataFrame:
    """Before/after diagnostics side by side, with the learned scale of each layer's weight."""
    table = before.merge(after, on=["layer", "name", "kind"], suffixes=("_before", "_after"))
    table["scale"] = [scales.get(name, 1.0) for name in table["name"]]
    return table


@dataclass
class GradInitReport:
    """One model rescaled by GradInit or MetaInit (:func:`rescale_with_diagnostics`): the run and
    its layer diagnostics before and after, on the same minibatches."""

    objective: str
    result: GradInitResult
    diagnostics: pd.DataFrame  # :func:`diagnostics_table`: each layer before, after, its scale

    @property
    def history(self) -> pd.DataFrame:
        """Per iteration: ``iteration``, ``grad_norm``, ``objective``, ``constraint``, ``finite``."""
        return self.result.history

    @functools.cached_property
    def summary(self) -> dict[str, Any]:
        """The run in numbers (the gradinit rule's ``scales.json``): the learned scales, the
        tensors left unscaled, iterations, constraint and non-finite steps, and ||g|| at the first
        and the last iteration."""
        history = self.result.history
        return {
            "objective": self.objective,
            "scales": self.result.scales,
            "skipped": self.result.skipped,
            "iterations": len(history),
            "constraint_steps": self.result.constraint_steps,
            "non_finite_steps": int((~history["finite"]).sum()),
            "initial_grad_norm": float(history["grad_norm"].iloc[0]),
            "final_grad_norm": float(history["grad_norm"].iloc[-1]),
        }


def rescale_with_diagnostics(
    model: nn.Module,
    data: TaskData,
    settings: Mapping[str, Any],
    seed: int,
    objective: str = "gradinit",
    progress: bool = False,
    recipe: Augmentation | None = None,
) -> GradInitReport:
    """:func:`run_gradinit` on ``model`` (rescaled in place), with :func:`layer_diagnostics` on the
    same seeded minibatches before and after. ``seed`` is the grid cell's: GradInit's draws and the
    diagnostics' each get a seed of their own derived from it; ``recipe`` augments both as training
    does (``train.<task>.augment``)."""
    cfg = check_settings(settings)
    probe = draws_for(data, cfg["batch_size"], derive_seed(seed, "gradinit-diagnostics"), recipe)
    before = layer_diagnostics(model, probe(), cfg["diagnostic_batches"])
    result = run_gradinit(model, data, cfg, derive_seed(seed, "gradinit"), objective,
                          progress=progress, recipe=recipe)  # fmt: skip
    after = layer_diagnostics(model, probe(), cfg["diagnostic_batches"])
    return GradInitReport(objective, result, diagnostics_table(before, after, result.scales))


def plot_diagnostics(table: pd.DataFrame, path: str | os.PathLike, title: str = "") -> str:
    """Weight magnitude, gradient std and scale per layer, before vs after (figures 4-8 style)."""
    from trainmap.figures import plt, save_png

    figure, axes = plt.subplots(1, 3, figsize=(14, 3.6))
    layers = table["layer"]
    for axis, column, label in ((axes[0], "weight_magnitude", "||W_i|| / d_i"),
                                (axes[1], "grad_std", "sigma(g_i)")):  # fmt: skip
        axis.semilogy(layers, table[f"{column}_before"], "o-", ms=3, label="before (Kaiming)")
        axis.semilogy(layers, table[f"{column}_after"], "s-", ms=3, label="after")
        axis.set(xlabel="layer (shallow to deep)", ylabel=label)
        axis.legend(fontsize=8)
    colours = ["C0" if kind == "linear" else "C2" for kind in table["kind"]]
    axes[2].bar(layers, table["scale"], color=colours)
    axes[2].axhline(1.0, color="0.3", lw=0.8)
    axes[2].set(xlabel="layer (blue: conv/linear, green: norm)", ylabel="learned scale alpha_i")
    if len(layers) <= 30:
        for axis in axes:
            axis.set_xticks(list(layers))
    figure.suptitle(title or "GradInit diagnostics", fontsize=10)
    figure.tight_layout()
    save_png(figure, path)
    return (
        "Per layer, shallow to deep: averaged per-dimension weight magnitude and gradient standard "
        "deviation over minibatches before and after the initialisation method, and the learned "
        "scale factor of each weight."
    )


def plot_history(
    history: pd.DataFrame, gamma: float, path: str | os.PathLike, title: str = ""
) -> str:
    """||g|| and the objective over the iterations; constraint steps marked."""
    from trainmap.figures import plt, save_png

    figure, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    axes[0].semilogy(history["iteration"], history["grad_norm"], lw=1)
    constrained = history[history["constraint"]]
    axes[0].scatter(constrained["iteration"], constrained["grad_norm"], s=8, color="C3",
                    label="constraint step", zorder=3)  # fmt: skip
    axes[0].axhline(gamma, color="0.3", ls="--", lw=0.8, label=f"gamma = {gamma}")
    axes[0].set(xlabel="iteration", ylabel="||g||")
    axes[0].legend(fontsize=8)
    axes[1].plot(history["iteration"], history["objective"], lw=1)
    axes[1].set(xlabel="iteration", ylabel="objective")
    figure.suptitle(title or "GradInit iterations", fontsize=10)
    figure.tight_layout()
    save_png(figure, path)
    return ("Gradient norm (constraint steps in red, gamma dashed) and the objective value over "
            "the iterations.")  # fmt: skip


def plot_block(
    summaries: list[Mapping[str, Any]],
    histories: Mapping[str, pd.DataFrame],
    gamma: float,
    path: str | os.PathLike,
    title: str = "",
) -> str:
    """A block of seeds: each seed's learned scale per tensor, and ||g|| over the iterations."""
    from trainmap.figures import plt, save_png

    figure, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    names = list(summaries[0]["scales"]) if summaries else []
    for summary in summaries:
        axes[0].plot(range(len(names)), [summary["scales"][n] for n in names], lw=0.8, alpha=0.6)
    axes[0].axhline(1.0, color="0.3", lw=0.8)
    axes[0].set(xlabel="rescaled tensor (shallow to deep)", ylabel="learned scale alpha_i")
    for label, history in histories.items():
        axes[1].semilogy(history["iteration"], history["grad_norm"], lw=0.8, alpha=0.6, label=label)
    axes[1].axhline(gamma, color="0.3", ls="--", lw=0.8)
    axes[1].set(xlabel="iteration", ylabel="||g||")
    figure.suptitle(title or "GradInit over a block of seeds", fontsize=10)
    figure.tight_layout()
    save_png(figure, path)
    return (
        "One line per seed of the block: the scale factor learned for each rescaled tensor, and "
        "the gradient norm ||g|| at each iteration (gamma dashed)."
    )
