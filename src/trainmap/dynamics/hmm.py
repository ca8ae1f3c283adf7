"""A Gaussian HMM over per-checkpoint metrics of many runs (Hu et al., sec. 2.1, appendix C).

:class:`TrainingHMM` follows the paper's recipe, made reproducible, with the choices that decide K
exposed as settings (defaults chosen by the known-answer tests in tests/test_dynamics_selection.py
and bench/hmm_select.py):

1. Standardise every feature (sec. 2.1: z~_t = (f(w_t) - mu) / sigma, mu and sigma from the first
   (up to) 1000 checkpoints). ``standardisation="pooled"`` (default) takes one mu and sigma over
   all runs' first 1000 checkpoints; ``"per_run"`` takes each run's own, as the paper and the
   authors' code do (``zscore`` per run). Per-run z-scores give one state different coordinates
   in runs that spend different times in it (a run that stays long in its first state has its mean
   there), so the HMM needs extra states to cover the copies: on the known-answer data (3 true
   states) per-run z-scoring selects too many or too few states where pooled recovers K.
   A feature that is constant, or not finite in some run, cannot be standardised; it is dropped
   with a warning and named with the reason (``dropped_features_``, ``hmm.json``). Tables come
   through :func:`trainmap.dynamics.tables.read_metric_table`, which stops at a damaged one, so a
   non-finite feature here has a reason a healthy group can have: a model without biases (NaN
   bias metrics in every run), a ratio of all-zero weights, a diverged run.
2. Split the runs, by a seeded permutation of the sorted run ids (the authors' split depended on
   file order), as the selection rule ``selection`` says. ``"holdout"`` (the paper's): hold out
   20 % of the runs; K's models are fitted on the rest. ``"folds"``: deal the runs into ``folds``
   folds and score K on each fold with models fitted on the other folds, every run held out once;
   K's model is then fitted on all runs. Real seeds differ by more than their state (an offset, a
   scale, a slow drift of the metrics per run): one 20 % split then decides K by which few runs it
   holds out (bench/selection_nuisance.py). On known-answer runs with such nuisance
   (:func:`trainmap.dynamics.synthetic.sample_runs`, ``nuisance=1``) one split chose K = 4, 5, 6, 4
   for one data set under four estimator seeds; the mean over 3 folds chose K = 5 for each. Over
   10 sampler seeds x K = 3, 5, 3 folds recover K as often as one split with nuisance (13 of 20:
   7 against 3 at K = 5, but 6 against 10 at K = 3, where they add a fourth state) and more often
   without (20 against 19), at about 3.5 times the cost of a fit and 4 of a warm-started refit
   (the bootstrap's and the stability curve's). ``"reproducible"``: split the runs ``halves``
   times into two random halves (within each group of ``strata``: per method in a joint
   comparison), fit each half and score it on the other (repeated two-fold held-out BIC, minimum
   K_BIC), and take the largest K <= K_BIC whose two half maps decode every run alike (adjusted
   Rand index >= ``reproduce_ari`` in >= ``reproduce_share`` of the splits; ``reproduce_k:
   nested``: such that K and every smaller K do); K's model is its fit of all runs. Held-out BIC
   picks more states the more runs it sees (real seeds differ by small consistent amounts that
   more data pays for), and so does the largest K that reproduces: with more runs the halves agree
   on finer splits of the states too. The first K that fails to reproduce does not move that way,
   but it stops short of a true K whose merges into fewer states are ambiguous
   (:data:`REPRODUCE_K`). Halves of a fixed size (``half_size``, default 20 runs of each group:
   two draws of 20 seeds per method, the other runs sitting out) keep the largest reproducing K
   from following the seed count without that cost (:data:`DEFAULT_HALF_SIZE`;
   bench/selection_settle.py, bench/selection_real.py, bench/selection_reproducible.py). The
   class default and the workflow's default (``params.yaml``) stay the paper's rule: the
   reproducible rule fits every K 2 x ``halves`` + 1 times, and the bootstrap's and the
   stability curve's refits with it take make run past its budget.
3. For K = 1..K_max fit R restarts of a Gaussian HMM (hmmlearn's Baum-Welch; E-step vectorised
   over runs by :class:`~trainmap.dynamics.batched_hmm.BatchedGaussianHMM`; one restart's Ks fitted
   in lockstep, :func:`~trainmap.dynamics.batched_hmm.fit_together`), each seeded from
   ``random_state``, K and the restart index (the authors' restarts were unseeded). EM stops when
   the training log-likelihood per observation improves by less than ``tol`` or after ``n_iter``
   iterations. The restart with the best *training* log-likelihood is K's model (restarts tied to
   1e-9 go to the first: they reached one optimum); its BIC on the
   held-out runs (hmmlearn's ``bic``: -2 log L + p log n) is K's score (``restart_rule="best"``;
   with folds: the mean of the folds' scores, :func:`folds_curve`).
   The authors averaged the held-out BIC over their restarts (``restart_rule="mean"``): one
   restart stuck in a poor local optimum then raises K's score, and with full covariances (where
   EM has more local optima) that hides the true K. Covariances are ``"full"`` by default: the
   metrics move together (l1, l2 and the spectral norm share the weights' scale), and a diagonal
   model covers each tilted cluster with several axis-aligned states, so its BIC keeps falling to
   K_max (the authors' script offers diag, its command-line default, and full; the models behind
   the paper's K are saved under names containing ``-full-``). K minimises the held-out BIC; when
   that is K_max the BIC was still falling, which the fit reports (``at_ceiling_``, a warning, the
   JSON and the selection figure). All (K, restart) fits run in parallel with ``n_jobs`` and give
   the same numbers as serially (BLAS single-threaded inside each fit).
   Steps 1 to 3 are one path, :func:`standardise_runs` then :func:`select_model` (which splits
   the runs by the rule, :func:`selection_splits`, and ends in :func:`choose_k`): the full fit and
   every bootstrap and stability refit (:func:`trainmap.dynamics.certainty.refit_resample`) call
   them with the same rule, a refit with its resample's draw counts as weights (with folds, on
   folds of its own drawn runs) and, by default, warm starts from the full fit's models.
   The emission model is a setting, ``emission`` (:data:`EMISSIONS`, :func:`make_model`):
   ``plain`` (default) is the paper's Gaussian HMM; ``run_offset`` (``run_offset_drift``,
   ``run_affine``) gives every run its own offset (and linear drift, and scale) of the emissions,
   fitted with the states by ECM (:mod:`trainmap.dynamics.run_offset`; each K fitted on its own, not
   in lockstep), its held-out score the profile likelihood with the held-out runs' terms estimated
   and counted in the BIC. Real seeds differ by such terms; the plain model then merges or adds
   states (bench/run_offsets.py, README "Run-to-run nuisance").
4. Decode runs with Viterbi; filtered posteriors p(s_t | z_1:t) come from the forward algorithm
   (:meth:`TrainingHMM.filtered_posteriors`), as appendix A's feature importance needs. With run
   terms, every run is decoded and evaluated on its residuals z_t - b - c u_t (``run_affine``:
   divided by its scale a), its terms estimated given the fitted parameters
   (:meth:`TrainingHMM.residuals`).

The fitted model saves as plain arrays (``.npz``) plus JSON, never as a pickle; the best model of
every K stays in memory (``models_``) for the bootstrap's warm starts
(:mod:`trainmap.dynamics.certainty`).

Appendix C baselines: :func:`kmeans_selection` (k-means, no temporal structure, with the BIC of the
equivalent hard-assignment spherical Gaussian mixture) and HMM-1 (the same HMM selection on the L2
norm alone); :func:`baseline_table` gives table 4's form.
"""

from __future__ import annotations

import json
import logging
import math
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from trainmap.dynamics.columns import METRIC_NAMES
from trainmap.dynamics.tables import UNDEFINED_BY_ARCHITECTURE
from trainmap.io import save_json, write_atomic

STANDARDISE_WINDOW = 1000
#: A feature whose standard deviation is below this is constant up to float32 rounding.
NUMERICALLY_CONSTANT = 1e-7
COVARIANCE_TYPES = ("full", "diag")
STANDARDISATIONS = ("pooled", "per_run")
RESTART_RULES = ("best", "mean")
SELECTION_RULES = ("holdout", "folds", "reproducible")
#: Folds of the runs for ``selection="folds"`` (bench/selection_nuisance.py: 3 recovered K as
#: often as 2 or 5 folds, at less cost than 5).
DEFAULT_FOLDS = 3
#: The ``reproducible`` rule's defaults: random splits of the runs into two halves (setting
#: ``halves`` None: this many, or as many distinct ones as the runs allow), the agreement two half
#: maps must reach (adjusted Rand index of their decodings of every run) and the share of splits
#: that must reach it (bench/selection_reproducible.py: 30 of 40 known-answer data sets right at
#: 0.8 / 0.8, 31 at the best pair of a 3 x 3 grid).
DEFAULT_HALVES = 5
DEFAULT_REPRODUCE_ARI = 0.8
DEFAULT_REPRODUCE_SHARE = 0.8
#: Which K the ``reproducible`` rule takes up to K_BIC (setting ``reproduce_k``): ``largest``, the
#: largest K whose half maps reproduce; ``nested``, the largest K such that K and every smaller K
#: reproduce (one less than the first K that fails). Known answers (bench/selection_reproducible.py,
#: 40 data sets): largest 30 right, nested 15 (five true states merge into three in several equally
#: good ways, so K = 3 fails and nested stops at 2). Real runs made adaptive (parity_init, 40 to 88
#: seeds per method, bench/selection_settle.py): largest grows 3 -> 6-7, nested stays at 3 in 12 of
#: 16 fits.
REPRODUCE_K = ("largest", "nested")
#: Runs of each group in each half (setting ``half_size``; None: half of each group's runs). The
#: halves of a fixed size are two draws of a fixed number of seeds per method, so the rule's K
#: answers "which states do two studies of 20 seeds per method both find" and does not follow
#: the seed count: parity_init made adaptive (bench/selection_settle.py) gave K = 3, 3, 3, 3 at
#: 88 seeds per method under four split seeds with halves of 20, and 7, 6, 6, 6 with halves of 44.
#: Up to 40 runs per group it is the plain two-fold split (the known-answer bench's 40 runs).
DEFAULT_HALF_SIZE = 20
INITIALISATIONS = ("sticky", "hmmlearn")
#: What EM's ``tol`` is measured on: the training log-likelihood per observation
#: (``per_observation``, trainmap's: one tolerance whatever the number of runs) or in total
#: (``total``, hmmlearn's own ``tol``, which the training-maps authors' script left at 0.01).
TOL_SCALES = ("per_observation", "total")
#: Emission models (setting ``emission``): the paper's Gaussian HMM (``plain``), and the Gaussian
#: HMM with a per-run offset (``run_offset``), a per-run offset and linear drift
#: (``run_offset_drift``) and a per-run offset, linear drift and scale (``run_affine``) of
#: :mod:`trainmap.dynamics.run_offset`.
EMISSIONS = ("plain", "run_offset", "run_offset_drift", "run_affine")


def check_choice(key: str, value: Any, allowed: Sequence[str]) -> None:
    """Raise ValueError naming ``key``, the bad ``value`` and the allowed values."""
    if value not in allowed:
        raise ValueError(f"{key}: {value!r} is not allowed; choose one of {', '.join(allowed)}")


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

    The one standardisation of the full fit and of every refit (:func:`trainmap.dynamics.certainty.
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


def restart_seed(random_state: int, n_states: int, restart: int) -> int:
    """The seed of one restart: a function of the estimator's seed, K and the restart index."""
    return int(np.random.SeedSequence([random_state, n_states, restart]).generate_state(1)[0])


def holdout_split(
    run_ids: Sequence[str], holdout: float, random_state: int
) -> tuple[list[str], list[str]]:
    """``(train, heldout)``: a seeded split of the sorted run ids (independent of input order)."""
    ordered = sorted(run_ids)
    if len(ordered) < 2:
        raise ValueError(
            f"a training map needs at least 2 runs (one to hold out), got {len(ordered)}"
        )
    n_heldout = min(len(ordered) - 1, max(1, round(holdout * len(ordered))))
    order = np.random.default_rng(random_state).permutation(len(ordered))
    heldout = sorted(ordered[i] for i in order[:n_heldout])
    return [run for run in ordered if run not in heldout], heldout


def fold_split(run_ids: Sequence[str], folds: int, random_state: int) -> list[list[str]]:
    """The held-out runs of each of ``folds`` folds: a seeded permutation of the sorted distinct run
    ids dealt round-robin, so fold sizes differ by at most one and every run is held out once
    (fewer runs than folds: one run per fold)."""
    ordered = sorted(set(run_ids))
    if len(ordered) < 2:
        raise ValueError(
            f"a training map needs at least 2 runs (one to hold out), got {len(ordered)}"
        )
    n_folds = min(folds, len(ordered))
    order = np.random.default_rng(random_state).permutation(len(ordered))
    return [sorted(ordered[i] for i in order[fold::n_folds]) for fold in range(n_folds)]


def distinct_halvings(group_sizes: Sequence[int], half_size: int | None = None) -> int:
    """How many distinct splits into two halves (each group halved, :func:`half_splits`) runs in
    groups of ``group_sizes`` allow: the product of C(n, n // 2) over groups, halved for one group
    of even size (a split and its mirror image are one). With ``half_size`` (h = min(half_size,
    n // 2) runs of each group in each half, the rest in neither): the product of
    C(n, h) C(n - h, h), halved (the two halves are interchangeable)."""
    if half_size is not None:
        sizes = [(n, min(half_size, n // 2)) for n in group_sizes]
        return math.prod(math.comb(n, h) * math.comb(n - h, h) for n, h in sizes) // 2
    distinct = math.prod(math.comb(n, n // 2) for n in group_sizes)
    return distinct // 2 if len(group_sizes) == 1 and group_sizes[0] % 2 == 0 else distinct


def half_splits(
    run_ids: Sequence[str], n_splits: int | None, random_state: int,
    strata: Mapping[str, str] | None = None, cap: bool = False, half_size: int | None = None,
) -> list[tuple[list[str], list[str]]]:  # fmt: skip
    """``n_splits`` random splits of the sorted distinct runs into two disjoint halves, each a
    seeded permutation (``SeedSequence([random_state, split])``), within each stratum of
    ``strata`` (run -> group: per method in a joint comparison; the first half of a stratum of odd
    size has the smaller part). ``half_size``: each half takes min(half_size, n // 2) runs of each
    stratum of n runs, the rest sit out that split (two draws of a fixed number of seeds per
    method, whatever the runs' count). Splits may repeat when the runs allow few distinct ones;
    more splits than distinct halvings, or a stratum with fewer than 2 runs, is a ValueError
    naming the key (``cap``, a refit's resample: as many splits as exist, and
    :class:`SelectionFailed` for a stratum of one run). ``n_splits`` None:
    :data:`DEFAULT_HALVES`, or as many as exist."""
    if n_splits is None:
        n_splits, cap = DEFAULT_HALVES, True
    ordered = sorted(set(run_ids))
    groups: dict[str, list[str]] = {}
    for run in ordered:
        groups.setdefault(strata.get(run, "") if strata else "", []).append(run)
    small = {group: len(ids) for group, ids in groups.items() if len(ids) < 2}
    if small and cap:
        raise SelectionFailed(f"groups {sorted(small)} have one distinct run: no halves")
    if small:
        raise ValueError(f"analysis.halves: the reproducible rule splits every group's runs in two "
                         f"halves, but {small} have fewer than 2 runs; use selection holdout or "
                         "more seeds")  # fmt: skip
    distinct = distinct_halvings([len(ids) for ids in groups.values()], half_size)
    if n_splits > distinct and cap:
        n_splits = distinct
    elif n_splits > distinct:
        raise ValueError(f"analysis.halves: {n_splits} splits of {len(ordered)} runs into halves "
                         f"but only {distinct} distinct ones exist; lower analysis.halves to at "
                         f"most {distinct} or add seeds")  # fmt: skip
    splits = []
    for split in range(n_splits):
        rng = np.random.default_rng(np.random.SeedSequence([random_state, split]))
        first, second = [], []
        for group in sorted(groups):
            ids = groups[group]
            order = rng.permutation(len(ids))
            size = len(ids) // 2 if half_size is None else min(half_size, len(ids) // 2)
            first += [ids[i] for i in order[:size]]
            second += [ids[i] for i in order[size : None if half_size is None else 2 * size]]
        splits.append((sorted(first), sorted(second)))
    return splits


def stack(sequences: Sequence[np.ndarray]) -> tuple[np.ndarray, list[int]]:
    """Concatenated observations and their lengths (hmmlearn's ``X, lengths``)."""
    return np.concatenate(sequences), [len(sequence) for sequence in sequences]


def emission_model(n_states: int, emission: str, **kw: Any) -> Any:
    """An unfitted model of the emission model ``emission`` (:data:`EMISSIONS`): a
    :class:`~trainmap.dynamics.batched_hmm.BatchedGaussianHMM` (``plain``) or a
    :class:`~trainmap.dynamics.run_offset.RunOffsetHMM` (its other options at their defaults)."""
    from trainmap.dynamics.batched_hmm import BatchedGaussianHMM
    from trainmap.dynamics.run_offset import RunOffsetHMM

    check_choice("emission", emission, EMISSIONS)
    if emission == "plain":
        return BatchedGaussianHMM(n_components=n_states, **kw)
    return RunOffsetHMM(n_components=n_states, drift=emission in ("run_offset_drift", "run_affine"),
                        scale=emission == "run_affine", **kw)  # fmt: skip


def has_run_terms(model: Any) -> bool:
    """Whether ``model``'s emissions carry per-run terms (a ``run_offset*``/``run_affine``
    emission model)."""
    from trainmap.dynamics.run_offset import RunOffsetHMM

    return isinstance(model, RunOffsetHMM)


def make_model(n_states: int, settings: Mapping[str, Any], n_observations: int, **kw: Any) -> Any:
    """An unfitted model of the settings' emission model (:func:`emission_model`; settings
    without ``emission``: ``plain``) with the estimator's EM settings."""
    per_observation = settings.get("tol_scale", "per_observation") == "per_observation"
    return emission_model(
        n_states,
        settings.get("emission", "plain"),
        covariance_type=settings["covariance_type"],
        n_iter=settings["n_iter"],
        # hmmlearn's tol is on the total log-likelihood; ours is per observation by default.
        tol=settings["tol"] * (n_observations if per_observation else 1),
        min_covar=settings["min_covar"],
        **kw,
    )


@contextmanager
def quietly() -> Iterator[None]:
    """hmmlearn without its chatter: it logs every EM step that lowers the likelihood by rounding
    (fits are judged by their final likelihood instead) and warns about convergence and
    degenerate fits (judged by :func:`training_score`)."""
    logging.getLogger("hmmlearn").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def training_score(
    model: Any, train: tuple[np.ndarray, list[int]], weights: Any = None, score: bool = True
) -> float | None:
    """A fitted model's training log-likelihood, or None if EM broke down (NaN parameters, a state
    never entered). ``weights``: run i of ``train`` counts ``weights[i]`` times. ``score=False``
    skips the scoring pass: the result is then NaN for a fit whose means are finite, None
    otherwise."""
    if not score:
        return math.nan if np.isfinite(model.means_).all() else None
    if has_run_terms(model):  # its fit's eq. 0 (the run terms' fit; rescoring would re-search them)
        finite = np.isfinite(model.objective_) and np.isfinite(model.means_).all()
        return float(model.objective_) if finite else None
    try:
        with quietly():
            if weights is None:
                train_ll = model.score(*train)
            else:
                train_ll = model.score_weighted(*train, weights)
    except ValueError:  # EM left a state without mass (NaN parameters)
        return None
    return float(train_ll) if np.isfinite(train_ll) else None


def n_free_parameters(model: Any) -> int:
    """The free parameters hmmlearn's ``bic`` counts for ``model`` (start, transitions, means,
    covariances of its covariance type)."""
    per_parameter = model._get_n_fit_scalars_per_param()
    return int(sum(per_parameter[name] for name in model.params))


def information_criteria(log_likelihood: float, n_parameters: int, n_observations: int) -> dict:
    """BIC = -2 log L + p log n and AIC = -2 log L + 2 p (hmmlearn's definitions)."""
    return {
        "heldout_log_likelihood": float(log_likelihood),
        "bic": float(-2 * log_likelihood + n_parameters * math.log(n_observations)),
        "aic": float(-2 * log_likelihood + 2 * n_parameters),
    }


def score_heldout(
    model: Any, heldout: tuple[np.ndarray, list[int]], weights: Any = None
) -> dict[str, float]:
    """Held-out log-likelihood, BIC and AIC of a fitted model (one forward pass; ``weights``
    counts each held-out run that many times, as a bootstrap draw does). The parameters counted
    include the scored runs' own terms (the model's ``n_run_parameters``: none for the plain
    model; d per run, 2d with drift, 2d + 1 with drift and scale for a model with run terms, whose
    score is the profile log-likelihood; a run drawn twice counts twice). Callers limit BLAS to one thread around it (:func:`_fit_group`, the
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


def initialise(model: Any, train: tuple[np.ndarray, list[int]], seed: int) -> Any:
    """Start EM from k-means means (one seeded k-means run per restart), the pooled covariance,
    uniform start probabilities and a *sticky* transition matrix.

    hmmlearn's default draws the transition matrix from Dirichlet(1/K), which is nearly one-hot:
    a run then "must" jump every step, and EM often stays in that basin. Training runs stay in a
    state for many checkpoints, so each state starts with self-transition 1 - K / T (T: the mean
    run length, i.e. K states visited per run) and the rest spread evenly. hmmlearn's k-means takes
    the best of 10 inits by inertia, which makes every restart start from nearly the same means; one
    k-means run per restart, seeded by the restart, makes the restarts differ.
    """
    from sklearn.cluster import KMeans

    x, lengths = train
    n_states = model.n_components
    model.means_ = KMeans(n_clusters=n_states, n_init=1, random_state=seed).fit(x).cluster_centers_
    model.startprob_ = np.full(n_states, 1.0 / n_states)
    if n_states == 1:
        model.transmat_ = np.ones((1, 1))
    else:
        stay = max(0.5, 1.0 - n_states / float(np.mean(lengths)))
        model.transmat_ = np.full((n_states, n_states), (1.0 - stay) / (n_states - 1))
        np.fill_diagonal(model.transmat_, stay)
    model.init_params = "c"  # hmmlearn sets the covariances from the data; the rest is set here
    return model


def model_parameters(model: Any) -> dict[str, np.ndarray]:
    """A fitted model's parameters as plain arrays (covariances in their own shape)."""
    return {"startprob": model.startprob_, "transmat": model.transmat_, "means": model.means_,
            "covars": covars_in_own_shape(model)}  # fmt: skip


def in_units(
    parameters: Mapping[str, np.ndarray], shift: np.ndarray, scale: np.ndarray, covariance_type: str
) -> dict[str, np.ndarray]:
    """``parameters`` re-expressed in other standard units, z = (z_reference - shift) / scale
    (:func:`unit_change`)."""
    covars = parameters["covars"]
    if covariance_type == "full":
        covars = covars / scale[None, :, None] / scale[None, None, :]
    else:
        covars = covars / scale[None, :] ** 2
    return {"startprob": parameters["startprob"].copy(), "transmat": parameters["transmat"].copy(),
            "means": (parameters["means"] - shift) / scale, "covars": covars}  # fmt: skip


def start_from(model: Any, parameters: Mapping[str, np.ndarray]) -> Any:
    """``model`` (made with ``init_params=""``) set to ``parameters``, ready to continue EM."""
    model.startprob_ = parameters["startprob"]
    model.transmat_ = parameters["transmat"]
    model.means_ = parameters["means"]
    # As hmmlearn's M-step does: a fitted model's covariances may be singular to rounding (a state
    # of K_max holding a handful of checkpoints), which the public setter would refuse.
    model._covars_ = parameters["covars"]
    model.n_features = parameters["covars"].shape[-1]
    return model


Data = tuple[np.ndarray, list[int]]


def _fit_group(
    ks: Sequence[int], restart: int, train: Data, heldout: Data | None, settings: dict[str, Any],
    weights: tuple[Any, Any], starts: Mapping[int, Mapping[str, np.ndarray]] | None,
    score_train: bool,
) -> list[dict[str, Any]]:  # fmt: skip
    """:func:`_fit_group_single_threaded` with BLAS single-threaded: the matrices are small
    (threads only add synchronisation), and the sums come out the same whether groups run one
    after another or in parallel processes."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        return _fit_group_single_threaded(ks, restart, train, heldout, settings, weights, starts,
                                          score_train)  # fmt: skip


# The scores of a restart that fitted nothing (no model; it never wins a selection).
_FAILED_FIT = {"model": None, "train_log_likelihood": math.nan,
               "heldout_log_likelihood": math.nan, "bic": math.inf, "aic": math.inf}  # fmt: skip


def _fit_group_single_threaded(
    ks: Sequence[int], restart: int, train: Data, heldout: Data | None, settings: dict[str, Any],
    weights: tuple[Any, Any], starts: Mapping[int, Mapping[str, np.ndarray]] | None,
    score_train: bool,
) -> list[dict[str, Any]]:  # fmt: skip
    """A fit of every K of ``ks`` on one split, each scored on the held-out runs (``heldout``
    None: not scored, models of all runs): seeded restart ``restart`` from :func:`initialise` (or
    hmmlearn's start), or EM continued from ``starts[K]`` (warm starts). Plain emissions: the Ks'
    EM iterations run in lockstep (:func:`~trainmap.dynamics.batched_hmm.fit_together`; each K's
    fit is the one it would have alone); emissions with run terms: each K by its own ECM fit
    (:func:`_fit_one`)."""
    from trainmap.dynamics.batched_hmm import fit_together

    train_weights = weights[0]
    n_observations = (len(train[0]) if train_weights is None
                      else int(np.asarray(train_weights) @ np.asarray(train[1])))  # fmt: skip
    rows, models = {}, {}
    for k in ks:
        seed = restart_seed(settings["random_state"], k, restart)
        if k > len(train[0]):  # more states than training observations: nothing to fit
            rows[k] = {"n_states": k, "restart": restart, "iterations": 0,
                       "converged": False} | _FAILED_FIT  # fmt: skip
        elif starts is not None:
            models[k] = start_from(make_model(k, settings, n_observations, random_state=seed,
                                              init_params=""), starts[k])  # fmt: skip
        else:
            models[k] = make_model(k, settings, n_observations, random_state=seed)
            if settings["init"] == "sticky":
                models[k] = initialise(models[k], train, seed)
    if settings.get("emission", "plain") == "plain":
        with quietly():
            completed = fit_together(list(models.values()), *train, train_weights)
    else:
        completed = [_fit_one(model, train, train_weights) for model in models.values()]
    for (k, model), done in zip(models.items(), completed, strict=True):
        rows[k] = _scored_fit(model, restart, train, heldout, weights, score_train, done)
    return [rows[k] for k in ks]


def _fit_one(model: Any, train: Data, weights: Any) -> bool:
    """Fit one model by its own ``fit`` (``fit_weighted`` with run weights): whether it completed
    with finite parameters and objective (the ECM of a
    :class:`~trainmap.dynamics.run_offset.RunOffsetHMM`, which :func:`fit_together` cannot run)."""
    from trainmap.dynamics.batched_hmm import usable

    with quietly():
        try:
            if weights is None:
                model.fit(*train)
            else:
                model.fit_weighted(*train, weights)
        except (ValueError, np.linalg.LinAlgError):
            return False
    return usable(model) and bool(np.isfinite(getattr(model, "objective_", math.nan)))


def _scored_fit(
    model: Any, restart: int, train: Data, heldout: Data | None, weights: tuple[Any, Any],
    score_train: bool, completed: bool,
) -> dict[str, Any]:  # fmt: skip
    """The row of one fitted K: its iterations, convergence, training and held-out scores."""
    row = {"n_states": model.n_components, "restart": restart,
           "iterations": int(getattr(model, "n_iterations_", model.monitor_.iter)),
           "converged": bool(model.monitor_.converged and model.monitor_.iter < model.n_iter)}  # fmt: skip
    train_ll = training_score(model, train, weights[0], score_train) if completed else None
    if train_ll is None:
        return row | _FAILED_FIT
    if heldout is None:  # not scored: NaN, not a failure's inf
        return row | {"model": model, "train_log_likelihood": train_ll,
                      "heldout_log_likelihood": math.nan, "bic": math.nan, "aic": math.nan}  # fmt: skip
    try:
        scores = score_heldout(model, heldout, weights[1])
    except (ValueError, np.linalg.LinAlgError):  # e.g. EM left a state that is never entered
        return row | _FAILED_FIT
    return row | {"model": model, "train_log_likelihood": train_ll} | scores


@dataclass
class Split:
    """One split of the runs: the training runs and the held-out runs (stacked: ``X, lengths``) and
    each part's run weights (None: each run once). ``heldout`` None: a fit of the runs that gives
    each K its model without scoring it (the final fit of the ``folds`` rule)."""

    train: Data
    heldout: Data | None
    weights: tuple[Any, Any] = (None, None)


def fit_restarts(
    tasks: Sequence[tuple[int, int, int]],
    splits: Sequence[Split],
    settings: dict[str, Any],
    n_jobs: int,
    starts: Mapping[int, Mapping[str, np.ndarray]] | None = None,
    score_train: bool = True,
    split_starts: Mapping[int, Mapping[int, Mapping[str, np.ndarray]]] | None = None,
) -> list[dict[str, Any]]:
    """Every (split, K, restart) fit, serially or in parallel processes (the same numbers either
    way); each fit's row names its ``split``. The Ks of one (split, restart) are fitted together
    (:func:`_fit_group`), whatever ``n_jobs``: processes share out such groups. ``starts`` (K ->
    parameters) warm-starts every split; ``split_starts`` (split -> K -> parameters) the splits it
    names instead."""
    groups: dict[tuple[int, int], list[int]] = {}
    for part, k, r in tasks:
        groups.setdefault((part, r), []).append(k)
    order = sorted(groups)
    split_starts = split_starts or {}
    arguments = [(sorted(groups[part, r]), r, splits[part].train, splits[part].heldout, settings,
                  splits[part].weights, split_starts.get(part, starts), score_train)
                 for part, r in order]  # fmt: skip
    if n_jobs == 1:
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=1):  # once: entering the limits costs ~2 ms
            results = [_fit_group_single_threaded(*args) for args in arguments]
    else:
        from joblib import Parallel, delayed

        results = Parallel(n_jobs=n_jobs)(delayed(_fit_group)(*args) for args in arguments)
    fits = [fit | {"split": part} for (part, _), rows in zip(order, results, strict=True)
            for fit in rows]  # fmt: skip
    return sorted(fits, key=lambda fit: (fit["split"], fit["n_states"], fit["restart"]))


# Restarts whose training log-likelihoods agree to this relative difference reached one optimum
# (often with their states in another order): round-off, not the data, would pick among them.
RESTART_TIE = 1e-9


def best_restart(fits: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The fit (of one K, in restart order) with the highest training log-likelihood; restarts
    tied to :data:`RESTART_TIE` go to the first, so the winner does not hang on summation order
    (a refit of the same runs listed in another order picks the same restart)."""
    scores = np.array([fit["train_log_likelihood"] for fit in fits], dtype=float)
    if len(fits) == 1 or not np.isfinite(scores).any():
        return fits[0]
    top = np.nanmax(scores)
    return fits[int(np.flatnonzero(scores >= top - RESTART_TIE * abs(top))[0])]


def selection_curve(fits: Sequence[dict[str, Any]], restart_rule: str) -> pd.DataFrame:
    """One row per K: the best restart's scores, the BIC over restarts, and K's criterion ``bic``.

    ``restart_rule="best"``: K's BIC is that of its best restart by training log-likelihood;
    ``"mean"``: the mean held-out BIC over its restarts (the authors' script).
    """
    rows = []
    for n_states in sorted({fit["n_states"] for fit in fits}):
        group = [fit for fit in fits if fit["n_states"] == n_states]
        usable = [fit for fit in group if fit["model"] is not None]
        bics = np.array([fit["bic"] for fit in usable])
        row = {"n_states": n_states, "train_log_likelihood": math.nan,
               "heldout_log_likelihood": math.nan, "bic": math.inf, "aic": math.inf,
               "bic_best_restart": math.inf, "bic_mean": float(bics.mean()) if len(bics) else math.inf,
               "bic_sd": float(bics.std()) if len(bics) else math.nan,
               "restarts_ok": len(usable), "restarts_converged": sum(f["converged"] for f in group),
               "restart": -1}  # fmt: skip
        if usable:
            best = best_restart(usable)
            row |= {key: best[key] for key in ("train_log_likelihood", "heldout_log_likelihood",
                                               "aic", "restart")}  # fmt: skip
            row["bic_best_restart"] = best["bic"]
            row["bic"] = best["bic"] if restart_rule == "best" else row["bic_mean"]
        rows.append(row)
    return pd.DataFrame(rows)


def folds_curve(fits: Sequence[dict[str, Any]], restart_rule: str, n_folds: int) -> pd.DataFrame:
    """The selection curve of the ``folds`` rule: one row per K, its criterion ``bic`` the mean of
    its held-out BIC over the folds (each fold's by ``restart_rule``, :func:`selection_curve`),
    ``heldout_log_likelihood`` the sum over the folds (every run held out once), ``bic_fold_sd``
    the spread over the folds; the training log-likelihood, restart and convergence counts are
    those of the fit of all runs (split ``n_folds``) that gives K its model. A K whose fit of all
    runs failed, or that some fold could not score, is not chosen (``bic`` inf)."""
    final = selection_curve([fit for fit in fits if fit["split"] == n_folds], restart_rule)
    per_fold = [selection_curve([fit for fit in fits if fit["split"] == fold], restart_rule)
                .set_index("n_states") for fold in range(n_folds)]  # fmt: skip
    rows = []
    for row in final.to_dict(orient="records"):
        k = row["n_states"]
        folds = pd.DataFrame([curve.loc[k] for curve in per_fold])
        bics = folds["bic"].to_numpy(dtype=float)
        scored = bool(np.isfinite(bics).all()) and row["restart"] >= 0
        row |= {
            "heldout_log_likelihood": float(folds["heldout_log_likelihood"].sum(skipna=False)),
            "bic": float(bics.mean()) if scored else math.inf,
            "aic": float(folds["aic"].mean()) if scored else math.inf,
            "bic_best_restart": float(folds["bic_best_restart"].mean()),
            "bic_mean": float(folds["bic_mean"].mean()),
            "bic_sd": float(folds["bic_sd"].mean()),
            "bic_fold_sd": float(bics.std()) if scored else math.nan,
        }  # fmt: skip
        rows.append(row)
    return pd.DataFrame(rows)


def reproducibility_curve(
    fits: Sequence[dict[str, Any]], z: Mapping[str, np.ndarray], n_halves: int,
    restart_rule: str, target_ari: float, target_share: float, every_k: bool = True,
    reproduce_k: str = "largest",
) -> tuple[pd.DataFrame, dict[int, dict[int, Any]]]:  # fmt: skip
    """The selection curve of the ``reproducible`` rule and the half maps.

    Splits 2s and 2s + 1 are the two halves of split s, each fitted on its half and scored on the
    other; split ``2 n_halves`` is the fit of all runs. One row per K: the mean held-out BIC over
    the 2 ``n_halves`` half fits (:func:`folds_curve`: repeated two-fold cross-validation, K's
    model its fit of all runs) and, per split, the adjusted Rand index between the two half maps'
    Viterbi decodings of every run of ``z`` (``ari_median``, ``ari_min``), the share of splits
    whose ARI reaches ``target_ari`` (``reproduced``) and whether that share reaches
    ``target_share`` (``reproducible``). A split where a half could not be fitted at K counts as
    not reproduced; K = 1 decodes every run alike. ``every_k=False`` (a refit: only its K
    matters) decodes only the Ks that can decide :func:`choose_k` under ``reproduce_k``: from
    K_BIC down to the first K that reproduces (``largest``), or from K = 1 up to the first that
    does not (``nested``); the others' ARI columns NaN and ``reproducible`` False: the same K, a
    fraction of the decoding. Returns the curve and the best model of each half and K (split ->
    K -> model)."""
    from sklearn.metrics import adjusted_rand_score
    from threadpoolctl import threadpool_limits

    curve = folds_curve(fits, restart_rule, n_folds=2 * n_halves)
    halves: dict[int, dict[int, Any]] = {}
    for part in range(2 * n_halves):
        for k in sorted({fit["n_states"] for fit in fits}):
            usable = [fit for fit in fits if fit["split"] == part and fit["n_states"] == k
                      and fit["model"] is not None]  # fmt: skip
            if usable:
                halves.setdefault(part, {})[k] = best_restart(usable)["model"]
    sequences = [z[run] for run in sorted(z)]
    k_bic = bic_minimum(curve) or 0
    rows, decided = [], False
    nested = reproduce_k == "nested"
    with threadpool_limits(limits=1):
        for row in sorted(curve.to_dict(orient="records"),
                          key=lambda r: r["n_states"] if nested else -r["n_states"]):  # fmt: skip
            k, aris = row["n_states"], []
            if not every_k and (decided or k > k_bic):
                row |= {"ari_median": math.nan, "ari_min": math.nan, "reproduced": math.nan,
                        "reproducible": False}  # fmt: skip
                rows.append(row)
                continue
            for split in range(n_halves):
                pair = [halves.get(2 * split + h, {}).get(k) for h in (0, 1)]
                if pair[0] is None or pair[1] is None:
                    aris.append(math.nan)
                    continue
                labels = [np.concatenate(model.predict_runs(sequences)) for model in pair]
                aris.append(float(adjusted_rand_score(*labels)))
            values = np.array(aris)
            found = bool(np.isfinite(values).any())
            share = float(np.mean(np.nan_to_num(values, nan=-1.0) >= target_ari))
            row |= {"ari_median": float(np.nanmedian(values)) if found else math.nan,
                    "ari_min": float(np.nanmin(values)) if found else math.nan,
                    "reproduced": share,
                    "reproducible": bool(share >= target_share and row["restart"] >= 0)}  # fmt: skip
            decided = decided or row["reproducible"] != nested
            rows.append(row)
    return pd.DataFrame(sorted(rows, key=lambda r: r["n_states"])), halves


class SelectionFailed(ValueError):
    """No K could be fitted and scored (every fit lost its states, or none could be scored)."""


def bic_minimum(selection: pd.DataFrame) -> int | None:
    """The K with the lowest criterion ``bic`` (the smaller K on a tie); None when no K scored."""
    finite = selection[np.isfinite(selection["bic"])]
    if finite.empty:
        return None
    return int(finite.sort_values(["bic", "n_states"], kind="stable").iloc[0]["n_states"])


def choose_k(selection: pd.DataFrame, reproduce_k: str = "largest") -> int:
    """The K with the lowest criterion ``bic`` (the smaller K on a tie); with the ``reproducible``
    rule's curve (a ``reproducible`` column), up to that K: the largest K whose half maps
    reproduce (``reproduce_k="largest"``), or the largest K such that K and every smaller K
    reproduce (``"nested"``: one less than the first K that fails). More states than the held-out
    BIC supports are not selected however well they reproduce; fewer are, when the BIC's extra
    states differ between halves of the runs. With none reproducing (no K could be decoded): the
    BIC's K (``largest``) or the smallest K (``nested``)."""
    best = bic_minimum(selection)
    if best is None:
        raise SelectionFailed("no K could be scored: every restart of every K failed")
    if "reproducible" not in selection:
        return best
    below = selection[selection["n_states"] <= best].sort_values("n_states")
    reproduced = below["reproducible"].astype(bool).to_numpy()
    ks = below["n_states"].astype(int).to_numpy()
    if reproduce_k == "nested":
        failed = np.flatnonzero(~reproduced)
        return int(ks[max(failed[0] - 1, 0)] if failed.size else ks[-1])
    return int(ks[reproduced].max()) if reproduced.any() else best


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


def selection_splits(
    z: Mapping[str, np.ndarray], train: Mapping[str, float], heldout: Mapping[str, float],
    selection: str, folds: int, random_state: int, halves_n: int | None = None,
    strata: Mapping[str, str] | None = None, cap_halves: bool = False,
    half_size: int | None = None,
) -> tuple[list[Split], list[list[str]]]:  # fmt: skip
    """The splits a selection rule scores K on, and their held-out runs (run -> times drawn in
    ``train`` and ``heldout``; the runs' z-scores in ``z``).

    ``"holdout"`` (the paper's): one split, ``train`` against ``heldout``; each K's model is its
    fit of ``train``. ``"folds"``: the runs of both parts pooled and dealt into ``folds`` folds
    (:func:`fold_split`, seeded by ``random_state``; a run drawn several times stays in one fold,
    so no copy of a held-out run is trained on), one split per fold (the other folds against it),
    then a last split of every run unscored, each K's model. ``"reproducible"``: the runs of both
    parts pooled and split ``halves_n`` times into two halves (:func:`half_splits`, within each
    stratum of ``strata``: run -> group; ``half_size`` runs of each in each half), one split per
    half scored on the other half (first, second, first, ...), then the split of every run, each
    K's model; the second halves are returned as the held-out runs.
    """
    check_choice("selection", selection, SELECTION_RULES)

    def part(counts: Mapping[str, float]) -> tuple[Data, Any]:
        return stack([z[run] for run in counts]), _run_weights(list(counts.values()))

    if selection == "reproducible":
        pooled = dict(train)
        for run, count in heldout.items():
            pooled[run] = pooled.get(run, 0.0) + count
        halves = half_splits(list(pooled), halves_n, random_state, strata, cap_halves, half_size)
        splits = []
        for first, second in halves:
            for half, other in ((first, second), (second, first)):
                (data, weights), (held_data, held_weights) = (
                    part({run: pooled[run] for run in half}),
                    part({run: pooled[run] for run in other}),
                )
                splits.append(Split(data, held_data, (weights, held_weights)))
        everything, weights = part(pooled)
        splits.append(Split(everything, None, (weights, None)))
        return splits, [second for _, second in halves]
    if selection == "holdout":
        (train_data, train_weights), (heldout_data, heldout_weights) = part(train), part(heldout)
        return [Split(train_data, heldout_data, (train_weights, heldout_weights))], [list(heldout)]
    pooled = dict(train)
    for run, count in heldout.items():
        pooled[run] = pooled.get(run, 0.0) + count
    held = fold_split(list(pooled), folds, random_state)
    splits = []
    for fold in held:
        inside = set(fold)
        kept = {run: count for run, count in pooled.items() if run not in inside}
        out = {run: count for run, count in pooled.items() if run in inside}
        (train_data, train_weights), (heldout_data, heldout_weights) = part(kept), part(out)
        splits.append(Split(train_data, heldout_data, (train_weights, heldout_weights)))
    everything, weights = part(pooled)
    splits.append(Split(everything, None, (weights, None)))
    return splits, held


def select_model(
    z: Mapping[str, np.ndarray],
    train: Mapping[str, float],
    heldout: Mapping[str, float],
    settings: dict[str, Any],
    ks: Sequence[int],
    *,
    selection: str = "holdout",
    folds: int = DEFAULT_FOLDS,
    restarts: int = 1,
    restart_rule: str = "best",
    n_jobs: int = 1,
    starts: Mapping[int, Mapping[str, np.ndarray]] | None = None,
    score_train: bool = True,
    halves: int | None = None,
    reproduce_ari: float = DEFAULT_REPRODUCE_ARI,
    reproduce_share: float = DEFAULT_REPRODUCE_SHARE,
    reproduce_k: str = "largest",
    half_size: int | None = DEFAULT_HALF_SIZE,
    strata: Mapping[str, str] | None = None,
    half_starts: Mapping[int, Mapping[int, Mapping[str, np.ndarray]]] | None = None,
    cap_halves: bool = False,
) -> ModelSelection:
    """Fit every K of ``ks`` on the standardised runs ``z``, score each on held-out runs and choose
    K by held-out BIC: the one selection of the full fit (:meth:`TrainingHMM.fit`) and of every
    refit (:func:`trainmap.dynamics.certainty.refit_resample`, the bootstrap's and the stability
    curve's).

    ``train`` and ``heldout``: run -> times drawn (a bootstrap draw; 1: once). ``selection`` is the
    rule (:func:`selection_splits`): ``"holdout"`` scores K on ``heldout`` once, ``"folds"`` scores
    it on each of ``folds`` folds of all the runs and takes the mean BIC (:func:`folds_curve`).
    ``restarts`` seeded restarts per K and split, K's model its best by training log-likelihood and
    K's score by ``restart_rule`` (:func:`selection_curve`). ``starts`` (K -> parameters in the
    standard units of ``z``) warm-starts every fit of K from those parameters with one EM run
    instead of fresh restarts; ``score_train=False`` then skips the training log-likelihood, which
    only picks among restarts. ``"reproducible"`` fits every K on each half of ``halves`` random
    splits of the runs (within each stratum of ``strata``: per method in a joint comparison),
    each half scored on the other, and on all runs; K is the largest K up to the minimum of that
    two-fold held-out BIC whose two half maps decode every run alike (adjusted Rand index >=
    ``reproduce_ari``) in a share >= ``reproduce_share`` of the splits (``reproduce_k``: the
    largest such K, or the largest such that every smaller K reproduces too; ``half_size``: each
    half holds that many runs of each stratum, at most half of them)
    (:func:`reproducibility_curve`, :func:`choose_k`); K's model is its fit of all runs. Warm-started, each half
    continues from ``half_starts[split]`` (the full fit's half maps, fitted independently, so two
    halves never share a start) and the fit of all runs from ``starts``; a refit (warm-started,
    or ``cap_halves``) uses as many splits as its runs allow. Raises
    :class:`SelectionFailed` when no K could be fitted and scored.
    """
    if starts is not None and (restarts != 1 or set(ks) - set(starts)):
        raise ValueError("a warm-started selection runs one EM fit per K and needs a start for "
                         "every K")  # fmt: skip
    if not score_train and restarts > 1:
        raise ValueError("choosing among restarts needs their training log-likelihood")
    if not 0 < reproduce_ari <= 1 or not 0 < reproduce_share <= 1:
        raise ValueError(f"analysis.reproduce_ari {reproduce_ari!r} and analysis.reproduce_share "
                         f"{reproduce_share!r} must be in (0, 1]")  # fmt: skip
    splits, held = selection_splits(z, train, heldout, selection, folds, settings["random_state"],
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


class TrainingHMM:
    """A Gaussian HMM over standardised per-checkpoint metrics of many runs (see module docstring).

    ``fit(runs)`` takes a mapping run id -> metrics table (columns named by ``features``); after
    fitting: ``n_states_``, ``features_`` (used), ``dropped_features_`` (feature -> why it was
    left out), ``train_runs_``, ``heldout_runs_``, ``folds_`` (the held-out runs K was scored
    on, one list per split), ``selection_`` (one row per K), ``restarts_`` (one row per fit),
    ``at_ceiling_``, ``standardisation_``, the hmmlearn model ``model_`` and every K's best model
    ``models_``.

    ``emission`` (:data:`EMISSIONS`): ``plain`` (default) is the paper's Gaussian HMM;
    ``run_offset`` and ``run_offset_drift`` add a per-run offset (and linear drift) to the emission
    means, ``run_affine`` a per-run offset, linear drift and scale of the emissions
    (:mod:`trainmap.dynamics.run_offset`), fitted with the states and estimated for every run the
    model decodes or scores; every use of the fitted model below works on the run's residuals
    (:meth:`residuals`).
    """

    def __init__(
        self,
        k_max: int = 8,
        restarts: int = 5,
        holdout: float = 0.2,
        covariance_type: str = "full",
        standardisation: str = "pooled",
        restart_rule: str = "best",
        selection: str = "holdout",
        folds: int = DEFAULT_FOLDS,
        halves: int | None = None,
        reproduce_ari: float = DEFAULT_REPRODUCE_ARI,
        reproduce_share: float = DEFAULT_REPRODUCE_SHARE,
        reproduce_k: str = "largest",
        half_size: int | None = DEFAULT_HALF_SIZE,
        init: str = "sticky",
        emission: str = "plain",
        n_iter: int = 500,
        tol: float = 1e-3,
        tol_scale: str = "per_observation",
        min_covar: float = 1e-3,
        random_state: int = 0,
        n_jobs: int = 1,
        features: Sequence[str] = METRIC_NAMES,
    ) -> None:
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
        check_choice("tol_scale", tol_scale, TOL_SCALES)
        check_choice("reproduce_k", reproduce_k, REPRODUCE_K)
        if half_size is not None and (not isinstance(half_size, int) or isinstance(half_size, bool)
                                      or half_size < 1):  # fmt: skip
            raise ValueError(f"half_size: {half_size!r} is not allowed; it must be an integer >= 1 "
                             "(or None: half of each group's runs)")  # fmt: skip
        if halves is not None and (not isinstance(halves, int) or isinstance(halves, bool)
                                   or halves < 1):  # fmt: skip
            raise ValueError(f"halves: {halves!r} is not allowed; it must be an integer >= 1 "
                             "(or None: 5, or as many splits as the runs allow)")  # fmt: skip
        for key, value in (("reproduce_ari", reproduce_ari), ("reproduce_share", reproduce_share)):
            if not (isinstance(value, int | float) and 0 < value <= 1):
                raise ValueError(f"{key}: {value!r} is not allowed; it must be in (0, 1]")
        self.tol_scale, self.halves = tol_scale, halves
        self.reproduce_ari, self.reproduce_share = reproduce_ari, reproduce_share
        self.reproduce_k, self.half_size = reproduce_k, half_size
        self.k_max, self.restarts, self.holdout = k_max, restarts, holdout
        self.covariance_type, self.standardisation = covariance_type, standardisation
        self.restart_rule, self.init, self.n_iter, self.tol = restart_rule, init, n_iter, tol
        self.min_covar, self.random_state, self.n_jobs = min_covar, random_state, n_jobs
        self.selection, self.folds, self.emission = selection, folds, emission
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

    def reproducibility(self) -> dict[str, Any]:
        """The ``reproducible`` rule's settings (:func:`select_model`'s keywords)."""
        return {"halves": self.halves, "reproduce_ari": self.reproduce_ari,
                "reproduce_share": self.reproduce_share, "reproduce_k": self.reproduce_k,
                "half_size": self.half_size}  # fmt: skip

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

    def settings(self) -> dict[str, Any]:
        """The EM and selection settings every fit uses (plain values, picklable)."""
        return {
            "covariance_type": self.covariance_type,
            "init": self.init,
            "emission": self.emission,
            "n_iter": self.n_iter,
            "tol": self.tol,
            "tol_scale": self.tol_scale,
            "min_covar": self.min_covar,
            "random_state": self.random_state,
        }

    def _usable_features(
        self, runs: Mapping[str, pd.DataFrame]
    ) -> tuple[list[str], dict[str, str]]:
        """The features the HMM can use, and every other one with the reason it is left out."""
        missing = [f for f in self.features if any(f not in table for table in runs.values())]
        if missing:
            raise ValueError(f"metric tables lack the feature columns {missing}; read them with "
                             "trainmap.dynamics.tables.read_metric_table, which names the file")  # fmt: skip
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
        ``run_affine``; :meth:`~trainmap.dynamics.run_offset.RunOffsetHMM.residuals`), for the
        whole run."""
        return self.model_.residuals(z)

    def log_emissions(self, z: np.ndarray, residualised: bool = False) -> np.ndarray:
        """log p(z_t | s_t = k), [T, K], of one run's z (its residuals, :meth:`residuals`, unless
        ``residualised``: ``z`` is already)."""
        from scipy.stats import multivariate_normal  # here: the refits' workers never need it

        z = z if residualised else self.residuals(z)
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
        # numpy's log-add reduction: scipy's logsumexp costs ~0.1 ms a call in array-API checks,
        # 6 of a default-study map's 18 s (80 runs x 321 checkpoints, two calls per step).
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
        pulls = np.einsum("kij,kj->ki", self.precisions(), self.model_.means_ - z[t])
        return pulls[state] - posterior @ pulls

    def state_means(self) -> pd.DataFrame:
        """mu_k in z-units, one row per state."""
        return pd.DataFrame(self.model_.means_, columns=self.features_).rename_axis("state")

    def state_means_original(
        self, runs: Mapping[str, pd.DataFrame], states: Mapping[str, np.ndarray]
    ) -> pd.DataFrame:
        """Per-state means in original units: the mean raw value of the checkpoints in each state."""
        raw = pd.concat([table[self.features_] for table in runs.values()], ignore_index=True)
        labels = np.concatenate([states[run] for run in runs])
        means = raw.groupby(labels).mean().reindex(range(self.n_states_))
        return means.rename_axis("state")

    # --- persistence ---------------------------------------------------------------------------

    def estimator_settings(self) -> dict[str, Any]:
        """The constructor arguments (JSON-ready): ``TrainingHMM(**settings)`` is this estimator."""
        return {
            "k_max": self.k_max,
            "restarts": self.restarts,
            "holdout": self.holdout,
            "standardisation": self.standardisation,
            "restart_rule": self.restart_rule,
            "selection": self.selection,
            "folds": self.folds,
            **self.reproducibility(),
            **self.settings(),
            "n_jobs": self.n_jobs,
            "features": list(self.features),
        }

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


def covars_in_own_shape(model: Any) -> np.ndarray:
    """The covariances in the shape the ``covars_`` setter of the covariance type takes."""
    full = model.covars_  # hmmlearn's getter always returns [K, d, d]
    kind = model.covariance_type
    if kind == "full":
        return full
    if kind == "diag":
        return np.diagonal(full, axis1=1, axis2=2).copy()
    if kind == "spherical":
        return full[:, 0, 0].copy()
    return full[0]  # tied


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with open(path, "wb") as stream:  # np.savez on a path would append ".npz" to the temp name
        np.savez(stream, **arrays)


# --- appendix C baselines ----------------------------------------------------------------------


def kmeans_bic(centres: np.ndarray, x: np.ndarray, weights: np.ndarray, variance: float) -> float:
    """BIC of k-means as a hard-assignment spherical Gaussian mixture with shared variance.

    log L = sum_i [log pi_c(i) + log N(x_i | mu_c(i), variance * I)] with c(i) the nearest centre;
    free parameters: K*d means, 1 variance, K-1 weights.
    """
    distances = ((x[:, None, :] - centres[None]) ** 2).sum(axis=2)
    nearest = distances.argmin(axis=1)
    n, d = x.shape
    log_likelihood = (
        np.log(weights[nearest]).sum()
        - 0.5 * distances[np.arange(n), nearest].sum() / variance
        - 0.5 * n * d * math.log(2 * math.pi * variance)
    )
    n_parameters = centres.size + 1 + (len(centres) - 1)
    return float(-2 * log_likelihood + n_parameters * math.log(n))


def kmeans_selection(
    hmm: TrainingHMM, runs: Mapping[str, pd.DataFrame], k_max: int | None = None
) -> pd.DataFrame:
    """k-means with K = 1..k_max (default the HMM's K_max) on the HMM's standardised runs, BIC
    on held-out runs by the HMM's selection rule: its training against its held-out runs
    (``holdout``), or the mean over its folds (``folds``)."""
    from sklearn.cluster import KMeans

    z = {run: hmm.transform(runs[run]) for run in hmm.train_runs_ + hmm.heldout_runs_}
    if hmm.selection == "holdout":
        splits = [(hmm.train_runs_, hmm.heldout_runs_)]
    else:
        splits = [
            ([run for run in hmm.train_runs_ if run not in fold], fold) for fold in hmm.folds_
        ]
    data = [(np.concatenate([z[run] for run in train]), np.concatenate([z[run] for run in held]))
            for train, held in splits]  # fmt: skip
    rows = []
    # k-means needs at least K training observations (a tiny smoke run can have fewer than 16).
    for k in range(1, min(k_max or hmm.k_max, min(len(train) for train, _ in data)) + 1):
        bics = []
        for train, heldout in data:
            kmeans = KMeans(n_clusters=k, n_init=hmm.restarts, random_state=hmm.random_state)
            labels = kmeans.fit_predict(train)
            weights = np.maximum(np.bincount(labels, minlength=k) / len(labels), 1e-12)
            variance = max(kmeans.inertia_ / train.size, 1e-12)
            bics.append(kmeans_bic(kmeans.cluster_centers_, heldout, weights, variance))
        rows.append({"n_states": k, "bic": float(np.mean(bics))})
    return pd.DataFrame(rows)


def baseline_table(
    hmm: TrainingHMM,
    runs: Mapping[str, pd.DataFrame],
    l2_feature: str = "l2",
    k_max: int | None = None,
) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """Appendix C, table 4's form: components and held-out BIC chosen by k-means, HMM-1 and HMM.

    The baselines search K = 1..``k_max`` (default the HMM's K_max; the paper let them reach 16).
    Returns the table and the selection curves of the two baselines.
    """
    k_max = k_max or hmm.k_max
    curves = {"k-means": kmeans_selection(hmm, runs, k_max)}
    hmm1 = TrainingHMM(**(hmm.estimator_settings() | {"features": (l2_feature,), "k_max": k_max}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hmm1.fit(runs)
    curves["HMM-1"] = hmm1.selection_[["n_states", "bic"]]
    curves["HMM"] = hmm.selection_[["n_states", "bic"]]
    rows = []
    for name, curve in curves.items():
        best = curve.loc[curve["bic"].idxmin()]
        if name == "HMM":  # the map's own K, whatever its rule (reproducible: not a BIC minimum)
            best = curve.set_index("n_states", drop=False).loc[hmm.n_states_]
        rows.append({"model": name, "components": int(best["n_states"]), "bic": float(best["bic"])})
    return pd.DataFrame(rows), curves
