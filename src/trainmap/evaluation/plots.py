"""Figures of the evaluation: every run's learning curves, and accuracy against bytes on disk for
every model form (written through :func:`trainmap.figures.save_png`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from trainmap.figures import plt, save_png

RunKey = tuple[str, str, str, int]  # task, arch, method, seed


def plot_learning_curves(histories: Mapping[RunKey, pd.DataFrame], path: str | Path) -> None:
    """Test accuracy and training loss against step: one row per task, one colour per arch/method.

    Thin lines are single seeds, so spread between seeds (and detours) stays visible.
    """
    tasks = sorted({key[0] for key in histories})
    figure, axes = plt.subplots(len(tasks), 2, figsize=(11, 3.2 * len(tasks)), squeeze=False)
    for row, task in enumerate(tasks):
        groups = sorted({key[1:3] for key in histories if key[0] == task})
        palette = plt.cm.tab10 if len(groups) <= 10 else plt.cm.tab20
        colours = {group: palette(index % palette.N) for index, group in enumerate(groups)}
        for key, history in sorted(histories.items()):
            if key[0] != task:
                continue
            label = f"{key[1]} / {key[2]}"
            style = {"color": colours[key[1:3]], "lw": 0.8, "alpha": 0.7}
            axes[row, 0].plot(history["step"], history["test_acc"], **style, label=label)
            axes[row, 1].plot(history["step"], history["train_loss"], **style, label=label)
        axes[row, 0].set(title=f"{task}: test accuracy", xlabel="step", ylabel="accuracy")
        axes[row, 1].set(title=f"{task}: training loss", xlabel="step", ylabel="loss", yscale="log")
        _legend_once(axes[row, 0])
    figure.tight_layout()
    save_png(figure, path)


def _legend_once(axis: plt.Axes) -> None:
    handles, labels = axis.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    axis.legend(unique.values(), unique.keys(), fontsize=8, loc="lower right")


def plot_compression(forms: pd.DataFrame, path: str | Path) -> None:
    """Accuracy against bytes on disk (log scale) for every form of every run, one panel per task.

    Marker shape: the form (trained, sparse, deploy, quantised); colour: arch/method.
    """
    tasks = sorted(forms["task"].unique()) if len(forms) else ["(no runs)"]
    figure, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4), squeeze=False)
    markers = dict(zip(sorted(forms["form"].unique()) if len(forms) else [], "osD^v<>pXh*",
                       strict=False))  # fmt: skip
    for axis, task in zip(axes[0], tasks, strict=True):
        rows = forms[forms["task"] == task] if len(forms) else forms
        groups = sorted({(a, m) for a, m in zip(rows["arch"], rows["method"], strict=True)})
        palette = plt.cm.tab10 if len(groups) <= 10 else plt.cm.tab20
        colours = {group: palette(index % palette.N) for index, group in enumerate(groups)}
        for (arch, method, form), group in rows.groupby(["arch", "method", "form"]):
            axis.scatter(group["bytes_on_disk"], group["test_acc"], s=22, alpha=0.8,
                         color=colours[(arch, method)], marker=markers[form],
                         label=f"{arch}/{method} {form}")  # fmt: skip
        axis.set_xscale("log")
        axis.set(title=f"{task}: accuracy vs size", xlabel="bytes on disk", ylabel="test accuracy")
        if len(rows):
            axis.legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    save_png(figure, path)
