"""Training maps: latent-state models of training dynamics (Hu et al., "Latent state models of
training dynamics"), implemented reproducibly.

* :mod:`~trainmap.dynamics.metrics.weights`: the 14 weight metrics of every checkpoint of a run.
* :mod:`~trainmap.dynamics.metrics.tables`: reading a run's metric table strictly (a damaged one stops the
  analysis, naming the file, the column and the step).
* :mod:`~trainmap.dynamics.maps.hmm`: the Gaussian HMM over many runs, selected by held-out BIC, the
  emission model with per-run offset (drift, scale) of the metrics (setting ``emission``), for
  seeds that differ by more than their states, and the appendix C baselines (k-means, HMM-1).
* :mod:`~trainmap.dynamics.maps.training_map`: states, the transitions runs take, their labels, the figure.
* :mod:`~trainmap.dynamics.maps.regression`: detour states (OLS of convergence step on the bag of
  states) and trajectory dissimilarity (eq. 1).
* :mod:`~trainmap.dynamics.verdicts.joint`: one shared map for several methods of a task.

``python -m trainmap.dynamics --help`` runs the analysis on any set of per-run metric tables.
"""

from __future__ import annotations

from trainmap import exports_on_first_use

# Name -> the module that defines it. Imported on first use (PEP 562), not with the package: a
# worker process that unpickles one refit function (the bootstrap's, the stability curve's) then
# imports what that function needs, not torch (metrics) or matplotlib (training_map), whose
# imports alone took 1.3 s of every worker's start.
_EXPORTS = {
    "METRIC_NAMES": "trainmap.dynamics.metrics.columns",
    "DetourRegression": "trainmap.dynamics.maps.regression",
    "JointComparison": "trainmap.dynamics.verdicts.joint",
    "MetricTableError": "trainmap.dynamics.metrics.tables",
    "TrainingHMM": "trainmap.dynamics.maps.hmm.estimator",
    "TrainingMap": "trainmap.dynamics.maps.training_map",
    "baseline_table": "trainmap.dynamics.maps.hmm.baselines",
    "build_training_map": "trainmap.dynamics.maps.training_map",
    "collect_run_metrics": "trainmap.dynamics.metrics.weights",
    "compare_groups": "trainmap.dynamics.verdicts.joint",
    "draw_training_map": "trainmap.dynamics.maps.training_map",
    "read_metric_table": "trainmap.dynamics.metrics.tables",
    "regress_detours": "trainmap.dynamics.maps.regression",
    "state_distribution": "trainmap.dynamics.maps.regression",
    "trajectory_dissimilarity": "trainmap.dynamics.maps.regression",
}
__all__ = sorted(_EXPORTS)


__getattr__ = exports_on_first_use(__name__, _EXPORTS)
