"""The recorder as a ``transformers.TrainerCallback``:
``Trainer(..., callbacks=[MetricCallback("runs/seed0")])``.

After each evaluation it records the model's weights at ``state.global_step`` (the step a
checkpoint saved there is named by) with the evaluation's ``accuracy_key`` (default
``eval_accuracy``) as ``test_acc`` and ``eval_loss`` as ``test_loss``
(:class:`trainmap.recorder.MetricRecorder`). Needs the ``transformers`` package.
"""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback

from trainmap.recorder import MetricRecorder


class MetricCallback(TrainerCallback):
    """Records the run's metric table in ``directory`` after every evaluation (module docstring);
    ``convention`` and ``heads`` as :class:`~trainmap.recorder.MetricRecorder`'s."""

    def __init__(self, directory: str | os.PathLike, accuracy_key: str = "eval_accuracy",
                 convention: str = "paper", heads: int | None = None) -> None:  # fmt: skip
        self.recorder = MetricRecorder(directory, convention, heads)
        self.accuracy_key = accuracy_key

    def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict | None = None,
                    model: Any = None, **kwargs: Any) -> None:  # fmt: skip
        metrics = metrics or {}
        if self.accuracy_key not in metrics:
            raise KeyError(f"MetricCallback: no {self.accuracy_key!r} in the evaluation "
                           f"({', '.join(sorted(metrics)) or 'none'}); return it from "
                           "compute_metrics or name it (accuracy_key=...)")  # fmt: skip
        self.recorder.log(model, state.global_step, test_acc=metrics[self.accuracy_key],
                          test_loss=metrics.get("eval_loss"))  # fmt: skip
