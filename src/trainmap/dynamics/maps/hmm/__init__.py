"""The training-map HMM (Hu et al., sec. 2.1, appendices A and C), split as hmmlearn splits it:

* :mod:`~trainmap.dynamics.maps.hmm.forward_backward`: the engine, forward-backward over many runs and
  models, the one E-step driver of every emission model;
* :mod:`~trainmap.dynamics.maps.hmm.gaussian`: the Gaussian emission model, many models in lockstep,
  and the one function of Gaussian sufficient statistics;
* :mod:`~trainmap.dynamics.maps.hmm.run_terms` (:mod:`~trainmap.dynamics.maps.hmm.run_term_updates`): the
  per-run offset, drift and scale of the emissions, fitted by ECM;
* :mod:`~trainmap.dynamics.maps.hmm.factory`: the emission setting's model and where EM starts;
* :mod:`~trainmap.dynamics.maps.hmm.splits`, :mod:`~trainmap.dynamics.maps.hmm.selection`,
  :mod:`~trainmap.dynamics.maps.hmm.curves`: splits of the runs, fits of every K, the choice of K;
* :mod:`~trainmap.dynamics.maps.hmm.estimator`: :class:`TrainingHMM`, standardising, save and load;
* :mod:`~trainmap.dynamics.maps.hmm.baselines`: appendix C's k-means and HMM-1 baselines.

The names below are the package's public interface.
"""

from trainmap.dynamics.maps.hmm.baselines import baseline_table, kmeans_bic, kmeans_selection
from trainmap.dynamics.maps.hmm.curves import (
    DEFAULT_REPRODUCE_ARI,
    DEFAULT_REPRODUCE_SHARE,
    REPRODUCE_K,
    RESTART_RULES,
    bic_minimum,
    choose_k,
    folds_curve,
    reproducibility_curve,
    selection_curve,
)
from trainmap.dynamics.maps.hmm.estimator import (
    STANDARDISATIONS,
    TrainingHMM,
    standardise,
    standardise_runs,
    unit_change,
)
from trainmap.dynamics.maps.hmm.factory import (
    COVARIANCE_TYPES,
    EMISSIONS,
    INITIALISATIONS,
    TOL_SCALES,
    emission_model,
    in_units,
    make_model,
    model_parameters,
    quietly,
    start_from,
)
from trainmap.dynamics.maps.hmm.selection import (
    DEFAULT_FOLDS,
    DEFAULT_HALF_SIZE,
    SELECTION_RULES,
    ModelSelection,
    SelectableHMM,
    n_free_parameters,
    score_heldout,
    select_model,
    selection_splits,
    training_score,
)
from trainmap.dynamics.maps.hmm.splits import (
    DEFAULT_HALVES,
    SelectionFailed,
    distinct_halvings,
    fold_split,
    half_splits,
    holdout_split,
    stack,
)

__all__ = [
    "COVARIANCE_TYPES",
    "DEFAULT_FOLDS",
    "DEFAULT_HALF_SIZE",
    "DEFAULT_HALVES",
    "DEFAULT_REPRODUCE_ARI",
    "DEFAULT_REPRODUCE_SHARE",
    "EMISSIONS",
    "INITIALISATIONS",
    "REPRODUCE_K",
    "RESTART_RULES",
    "SELECTION_RULES",
    "STANDARDISATIONS",
    "TOL_SCALES",
    "ModelSelection",
    "SelectableHMM",
    "SelectionFailed",
    "TrainingHMM",
    "baseline_table",
    "bic_minimum",
    "choose_k",
    "distinct_halvings",
    "emission_model",
    "fold_split",
    "folds_curve",
    "half_splits",
    "holdout_split",
    "in_units",
    "kmeans_bic",
    "kmeans_selection",
    "make_model",
    "model_parameters",
    "n_free_parameters",
    "quietly",
    "reproducibility_curve",
    "score_heldout",
    "select_model",
    "selection_curve",
    "selection_splits",
    "stack",
    "standardise",
    "standardise_runs",
    "start_from",
    "training_score",
    "unit_change",
]
