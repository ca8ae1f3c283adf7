"""The recorder as a Lightning ``Callback``: ``Trainer(callbacks=[MetricCallback("runs/seed0")])``.

After each validation it records the LightningModule's weights at ``trainer.global_step`` (the step
a ModelCheckpoint saved there is named by) with the accuracy logged under ``accuracy_key``
(default ``val_acc``) as ``test_acc`` and, where logged, ``val_loss`` as ``test_loss``
(:class:`trainmap.recorder.MetricRecorder`). Needs the ``lightning`` package.
"""

from __future__ import annotations

import os

import lightning as L

from trainmap.recorder import MetricRecorder


class MetricCallback(L.Callback):
    """Records the run's metric table in ``directory`` after every validation (module docstring);
    ``convention`` and ``heads`` as :class:`~trainmap.recorder.MetricRecorder`'s."""

    def __init__(self, directory: str | os.PathLike, accuracy_key: str = "val_acc",
                 loss_key: str = "val_loss", convention: str = "paper",
                 heads: int | None = None) -> None:  # fmt: skip
        super().__init__()
        self.recorder = MetricRecorder(directory, convention, heads)
        self.accuracy_key, self.loss_key = accuracy_key, loss_key

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        metrics = trainer.callback_metrics
        if self.accuracy_key not in metrics:
            raise KeyError(f"MetricCallback: no {self.accuracy_key!r} among the metrics logged "
                           f"({', '.join(sorted(metrics)) or 'none'}); log it in "
                           "validation_step or name it (accuracy_key=...)")  # fmt: skip
        self.recorder.log(pl_module, trainer.global_step, test_acc=metrics[self.accuracy_key],
                          test_loss=metrics.get(self.loss_key))  # fmt: skip
