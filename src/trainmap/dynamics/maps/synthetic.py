"""Runs with a known answer: metric tables sampled from a left-to-right Gaussian HMM.

Training runs move through phases in order and spend different times in each; the 14 weight
metrics move together (L1, L2 and the spectral norm all grow with the weights' scale). The sampler
reproduces both, so model selection, decoding and the training map can be checked against the truth:

* hidden states 0 -> 1 -> ... -> K-1, each run starts in 0 and moves one state right with
  probability 1/dwell per checkpoint (geometric times per state, so runs differ in how long they
  stay, and some never reach the last state); the last state absorbs;
* the states' factor means lie on a path of steps of length ``separation`` (in units of the
  factors' within-state standard deviation, about 1), each within 60 degrees of one main direction;
* emissions are Gaussian in a few shared factors plus small feature-specific noise:
  x = loadings @ f + e, f ~ N(m_k, C_k), e ~ N(0, diag(psi)); so every state's covariance
  loadings C_k loadings^T + diag(psi) is full and the features are strongly correlated;
* the features come in raw units: each has its own offset and a scale between 1e-3 and 1e3, as
  real metrics do (a bias variance near 1e-4 beside an L1 norm near 600);
* ``nuisance`` (default 0: no nuisance, the samples of earlier versions byte for byte) makes seeds
  differ by more than their states, as real seeds do: run i gets its own offset a_i, scale s_i and
  slow linear drift b_i, all in the factor space (the metrics of a seed move together), drawn from
  ``SeedSequence([seed, i])`` independently of the states: f -> s_i f + a_i + b_i t / (T - 1),
  with a_i, b_i ~ N(0, nuisance^2 I) (within-state SDs; the drift is the total over the run) and
  log s_i ~ N(0, (nuisance / 10)^2), the scale acting about the first state's mean (the origin);
* ``state_drift`` (default 0: none, the samples of earlier versions byte for byte) keeps the level
  moving inside a state, which no emission with one mean per state models: within each visit the
  values move away from the state's mean along the path's direction by
  state_drift * sqrt(tau / dwell) within-state standard deviations (tau checkpoints since entering
  the state, dwell its mean time);
* ``length_spread`` (default 1: every run ``length`` long) cuts run i short, to a length drawn
  uniformly between ``length / length_spread`` and ``length``, as real runs stop early.

:func:`sample_runs` returns metric tables named like the real ones (``step``, :data:`METRIC_NAMES`,
``test_acc``), the true state sequences and the true model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from hmmlearn.hmm import GaussianHMM

from trainmap.dynamics.metrics.columns import METRIC_NAMES


@dataclass
class KnownHMM:
    """The true model behind sampled runs: an hmmlearn model in standard units, and raw units."""

    model: GaussianHMM
    scale: np.ndarray
    offset: np.ndarray
    loadings: np.ndarray | None = None  # features x factors (standard units)

    @property
    def n_states(self) -> int:
        """The true number of hidden states."""
        return self.model.n_components

    def true_edges(self) -> set[tuple[int, int]]:
        """The non-zero transitions between different states."""
        transmat = self.model.transmat_
        n = self.n_states
        return {(j, k) for j in range(n) for k in range(n) if j != k and transmat[j, k] > 0}


def left_to_right_hmm(
    n_states: int,
    n_features: int = len(METRIC_NAMES),
    n_factors: int = 2,
    length: int = 200,
    separation: float = 8.0,
    seed: int = 0,
) -> KnownHMM:
    """A left-to-right Gaussian HMM whose features share ``n_factors`` factors (module docstring).

    Consecutive states' factor means are ``separation`` apart; the mean time in each non-final
    state is ``length / (n_states + 1)`` checkpoints.
    """
    rng = np.random.default_rng(seed)
    loadings = rng.normal(0.0, 1.0, (n_features, n_factors))
    # Training drifts: every step leaves in a direction within 60 degrees of one main direction,
    # so the path never folds back onto an earlier state.
    main = rng.normal(0.0, 1.0, n_factors)
    main /= np.linalg.norm(main)
    directions = []
    while len(directions) < n_states - 1:
        candidate = rng.normal(0.0, 1.0, n_factors)
        candidate /= np.linalg.norm(candidate)
        if candidate @ main >= 0.5:
            directions.append(candidate)
    directions = np.array(directions).reshape(n_states - 1, n_factors)
    factor_means = np.vstack([np.zeros(n_factors), np.cumsum(separation * directions, axis=0)])
    covars = []
    for _ in range(n_states):
        mixing = rng.normal(0.0, 0.5, (n_factors, n_factors))
        factor_covariance = mixing @ mixing.T + 0.5 * np.eye(n_factors)
        specific = rng.uniform(0.05, 0.2, n_features)
        covars.append(loadings @ factor_covariance @ loadings.T + np.diag(specific))
    stay = 1.0 - (n_states + 1) / length
    transmat = np.zeros((n_states, n_states))
    for k in range(n_states - 1):
        transmat[k, k], transmat[k, k + 1] = stay, 1.0 - stay
    transmat[-1, -1] = 1.0
    model = GaussianHMM(n_components=n_states, covariance_type="full")
    model.startprob_ = np.eye(n_states)[0]
    model.transmat_ = transmat
    model.means_ = factor_means @ loadings.T
    model.covars_ = np.array(covars)
    model.n_features = n_features
    scale = 10.0 ** rng.uniform(-3, 3, n_features)
    offset = rng.normal(0.0, 5.0, n_features) * scale
    return KnownHMM(model, scale, offset, loadings)


def sample_runs(
    n_states: int, n_runs: int = 40, length: int = 200, seed: int = 0, nuisance: float = 0.0,
    tails: float | None = None, autocorrelation: float = 0.0, state_drift: float = 0.0,
    length_spread: float = 1.0, **options: float,
) -> tuple[dict[str, pd.DataFrame], dict[str, np.ndarray], KnownHMM]:  # fmt: skip
    """``n_runs`` metric tables of ``length`` checkpoints from :func:`left_to_right_hmm`, each with
    its own offset, scale and drift of size ``nuisance`` (module docstring; 0: none).

    ``tails``: a misspecification no emission of trainmap models: each checkpoint's deviation from
    its state's mean is scaled by sqrt(tails / chi2(tails)), so the within-state noise is
    multivariate Student-t with ``tails`` degrees of freedom (heavy tails; None: Gaussian, the
    samples of earlier versions byte for byte), drawn from ``SeedSequence([seed, index, 7])``.
    ``autocorrelation``: another: the within-state noise is AR(1), each checkpoint's deviation
    from its state's mean rho times the previous one plus sqrt(1 - rho^2) times fresh noise
    (:func:`autocorrelated_noise`; the same marginal covariance, correlated over checkpoints as
    training metrics are; 0: independent, the samples of earlier versions byte for byte).
    ``state_drift``: another: the level drifts inside each state (a square root of the time in it):
    a checkpoint tau checkpoints after entering state k (tau = 0 at entry, counted afresh at each
    visit) moves by state_drift * sqrt(tau / dwell_k) within-state standard deviations along the
    path's direction at k (the step to state k + 1; for the last state, the step into it), dwell_k
    the state's mean dwell 1 / (1 - transmat[k, k]) (the absorbing state: length / (n_states + 1));
    direction and standard deviation in the factor space (:func:`state_drift_steps`). Applied
    after ``tails`` and ``autocorrelation``, before the nuisance; no random draws (0: none, the
    samples of earlier versions byte for byte; needs ``n_states`` >= 2, a path's direction).
    ``length_spread``: unequal run lengths: run i is cut short to a length drawn uniformly from the
    integers in [length / length_spread, length] (at least 2), from
    ``SeedSequence([seed, index, 11])``; its table and true states are the first checkpoints of the
    full-length run (the same values: a run stopped early). 1: every run ``length`` long, no draw.
    Other ``options`` go to :func:`left_to_right_hmm` (``separation``, ``n_factors``, ...).

    Returns ``(runs, states, truth)``: run id -> table (``step``, the metric columns in raw units,
    ``test_acc`` = 1.0 from the last state on, else 0.0), run id -> true state sequence, the model.
    Raises ValueError, naming the option, for a ``state_drift`` that is not a finite number >= 0 or
    a ``length_spread`` that is not a finite number >= 1.
    """
    if not (math.isfinite(state_drift) and state_drift >= 0):
        raise ValueError(f"state_drift {state_drift!r}: a drift in within-state standard "
                         "deviations, a finite number >= 0")  # fmt: skip
    if state_drift and n_states < 2:
        raise ValueError(f"state_drift {state_drift!r} needs n_states >= 2 (the path's direction); "
                         f"n_states is {n_states!r}")  # fmt: skip
    if not (math.isfinite(length_spread) and length_spread >= 1):
        raise ValueError(f"length_spread {length_spread!r}: the longest run's length over the "
                         "shortest's, a finite number >= 1")  # fmt: skip
    truth = left_to_right_hmm(n_states, length=length, seed=seed, **options)
    runs, states = {}, {}
    for index in range(n_runs):
        runs[f"run{index:02d}"], states[f"run{index:02d}"] = _sample_table(
            truth, index, length, seed, nuisance, (n_states - 1,), tails, autocorrelation,
            state_drift, length_spread,
        )  # fmt: skip
    return runs, states, truth


def heavy_tails(
    values: np.ndarray, hidden: np.ndarray, means: np.ndarray, degrees: float, seed: int,
    index: int,
) -> np.ndarray:  # fmt: skip
    """``values`` [T, d] with each checkpoint's deviation from its state's mean scaled by
    sqrt(degrees / chi2(degrees)): Gaussian noise made multivariate Student-t."""
    if not degrees > 0:
        raise ValueError(f"tails {degrees!r}: degrees of freedom must be > 0")
    rng = np.random.default_rng(np.random.SeedSequence([seed, index, 7]))
    weights = np.sqrt(degrees / rng.chisquare(degrees, len(values)))[:, None]
    return means[hidden] + (values - means[hidden]) * weights


def autocorrelated_noise(
    values: np.ndarray, hidden: np.ndarray, means: np.ndarray, rho: float
) -> np.ndarray:
    """``values`` [T, d] with the deviations e_t from their states' means made AR(1):
    u_0 = e_0, u_t = rho u_(t-1) + sqrt(1 - rho^2) e_t (a linear filter of the sampled noise, no
    new draws; within a state the marginal covariance is unchanged)."""
    if not -1 < rho < 1:
        raise ValueError(f"autocorrelation {rho!r}: an AR(1) coefficient must be in (-1, 1)")
    from scipy.signal import lfilter

    noise = values - means[hidden]
    gain = np.full(len(noise), math.sqrt(1 - rho**2))
    gain[0] = 1.0
    filtered = lfilter([1.0], [1.0, -rho], noise * gain[:, None], axis=0)
    return means[hidden] + filtered


def state_drift_steps(truth: KnownHMM, length: int) -> np.ndarray:
    """[n_states, d] (standard units): state k's move at tau = dwell_k for ``state_drift`` 1
    (:func:`sample_runs`), the move at tau being this times sqrt(tau).

    Row k is spread_k * u_k @ loadings.T / sqrt(dwell_k): u_k the unit factor direction of the step
    from state k to k + 1 (the last state: of the step into it), spread_k = sqrt(u_k' L+ C_k L+' u_k)
    the state's within-state standard deviation along it (L+ the loadings' pseudo-inverse, C_k the
    state's covariance), dwell_k = 1 / (1 - transmat[k, k]) or, for an absorbing state,
    ``length / (n_states + 1)``. Needs at least 2 states."""
    model = truth.model
    n = model.n_components
    if n < 2:
        raise ValueError(f"state_drift needs n_states >= 2 (the path's direction); n_states is {n}")
    to_factors = np.linalg.pinv(truth.loadings)
    factor_means = model.means_ @ to_factors.T
    steps = np.empty_like(model.means_)
    for k in range(n):
        step = factor_means[k + 1] - factor_means[k] if k < n - 1 else (
            factor_means[k] - factor_means[k - 1])  # fmt: skip
        direction = step / np.linalg.norm(step)
        spread = math.sqrt(direction @ to_factors @ model.covars_[k] @ to_factors.T @ direction)
        stay = model.transmat_[k, k]
        dwell = 1.0 / (1.0 - stay) if stay < 1 else length / (n + 1)
        steps[k] = spread * direction @ truth.loadings.T / math.sqrt(dwell)
    return steps


def drifting_states(
    values: np.ndarray, hidden: np.ndarray, steps: np.ndarray, drift: float
) -> np.ndarray:
    """``values`` [T, d] with each checkpoint moved by drift * sqrt(tau) * steps[state], tau the
    checkpoints since the run entered its state's current visit (0 at entry; no random draws)."""
    time = np.arange(len(hidden))
    entries = np.flatnonzero(np.r_[True, hidden[1:] != hidden[:-1]])
    tau = time - entries[np.searchsorted(entries, time, side="right") - 1]
    return values + drift * np.sqrt(tau)[:, None] * steps[hidden]


def run_nuisance(
    values: np.ndarray, loadings: np.ndarray, nuisance: float, seed: int, index: int
) -> np.ndarray:
    """``values`` [T, d] (standard units) of run ``index`` with its offset, scale and drift in the
    factor space (module docstring), seeded by ``seed`` and the run index."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, index]))
    n_factors = loadings.shape[1]
    offset = rng.normal(0.0, nuisance, n_factors)
    drift = rng.normal(0.0, nuisance, n_factors)
    scale = math.exp(rng.normal(0.0, nuisance / 10))
    time = np.linspace(0.0, 1.0, len(values))[:, None]
    return scale * values + (offset + time * drift) @ loadings.T


def match_states(decoded: dict[str, np.ndarray], truth: dict[str, np.ndarray]) -> dict[int, int]:
    """Decoded state -> true state, the relabelling that agrees on the most checkpoints
    (Hungarian algorithm on the confusion matrix); decoded states left over map to nothing."""
    from scipy.optimize import linear_sum_assignment

    predicted = np.concatenate([decoded[run] for run in sorted(truth)])
    actual = np.concatenate([truth[run] for run in sorted(truth)])
    confusion = np.zeros((predicted.max() + 1, actual.max() + 1))
    np.add.at(confusion, (predicted, actual), 1)
    rows, columns = linear_sum_assignment(-confusion)
    return {int(row): int(column) for row, column in zip(rows, columns, strict=True)}


def known_answer_scores(
    decoded: dict[str, np.ndarray], edges: set[tuple[int, int]], states: dict[str, np.ndarray],
    truth: KnownHMM,
) -> dict[str, object]:  # fmt: skip
    """How a fitted map compares with the truth: the fraction of checkpoints decoded right up to
    relabelling, and whether the map's kept edges (relabelled) are exactly the true transitions."""
    mapping = match_states(decoded, states)
    predicted = np.concatenate([decoded[run] for run in sorted(states)])
    actual = np.concatenate([states[run] for run in sorted(states)])
    relabelled = np.array([mapping.get(int(label), -1) for label in predicted])
    kept = {(mapping.get(j, -1), mapping.get(k, -1)) for j, k in edges}
    return {
        "accuracy": float(np.mean(relabelled == actual)),
        "edges": sorted(kept),
        "edges_match": kept == truth.true_edges(),
    }


#: The differences :func:`sample_methods` plants between two methods: changes of b's model, and
#: (:data:`SAME_DYNAMICS`) changes of b's runs' values that leave the dynamics as a's.
_EFFECTS = ("detour", "fork", "slower", "offset", "start", "start_slow", "level", "scale")
#: The planted effects under which the methods follow the same dynamics: a start that decays,
#: a constant level, a constant scale (the path verdicts' nulls).
SAME_DYNAMICS = ("start", "start_slow", "level", "scale")
#: The start effects' decay, as a share of the run's length: ``start`` is gone by a tenth of
#: training (the default start window), ``start_slow`` by twice that.
START_DECAY = {"start": 0.1, "start_slow": 0.2}


def sample_methods(
    effect: str, size: float, n_runs_per_method: int, n_states: int = 3, length: int = 150,
    seed: int = 0, nuisance: float = 0.0, tails: float | None = None,
) -> tuple[dict[str, pd.DataFrame], dict[str, str], dict[str, np.ndarray], dict[str, KnownHMM]]:  # fmt: skip
    """Two methods' runs with a known difference: ``n_runs_per_method`` metric tables of group
    ``"a"`` and as many of group ``"b"``, whose law differs from a's by ``effect`` of ``size``.

    Group a is :func:`sample_runs` ``(n_states, n_runs_per_method, length, seed, nuisance)``
    itself (runs ``run00`` ...). b's runs continue that numbering, run i drawn as
    :func:`sample_runs` draws its run i (the same random state and nuisance), from b's model: a's
    (:func:`left_to_right_hmm`) with the effect planted at the middle phase k = (n_states - 1) // 2
    (sizes of means in the factor space, distances in units of the path's step):

    * ``detour``: a b run leaving state k goes, with probability ``size``, to an extra state D
      (numbered ``n_states``) instead of k + 1, and from D on to k + 1 (D's dwell as any state's);
      D lies one step off the path, beside the midpoint of k and k + 1, on the side away from the
      other states (covariance: state k's);
    * ``fork``: a b run leaving state n_states - 2 goes, with probability ``size``, to another final
      state F (numbered ``n_states``, absorbing, ``test_acc`` 1.0 as in the last state) instead of
      the last state; F lies one step off the path beside the midpoint of the last step
      (covariance: the last state's);
    * ``slower``: b's mean dwell in state k is multiplied by 1 + ``size`` (``size`` > -1);
    * ``offset``: b's first state's mean moves by ``size`` within-state standard deviations (the
      first state's, along the move) perpendicular to the path's first step;
    * ``start``: every b run's values move by ``size`` such standard deviations in that direction
      at the first checkpoint, the move decaying linearly to nothing by a tenth of the run
      (``start_slow``: by a fifth, twice the default start window): another start, the same
      dynamics;
    * ``level``: every b run's values move by ``size`` such standard deviations in that direction
      at every checkpoint (every state's mean shifted: the same dynamics at another level);
    * ``scale``: every b run's values (standard units: means and within-state spread) are
      multiplied by 1 + ``size`` about the first state's mean (``size`` > -1): the same dynamics
      at another scale, as a rescaling of the weights scales their norms.

    Each planted choice is one transition probability of b's model, so each b run takes it
    independently with probability ``size``. ``tails``: both methods' within-state noise
    Student-t (:func:`sample_runs`). At ``size`` 0 b's model draws exactly what a's does
    (an extra state has probability 0, and hmmlearn draws the same numbers): ``runs`` and
    ``states`` are then those of :func:`sample_runs` with ``2 * n_runs_per_method`` runs, a true
    null.

    Returns ``(runs, groups, states, truth)``: run id -> metric table (as :func:`sample_runs`'),
    run id -> ``"a"`` or ``"b"``, run id -> true state sequence (b's model's numbering: a's states
    keep their numbers), group -> its true model (:class:`KnownHMM`; b's has ``n_states + 1``
    states for ``detour`` and ``fork``).
    """
    if effect not in _EFFECTS:
        raise ValueError(f"effect {effect!r}: choose one of {', '.join(_EFFECTS)}")
    if effect in ("detour", "fork") and not 0 <= size <= 1:
        raise ValueError(f"{effect} size {size!r}: a probability, in [0, 1]")
    if effect in ("slower", "scale") and not size > -1:
        raise ValueError(f"{effect} size {size!r}: multiplies by 1 + size, so > -1")
    if n_states < 2:
        raise ValueError(f"n_states {n_states!r}: a path needs at least 2 states")
    runs, states, truth = sample_runs(n_states, n_runs_per_method, length, seed, nuisance, tails)
    same = effect in SAME_DYNAMICS
    planted = truth if same else _planted_model(truth, effect, size)
    moved = _moved_values(truth, effect, size, length) if same else None
    finals = (n_states - 1, n_states) if effect == "fork" else (n_states - 1,)
    groups = dict.fromkeys(runs, "a")
    for index in range(n_runs_per_method, 2 * n_runs_per_method):
        run = f"run{index:02d}"
        runs[run], states[run] = _sample_table(planted, index, length, seed, nuisance, finals,
                                               tails, moved=moved)  # fmt: skip
        groups[run] = "b"
    return runs, groups, states, {"a": truth, "b": planted}


def _sample_table(
    truth: KnownHMM, index: int, length: int, seed: int, nuisance: float, finals: tuple[int, ...],
    tails: float | None = None, autocorrelation: float = 0.0, state_drift: float = 0.0,
    length_spread: float = 1.0, moved=None,
) -> tuple[pd.DataFrame, np.ndarray]:  # fmt: skip
    """Run ``index`` of ``truth`` (:func:`sample_runs`' and :func:`sample_methods`' one draw):
    its metric table, ``test_acc`` 1.0 in the states ``finals``, and its true states.
    ``state_drift`` and ``length_spread`` as :func:`sample_runs`' (0 and 1: none).
    ``moved``: a function of the values [T, d] (standard units) that plants a same-dynamics
    effect (:func:`_moved_values`), applied before the run's nuisance."""
    values, hidden = truth.model.sample(length, random_state=seed * 1000 + index + 1)
    if tails is not None:
        values = heavy_tails(values, hidden, truth.model.means_, tails, seed, index)
    if autocorrelation:
        values = autocorrelated_noise(values, hidden, truth.model.means_, autocorrelation)
    if state_drift:
        values = drifting_states(values, hidden, state_drift_steps(truth, length), state_drift)
    if moved is not None:
        values = moved(values)
    if nuisance:
        values = run_nuisance(values, truth.loadings, nuisance, seed, index)
    if length_spread > 1:  # the run stopped early: its first checkpoints
        rng = np.random.default_rng(np.random.SeedSequence([seed, index, 11]))
        shortest = min(length, max(2, math.ceil(length / length_spread)))
        kept = int(rng.integers(shortest, length, endpoint=True))
        values, hidden = values[:kept], hidden[:kept]
    names = list(METRIC_NAMES[: truth.model.n_features])
    table = pd.DataFrame(values * truth.scale + truth.offset, columns=names)
    table.insert(0, "step", np.arange(len(values)) * 10)
    table["test_acc"] = np.isin(hidden, finals).astype(float)
    return table, hidden


def _moved_values(truth: KnownHMM, effect: str, size: float, length: int):
    """The function that plants a same-dynamics ``effect`` of ``size`` (:data:`SAME_DYNAMICS`,
    :func:`sample_methods`) in a run's values [length, d] in standard units."""
    if effect == "scale":
        origin = truth.model.means_[0]
        return lambda values: origin + (1 + size) * (values - origin)
    to_factors = np.linalg.pinv(truth.loadings)
    factor_means = truth.model.means_ @ to_factors.T
    direction = _away(factor_means[1] - factor_means[0], factor_means[0], factor_means)
    spread = math.sqrt(direction @ to_factors @ truth.model.covars_[0] @ to_factors.T @ direction)
    shift = (size * spread * direction) @ truth.loadings.T
    if effect == "level":
        return lambda values: values + shift
    weight = np.clip(1 - np.arange(length) / (START_DECAY[effect] * length), 0.0, 1.0)
    return lambda values: values + weight[:, None] * shift


def _planted_model(truth: KnownHMM, effect: str, size: float) -> KnownHMM:
    """``truth`` with ``effect`` of ``size`` planted (:func:`sample_methods`)."""
    base = truth.model
    n = base.n_components
    middle = (n - 1) // 2
    to_factors = np.linalg.pinv(truth.loadings)  # factors x features: L^+ L = I
    factor_means = base.means_ @ to_factors.T
    startprob, transmat = base.startprob_.copy(), base.transmat_.copy()
    means, covars = base.means_.copy(), base.covars_.copy()
    if effect in ("detour", "fork"):
        branch = middle if effect == "detour" else n - 2
        step = factor_means[branch + 1] - factor_means[branch]
        extra = (factor_means[branch] + factor_means[branch + 1]) / 2
        distance = np.linalg.norm(step)
        extra = extra + distance * _away(step, extra, factor_means, distance)
        leave = transmat[branch, branch + 1]
        transmat = np.pad(transmat, ((0, 1), (0, 1)))
        transmat[branch, branch + 1], transmat[branch, n] = leave * (1 - size), leave * size
        if effect == "detour":
            transmat[n, n], transmat[n, branch + 1] = 1 - leave, leave
        else:
            transmat[n, n] = 1.0
        startprob = np.append(startprob, 0.0)
        means = np.vstack([means, extra @ truth.loadings.T])
        covars = np.concatenate([covars, covars[[branch if effect == "detour" else n - 1]]])
    elif effect == "slower":
        leave = 1.0 - transmat[middle, middle]
        transmat[middle, middle], transmat[middle, middle + 1] = (
            1.0 - leave / (1 + size), leave / (1 + size))  # fmt: skip
    else:  # offset
        direction = _away(factor_means[1] - factor_means[0], factor_means[0], factor_means)
        spread = math.sqrt(direction @ to_factors @ covars[0] @ to_factors.T @ direction)
        means[0] = means[0] + (size * spread * direction) @ truth.loadings.T
    model = GaussianHMM(n_components=len(means), covariance_type="full")
    model.startprob_, model.transmat_, model.means_ = startprob, transmat, means
    model.covars_ = covars
    model.n_features = base.n_features
    return KnownHMM(model, truth.scale, truth.offset, truth.loadings)


def _away(
    step: np.ndarray, anchor: np.ndarray, factor_means: np.ndarray, distance: float = 1.0
) -> np.ndarray:
    """The unit factor direction perpendicular to ``step`` in which a point ``distance`` from
    ``anchor`` keeps furthest from the nearest of the states' ``factor_means``."""
    perpendicular = np.linalg.svd(step[None, :])[2][1]
    return max((perpendicular, -perpendicular), key=lambda u: np.linalg.norm(
        factor_means - (anchor + distance * u), axis=1).min())  # fmt: skip
