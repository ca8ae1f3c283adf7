"""The Student-t emission model: a hidden Markov model whose states emit multivariate Student-t
observations, fitted by EM on the engine of the Gaussian model, in lockstep with the other Ks.

Heavy-tailed within-state noise (a metric's spike after a learning-rate change) makes a Gaussian
HMM open states for the tails, and the held-out likelihood rewards them: K grows
(docs/decisions/hmm-selection.md). A t emission absorbs the tails in its scale instead
(Peel & McLachlan, "Robust mixture modelling using the t distribution", Statistics and Computing
10, 2000, sec. 4-5; for hidden Markov models, Bulla, "Hidden Markov models with t components",
Computational Statistics & Data Analysis 55, 2011):

    p(x | s = k) = t_nu(x; mu_k, Sigma_k)
                 = Gamma((nu + d) / 2) / (Gamma(nu / 2) (nu pi)^(d/2) |Sigma_k|^(1/2))
                   * (1 + delta_k(x) / nu)^(-(nu + d) / 2),
    delta_k(x) = (x - mu_k)' Sigma_k^-1 (x - mu_k),

the Gaussian scale mixture x | u ~ N(mu_k, Sigma_k / u), u ~ Gamma(nu / 2, nu / 2). EM with u
latent at a fixed nu: the E-step's posteriors gamma_t(k) (the forward-backward pass over the t
densities) and the latent scales' expectations

    u_t(k) = E[u | x_t, s_t = k] = (nu + d) / (nu + delta_k(x_t)),

the M-step

    mu_k = sum_t gamma_t(k) u_t(k) x_t / sum_t gamma_t(k) u_t(k),
    Sigma_k = sum_t gamma_t(k) u_t(k) (x_t - mu_k)(x_t - mu_k)' / sum_t gamma_t(k),

start and transition probabilities as the Gaussian model's (Peel & McLachlan's ECM at a fixed
nu, their eqs. 20-22 and 30-31). ``expanded=True`` divides the scatter by
sum_t gamma_t(k) u_t(k) instead, the parameter-expanded EM's step (PX-EM: Liu, Rubin & Wu,
"Parameter expansion to accelerate EM", Biometrika 85, 1998; Kent, Tyler & Vardi, Communications
in Statistics - Simulation and Computation 23, 1994, for one t): EM of the model with each
state's u scaled by a free a_k, reduced to a_k = 1, so the likelihood never falls. Both have the
same fixed points (but for hmmlearn's covariance prior, ``covars_prior`` over the denominator on
the diagonal): at either, the trace of Sigma_k^-1 times the scatter equation gives
sum_t gamma_t(k) u_t(k) delta_k(x_t) = d * (its denominator), and with u delta = nu + d - nu u
that holds only where sum_t gamma_t(k) u_t(k) = sum_t gamma_t(k). PX-EM reaches them in fewer iterations
(tests/unit/dynamics/maps/hmm/test_student_t.py); the ECM is the default, the step the published
results were fitted with. The degrees of freedom nu are a setting
(``analysis.degrees_of_freedom``), not estimated: a fixed nu (Lange, Little & Taylor, JASA 84,
1989, who propose nu = 4 when it is not estimated) keeps each EM step in closed form and the models
of all Ks in lockstep; as nu grows the model becomes the Gaussian one.

The engine computes Gaussian log-densities (:func:`~trainmap.dynamics.maps.hmm.gaussian.
log_densities_together`); this model turns them into t densities and the weights u_t(k) in one
pass (:meth:`StudentTHMM.emission_terms`: delta_k(x) is -2 log N(x; mu_k, Sigma_k) - d log 2 pi
- log det Sigma_k) and the engine weighs the posteriors by u_t(k) before its statistics, so
hmmlearn's Gaussian M-step on them is the M-step above with the PX-EM's denominator
(:meth:`StudentTHMM._do_mstep` rescales the covariances to the ECM's, ``stats["post_unweighted"]``,
unless ``expanded``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy.special import gammaln

from trainmap.dynamics.maps.hmm.gaussian import BatchedGaussianHMM, cholesky_factors
from trainmap.dynamics.maps.hmm.run_terms import DEFAULT_COVARIANCE_TYPE
from trainmap.schema import section_defaults

#: The degrees of freedom nu: the config schema's default of ``analysis.degrees_of_freedom``
#: (docs/decisions/hmm-selection.md).
DEFAULT_DEGREES: float = section_defaults("analysis")["degrees_of_freedom"]


class StudentTHMM(BatchedGaussianHMM):
    """A hidden Markov model with multivariate Student-t emissions of ``degrees`` degrees of
    freedom (module docstring), hmmlearn's ``GaussianHMM`` otherwise (its other arguments; the
    covariance types ``"full"`` and ``"diag"``). ``expanded``: the PX-EM M-step, else (default)
    Peel & McLachlan's ECM; the same fixed points. ``means_`` are the t locations and ``covars_``
    the scale matrices Sigma_k (the covariances are Sigma_k nu / (nu - 2) for nu > 2)."""

    fits_in_lockstep = True

    def __init__(
        self, n_components: int = 1, covariance_type: str = DEFAULT_COVARIANCE_TYPE, *,
        degrees: float = DEFAULT_DEGREES, expanded: bool = False,
        **kwargs: Any,
    ) -> None:  # fmt: skip
        if covariance_type not in ("full", "diag"):
            raise ValueError(f"covariance_type: {covariance_type!r}; the Student-t emission takes "
                             "full or diag")  # fmt: skip
        if not (isinstance(degrees, int | float) and math.isfinite(degrees) and degrees > 0):
            raise ValueError(f"degrees_of_freedom: {degrees!r}; the Student-t emission's degrees "
                             "of freedom are a number > 0")  # fmt: skip
        super().__init__(n_components=n_components, covariance_type=covariance_type, **kwargs)
        self.degrees = degrees
        self.expanded = expanded

    def _log_det(self) -> np.ndarray:
        """log det Sigma_k [K] of the covariances the Gaussian log-densities used: for full ones
        the engine's (:func:`~trainmap.dynamics.maps.hmm.gaussian.cholesky_factors`) where it
        succeeds, else hmmlearn's, which adds ``min_covar`` to the diagonal of a state whose
        Cholesky fails."""
        if self.covariance_type == "diag":  # the Cholesky factors' diagonals: sqrt(sigma^2)
            return 2 * np.log(np.sqrt(self._covars_)).sum(axis=1)
        cholesky = cholesky_factors(self._covars_)
        if cholesky is None:
            from scipy import linalg

            eye = np.eye(self._covars_.shape[1])
            factors = []
            for covariance in self._covars_:
                try:
                    factors.append(linalg.cholesky(covariance, lower=True))
                except linalg.LinAlgError:
                    factors.append(linalg.cholesky(covariance + self.min_covar * eye, lower=True))
            cholesky = np.stack(factors)
        return 2 * np.log(np.diagonal(cholesky, axis1=1, axis2=2)).sum(axis=1)

    def emission_terms(self, gaussian: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """From the Gaussian log-densities log N(x_t; mu_k, Sigma_k) [T, K]: the t log-densities
        log t_nu(x_t; mu_k, Sigma_k) [T, K] (module docstring's density) and the latent scales'
        expectations u_t(k) = (nu + d) / (nu + delta_k(x_t)) [T, K] (the E-step's weights of the
        moments), delta_k(x_t) computed once for both."""
        nu, d = float(self.degrees), self.means_.shape[1]
        log_det = self._log_det()
        delta = -2.0 * gaussian
        delta -= d * math.log(2 * math.pi)
        delta -= log_det[None, :]
        np.maximum(delta, 0.0, out=delta)  # >= 0; rounding of the subtraction may dip below
        weights = (nu + d) / (nu + delta)
        constant = (gammaln((nu + d) / 2) - gammaln(nu / 2) - d / 2 * math.log(nu * math.pi)
                    - 0.5 * log_det)  # fmt: skip
        delta /= nu
        densities = np.log1p(delta, out=delta)
        densities *= (nu + d) / 2
        return np.subtract(constant[None, :], densities, out=densities), weights

    def _do_mstep(self, stats: dict) -> None:
        """The M-step of the module docstring: hmmlearn's Gaussian M-step on the u-weighted
        statistics gives mu_k and sum gamma u (x - mu)(x - mu)' / sum gamma u (PX-EM, where
        ``expanded``); for the ECM the covariances are then rescaled to the denominator
        sum_t gamma_t(k) (``stats["post_unweighted"]``)."""
        super()._do_mstep(stats)
        if not self.expanded and "c" in self.params:
            ratio = stats["post"] / np.maximum(stats["post_unweighted"], 1e-300)
            shape = (-1, 1, 1) if self.covariance_type == "full" else (-1, 1)
            self._covars_ = self._covars_ * ratio.reshape(shape)
