"""The columns of a run's metric table (``metrics.csv``), by name: the 14 weight metrics of the
training-maps paper (:mod:`trainmap.dynamics.metrics.weights` defines and computes them), the history
columns beside them and the ratios among them.

Names only, without torch: every analysis step (the HMM, its refits in worker processes, the
tables) reads these and none of them needs torch, whose import alone takes about 1 s.
"""

from __future__ import annotations

#: The 14 metrics, in the table's column order (the paper's Table 1).
METRIC_NAMES = (
    "l1",
    "l2",
    "l1_l2",
    "trace",
    "spectral",
    "trace_spectral",
    "sv_mean",
    "sv_var",
    "w_mean",
    "w_median",
    "w_var",
    "b_mean",
    "b_median",
    "b_var",
)
#: The run's history at each checkpoint, after the metrics.
HISTORY_COLUMNS = ("train_loss", "train_acc", "test_loss", "test_acc")
#: The history columns a convergence criterion can read: an accuracy, or a held-out loss.
CURVES = ("test_acc", "test_loss")
#: How a curve reaches its threshold: an accuracy rises to it, a loss falls to it.
DIRECTIONS = ("rising", "falling")
#: Ratio metric -> its denominator metric (a ratio is undefined where the denominator is 0).
RATIOS = {"l1_l2": "l2", "trace_spectral": "spectral"}
#: The metric conventions (module docstring of :mod:`trainmap.dynamics.metrics.weights`): the paper's
#: code's, the same with the 1x1 shortcut convs of residual blocks counted, and the extended one.
CONVENTIONS = ("paper", "paper_shortcuts", "extended")
#: The conventions that compute the statistics the paper's way; they differ only in which layers
#: count (``paper`` leaves the shortcut convs out, as the authors' ResNet walker does).
PAPER_CONVENTIONS = ("paper", "paper_shortcuts")
