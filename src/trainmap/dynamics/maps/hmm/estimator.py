"""The training-map estimator: an HMM over standardised per-checkpoint metrics of many runs (Hu et
al., sec. 2.1, appendices A and C; Gaussian emissions in the paper, Student-t ones by default
here), fitted and saved reproducibly.

:class:`TrainingHMM` follows the paper's recipe, with the choices that decide K as settings:

1. Standardise every feature (sec. 2.1: z~_t = (f(w_t) - mu) / sigma, mu and sigma from the first
   (up to) :data:`STANDARDISE_WINDOW` checkpoints; :func:`standardise_runs`): ``pooled`` takes
   one mu and sigma over all runs' first checkpoints, ``per_run`` each run's own (the paper's and
   the authors' code). A feature that is constant, or not finite in some run, cannot be
   standardised; it is dropped with a warning and named with the reason (``dropped_features_``,
   ``hmm.json``).
2. Split the runs, fit every K = 1..K_max with seeded restarts, score K on held-out runs and choose
   it by the selection rule ``selection`` (``holdout``, the paper's; ``folds``; ``reproducible``):
   :func:`~trainmap.dynamics.maps.hmm.selection.select_model`, the one path of the full fit and of
   every bootstrap and stability refit (:func:`trainmap.dynamics.verdicts.certainty.refit_resample`). K at
   K_max is a ceiling, not a minimum, which the fit reports (``at_ceiling_``, a warning, the JSON
   and the selection figure).
3. The emission model is the setting ``emission`` (:data:`~trainmap.dynamics.maps.hmm.factory.
   EMISSIONS`): ``student_t`` (the default: Student-t emissions, which heavy-tailed metrics do not
   split into extra states; :mod:`~trainmap.dynamics.maps.hmm.student_t`, docs/training-maps.md,
   "Heavy tails"), ``plain``, the paper's Gaussian HMM, or per-run terms of the emissions
   (:mod:`~trainmap.dynamics.maps.hmm.run_terms`, docs/training-maps.md, "Run-to-run nuisance").
4. Decode runs with Viterbi; filtered posteriors p(s_t | z_1:t) come from the forward algorithm
   (:meth:`TrainingHMM.filtered_posteriors`), as appendix A's feature importance needs. With run
   terms, every run is decoded and evaluated on its residuals (:meth:`TrainingHMM.residuals`).

The fitted model saves as plain arrays (``.npz``) plus JSON, never as a pickle; the best model of
every K stays in memory (``models_``) for the bootstrap's warm starts
(:mod:`trainmap.dynamics.verdicts.certainty`). The settings' defaults are declared in the config schema
(:class:`TrainingHMM` reads them), chosen by the known-answer tests in
tests/unit/dynamics/maps/hmm/test_selection.py and bench/hmm_select.py; why:
docs/decisions/hmm-selection.md.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trainmap.dynamics.maps.hmm.curves import REPRODUCE_K, RESTART_RULES
from trainmap.dynamics.maps.hmm.factory import (
    COVARIANCE_TYPES,
    EMISSIONS,
    INITIALISATIONS,
    TOL_SCALES,
    EMSettings,
    check_choice,
    covars_in_own_shape,
    emission_model,
)
from trainmap.dynamics.maps.hmm.selection import MIN_GAIN_SCALES, SELECTION_RULES, select_model
from trainmap.dynamics.maps.hmm.splits import holdout_split
from trainmap.dynamics.metrics.columns import METRIC_NAMES
from trainmap.dynamics.metrics.tables import UNDEFINED_BY_ARCHITECTURE
from trainmap.io import save_json, write_atomic
from trainmap.schema import section_defaults

#: hmmlearn's floor on the covariances (``GaussianHMM(min_covar=...)``'s default), which
#: ``analysis.min_covar`` left out keeps. Written here, not read from hmmlearn: importing
#: ``hmmlearn.hmm`` loads scikit-learn and scipy's BLAS, which a refit worker must load only after
#: it limits its threads (tests/unit/test_defaults.py holds the two equal).
HMMLEARN_MIN_COVAR: float = 1e-3

#: The config schema's ``analysis`` defaults, :class:`TrainingHMM`'s keyword defaults (the values
#: of :data:`trainmap.dynamics.maps.settings.ANALYSIS_DEFAULTS`, read here because that module imports
#: this one).
_SCHEMA_DEFAULTS = section_defaults("analysis")
STANDARDISE_WINDOW = 1000
#: A feature whose standard deviation is below this is constant up to float32 rounding.
NUMERICALLY_CONSTANT = 1e-7
STANDARDISATIONS = ("pooled", "per_run")
#: The parameters every EM fit of every K uses (:meth:`TrainingHMM.settings`,
#: :class:`~trainmap.dynamics.maps.hmm.factory.EMSettings`'s fields).
EM_PARAMETERS = tuple(field.name for field in dataclasses.fields(EMSettings))
#: The ``reproducible`` and ``gain`` rules' parameters (:meth:`TrainingHMM.reproducibility`).
RULE_PARAMETERS = ("halves", "reproduce_ari", "reproduce_share", "reproduce_k", "half_size",
                   "min_gain", "min_gain_scale")  # fmt: skip


def standardise(values: np.ndarray, window: int = STANDARDISE_WINDOW) -> tuple[np.ndarray, ...]:
    """``(z, mean, std)``: z-scores of ``values`` [T, d] with the statistics of its first rows."""
    head = values[:window]
    mean, std = head.mean(axis=0), head.std(axis=0)
    return (values - mean) / std, mean, std


def pooled_statistics(
    tables: Sequence[np.ndarray], window: int = STANDARDISE_WINDOW
) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard deviation of every run's first ``window`` rows, pooled."""
    head = np.concatenate([values[:window] for values in tables])
    return head.mean(axis=0), head.std(axis=0)


def standardise_runs(
    raw: Mapping[str, np.ndarray],
    kind: str,
    pooled_over: Sequence[str] | None = None,
    fallback_std: np.ndarray | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(z, statistics)``: the z-scores of every run of ``raw`` (run -> values [T, d]) and the
    statistics used, in the form of :attr:`TrainingHMM.standardisation_` (saved in ``hmm.json``).

    The one standardisation of the full fit and of every refit (:func:`trainmap.dynamics.verdicts.certainty.
    refit_resample`). ``kind="pooled"``: one mean and SD over the first :data:`STANDARDISE_WINDOW`
    rows of the runs ``pooled_over``, in that order (default: every run of ``raw`` once; a bootstrap
    draw names a run as often as it was drawn), a zero SD (a feature constant in a draw) replaced by
    ``fallback_std``. ``kind="per_run"``: each run's own first rows.
    """
    check_choice("standardisation", kind, STANDARDISATIONS)
    if kind == "per_run":
        z, per_run = {}, {}
        for run, values in raw.items():
            z[run], mean, std = standardise(values)
            per_run[run] = {"mean": mean.tolist(), "std": std.tolist()}
        return z, {"kind": "per_run", "window": STANDARDISE_WINDOW, "runs": per_run}
    pooled_over = list(raw) if pooled_over is None else pooled_over
    mean, std = pooled_statistics([raw[run] for run in pooled_over])
    if fallback_std is not None:
        std = np.where(std > 0, std, fallback_std)
    z = {run: (values - mean) / std for run, values in raw.items()}
    statistics = {"kind": "pooled", "window": STANDARDISE_WINDOW, "mean": mean.tolist(),
                  "std": std.tolist()}  # fmt: skip
    return z, statistics


def unit_change(
    reference: Mapping[str, Any], statistics: Mapping[str, Any]
) -> tuple[np.ndarray, np.ndarray]:
    """``(shift, scale)`` between two standardisations of the same features (the statistics of
    :func:`standardise_runs`): z = (z_reference - shift) / scale. Per-run z-scores of a run do not
    depend on the other runs: no change."""
    if reference["kind"] == "per_run":
        d = len(next(iter(reference["runs"].values()))["mean"])
        return np.zeros(d), np.ones(d)
    reference_mean, reference_std = np.asarray(reference["mean"]), np.asarray(reference["std"])
    mean, std = np.asarray(statistics["mean"]), np.asarray(statistics["std"])
    return (mean - reference_mean) / reference_std, std / reference_std


class TrainingHMM:
    """An HMM over standardised per-checkpoint metrics of many runs (module docstring).

    ``fit(runs)`` takes a mapping run id -> metrics table (columns named by ``features``); after
    fitting: ``n_states_``, ``features_`` (used), ``dropped_features_`` (feature -> why it was
    left out), ``train_runs_``, ``heldout_runs_``, ``folds_`` (the held-out runs K was scored
    on, one list per split), ``selection_`` (one row per K), ``restarts_`` (one row per fit),
    ``at_ceiling_``, ``standardisation_``, the hmmlearn model ``model_`` and every K's best model
    ``models_``.

    ``emission`` (:data:`EMISSIONS`): ``student_t`` (the default) has multivariate Student-t
    emissions of ``degrees_of_freedom`` (:class:`~trainmap.dynamics.maps.hmm.student_t.StudentTHMM`);
    ``plain`` is the paper's Gaussian HMM;
    ``run_offset`` and ``run_offset_drift`` add a per-run offset (and linear drift) to the emission
    means, ``run_affine`` a per-run offset, linear drift and scale of the emissions
    (:mod:`trainmap.dynamics.maps.hmm.run_terms`), fitted with the states and estimated for every run the
    model decodes or scores; every use of the fitted model below works on the run's residuals
    (:meth:`residuals`).

    The keyword defaults are the config schema's ``analysis`` defaults
    (``workflow/schemas/config.schema.yaml``; ``random_state`` is ``analysis.seed``), read from it,
    so the estimator without a config fits as the workflow does, selection rule included.
    ``min_covar``, ``n_jobs`` and ``features`` have no schema default: ``min_covar`` is hmmlearn's
    (``GaussianHMM``'s floor on the covariances), ``n_jobs`` the processes a fit uses (1: serial;
    the fit is the same for any count) and ``features`` every metric.
    """

    def __init__(
        self,
        k_max: int = _SCHEMA_DEFAULTS["k_max"],
        restarts: int = _SCHEMA_DEFAULTS["restarts"],
        holdout: float = _SCHEMA_DEFAULTS["holdout"],
        covariance_type: str = _SCHEMA_DEFAULTS["covariance_type"],
        standardisation: str = _SCHEMA_DEFAULTS["standardisation"],
        restart_rule: str = _SCHEMA_DEFAULTS["restart_rule"],
        selection: str = _SCHEMA_DEFAULTS["selection"],
        folds: int = _SCHEMA_DEFAULTS["folds"],
        halves: int | None = _SCHEMA_DEFAULTS["halves"],
        reproduce_ari: float = _SCHEMA_DEFAULTS["reproduce_ari"],
        reproduce_share: float = _SCHEMA_DEFAULTS["reproduce_share"],
        reproduce_k: str = _SCHEMA_DEFAULTS["reproduce_k"],
        half_size: int | None = _SCHEMA_DEFAULTS["half_size"],
        min_gain: float = _SCHEMA_DEFAULTS["min_gain"],
        min_gain_scale: str = _SCHEMA_DEFAULTS["min_gain_scale"],
        init: str = _SCHEMA_DEFAULTS["init"],
        emission: str = _SCHEMA_DEFAULTS["emission"],
        degrees_of_freedom: float = _SCHEMA_DEFAULTS["degrees_of_freedom"],
        n_iter: int = _SCHEMA_DEFAULTS["n_iter"],
        tol: float = _SCHEMA_DEFAULTS["tol"],
        tol_scale: str = _SCHEMA_DEFAULTS["tol_scale"],
        min_covar: float = HMMLEARN_MIN_COVAR,
        random_state: int = _SCHEMA_DEFAULTS["seed"],
        n_jobs: int = 1,
        features: Sequence[str] = METRIC_NAMES,
    ) -> None:
        arguments = dict(locals())  # the parameters, before anything else is bound here
        if not isinstance(k_max, int) or k_max < 1:
            raise ValueError(f"k_max: {k_max!r} is not allowed; it must be an integer >= 1")
        if not isinstance(restarts, int) or restarts < 1:
            raise ValueError(f"restarts: {restarts!r} is not allowed; it must be an integer >= 1")
        if not 0 < holdout < 1:
            raise ValueError(f"holdout: {holdout!r} is not allowed; it must be in (0, 1)")
        if not isinstance(n_iter, int) or n_iter < 1:
            raise ValueError(f"n_iter: {n_iter!r} is not allowed; it must be an integer >= 1")
        if not tol > 0:
            raise ValueError(f"tol: {tol!r} is not allowed; it must be > 0")
        check_choice("covariance_type", covariance_type, COVARIANCE_TYPES)
        check_choice("standardisation", standardisation, STANDARDISATIONS)
        check_choice("restart_rule", restart_rule, RESTART_RULES)
        check_choice("selection", selection, SELECTION_RULES)
        if not isinstance(folds, int) or isinstance(folds, bool) or folds < 2:
            raise ValueError(f"folds: {folds!r} is not allowed; it must be an integer >= 2")
        check_choice("init", init, INITIALISATIONS)
        check_choice("emission", emission, EMISSIONS)
        if not (isinstance(degrees_of_freedom, int | float) and not isinstance(degrees_of_freedom,
                bool) and 0 < degrees_of_freedom <= 1000):  # fmt: skip
            raise ValueError(f"degrees_of_freedom: {degrees_of_freedom!r} is not allowed; the "
                             "Student-t emission's nu is a number in (0, 1000]")  # fmt: skip
        check_choice("tol_scale", tol_scale, TOL_SCALES)
        check_choice("min_gain_scale", min_gain_scale, MIN_GAIN_SCALES)
        check_choice("reproduce_k", reproduce_k, REPRODUCE_K)
        if half_size is not None and (not isinstance(half_size, int) or isinstance(half_size, bool)
                                      or half_size < 1):  # fmt: skip
            raise ValueError(f"half_size: {half_size!r} is not allowed; it must be an integer >= 1 "
                             "(or None: half of each group's runs)")  # fmt: skip
        if halves is not None and (not isinstance(halves, int) or isinstance(halves, bool)
                                   or halves < 1):  # fmt: skip
            raise ValueError(f"halves: {halves!r} is not allowed; it must be an integer >= 1 "
                             "(or None: 5, or as many splits as the runs allow)")  # fmt: skip
        if not (isinstance(min_gain, int | float) and not isinstance(min_gain, bool)
                and np.isfinite(min_gain) and min_gain >= 0):  # fmt: skip
            raise ValueError(f"min_gain: {min_gain!r} is not allowed; it must be a number >= 0 "
                             "(nats of held-out log-likelihood per checkpoint)")  # fmt: skip
        for key, value in (("reproduce_ari", reproduce_ari), ("reproduce_share", reproduce_share)):
            if not (isinstance(value, int | float) and 0 < value <= 1):
                raise ValueError(f"{key}: {value!r} is not allowed; it must be in (0, 1]")
        for name in self.param_names():  # each parameter kept as given (scikit-learn's rule)
            setattr(self, name, arguments[name])
        self.features = tuple(features)

    # --- fitting -------------------------------------------------------------------------------

    def fit(
        self, runs: Mapping[str, pd.DataFrame], strata: Mapping[str, str] | None = None
    ) -> TrainingHMM:
        """Standardise, split, select K by the selection rule and keep the chosen model.

        ``selection="holdout"``: the model is fitted on ``train_runs_``, K scored on
        ``heldout_runs_``; ``"folds"``: the model is fitted on every run (``train_runs_``, no
        ``heldout_runs_``), K scored on each fold of ``folds_``; ``"reproducible"``: the model is
        fitted on every run, K the largest up to the two-fold BIC's minimum whose half maps agree
        (``folds_``: the second halves;
        ``half_models_``: split -> K -> model). ``strata`` (run -> group; ``strata_``): the
        reproducible rule halves each group's runs (a joint comparison's methods)."""
        self.strata_ = dict(strata) if strata else None
        self.features_, self.dropped_features_ = self._usable_features(runs)
        if self.selection == "holdout":
            self.train_runs_, self.heldout_runs_ = holdout_split(
                list(runs), self.holdout, self.random_state
            )
        else:
            self.train_runs_, self.heldout_runs_ = sorted(runs), []
        raw = {run: table[self.features_].to_numpy(dtype=float) for run, table in runs.items()}
        standardised, self.standardisation_ = standardise_runs(raw, self.standardisation)
        selection = select_model(
            standardised, dict.fromkeys(self.train_runs_, 1.0),
            dict.fromkeys(self.heldout_runs_, 1.0), self.settings(), range(1, self.k_max + 1),
            selection=self.selection, folds=self.folds, restarts=self.restarts,
            restart_rule=self.restart_rule, n_jobs=self.n_jobs, **self.reproducibility(),
            strata=self.strata_,
        )  # fmt: skip
        self.folds_ = selection.folds
        self.half_models_ = selection.half_models
        self.restarts_, self.selection_ = selection.restarts, selection.curve
        self.models_, self.n_states_ = selection.models, selection.n_states
        self.model_ = selection.model
        self.at_ceiling_ = bool(self.k_max > 1 and self.n_states_ == self.k_max)
        if self.at_ceiling_:
            warnings.warn(self.ceiling_message(), stacklevel=2)
        return self

    @classmethod
    def param_names(cls) -> tuple[str, ...]:
        """The estimator's parameters, read from its constructor's signature (scikit-learn's
        ``_get_param_names``): the one list of them."""
        return tuple(name for name in inspect.signature(cls.__init__).parameters if name != "self")

    def get_params(self) -> dict[str, Any]:
        """Every parameter's value, by name (scikit-learn's ``get_params``)."""
        return {name: getattr(self, name) for name in self.param_names()}

    def reproducibility(self) -> dict[str, Any]:
        """The ``reproducible`` and ``gain`` rules' settings (:data:`RULE_PARAMETERS`;
        :func:`~trainmap.dynamics.maps.hmm.selection.select_model`'s keywords)."""
        return {name: getattr(self, name) for name in RULE_PARAMETERS}

    def ceiling_message(self) -> str:
        """What a selection that chose K_max means, and the fix."""
        if self.selection == "reproducible":
            return (f"the half maps still agree at K_max = {self.k_max}: K = {self.k_max} is a "
                    "ceiling; raise analysis.k_max to see whether more states reproduce")  # fmt: skip
        return (
            f"held-out BIC is still falling at K_max = {self.k_max}: K = {self.k_max} is a "
            "ceiling, not a minimum; raise analysis.k_max (and check covariance_type and "
            "standardisation) before reading the map's states"
        )

    def settings(self) -> EMSettings:
        """The EM settings every fit uses (:data:`EM_PARAMETERS`; plain values, picklable)."""
        return EMSettings(**{name: getattr(self, name) for name in EM_PARAMETERS})

    def _usable_features(
        self, runs: Mapping[str, pd.DataFrame]
    ) -> tuple[list[str], dict[str, str]]:
        """The features the HMM can use, and every other one with the reason it is left out."""
        missing = [f for f in self.features if any(f not in table for table in runs.values())]
        if missing:
            raise ValueError(f"metric tables lack the feature columns {missing}; read them with "
                             "trainmap.dynamics.metrics.tables.read_metric_table, which names the file")  # fmt: skip
        used, dropped = [], {}
        for feature in self.features:
            reason = self._why_unusable(feature, runs)
            if reason is None:
                used.append(feature)
                continue
            dropped[feature] = reason
            warnings.warn(f"feature {feature!r} is {reason}; dropped from the HMM", stacklevel=3)
        if not used:
            reasons = "; ".join(f"{feature}: {reason}" for feature, reason in dropped.items())
            raise ValueError(f"no usable feature: every feature was dropped ({reasons})")
        return used, dropped

    def _why_unusable(self, feature: str, runs: Mapping[str, pd.DataFrame]) -> str | None:
        """Why ``feature`` cannot be standardised over ``runs``, or None when it can.

        Not finite: in whole runs (an architecture without the metric) or at some checkpoints (a
        diverged run, a ratio of all-zero weights). Constant: variation below float32 rounding
        (metrics come from float32 weights: e.g. the mean classifier bias under cross-entropy
        moves only by ~1e-9 of rounding).
        """
        columns = {run: table[feature].to_numpy(dtype=float) for run, table in runs.items()}
        undefined = [run for run, values in columns.items() if np.isnan(values).all()]
        if undefined:
            why = UNDEFINED_BY_ARCHITECTURE.get(feature, "")
            where = "every run" if len(undefined) == len(runs) else _some_runs(undefined, len(runs))
            return f"NaN at every checkpoint of {where}" + (f" ({why})" if why else "")
        first_bad = {}
        for run, values in columns.items():
            bad = np.flatnonzero(~np.isfinite(values))
            if len(bad):
                table = runs[run]
                first_bad[run] = (f"step {table['step'].iloc[bad[0]]}" if "step" in table
                                  else f"row {bad[0]}")  # fmt: skip
        if first_bad:
            examples = [f"{run} from {where}" for run, where in first_bad.items()]
            return (f"not finite at some checkpoints of {_some_runs(examples, len(runs))} (a "
                    "diverged run, or a ratio where every weight is zero)")  # fmt: skip
        if self.standardisation == "per_run":
            flat = [run for run, values in columns.items()
                    if values[:STANDARDISE_WINDOW].std() <= NUMERICALLY_CONSTANT]  # fmt: skip
            if flat:
                return (f"constant over the first {STANDARDISE_WINDOW} checkpoints of "
                        f"{_some_runs(flat, len(runs))} (per-run standardisation)")  # fmt: skip
            return None
        _, std = pooled_statistics(list(columns.values()))
        if std > NUMERICALLY_CONSTANT:
            return None
        return (
            f"constant over the first {STANDARDISE_WINDOW} checkpoints of every run (pooled "
            "standardisation)"
        )

    def dropped_note(self) -> str:
        """A sentence naming the features left out and why ("" when none was)."""
        if not self.dropped_features_:
            return ""
        reasons = "; ".join(f"{f}: {why}" for f, why in self.dropped_features_.items())
        return f"Features left out of the HMM: {reasons}."

    # --- using a fitted model ------------------------------------------------------------------

    def transform(self, table: pd.DataFrame) -> np.ndarray:
        """A run's observations z~_1:T: standardised with the pooled statistics of the fitted runs,
        or (``per_run``) with the run's own first checkpoints."""
        values = table[self.features_].to_numpy(dtype=float)
        if self.standardisation_["kind"] == "pooled":
            mean = np.asarray(self.standardisation_["mean"])
            std = np.asarray(self.standardisation_["std"])
            return (values - mean) / std
        z, _, std = standardise(values)
        if not (np.isfinite(z).all() and (std > 0).all()):
            bad = [f for f, s in zip(self.features_, std, strict=True) if not s > 0]
            raise ValueError(f"the run cannot be standardised: constant features {bad}")
        return z

    def predict(self, table: pd.DataFrame) -> np.ndarray:
        """The Viterbi state sequence of one run (:meth:`decode` of it)."""
        return self.decode({"run": table})["run"]

    def decode(self, runs: Mapping[str, pd.DataFrame]) -> dict[str, np.ndarray]:
        """Viterbi state sequences of many runs (one call for their log-densities; a model with
        run terms decodes every run's residuals, its terms estimated first)."""
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=1):  # tiny matrices: BLAS threads only add overhead
            states = self.model_.predict_runs([self.transform(table) for table in runs.values()])
        return dict(zip(runs, states, strict=True))

    def residuals(self, z: np.ndarray) -> np.ndarray:
        """One run's observations as the emission model sees them: ``z`` itself (``plain``), or
        its residuals z_t - b - c u_t (``run_affine``: divided by the run's scale a) with the run's
        terms estimated given the fitted parameters (``run_offset``, ``run_offset_drift``,
        ``run_affine``; :meth:`~trainmap.dynamics.maps.hmm.run_terms.RunOffsetHMM.residuals`), for the
        whole run."""
        return self.model_.residuals(z)

    def log_emissions(self, z: np.ndarray, residualised: bool = False) -> np.ndarray:
        """log p(z_t | s_t = k), [T, K], of one run's z (its residuals, :meth:`residuals`, unless
        ``residualised``: ``z`` is already)."""
        z = z if residualised else self.residuals(z)
        return self.model_.emission_log_densities(self._gaussian_log_densities(z))

    def _gaussian_log_densities(self, z: np.ndarray) -> np.ndarray:
        """log N(z_t; mu_k, Sigma_k), [T, K], of observations ``z`` as the model sees them."""
        from scipy.stats import multivariate_normal  # here: the refits' workers never need it

        covars = self.model_.covars_  # full matrices for every covariance type
        return np.column_stack(
            [
                # allow_singular: a tiny group (fewer checkpoints than features) fits a singular
                # full covariance; scipy then uses the pseudo-determinant and pseudo-inverse.
                multivariate_normal(self.model_.means_[k], covars[k], allow_singular=True).logpdf(z)
                for k in range(self.n_states_)
            ]
        ).reshape(len(z), self.n_states_)

    def filtered_posteriors(self, z: np.ndarray, residualised: bool = False) -> np.ndarray:
        """p(s_t = k | z_1:t) by the forward algorithm, [T, K] (not the smoothed posterior), of one
        run's z (residuals as :meth:`log_emissions`; a model with run terms estimates them from the
        whole run)."""
        log_emission = self.log_emissions(z, residualised)
        log_transition = np.log(np.maximum(self.model_.transmat_, 1e-300))
        log_alpha = np.log(np.maximum(self.model_.startprob_, 1e-300)) + log_emission[0]
        # numpy's log-add reduction: scipy's logsumexp is slower per call here
        # (docs/decisions/hmm-engine.md).
        log_sum = np.logaddexp.reduce
        filtered = np.empty_like(log_emission)
        filtered[0] = log_alpha - log_sum(log_alpha)
        for t in range(1, len(z)):
            log_alpha = log_sum(filtered[t - 1][:, None] + log_transition, axis=0) + log_emission[t]
            filtered[t] = log_alpha - log_sum(log_alpha)
        return np.exp(filtered)

    def precisions(self) -> np.ndarray:
        """Sigma_k^-1 of every state, [K, d, d]."""
        return np.linalg.pinv(self.model_.covars_, hermitian=True)  # = inv when not singular

    def feature_importance(self, z: np.ndarray, state: int, t: int) -> np.ndarray:
        """|d log p(s_t = k | z_1:t) / d z_t| (appendix A, the vector form):

        | Sigma_k^-1 (mu_k - z_t) - sum_h p(s_t = h | z_1:t) Sigma_h^-1 (mu_h - z_t) |,

        z_t the run's residual (:meth:`residuals`) where the model has run terms (held fixed).
        """
        return np.abs(self.log_posterior_gradient(z, state, t))

    def log_posterior_gradient(self, z: np.ndarray, state: int, t: int) -> np.ndarray:
        """d log p(s_t = k | z_1:t) / d z_t (appendix A, before the absolute value), of one run's
        whole z (the run terms of a model that has them estimated from all of it)."""
        z = self.residuals(z)
        posterior = self.filtered_posteriors(z[: t + 1], residualised=True)[t]
        pulls = self.state_pulls(z[t : t + 1])[0]
        return pulls[state] - posterior @ pulls

    def state_pulls(self, z: np.ndarray) -> np.ndarray:
        """d log p(z_t | s_t = h) / d z_t for every observation and state, [T, K, d], of
        observations ``z`` as the model sees them (:meth:`residuals`): Sigma_h^-1 (mu_h - z_t) for
        a Gaussian state, times u_h(z_t) = (nu + d) / (nu + delta_h(z_t)) for a Student-t one
        (:meth:`~trainmap.dynamics.maps.hmm.student_t.StudentTHMM.posterior_weights`)."""
        differences = self.model_.means_[None, :, :] - z[:, None, :]
        pulls = np.einsum("hij,thj->thi", self.precisions(), differences)
        weights = self.model_.posterior_weights(self._gaussian_log_densities(z))
        return pulls if weights is None else pulls * weights[:, :, None]

    def state_means(self) -> pd.DataFrame:
        """mu_k in z-units, one row per state."""
        return pd.DataFrame(self.model_.means_, columns=self.features_).rename_axis("state")

    def state_means_original(
        self, runs: Mapping[str, pd.DataFrame], states: Mapping[str, np.ndarray]
    ) -> pd.DataFrame:
        """Per-state means in original units: the mean raw value of the checkpoints in each
        state."""
        raw = pd.concat([table[self.features_] for table in runs.values()], ignore_index=True)
        labels = np.concatenate([states[run] for run in runs])
        means = raw.groupby(labels).mean().reindex(range(self.n_states_))
        return means.rename_axis("state")

    # --- persistence ---------------------------------------------------------------------------

    def estimator_settings(self) -> dict[str, Any]:
        """The constructor arguments (JSON-ready): ``TrainingHMM(**settings)`` is this estimator."""
        params = self.get_params() | {"features": list(self.features)}
        if self.emission != "student_t":  # read by that emission only: hmm.json as before it
            del params["degrees_of_freedom"]
        return params

    def save(self, npz_path: str | os.PathLike, json_path: str | os.PathLike) -> None:
        """Parameters as arrays (npz) and everything else as JSON (the emission model among the
        estimator's settings, so :meth:`load` rebuilds the same model type); no pickle. The run
        terms of the fitted runs are not saved: they belong to the runs and are estimated again
        for every run decoded."""
        arrays = {
            "startprob": self.model_.startprob_,
            "transmat": self.model_.transmat_,
            "means": self.model_.means_,
            "covars": covars_in_own_shape(self.model_),
        }
        write_atomic(npz_path, lambda tmp: _save_npz(tmp, arrays))
        meta = {
            "estimator": self.estimator_settings(),
            "n_states": self.n_states_,
            "selection_at_ceiling": self.at_ceiling_,
            "selection_note": self.ceiling_message() if self.at_ceiling_ else None,
            "features": self.features_,
            "dropped_features": self.dropped_features_,
            "train_runs": self.train_runs_,
            "heldout_runs": self.heldout_runs_,
            "folds": self.folds_,
            "standardisation": self.standardisation_,
            "selection": self.selection_.to_dict(orient="records"),
            "restarts": self.restarts_.to_dict(orient="records"),
        }
        save_json(meta, json_path)

    @classmethod
    def load(cls, npz_path: str | os.PathLike, json_path: str | os.PathLike) -> TrainingHMM:
        """Rebuild a fitted estimator saved by :meth:`save`; predictions are identical."""
        meta = json.loads(Path(json_path).read_text())
        # A file saved before the selection rule (the emission model) was a setting was selected by
        # one held-out split (with the plain model).
        estimator = cls(**({"selection": "holdout", "emission": "plain"} | meta["estimator"]))
        with np.load(npz_path, allow_pickle=False) as arrays:
            model = emission_model(
                meta["n_states"],
                estimator.emission,
                degrees_of_freedom=estimator.degrees_of_freedom,
                covariance_type=estimator.covariance_type,
                min_covar=estimator.min_covar,
            )
            model.startprob_ = arrays["startprob"]
            model.transmat_ = arrays["transmat"]
            model.means_ = arrays["means"]
            # As fitted (hmmlearn's M-step sets _covars_ directly): a state of a tiny group may be
            # singular to rounding, which the public setter would refuse.
            model._covars_ = arrays["covars"]
            model.n_features = arrays["means"].shape[1]
        estimator.model_, estimator.n_states_ = model, meta["n_states"]
        estimator.models_ = {meta["n_states"]: model}
        estimator.at_ceiling_ = meta["selection_at_ceiling"]
        estimator.features_ = meta["features"]
        dropped = meta["dropped_features"]  # a list before the reasons were recorded
        estimator.dropped_features_ = (dict.fromkeys(dropped, "reason not recorded")
                                       if isinstance(dropped, list) else dropped)  # fmt: skip
        estimator.train_runs_, estimator.heldout_runs_ = meta["train_runs"], meta["heldout_runs"]
        estimator.folds_ = meta.get("folds", [meta["heldout_runs"]])
        estimator.standardisation_ = meta["standardisation"]
        estimator.selection_ = pd.DataFrame(meta["selection"])
        estimator.restarts_ = pd.DataFrame(meta["restarts"])
        return estimator


def _some_runs(runs: Sequence[str], total: int) -> str:
    """``runs a, b, c ... (7 of 40)``: a few of the runs a reason names, and how many."""
    shown = ", ".join(runs[:3]) + (" ..." if len(runs) > 3 else "")
    return f"run{'s' * (len(runs) > 1)} {shown} ({len(runs)} of {total})"


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as stream:  # np.savez on a path would append ".npz" to the temp name
        np.savez(stream, **arrays)
