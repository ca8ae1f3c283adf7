"""Model selection: every K fitted on the splits of a selection rule, scored, and K chosen.

The one path of the full fit (:meth:`~trainmap.dynamics.maps.hmm.estimator.TrainingHMM.fit`) and of
every bootstrap and stability refit (:func:`trainmap.dynamics.verdicts.certainty.refit_resample`):
:func:`select_model` splits the standardised runs by the rule (:func:`selection_splits`:
``holdout``, the paper's 20 % of the runs held out; ``folds``; ``reproducible``; ``gain``, on the
folds' splits), fits every
(split, K, restart) (:func:`fit_restarts`: the Ks of one (split, restart), a lockstep set, in one
call; in parallel processes with the same numbers as serially), scores each K on its held-out runs
by hmmlearn's BIC, -2 log L + p log n (Hu et al., sec. 2.1; the runs' own terms counted in p,
:func:`score_heldout`) or (``gain``) by its held-out log-likelihood per checkpoint, and chooses K
(:func:`~trainmap.dynamics.maps.hmm.curves.choose_k`). Each restart is seeded from the estimator's
seed, K and the restart index (:func:`restart_seed`); a refit warm-starts from the full fit's
models. Selection asks each model what it needs through :class:`SelectableHMM`: whether it fits
in lockstep with the other Ks, its training objective, its EM iterations and its run parameters,
never its emission's name. Why these rules and their defaults: docs/decisions/hmm-selection.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import pandas as pd

from trainmap.dynamics.maps.hmm.curves import (
    DEFAULT_REPRODUCE_ARI,
    DEFAULT_REPRODUCE_K,
    DEFAULT_REPRODUCE_SHARE,
    choose_k,
    folds_curve,
    gain_curve,
    reproducibility_curve,
    selection_curve,
)
from trainmap.dynamics.maps.hmm.factory import (
    EMSettings,
    check_choice,
    initialise,
    make_model,
    quietly,
    start_from,
)
from trainmap.dynamics.maps.hmm.splits import (
    Data,
    SelectionFailed,
    Split,
    fold_split,
    half_splits,
    stack,
)
from trainmap.schema import section_defaults

SELECTION_RULES = ("holdout", "folds", "reproducible", "gain")
#: The selection rule, its restarts per K and how a K's restarts score it: the config schema's
#: defaults of ``analysis.selection``, ``analysis.restarts`` and ``analysis.restart_rule``
#: (docs/decisions/hmm-selection.md).
DEFAULT_SELECTION: str = section_defaults("analysis")["selection"]
DEFAULT_RESTARTS: int = section_defaults("analysis")["restarts"]
DEFAULT_RESTART_RULE: str = section_defaults("analysis")["restart_rule"]
#: Folds of the runs for ``selection="folds"``: the config schema's default of ``analysis.folds``
#: (bench/selection_nuisance.py; docs/decisions/hmm-selection.md).
DEFAULT_FOLDS: int = section_defaults("analysis")["folds"]
#: Runs of each group in each half of the ``reproducible`` rule (setting ``half_size``; None: half
#: of each group's runs; a joint comparison halves each of its groups): two draws of a fixed
#: number of seeds per method, so that K does not follow the seed count. The config schema's
#: default of ``analysis.half_size`` (bench/selection_settle.py; docs/decisions/hmm-selection.md).
DEFAULT_HALF_SIZE: int | None = section_defaults("analysis")["half_size"]
#: The ``gain`` rule's tolerance: the held-out log-likelihood per checkpoint (nats) each added
#: state must raise on average; the config schema's default of ``analysis.min_gain``
#: (bench/selection_growth.py; docs/decisions/hmm-selection.md).
DEFAULT_MIN_GAIN: float = section_defaults("analysis")["min_gain"]
#: How ``min_gain`` applies to d metrics (``analysis.min_gain_scale``): ``metrics``, the tolerance
#: at the paper's :data:`PAPER_METRICS` metrics scaled by d / 14, or ``fixed``, the same for any d.
MIN_GAIN_SCALES = ("metrics", "fixed")
DEFAULT_MIN_GAIN_SCALE: str = section_defaults("analysis")["min_gain_scale"]
#: The paper's number of weight metrics (Hu et al., table 1), the d at which ``min_gain`` is stated.
PAPER_METRICS = 14


def gain_tolerance(min_gain: float, min_gain_scale: str, n_features: int) -> float:
    """The gain rule's tolerance in held-out nats per checkpoint per added state for a map of
    ``n_features`` metrics: ``min_gain * n_features / 14`` (``metrics``: the same gain per metric
    as ``min_gain`` at the paper's 14) or ``min_gain`` (``fixed``)."""
    check_choice("min_gain_scale", min_gain_scale, MIN_GAIN_SCALES)
    return min_gain * n_features / PAPER_METRICS if min_gain_scale == "metrics" else min_gain


class SelectableHMM(Protocol):
    """What model selection asks of an emission model (hmmlearn's estimator interface besides:
    ``fit``, ``score``, ``n_components``, ``monitor_``, ``n_iter``)."""

    #: Whether several models of the same runs fit in lockstep
    #: (:func:`~trainmap.dynamics.maps.hmm.gaussian.fit_together`), or each by its own ``fit``.
    fits_in_lockstep: bool

    def fit_weighted(self, X: np.ndarray, lengths: Any, weights: Any) -> Any:
        """Fit where run i counts ``weights[i]`` times."""
        ...

    def score_weighted(self, X: np.ndarray, lengths: Any, weights: Any) -> float:
        """log p of the runs, run i counted ``weights[i]`` times."""
        ...

    def training_objective(self, X: np.ndarray, lengths: Any, weights: Any = None) -> float:
        """What the fit maximised, at the fitted parameters (ranks restarts)."""
        ...

    def fit_iterations(self) -> int:
        """EM iterations of the last fit."""
        ...

    def n_run_parameters(self, n_runs: int) -> int:
        """Free parameters of ``n_runs`` scored runs' own terms (counted in the held-out BIC)."""
        ...

    def predict_runs(self, sequences: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The Viterbi state sequence of each run."""
        ...


def restart_seed(random_state: int, n_states: int, restart: int) -> int:
    """The seed of one restart: a function of the estimator's seed, K and the restart index."""
    return int(np.random.SeedSequence([random_state, n_states, restart]).generate_state(1)[0])


def training_score(
    model: Any, train: tuple[np.ndarray, list[int]], weights: Any = None, score: bool = True
) -> float | None:
    """A fitted model's training objective (:meth:`SelectableHMM.training_objective`: the
    log-likelihood, or with run terms the penalised one of their fit), or None if EM broke down
    (NaN parameters, a state never entered). ``weights``: run i of ``train`` counts ``weights[i]``
    times. ``score=False`` skips the scoring pass: the result is then NaN for a fit whose means are
    finite, None otherwise."""
    if not score:
        return math.nan if np.isfinite(model.means_).all() else None
    try:
        with quietly():
            objective = model.training_objective(*train, weights)
    except ValueError:  # EM left a state without mass (NaN parameters)
        return None
    return float(objective) if np.isfinite(objective) else None


def n_free_parameters(model: Any) -> int:
    """The free parameters hmmlearn's ``bic`` counts for ``model`` (start, transitions, means,
    covariances of its covariance type)."""
    per_parameter = model._get_n_fit_scalars_per_param()
    return int(sum(per_parameter[name] for name in model.params))


def information_criteria(log_likelihood: float, n_parameters: int, n_observations: int) -> dict:
    """BIC = -2 log L + p log n and AIC = -2 log L + 2 p (hmmlearn's definitions), and the n
    held-out observations they were scored on."""
    return {
        "heldout_log_likelihood": float(log_likelihood),
        "bic": float(-2 * log_likelihood + n_parameters * math.log(n_observations)),
        "aic": float(-2 * log_likelihood + 2 * n_parameters),
        "heldout_observations": int(n_observations),
    }


def score_heldout(
    model: Any, heldout: tuple[np.ndarray, list[int]], weights: Any = None
) -> dict[str, float]:
    """Held-out log-likelihood, BIC and AIC of a fitted model (one forward pass; ``weights``
    counts each held-out run that many times, as a bootstrap draw does). The parameters counted
    include the scored runs' own terms (the model's ``n_run_parameters``: none for the plain
    model; d per run, 2d with drift, 2d + 1 with drift and scale for a model with run terms, whose
    score is the profile log-likelihood; a run drawn twice counts twice). Callers limit BLAS to
    one thread around it (:func:`_fit_ks_together`, the
    bootstrap's chunks)."""
    if weights is None:
        log_likelihood, n_observations = model.score(*heldout), len(heldout[0])
        n_runs = len(heldout[1])
    else:
        log_likelihood = model.score_weighted(*heldout, weights)
        n_observations = int(np.asarray(weights) @ np.asarray(heldout[1]))
        n_runs = int(np.asarray(weights).sum())
    n_parameters = n_free_parameters(model) + model.n_run_parameters(n_runs)
    return information_criteria(log_likelihood, n_parameters, n_observations)


def _fit_ks_together(
    ks: Sequence[int], restart: int, train: Data, heldout: Data | None, settings: EMSettings,
    weights: tuple[Any, Any], starts: Mapping[int, Mapping[str, np.ndarray]] | None,
    score_train: bool,
) -> list[dict[str, Any]]:  # fmt: skip
    """:func:`_fit_ks_together_single_threaded` with BLAS single-threaded: the matrices are small
    (threads only add synchronisation), and the sums come out the same whether lockstep sets run
    one after another or in parallel processes."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        return _fit_ks_together_single_threaded(ks, restart, train, heldout, settings, weights,
                                                starts, score_train)  # fmt: skip


# The scores of a restart that fitted nothing (no model; it never wins a selection).
_FAILED_FIT = {"model": None, "train_log_likelihood": math.nan,
               "heldout_log_likelihood": math.nan, "bic": math.inf, "aic": math.inf,
               "heldout_observations": 0}  # fmt: skip


def _fit_ks_together_single_threaded(
    ks: Sequence[int], restart: int, train: Data, heldout: Data | None, settings: EMSettings,
    weights: tuple[Any, Any], starts: Mapping[int, Mapping[str, np.ndarray]] | None,
    score_train: bool,
) -> list[dict[str, Any]]:  # fmt: skip
    """A fit of every K of ``ks`` (a lockstep set) on one split, each scored on the held-out runs
    (``heldout`` None: not scored, models of all runs): seeded restart ``restart`` from
    :func:`~trainmap.dynamics.maps.hmm.factory.initialise` (or hmmlearn's start), or EM continued from
    ``starts[K]`` (warm starts). Models that fit in lockstep
    (:attr:`SelectableHMM.fits_in_lockstep`): the Ks' EM iterations run together
    (:func:`~trainmap.dynamics.maps.hmm.gaussian.fit_together`; each K's fit is the one it would have
    alone); the others each by its own fit (:func:`_fit_alone`)."""
    train_weights = weights[0]
    n_observations = (len(train[0]) if train_weights is None
                      else int(np.asarray(train_weights) @ np.asarray(train[1])))  # fmt: skip
    rows, models = {}, {}
    for k in ks:
        seed = restart_seed(settings.random_state, k, restart)
        if k > len(train[0]):  # more states than training observations: nothing to fit
            rows[k] = {"n_states": k, "restart": restart, "iterations": 0,
                       "converged": False} | _FAILED_FIT  # fmt: skip
        elif starts is not None:
            models[k] = start_from(make_model(k, settings, n_observations, random_state=seed,
                                              init_params=""), starts[k])  # fmt: skip
        else:
            models[k] = make_model(k, settings, n_observations, random_state=seed)
            if settings.init == "sticky":
                models[k] = initialise(models[k], train, seed)
    from trainmap.dynamics.maps.hmm.gaussian import fit_together  # hmmlearn: see emission_model

    together = [k for k, model in models.items() if model.fits_in_lockstep]
    completed = {}
    if together:
        with quietly():
            done = fit_together([models[k] for k in together], *train, train_weights)
        completed = dict(zip(together, done, strict=True))
    for k, model in models.items():
        if k not in completed:
            completed[k] = _fit_alone(model, train, train_weights)
    for k, model in models.items():
        rows[k] = _scored_fit(model, restart, train, heldout, weights, score_train, completed[k])
    return [rows[k] for k in ks]


def _fit_alone(model: SelectableHMM, train: Data, weights: Any) -> bool:
    """Fit one model by its own ``fit`` (``fit_weighted`` with run weights): whether it completed
    with finite parameters and training objective (a model that does not fit in lockstep, such as
    the ECM of :class:`~trainmap.dynamics.maps.hmm.run_terms.RunOffsetHMM`)."""
    from trainmap.dynamics.maps.hmm.gaussian import usable

    with quietly():
        try:
            if weights is None:
                model.fit(*train)
            else:
                model.fit_weighted(*train, weights)
        except (ValueError, np.linalg.LinAlgError):
            return False
    return usable(model) and training_score(model, train, weights) is not None


def _scored_fit(
    model: Any, restart: int, train: Data, heldout: Data | None, weights: tuple[Any, Any],
    score_train: bool, completed: bool,
) -> dict[str, Any]:  # fmt: skip
    """The row of one fitted K: its iterations, convergence, training and held-out scores."""
    row = {"n_states": model.n_components, "restart": restart,
           "iterations": model.fit_iterations(),
           "converged": bool(model.monitor_.converged and model.monitor_.iter < model.n_iter)}  # fmt: skip
    train_ll = training_score(model, train, weights[0], score_train) if completed else None
    if train_ll is None:
        return row | _FAILED_FIT
    if heldout is None:  # not scored: NaN, not a failure's inf
        return row | {"model": model, "train_log_likelihood": train_ll,
                      "heldout_log_likelihood": math.nan, "bic": math.nan, "aic": math.nan,
                      "heldout_observations": 0}  # fmt: skip
    try:
        scores = score_heldout(model, heldout, weights[1])
    except (ValueError, np.linalg.LinAlgError):  # e.g. EM left a state that is never entered
        return row | _FAILED_FIT
    return row | {"model": model, "train_log_likelihood": train_ll} | scores


def fit_restarts(
    tasks: Sequence[tuple[int, int, int]],
    splits: Sequence[Split],
    settings: EMSettings,
    n_jobs: int,
    starts: Mapping[int, Mapping[str, np.ndarray]] | None = None,
    score_train: bool = True,
    split_starts: Mapping[int, Mapping[int, Mapping[str, np.ndarray]]] | None = None,
) -> list[dict[str, Any]]:
    """Every (split, K, restart) fit, serially or in parallel processes (the same numbers either
    way); each fit's row names its ``split``. The Ks of one (split, restart), a lockstep set, are
    fitted together (:func:`_fit_ks_together`), whatever ``n_jobs``: processes share out the
    lockstep sets. ``starts`` (K -> parameters) warm-starts every split; ``split_starts`` (split ->
    K -> parameters) the splits it names instead."""
    ks_together: dict[tuple[int, int], list[int]] = {}
    for part, k, r in tasks:
        ks_together.setdefault((part, r), []).append(k)
    order = sorted(ks_together)
    split_starts = split_starts or {}
    arguments = [(sorted(ks_together[part, r]), r, splits[part].train, splits[part].heldout,
                  settings, splits[part].weights, split_starts.get(part, starts), score_train)
                 for part, r in order]  # fmt: skip
    if n_jobs == 1:
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=1):  # once: entering the limits costs ~2 ms
            results = [_fit_ks_together_single_threaded(*args) for args in arguments]
    else:
        from joblib import Parallel, delayed

        results = Parallel(n_jobs=n_jobs)(delayed(_fit_ks_together)(*args) for args in arguments)
    fits = [fit | {"split": part} for (part, _), rows in zip(order, results, strict=True)
            for fit in rows]  # fmt: skip
    return sorted(fits, key=lambda fit: (fit["split"], fit["n_states"], fit["restart"]))


@dataclass
class ModelSelection:
    """What :func:`select_model` found: every fit, the selection curve, each K's model, the K."""

    restarts: pd.DataFrame  # one row per (split, K, restart) fit, without its model
    curve: pd.DataFrame  # one row per K (selection_curve, folds_curve)
    models: dict[int, Any]  # K -> its best restart's model
    n_states: int  # the chosen K
    folds: list[list[str]]  # the held-out runs of each split that scored K
    # the reproducible rule's half maps: split -> K -> its best model (empty for other rules)
    half_models: dict[int, dict[int, Any]] = field(default_factory=dict)

    @property
    def model(self) -> Any:
        """The chosen K's model."""
        return self.models[self.n_states]


def _run_weights(counts: Sequence[float]) -> np.ndarray | None:
    """Run weights of a part (None when every run counts once: the unweighted fit)."""
    weights = np.asarray(counts, dtype=float)
    return None if np.all(weights == 1.0) else weights


def stacked_runs(z: Mapping[str, np.ndarray], counts: Mapping[str, float]) -> tuple[Data, Any]:
    """The runs of ``counts`` (run -> times drawn) stacked for one fit, with their weights."""
    return stack([z[run] for run in counts]), _run_weights(list(counts.values()))


def _split(z: Mapping[str, np.ndarray], train: Mapping[str, float],
           heldout: Mapping[str, float] | None = None) -> Split:  # fmt: skip
    """One split: the runs of ``train`` fitted, those of ``heldout`` scored (None: nothing held
    out, every run fitted), each counted as often as drawn."""
    data, weights = stacked_runs(z, train)
    if heldout is None:
        return Split(data, None, (weights, None))
    held, held_weights = stacked_runs(z, heldout)
    return Split(data, held, (weights, held_weights))


def pooled_counts(train: Mapping[str, float], heldout: Mapping[str, float]) -> dict[str, float]:
    """Both parts of a draw as one: run -> times drawn in either (the rules that split the runs
    themselves, and a fixed-K fit, use every run)."""
    pooled = dict(train)
    for run, count in heldout.items():
        pooled[run] = pooled.get(run, 0.0) + count
    return pooled


def selection_splits(
    z: Mapping[str, np.ndarray], train: Mapping[str, float], heldout: Mapping[str, float],
    selection: str, folds: int, random_state: int, halves_n: int | None = None,
    strata: Mapping[str, str] | None = None, cap_halves: bool = False,
    half_size: int | None = None,
) -> tuple[list[Split], list[list[str]]]:  # fmt: skip
    """The splits a selection rule scores K on, and their held-out runs (run -> times drawn in
    ``train`` and ``heldout``; the runs' z-scores in ``z``).

    ``"holdout"`` (the paper's): one split, ``train`` against ``heldout``; each K's model is its fit
    of ``train``. ``"folds"``: the runs of both parts pooled and dealt into ``folds`` folds
    (:func:`~trainmap.dynamics.maps.hmm.splits.fold_split`, seeded by ``random_state``; a run drawn
    several times stays in one fold, so no copy of a held-out run is trained on), one split per fold
    (the other folds against it), then a last split of every run unscored, each K's model;
    ``"gain"`` scores K on the same splits. ``"reproducible"``: the runs of both parts pooled and split ``halves_n`` times into two halves
    (:func:`~trainmap.dynamics.maps.hmm.splits.half_splits`, within each stratum of ``strata``: run ->
    group, a joint comparison's labels; None: the runs are one group; ``half_size`` runs of each
    group in each half), one split per half scored on the other half (first, second, first, ...),
    then the split of every run, each K's model; the second halves are returned as the held-out
    runs.
    """
    check_choice("selection", selection, SELECTION_RULES)

    if selection == "reproducible":
        pooled = pooled_counts(train, heldout)
        halves = half_splits(list(pooled), halves_n, random_state, strata, cap_halves, half_size)
        splits = []
        for first, second in halves:
            for half, other in ((first, second), (second, first)):
                splits.append(_split(z, {run: pooled[run] for run in half},
                                     {run: pooled[run] for run in other}))  # fmt: skip
        splits.append(_split(z, pooled))
        return splits, [second for _, second in halves]
    if selection == "holdout":  # "gain" scores on folds, as "folds" does
        return [_split(z, train, heldout)], [list(heldout)]
    pooled = pooled_counts(train, heldout)
    held = fold_split(list(pooled), folds, random_state)
    splits = []
    for fold in held:
        inside = set(fold)
        kept = {run: count for run, count in pooled.items() if run not in inside}
        out = {run: count for run, count in pooled.items() if run in inside}
        splits.append(_split(z, kept, out))
    splits.append(_split(z, pooled))
    return splits, held


def select_model(
    z: Mapping[str, np.ndarray],
    train: Mapping[str, float],
    heldout: Mapping[str, float],
    settings: EMSettings,
    ks: Sequence[int],
    *,
    selection: str = DEFAULT_SELECTION,
    folds: int = DEFAULT_FOLDS,
    restarts: int = DEFAULT_RESTARTS,
    restart_rule: str = DEFAULT_RESTART_RULE,
    n_jobs: int = 1,
    starts: Mapping[int, Mapping[str, np.ndarray]] | None = None,
    score_train: bool = True,
    halves: int | None = None,
    reproduce_ari: float = DEFAULT_REPRODUCE_ARI,
    reproduce_share: float = DEFAULT_REPRODUCE_SHARE,
    reproduce_k: str = DEFAULT_REPRODUCE_K,
    half_size: int | None = DEFAULT_HALF_SIZE,
    strata: Mapping[str, str] | None = None,
    half_starts: Mapping[int, Mapping[int, Mapping[str, np.ndarray]]] | None = None,
    cap_halves: bool = False,
    min_gain: float = DEFAULT_MIN_GAIN,
    min_gain_scale: str = DEFAULT_MIN_GAIN_SCALE,
    fixed: bool = False,
) -> ModelSelection:
    """Fit every K of ``ks`` on the standardised runs ``z``, score each on held-out runs and choose
    K by held-out BIC: the one selection of the full fit
    (:meth:`~trainmap.dynamics.maps.hmm.estimator.TrainingHMM.fit`) and of every refit
    (:func:`trainmap.dynamics.verdicts.certainty.refit_resample`, the bootstrap's and the stability curve's).

    ``train`` and ``heldout``: run -> times drawn (a bootstrap draw; 1: once). ``selection`` is the
    rule (:func:`selection_splits`): ``"holdout"`` scores K on ``heldout`` once, ``"folds"`` scores
    it on each of ``folds`` folds of all the runs and takes the mean BIC
    (:func:`~trainmap.dynamics.maps.hmm.curves.folds_curve`); ``"gain"`` scores it on the same folds
    and takes the smallest K that no larger K beats by more than ``min_gain`` held-out nats per
    checkpoint per added state (:func:`~trainmap.dynamics.maps.hmm.curves.gain_curve`; ``min_gain``
    >= 0, else a ValueError naming ``analysis.min_gain``), scaled to the runs' d metrics by
    ``min_gain_scale`` (:func:`gain_tolerance`). ``restarts`` seeded restarts per K and
    split, K's model its best by training log-likelihood and K's score by ``restart_rule``
    (:func:`~trainmap.dynamics.maps.hmm.curves.selection_curve`). ``starts`` (K -> parameters in the
    standard units of ``z``) warm-starts every fit of K from those parameters with one EM run
    instead of fresh restarts; ``score_train=False`` then skips the training log-likelihood, which
    only picks among restarts. ``"reproducible"`` fits every K on each half of ``halves`` random
    splits of the runs (within each stratum of ``strata``: per method in a joint comparison), each
    half scored on the other, and on all runs; K is the largest K up to the minimum of that two-fold
    held-out BIC whose two half maps decode every run alike (adjusted Rand index >=
    ``reproduce_ari``) in a share >= ``reproduce_share`` of the splits (``reproduce_k``: the largest
    such K, or the largest such that every smaller K reproduces too; ``half_size``: each half holds
    that many runs of each stratum, at most half of them)
    (:func:`~trainmap.dynamics.maps.hmm.curves.reproducibility_curve`,
    :func:`~trainmap.dynamics.maps.hmm.curves.choose_k`); K's model is its fit of all runs. Warm-started,
    each half continues from ``half_starts[split]`` (the full fit's half maps, fitted independently,
    so two halves never share a start) and the fit of all runs from ``starts``; a refit
    (warm-started, or ``cap_halves``) uses as many splits as its runs allow. Raises
    :class:`~trainmap.dynamics.maps.hmm.splits.SelectionFailed` when no K could be fitted and scored.
    """
    if starts is not None and (restarts != 1 or set(ks) - set(starts)):
        raise ValueError("a warm-started selection runs one EM fit per K and needs a start for "
                         "every K")  # fmt: skip
    if not score_train and restarts > 1:
        raise ValueError("choosing among restarts needs their training log-likelihood")
    if not (isinstance(min_gain, int | float) and math.isfinite(min_gain) and min_gain >= 0):
        raise ValueError(f"analysis.min_gain {min_gain!r}: the held-out log-likelihood per "
                         "checkpoint a state must add is a number >= 0 (nats; default "
                         f"{DEFAULT_MIN_GAIN})")  # fmt: skip
    if not 0 < reproduce_ari <= 1 or not 0 < reproduce_share <= 1:
        raise ValueError(f"analysis.reproduce_ari {reproduce_ari!r} and analysis.reproduce_share "
                         f"{reproduce_share!r} must be in (0, 1]")  # fmt: skip
    if fixed:
        return _fixed_k(z, train, heldout, settings, ks, restarts, restart_rule, n_jobs, starts,
                        score_train)  # fmt: skip
    splits, held = selection_splits(z, train, heldout, selection, folds, settings.random_state,
                                    halves, strata, cap_halves=starts is not None or cap_halves,
                                    half_size=half_size)  # fmt: skip
    tasks = [(part, k, r) for part in range(len(splits)) for k in ks for r in range(restarts)]
    split_starts = None
    if starts is not None and half_starts:  # each half from its own; the fit of all runs: starts
        split_starts = {part: half_starts[part] for part in range(len(splits) - 1)
                        if part in half_starts}  # fmt: skip
    fits = fit_restarts(tasks, splits, settings, n_jobs, starts, score_train, split_starts)
    modelled = len(splits) - 1  # the split whose fits are the models: the last
    half_models: dict[int, dict[int, Any]] = {}
    if selection == "holdout":
        curve = selection_curve(fits, restart_rule)
    elif selection == "folds":
        curve = folds_curve(fits, restart_rule, n_folds=modelled)
    elif selection == "gain":
        n_features = next(iter(z.values())).shape[1]
        tolerance = gain_tolerance(min_gain, min_gain_scale, n_features)
        curve = gain_curve(folds_curve(fits, restart_rule, n_folds=modelled), tolerance)
    else:
        pooled = {run: z[run] for run in {*train, *heldout}}
        curve, half_models = reproducibility_curve(fits, pooled, len(held), restart_rule,
                                                   reproduce_ari, reproduce_share,
                                                   every_k=starts is None and not cap_halves,
                                                   reproduce_k=reproduce_k)  # fmt: skip
    models = {}
    for row in curve.itertuples():
        if row.restart >= 0:
            models[row.n_states] = next(
                f["model"] for f in fits
                if f["split"] == modelled and f["n_states"] == row.n_states
                and f["restart"] == row.restart
            )  # fmt: skip
    if not models:
        raise SelectionFailed("every HMM fit failed (EM lost all states); the runs may be too "
                              "short or the features degenerate")  # fmt: skip
    table = pd.DataFrame([{k: v for k, v in f.items() if k != "model"} for f in fits])
    return ModelSelection(table, curve, models, choose_k(curve, reproduce_k), held, half_models)


def _fixed_k(
    z: Mapping[str, np.ndarray], train: Mapping[str, float], heldout: Mapping[str, float],
    settings: EMSettings, ks: Sequence[int], restarts: int, restart_rule: str, n_jobs: int,
    starts: Mapping[int, Mapping[str, np.ndarray]] | None, score_train: bool,
) -> ModelSelection:  # fmt: skip
    """:func:`select_model` with ``fixed=True``: the one K of ``ks`` fitted on every run of both
    parts (run -> times drawn), unscored (nothing to choose): a refit that keeps the full map's K
    (the bootstrap's and the stability curve's, :class:`~trainmap.dynamics.verdicts.certainty.Refit`)."""
    if len(ks) != 1:
        raise ValueError(f"a fixed-K fit takes one K, got {list(ks)}")
    splits = [_split(z, pooled_counts(train, heldout))]
    tasks = [(0, ks[0], r) for r in range(restarts)]
    fits = fit_restarts(tasks, splits, settings, n_jobs, starts, score_train)
    curve = selection_curve(fits, restart_rule)
    row = curve.iloc[0]
    if row["restart"] < 0:
        raise SelectionFailed(f"the fit of K = {ks[0]} failed (EM lost a state)")
    model = next(f["model"] for f in fits if f["restart"] == row["restart"])
    table = pd.DataFrame([{k: v for k, v in f.items() if k != "model"} for f in fits])
    return ModelSelection(table, curve, {int(ks[0]): model}, int(ks[0]), [])
