"""Run terms of the emissions: a Gaussian HMM with a per-run offset (drift, scale), fitted by ECM.

Real seeds differ by more than their states: an offset, a scale and a slow drift of the metrics per
run (:func:`trainmap.dynamics.maps.synthetic.run_nuisance`). A plain HMM covers those differences with
extra states or merges true ones (bench/selection_nuisance.py). :class:`RunOffsetHMM` models them.
It is the analysis setting ``emission`` (``params.yaml`` ``analysis.emission``): ``run_offset``
and ``run_offset_drift`` (this model without and with drift) and ``run_affine`` (with drift and
scale, eq. 3), made by :func:`~trainmap.dynamics.maps.hmm.factory.make_model` and fitted, scored and
selected by :func:`~trainmap.dynamics.maps.hmm.selection.select_model` as the plain model is, in the
full fit and in every bootstrap and stability refit. Measured by bench/run_offsets.py (docs/training-maps.md,
"Run-to-run nuisance"); design record: docs/decisions/run-terms.md.

Model
-----
Run r (length T_r) with hidden states s_t and observations x_{r,t} in R^d:

    x_{r,t} = mu_{s_t} + b_r + c_r u_{r,t} + eps_{r,t},   eps_{r,t} ~ N(0, Sigma_{s_t}),
    u_{r,t} = t / (T_r - 1)  (0 at the first checkpoint, 1 at the last),

with c_r = 0 unless ``drift=True``. The offsets get a Gaussian prior b_r ~ N(0, tau_b^2 I) (drifts
c_r ~ N(0, tau_c^2 I)), independent of the states. The HMM parameters theta = (pi, A, mu, Sigma)
and the run terms (b, c) maximise the penalised log-likelihood (the log posterior up to a constant,
since log N(b; 0, tau^2 I) = -|b|^2 / (2 tau^2) + const):

    F(theta, b, c) = sum_r log p(x_r | theta, b_r, c_r) - lambda_b/2 sum_r |b_r|^2
                     - lambda_c/2 sum_r |c_r|^2,           lambda = 1 / tau^2.        (eq. 0)

With a per-run scale (``scale=True``) a_r > 0 multiplies the state's mean and noise, with no prior:

    x_{r,t} = a_r (mu_{s_t} + eps_{r,t}) + b_r + c_r u_{r,t},
    i.e. x_{r,t} | s_t = k ~ N(a_r mu_k + b_r + c_r u_{r,t}, a_r^2 Sigma_k),                (eq. 3)

so log p(x_t | k) = log N(y_t; mu_k, Sigma_k) - d log a_r with the residuals
y_{r,t} = (x_{r,t} - b_r - c_r u_{r,t}) / a_r, and eq. 0 has -T_r d log a_r in each run's term.

Estimation: ECM (Meng & Rubin 1993, Biometrika 80: the M-step replaced by conditional
maximisations, each raising the same expected complete-data log-likelihood Q, so F never
decreases). E-step: the residuals y are an ordinary HMM's observations; the engine
(:func:`~trainmap.dynamics.maps.hmm.forward_backward.forward_backward_runs`) gives gamma_{r,t,k} and the
expected transitions, and :func:`~trainmap.dynamics.maps.hmm.gaussian.gaussian_statistics` the
statistics of y. CM-step 1: hmmlearn's Gaussian M-step on them. CM-step 2: (b_r, c_r) by eqs. 1-2;
CM-step 3 (with scale): a_r in closed form (:mod:`~trainmap.dynamics.maps.hmm.run_term_updates`).

Identifiability: mu_k + b_r is unchanged by mu_k -> mu_k + m, b_r -> b_r - m, so after CM-step 2
the offsets are centred, m = the run-weighted mean of b_r, b_r -= m, mu_k += m (the likelihood is
unchanged and the penalty can only fall). A common drift competes with the states' progression (a
left-to-right process looks like a drift shared by every run), so the drifts are constrained to
sum_r w_r c_r = 0. With scale, a_r -> a_r / g, mu -> g mu, Sigma -> g^2 Sigma leaves every density
unchanged: the scales are normalised to weighted geometric mean 1, and the centring takes
m = sum_r w_r a_r b_r / sum_r w_r a_r^2 (b_r -> b_r - a_r m). None of these lowers eq. 0.

Local optima: a run's likelihood is multimodal in b_r (an offset of about one state step makes a
run's segments look like their neighbour states). So the run terms are searched
(:meth:`RunOffsetHMM.search_run_terms`, theta fixed) from several starts: the current terms, the
offsets that put the mean of the run's first (last) :data:`SEARCH_WINDOW` checkpoints on each
state's mean and, with scale, the (a_r, b_r) that put the means of the first and last checkpoints
on states j < k (least squares, a_r > 0); the best few by penalised likelihood are refined and the
best kept. A fit alternates ECM to convergence with such a search of the fitted runs' terms (the
current terms among the starts, so no run's penalised likelihood falls) until the search moves no
run by more than :data:`SEARCH_MOVE` (at most ``search_rounds`` ECM runs; the terms of a search
that moved nothing are not kept).

Run weights (:meth:`RunOffsetHMM.fit_weighted`: run r counts w_r times): eq. 0 becomes
sum_r w_r [log p(x_r | theta, b_r, c_r) - lambda_b/2 |b_r|^2 - lambda_c/2 |c_r|^2], the fit of the
data with run r repeated w_r times; the statistics, the centring, the drift constraint and the
scales' normalisation are weighted by w_r.

Warm starts (a model made with ``init_params=""`` and set to a fitted theta,
:func:`~trainmap.dynamics.maps.hmm.factory.start_from`): the run terms belong to the runs, so the fit
first searches them with theta fixed (from b = c = 0, a = 1; then the centring and the constraint)
and continues ECM from there. In a selection each K is fitted on its own (``fits_in_lockstep``
False), its restarts ranked by eq. 0 (``objective_``, :meth:`RunOffsetHMM.training_objective`).

New runs (held-out scoring, decoding): theta stays fixed and each run's terms come from the search
above started from b = c = 0 (and a = 1; no centring, normalisation or constraint).
:meth:`RunOffsetHMM.score` is the profile log-likelihood sum_r log p(x_r | theta, b_r, c_r, a_r)
(prior not added; with scale the Jacobian included), the held-out BIC counts the d (2d with drift,
2d + 1 with drift and scale) terms of every scored run (:meth:`RunOffsetHMM.n_run_parameters`),
and :meth:`RunOffsetHMM.predict_runs` is hmmlearn's Viterbi on the residuals.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from trainmap.dynamics.maps.hmm.forward_backward import (
    forward_backward_runs,
    run_log_likelihoods,
    run_starts,
    runs_of_equal_length,
)
from trainmap.dynamics.maps.hmm.gaussian import BatchedGaussianHMM, gaussian_statistics
from trainmap.dynamics.maps.hmm.run_term_updates import (
    offset_system,
    run_sums,
    run_time,
    scale_sums,
    solve_run_terms,
    solve_scales,
)
from trainmap.schema import section_defaults

#: The covariance type of a model made without one: the config schema's default of
#: ``analysis.covariance_type``.
DEFAULT_COVARIANCE_TYPE: str = section_defaults("analysis")["covariance_type"]
#: Default prior standard deviation of an offset (and a drift), in standardised units.
DEFAULT_OFFSET_SCALE = 0.5
#: Alternations of posteriors and offset update for a new run (parameters fixed).
DEFAULT_OFFSET_ITER = 20
#: Stop those alternations when no run term moves by more than this (standardised units).
OFFSET_TOL = 1e-4
#: Checkpoints at a run's start (end) whose mean the search aligns with each state's mean.
SEARCH_WINDOW = 10
#: Alternations of each refined start of the search before the best one of each run is kept.
SEARCH_ITER = 3
#: Starts per run refined besides its current terms (the best by penalised likelihood).
SEARCH_KEEP = 2
#: Rounds of (ECM to convergence, search of the fitted runs' terms) in a fit.
DEFAULT_SEARCH_ROUNDS = 3
#: A search that moves no run term by more than this (standardised units) ends the fit.
SEARCH_MOVE = 0.05


def posteriors_and_likelihood(
    log_frames: np.ndarray,
    startprob: np.ndarray,
    transmat: np.ndarray,
    lengths: Sequence[int],
    weights: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The engine's E-step of every run (:func:`~trainmap.dynamics.maps.hmm.forward_backward.
    forward_backward_runs`), in the runs' own order: posteriors [N, K], expected transitions
    [K, K] (each run's times its weight), each run's first-step posterior [R, K] and
    log-likelihood [R]."""
    n_states = log_frames.shape[1]
    batches = runs_of_equal_length(lengths)
    answer = forward_backward_runs([(positions, log_frames[rows.T]) for positions, rows in batches],
                                   startprob, transmat, [n_states], weights)  # fmt: skip
    posteriors = np.empty_like(log_frames)
    first = np.empty((len(lengths), n_states))
    log_likelihood = np.empty(len(lengths))
    for (positions, rows), gamma, run_log_likelihood in zip(
        batches, answer.posteriors, answer.log_likelihoods, strict=True
    ):
        posteriors[rows.T] = gamma
        first[positions] = gamma[0]
        log_likelihood[positions] = run_log_likelihood[:, 0]
    return posteriors, answer.transitions, first, log_likelihood


class RunOffsetHMM(BatchedGaussianHMM):
    """A Gaussian HMM with a per-run emission offset, with ``drift=True`` a per-run linear drift
    and with ``scale=True`` a per-run scale (eq. 3), estimated with the HMM's parameters by ECM
    (module docstring).

    ``offset_scale`` and ``drift_scale``: the prior standard deviations tau_b and tau_c, in the
    units of X (lambda = 1 / tau^2 in eqs. 1-2). ``offset_iter``: alternations of posteriors and
    run-term updates for new runs (:meth:`estimate_run_terms`). Other arguments: hmmlearn's
    ``GaussianHMM`` (covariance types ``"full"`` and ``"diag"``). After :meth:`fit`: ``offsets_``
    [R, d], ``drifts_`` [R, d] (zeros without drift) and ``scales_`` [R] (ones without scale) of
    the fitted runs, in ``lengths`` order,
    ``objective_`` (eq. 0 at the last E-step), ``train_log_likelihood_`` (its likelihood part),
    ``objective_history_`` (eq. 0 at every E-step of the fit, one list per ECM run of
    :meth:`fit_weighted`) and ``n_iterations_`` (ECM iterations over all runs). Run weights:
    :meth:`fit_weighted`, :meth:`score_weighted`.
    """

    #: Each model fits by its own ECM (the search of the run terms does not run in lockstep).
    fits_in_lockstep = False

    def __init__(
        self, n_components: int = 1, covariance_type: str = DEFAULT_COVARIANCE_TYPE, *,
        drift: bool = False,
        scale: bool = False, offset_scale: float = DEFAULT_OFFSET_SCALE,
        drift_scale: float = DEFAULT_OFFSET_SCALE, offset_iter: int = DEFAULT_OFFSET_ITER,
        search_rounds: int = DEFAULT_SEARCH_ROUNDS, **kwargs: Any,
    ) -> None:  # fmt: skip
        if covariance_type not in ("full", "diag"):
            raise ValueError(f"covariance_type: {covariance_type!r}; choose full or diag")
        super().__init__(n_components=n_components, covariance_type=covariance_type, **kwargs)
        self.drift, self.offset_scale, self.drift_scale = drift, offset_scale, drift_scale
        self.scale = scale
        self.offset_iter, self.search_rounds = offset_iter, search_rounds

    # --- parameters of the run terms -----------------------------------------------------------

    @property
    def ridge(self) -> tuple[float, float]:
        """(lambda_b, lambda_c) = 1 / tau^2 (0 for an infinite prior scale)."""
        return 1.0 / self.offset_scale**2, 1.0 / self.drift_scale**2

    def n_run_parameters(self, n_runs: int) -> int:
        """Free run terms of ``n_runs`` runs: d each (2d with drift), and 1 more with scale."""
        return n_runs * self.n_terms(self.n_features)

    def n_terms(self, d: int) -> int:
        """Columns of the run terms: the offset b_r (d), the drift c_r (d, with drift) and the
        scale a_r (1, with scale; last)."""
        return d * (2 if self.drift else 1) + (1 if self.scale else 0)

    def initial_terms(self, n_runs: int, d: int) -> np.ndarray:
        """Run terms b = c = 0 (and a = 1): [R, m]."""
        terms = np.zeros((n_runs, self.n_terms(d)))
        if self.scale:
            terms[:, -1] = 1.0
        return terms

    def run_shift(self, terms: np.ndarray, lengths: Sequence[int]) -> np.ndarray:
        """b_r + c_r u_{r,t} for every row [N, d] from the run terms [R, m]."""
        d = self.n_features
        shift = np.repeat(terms[:, :d], lengths, axis=0)
        if self.drift:
            shift += np.repeat(terms[:, d : 2 * d], lengths, axis=0) * run_time(lengths)[:, None]
        return shift

    def run_residuals(self, X: np.ndarray, terms: np.ndarray, lengths: Sequence[int]) -> np.ndarray:
        """y_{r,t} = (x_{r,t} - b_r - c_r u_{r,t}) / a_r [N, d] (a_r = 1 without scale)."""
        residual = X - self.run_shift(terms, lengths)
        if self.scale:
            residual = residual / np.repeat(terms[:, -1], lengths)[:, None]
        return residual

    def _log_frames(
        self, X: np.ndarray, terms: np.ndarray, lengths: Sequence[int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """log p(x_t | s_t = k, run terms) [N, K] and the residuals y [N, d]: log N(y_t; mu_k,
        Sigma_k), minus the Jacobian d log a_r with scale (eq. 3)."""
        residual = self.run_residuals(X, terms, lengths)
        log_frames = self._compute_log_likelihood(residual)
        if self.scale:
            jacobian = self.n_features * np.log(np.repeat(terms[:, -1], lengths))
            log_frames = log_frames - jacobian[:, None]
        return log_frames, residual

    def precisions(self) -> np.ndarray:
        """P_k = Sigma_k^-1 [K, d, d] (pseudo-inverse where singular to rounding)."""
        return np.linalg.pinv(self.covars_, hermitian=True)  # covars_: full for every type

    def training_objective(self, X: np.ndarray, lengths: Any, weights: Any = None) -> float:
        """What the fit maximised: eq. 0 at its last E-step (``objective_``; rescoring the runs
        would search their terms again), NaN where ECM left a state without mass."""
        return float(self.objective_) if np.isfinite(self.means_).all() else math.nan

    def fit_iterations(self) -> int:
        """ECM iterations of the last fit, over all its rounds."""
        return int(self.n_iterations_)

    # --- fitting (ECM) -------------------------------------------------------------------------

    def fit(self, X: np.ndarray, lengths: Sequence[int] | None = None) -> RunOffsetHMM:
        """Fit theta and the fitted runs' terms, every run once (:meth:`fit_weighted`)."""
        return self._fit_runs(X, lengths, None)

    def fit_weighted(self, X: np.ndarray, lengths: Any, weights: Any) -> RunOffsetHMM:
        """Fit where run i (in ``lengths`` order) counts ``weights[i]`` times: eq. 0 with each
        run's terms weighted (module docstring, "Run weights"), the fit of the data with run i
        repeated ``weights[i]`` times."""
        return self._fit_runs(X, lengths, np.asarray(weights, dtype=float))

    def _fit_runs(
        self, X: np.ndarray, lengths: Sequence[int] | None, weights: np.ndarray | None
    ) -> RunOffsetHMM:
        """ECM from zero run terms (warm start, ``init_params=""``: from the terms searched with
        the given theta) to convergence, then up to ``search_rounds - 1`` times a search of every
        run's terms with theta fixed (:meth:`search_run_terms`, started from the current terms, so
        no run's penalised likelihood falls), centring, and ECM again from there, until the search
        moves no run. Each step does not decrease eq. 0 (module docstring)."""
        X = np.asarray(X, dtype=float)
        lengths = [len(X)] if lengths is None else [int(n) for n in lengths]
        self._fit_lengths, self._X_fit = lengths, X
        self._fit_weights = np.ones(len(lengths)) if weights is None else weights
        self._fit_time = run_time(lengths) if self.drift else None
        self._terms = self.initial_terms(len(lengths), X.shape[1])
        self.objective_history_: list[list[float]] = []
        init_params, iterations = self.init_params, 0
        try:
            if not set("stmc") & set(self.init_params):  # warm start: theta given
                self._check()
                self._adopt(self.search_run_terms(X, lengths, self._terms)[0])
            for round_ in range(self.search_rounds):
                self.objective_history_.append([])
                super().fit(X, lengths)
                iterations += self.monitor_.iter
                if round_ == self.search_rounds - 1 or not self._search_fitted(X, lengths):
                    break
                self.init_params = ""  # continue EM from the current parameters
        finally:
            # Every exit sets the fit's results, a fit that raised included (its caller reads
            # them to report the failed fit): the iterations done and the current run terms.
            del self._X_fit, self._fit_weights
            self.__dict__.pop("_posteriors", None)  # [N, K]: not carried to worker results
            self.init_params = init_params
            self.n_iterations_ = iterations
            d = X.shape[1]
            self.offsets_ = self._terms[:, :d].copy()
            self.drifts_ = (self._terms[:, d : 2 * d].copy() if self.drift
                            else np.zeros_like(self.offsets_))  # fmt: skip
            self.scales_ = self._terms[:, -1].copy() if self.scale else np.ones(len(lengths))
        return self

    def _search_fitted(self, X: np.ndarray, lengths: Sequence[int]) -> bool:
        """Search the fitted runs' terms (theta fixed); where some run moves by more than
        :data:`SEARCH_MOVE`, keep the new terms (:meth:`_adopt`); whether any run moved."""
        if not np.isfinite(self.means_).all():
            return False
        terms = self.search_run_terms(X, lengths, self._terms)[0]
        if float(np.abs(terms - self._terms).max()) <= SEARCH_MOVE:
            return False
        self._adopt(terms)
        return True

    def _adopt(self, terms: np.ndarray) -> None:
        """Make ``terms`` the fitted runs' terms: centre the offsets on their weighted mean
        (moving the means: the likelihood is unchanged) and, with drift, project the drifts onto
        sum_r w_r c_r = 0 (the next ECM restores the constrained CM-step). With scale, first the
        scales are normalised and the offsets centred as in eq. 3 (:meth:`_normalise`)."""
        d, w = self.n_features, self._fit_weights
        self._reparametrise(terms)
        if self.drift:
            terms[:, d : 2 * d] -= w @ terms[:, d : 2 * d] / w.sum()
        self._terms = terms

    def _reparametrise(self, terms: np.ndarray) -> None:
        """In place, the reparametrisations that leave the likelihood unchanged: the offsets
        centred on their weighted mean (moving the means), or with scale those of eq. 3
        (:meth:`_normalise`)."""
        if self.scale:
            self._normalise(terms)
            return
        d, w = self.n_features, self._fit_weights
        centre = w @ terms[:, :d] / w.sum()
        terms[:, :d] -= centre
        self.means_ = self.means_ + centre

    def _normalise(self, terms: np.ndarray) -> None:
        """With scale, the two reparametrisations of eq. 3 that leave the likelihood unchanged,
        in place: a_r -> a_r / g, mu -> g mu, Sigma -> g^2 Sigma with g the weighted geometric
        mean of the scales (so it becomes 1), then mu_k -> mu_k + m, b_r -> b_r - a_r m with
        m = sum_r w_r a_r b_r / sum_r w_r a_r^2 (the m that minimises the offsets' penalty)."""
        d, w = self.n_features, self._fit_weights
        g = float(np.exp(w @ np.log(terms[:, -1]) / w.sum()))
        terms[:, -1] /= g
        self.means_ = self.means_ * g
        self._covars_ = self._covars_ * g**2
        a = terms[:, -1]
        centre = (w * a) @ terms[:, :d] / (w @ a**2)
        terms[:, :d] -= a[:, None] * centre
        self.means_ = self.means_ + centre

    def _do_estep(self, X: np.ndarray, lengths: Sequence[int]) -> tuple[dict, float]:
        """E-step on the residuals y = x - b - c u, each run's statistics times its weight;
        returns hmmlearn's statistics of y and eq. 0."""
        w = self._fit_weights
        log_frames, residual = self._log_frames(X, self._terms, lengths)
        posteriors, transitions, first, run_ll = posteriors_and_likelihood(
            log_frames, self.startprob_, self.transmat_, lengths, w)  # fmt: skip
        self._posteriors = posteriors
        weighted = posteriors * np.repeat(w, lengths)[:, None]
        stats = gaussian_statistics([self], weighted, residual, w @ first, transitions,
                                    float(w.sum()), packed=False)[0]  # fmt: skip
        self.train_log_likelihood_ = float(w @ run_ll)
        self.objective_ = self.train_log_likelihood_ - float(w @ self._penalties(self._terms))
        self.objective_history_[-1].append(self.objective_)
        return stats, self.objective_

    def _penalties(self, terms: np.ndarray) -> np.ndarray:
        """lambda_b/2 |b_r|^2 + lambda_c/2 |c_r|^2 of every run [R] (eq. 0's prior terms)."""
        d = self.n_features
        value = 0.5 * self.ridge[0] * (terms[:, :d] ** 2).sum(axis=1)
        if self.drift:
            value = value + 0.5 * self.ridge[1] * (terms[:, d : 2 * d] ** 2).sum(axis=1)
        return value

    def _do_mstep(self, stats: dict) -> None:
        """CM-step 1 (hmmlearn's M-step on the residuals' statistics), CM-step 2 (eq. 1 or 2 with
        the new theta, gamma of the last E-step; with drift under sum_r w_r c_r = 0) and the
        centring of the offsets on their weighted mean; with scale, CM-steps 2 and 3 of eq. 3 and
        its normalisation and centring (:meth:`_normalise`)."""
        super()._do_mstep(stats)
        X, lengths, w = self._X_fit, self._fit_lengths, self._fit_weights
        if not np.isfinite(self.means_).all():
            return  # a state lost its mass; hmmlearn's checks report it
        self._terms = self._update_terms(X, lengths, self._posteriors, self._terms, w)
        self._reparametrise(self._terms)

    def _update_terms(
        self, X: np.ndarray, lengths: Sequence[int], posteriors: np.ndarray, terms: np.ndarray,
        weights: np.ndarray | None,
    ) -> np.ndarray:  # fmt: skip
        """CM-step 2, (b, c) given theta (and a: eq. 3's system), then with scale CM-step 3, a
        given (b, c) and theta (closed form); gamma = ``posteriors`` held fixed. ``weights``
        given (a fit's runs): with drift under sum_r w_r c_r = 0; None (new runs): unconstrained.
        New terms [R, m]."""
        precisions = self.precisions()
        sums = run_sums(X, posteriors, lengths, run_time(lengths) if self.drift else None,
                        self.drift)  # fmt: skip
        scales = terms[:, -1] if self.scale else None
        matrix, rhs = offset_system(sums, self.means_, precisions, self.ridge, self.drift, scales)
        updated = np.array(terms, dtype=float)
        shifts = slice(0, updated.shape[1] - (1 if self.scale else 0))  # b (and c)
        updated[:, shifts] = solve_run_terms(matrix, rhs, self.drift, centre=weights is not None,
                                             weights=weights)  # fmt: skip
        if self.scale:
            A, B = scale_sums(X - self.run_shift(updated, lengths), posteriors, lengths,
                              self.means_, precisions)  # fmt: skip
            updated[:, -1] = solve_scales(A, B, lengths, self.n_features)
        return updated

    # --- new runs: terms estimated with theta fixed --------------------------------------------

    def estimate_run_terms(self, X: np.ndarray, lengths: Sequence[int] | None = None) -> np.ndarray:
        """Each run's MAP terms [R, d] (offsets; [R, 2d], offsets then drifts, with drift; a last
        column, the scale, with scale) given the fitted theta, by the multi-start search of
        :meth:`search_run_terms` from zero (and a = 1)."""
        self._check()
        X = np.asarray(X, dtype=float)
        lengths = [len(X)] if lengths is None else [int(n) for n in lengths]
        return self.search_run_terms(X, lengths, self.initial_terms(len(lengths), X.shape[1]))[0]

    def search_run_terms(
        self, X: np.ndarray, lengths: Sequence[int], current: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each run's terms [R, m] and penalised log-likelihood [R] given theta, from the best of
        several starts (the run's likelihood in b is multimodal: an offset of one state step makes
        a run's segments look like their neighbour states). Starts: ``current``, and the offsets
        that put the mean of the run's first (last) :data:`SEARCH_WINDOW` checkpoints on each
        state's mean (drift 0). Every start is scored by its penalised log-likelihood (eq. 0's
        terms of the run); ``current`` and the :data:`SEARCH_KEEP` best others get
        :data:`SEARCH_ITER` alternations of posteriors and eq. 1 / 2; the best of those then
        continues to ``offset_iter`` alternations or until no term moves by :data:`OFFSET_TOL`."""
        starts, owner = self._starts(X, lengths, current)
        value = self._penalised(*self._repeat(X, lengths, owner), starts)
        kept = self._kept_starts(value, owner, len(lengths))
        repeated, rep_lengths = self._repeat(X, lengths, owner[kept])
        terms, value = self._alternate(repeated, rep_lengths, starts[kept], SEARCH_ITER)
        owner = owner[kept]
        best = np.array([np.flatnonzero(owner == r)[np.argmax(value[owner == r])]
                         for r in range(len(lengths))])  # fmt: skip
        return self._alternate(X, lengths, terms[best], self.offset_iter)

    @staticmethod
    def _kept_starts(value: np.ndarray, owner: np.ndarray, n_runs: int) -> np.ndarray:
        """Indices of the starts to refine: each run's first (its current terms) and its
        :data:`SEARCH_KEEP` best others by ``value``."""
        kept = []
        for r in range(n_runs):
            mine = np.flatnonzero(owner == r)
            others = mine[1:][np.argsort(-value[mine[1:]], kind="stable")[:SEARCH_KEEP]]
            kept.extend([mine[0], *others])
        return np.array(kept)

    def _repeat(
        self, X: np.ndarray, lengths: Sequence[int], owner: np.ndarray
    ) -> tuple[np.ndarray, list[int]]:
        """``X, lengths`` with the run behind every start repeated, in the starts' order."""
        rows = self._rows(lengths, owner)
        return np.concatenate([X[a : a + n] for a, n in rows]), [n for _, n in rows]

    @staticmethod
    def _rows(lengths: Sequence[int], owner: np.ndarray) -> list[tuple[int, int]]:
        """(first row, length) in X of the run behind every start."""
        begins = run_starts(lengths)
        return [(int(begins[r]), int(lengths[r])) for r in owner]

    def _starts(
        self, X: np.ndarray, lengths: Sequence[int], current: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The starts of :meth:`search_run_terms` [S, m] and the run each belongs to [S]."""
        d = self.n_features
        begins = run_starts(lengths)
        starts, owner = [current], [np.arange(len(lengths))]
        for r, (a, n) in enumerate(zip(begins, lengths, strict=True)):
            w = min(SEARCH_WINDOW, n)
            for window in (X[a : a + w], X[a + n - w : a + n]):
                aligned = np.zeros((self.n_components, current.shape[1]))
                aligned[:, :d] = window.mean(axis=0) - self.means_
                if self.scale:
                    aligned[:, -1] = 1.0
                starts.append(aligned)
                owner.append(np.full(self.n_components, r))
            if self.scale:
                paired = self._paired_starts(X[a : a + w].mean(axis=0),
                                             X[a + n - w : a + n].mean(axis=0))  # fmt: skip
                starts.append(paired)
                owner.append(np.full(len(paired), r))
        starts, owner = np.concatenate(starts), np.concatenate(owner)
        order = np.argsort(owner, kind="stable")  # each run's current terms first
        return starts[order], owner[order]

    def _paired_starts(self, first: np.ndarray, last: np.ndarray) -> np.ndarray:
        """With scale, starts [S, m] that put a run's first and last windows' means (``first``,
        ``last``) on states j < k: a = (last - first)^T (mu_k - mu_j) / |mu_k - mu_j|^2 (least
        squares), b = (first + last) / 2 - a (mu_j + mu_k) / 2, c = 0; pairs giving a <= 0 left
        out. (A run of small scale is otherwise fitted by a drift across a state step.)"""
        d = self.n_features
        j, k = np.triu_indices(self.n_components, k=1)
        step = self.means_[k] - self.means_[j]
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = step @ (last - first) / (step**2).sum(axis=1)
        keep = np.isfinite(scale) & (scale > 0)
        scale, j, k = scale[keep], j[keep], k[keep]
        starts = np.zeros((len(scale), self.n_terms(d)))
        starts[:, :d] = (first + last) / 2 - scale[:, None] * (self.means_[j] + self.means_[k]) / 2
        starts[:, -1] = scale
        return starts

    def _alternate(
        self, X: np.ndarray, lengths: Sequence[int], terms: np.ndarray, n_iter: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``n_iter`` alternations of posteriors and eq. 1 / eq. 2 (theta fixed) from
        ``terms``; the terms and each run's penalised log-likelihood at them."""
        for _ in range(n_iter):
            posteriors = posteriors_and_likelihood(self._log_frames(X, terms, lengths)[0],
                                                   self.startprob_, self.transmat_,
                                                   lengths)[0]  # fmt: skip
            updated = self._update_terms(X, lengths, posteriors, terms, None)
            moved = float(np.abs(updated - terms).max())
            terms = updated
            if moved < OFFSET_TOL:
                break
        return terms, self._penalised(X, lengths, terms)

    def _penalised(self, X: np.ndarray, lengths: Sequence[int], terms: np.ndarray) -> np.ndarray:
        """log p(x_r | theta, b_r, c_r, a_r) - lambda_b/2 |b_r|^2 - lambda_c/2 |c_r|^2 per run."""
        log_frames = self._log_frames(X, terms, lengths)[0]
        value = run_log_likelihoods(log_frames, self.startprob_, self.transmat_, lengths)
        value = value - self._penalties(terms)
        return np.where(np.isfinite(value), value, -np.inf)

    def residuals(self, X: np.ndarray, lengths: Sequence[int] | None = None) -> np.ndarray:
        """x - b_r - c_r u_t (with scale: divided by a_r) with every run's terms estimated
        (:meth:`estimate_run_terms`)."""
        lengths = [len(X)] if lengths is None else [int(n) for n in lengths]
        X = np.asarray(X, dtype=float)
        return self.run_residuals(X, self.estimate_run_terms(X, lengths), lengths)

    def profile_log_likelihoods(
        self, X: np.ndarray, lengths: Sequence[int] | None = None
    ) -> np.ndarray:
        """log p(x_r | theta, b_r, c_r) of every new run [R], its terms estimated with theta fixed
        (the profile likelihood; prior not added; with scale the Jacobian included, eq. 3)."""
        lengths = [len(X)] if lengths is None else [int(n) for n in lengths]
        X = np.asarray(X, dtype=float)
        log_frames = self._log_frames(X, self.estimate_run_terms(X, lengths), lengths)[0]
        return run_log_likelihoods(log_frames, self.startprob_, self.transmat_, lengths)

    def score(self, X: np.ndarray, lengths: Sequence[int] | None = None) -> float:
        """Profile log-likelihood sum_r log p(x_r | theta, b_r, c_r) of new runs."""
        return float(self.profile_log_likelihoods(X, lengths).sum())

    def score_weighted(self, X: np.ndarray, lengths: Any, weights: Any) -> float:
        """:meth:`score` where run i (in ``lengths`` order) counts ``weights[i]`` times."""
        return float(np.asarray(weights, dtype=float) @ self.profile_log_likelihoods(X, lengths))

    def bic(self, X: np.ndarray, lengths: Sequence[int] | None = None) -> float:
        """-2 log L + p log n, p: hmmlearn's count plus the scored runs' terms."""
        lengths = [len(X)] if lengths is None else list(lengths)
        return super().bic(X, lengths) + self.n_run_parameters(len(lengths)) * math.log(len(X))

    def predict(self, X: np.ndarray, lengths: Sequence[int] | None = None) -> np.ndarray:
        """Viterbi states of new runs on their residuals (terms estimated first)."""
        lengths = [len(X)] if lengths is None else [int(n) for n in lengths]
        return super().predict(self.residuals(X, lengths), lengths)

    def predict_runs(self, sequences: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The Viterbi state sequence of each run on its residuals x - b_r - c_r u_t, every run's
        terms estimated with theta fixed in one batch (:meth:`residuals`)."""
        lengths = [len(sequence) for sequence in sequences]
        residual = self.residuals(np.concatenate(sequences), lengths)
        ends = np.cumsum(lengths)
        pieces = [residual[end - n : end] for n, end in zip(lengths, ends, strict=True)]
        return super().predict_runs(pieces)
