"""Training maps: latent-state models of training dynamics (Hu et al., "Latent state models of
training dynamics"), implemented reproducibly.

* :mod:`~trainmap.dynamics.metrics`: the 14 weight metrics of every checkpoint of a run.
* :mod:`~trainmap.dynamics.tables`: reading a run's metric table strictly (a damaged one stops the
  analysis, naming the file, the column and the step).
* :mod:`~trainmap.dynamics.hmm`: the Gaussian HMM over many runs, selected by held-out BIC, and the
  appendix C baselines (k-means, HMM-1).
* :mod:`~trainmap.dynamics.run_offset`: the emission model with a per-run offset (and drift) of the
  metrics (setting ``emission``), for seeds that differ by more than their states.
* :mod:`~trainmap.dynamics.training_map`: states, the transitions runs take, their labels, the figure.
* :mod:`~trainmap.dynamics.regression`: detour states (OLS of convergence step on the bag of
  states) and trajectory dissimilarity (eq. 1).
* :mod:`~trainmap.dynamics.joint`: one shared map for several methods of a task.

``python -m trainmap.dynamics --help`` runs the analysis on any set of per-run metric tables.
"""

from trainmap.dynamics.hmm import TrainingHMM, baseline_table
from trainmap.dynamics.joint import JointComparison, compare_groups
from trainmap.dynamics.metrics import METRIC_NAMES, collect_run_metrics
from trainmap.dynamics.regression import (
    DetourRegression,
    regress_detours,
    state_distribution,
    trajectory_dissimilarity,
)
from trainmap.dynamics.tables import MetricTableError, read_metric_table
from trainmap.dynamics.training_map import TrainingMap, build_training_map, draw_training_map

__all__ = [
    "METRIC_NAMES",
    "DetourRegression",
    "JointComparison",
    "MetricTableError",
    "TrainingHMM",
    "TrainingMap",
    "baseline_table",
    "build_training_map",
    "collect_run_metrics",
    "compare_groups",
    "draw_training_map",
    "read_metric_table",
    "regress_detours",
    "state_distribution",
    "trajectory_dissimilarity",
]
