"""Figures of the study (matplotlib, Agg backend; written atomically as PNG)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from trainmap.io import write_atomic  # noqa: E402

RunKey = tuple[str, str, str, int]  # task, arch, method, seed


def plot_learning_curves(histories: Mapping[RunKey, pd.DataFrame], path: str | Path) -> None:
    """Test accuracy and training loss against step: one row per task, one colour per arch/method.

    Thin lines are single seeds, so spread between seeds (and detours) stays visible.
    """
    tasks = sorted({key[0] for key in histories})
    figure, axes = plt.subplots(len(tasks), 2, figsize=(11, 3.2 * len(tasks)), squeeze=False)
    for row, task in enumerate(tasks):
        groups = sorted({key[1:3] for key in histories if key[0] == task})
        colours = dict(zip(groups, plt.cm.tab10.colors, strict=False))
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
    write_atomic(path, lambda tmp: figure.savefig(tmp, format="png", dpi=110))
    plt.close(figure)


def _legend_once(axis: plt.Axes) -> None:
    handles, labels = axis.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    axis.legend(unique.values(), unique.keys(), fontsize=8, loc="lower right")
