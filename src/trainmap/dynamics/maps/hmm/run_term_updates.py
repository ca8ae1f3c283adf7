"""The run terms' conditional maximisations: closed-form updates of eqs. 1-3.

The model (:mod:`~trainmap.dynamics.maps.hmm.run_terms`): run r's observations x_{r,t} =
a_r (mu_{s_t} + eps_{r,t}) + b_r + c_r u_{r,t}, u_{r,t} = t / (T_r - 1), with a Gaussian prior
b_r ~ N(0, tau_b^2 I) on the offsets and c_r ~ N(0, tau_c^2 I) on the drifts (lambda = 1 / tau^2).
With the posteriors gamma_{tk} held fixed and P_k = Sigma_k^-1:

* CM-step 2, offsets (and drifts) given theta (a_r = 1 without scale). The part of Q that depends
  on run r's terms is

      -1/2 sum_t sum_k gamma_{tk} (x_t - mu_k - b_r - c_r u_t)^T P_k (x_t - mu_k - b_r - c_r u_t),

  and setting its gradient (with the penalty's) to zero gives, offset only,

      (sum_k G0_k P_k + lambda_b I) b_r = sum_k P_k (S0_k - G0_k mu_k),                  (eq. 1)

  and with drift the 2d x 2d system

      [ sum_k G0_k P_k + lambda_b I   sum_k G1_k P_k              ] [b_r]   [ h0_r ]
      [ sum_k G1_k P_k                sum_k G2_k P_k + lambda_c I ] [c_r] = [ h1_r ],   (eq. 2)

      hj_r = sum_k P_k (Sj_k - Gj_k mu_k),

  where Gj_k = sum_t gamma_{tk} u_t^j and Sj_k = sum_t gamma_{tk} u_t^j x_t (sums over run r)
  (:func:`run_sums`, :func:`offset_system`). The ridge terms lambda keep an offset from
  "explaining" a run that sits in one state all along: moving such a run to another state's mean
  by its offset costs lambda_b |mu_k - mu_h|^2 / 2. The drifts of a fit's runs are constrained to
  sum_r w_r c_r = 0 with a Lagrange multiplier nu (M_r [b_r; c_r] = h_r - [0; nu]):
  nu = (sum_r w_r W_r^cc)^-1 sum_r w_r c_r^0, [b_r; c_r] = [b_r^0; c_r^0] - W_r[:, c] nu, with
  W_r = M_r^-1 and [b_r^0; c_r^0] the unconstrained solution of eq. 2 (:func:`solve_run_terms`).
* With a per-run scale (eq. 3, x_{r,t} | s_t = k ~ N(a_r mu_k + b_r + c_r u_{r,t},
  a_r^2 Sigma_k)), CM-step 2 is eqs. 1-2 with mu_k -> a_r mu_k and lambda -> lambda a_r^2
  (hj_r = sum_k P_k (Sj_k - a_r Gj_k mu_k)), solved as the gradient of Q itself (the system
  divided by a_r^2: M_r = sum_k Gj_k P_k / a_r^2 + lambda I, h_r / a_r^2), so that W_r = M_r^-1
  of the drift constraint is the inverse Hessian of Q it must be (the multiplier enters Q's
  gradient, not the multiplied one).
* CM-step 3, the scale given (b_r, c_r) and theta. With y'_t = x_t - b_r - c_r u_t,
  A_r = sum_t sum_k gamma_{tk} y'_t^T P_k y'_t and B_r = sum_t sum_k gamma_{tk} y'_t^T P_k mu_k
  (:func:`scale_sums`), run r's part of Q is -T_r d log a - A_r / (2 a^2) + B_r / a + const,
  whose derivative (A_r - B_r a - T_r d a^2) / a^3 is positive below and negative above the one
  positive root, so

      a_r = (-B_r + sqrt(B_r^2 + 4 T_r d A_r)) / (2 T_r d)   (= 2 A_r / (B_r + sqrt(...)))

  is its maximum (A_r > 0; the second form where B_r > 0, without cancellation;
  :func:`solve_scales`).

Run weights (run r counts w_r times) leave eqs. 1-3 per run (w_r multiplies both sides); only the
drift constraint weighs the runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from trainmap.dynamics.maps.hmm.forward_backward import run_starts


def run_time(lengths: Sequence[int]) -> np.ndarray:
    """u_{r,t} = t / (T_r - 1) for every row of the concatenated runs (0 for a run of length 1)."""
    return np.concatenate([np.linspace(0.0, 1.0, n) if n > 1 else np.zeros(1) for n in lengths])


def run_sums(
    X: np.ndarray, posteriors: np.ndarray, lengths: Sequence[int], time: np.ndarray, drift: bool
) -> dict[str, np.ndarray]:
    """Per run r and state k: Gj_k = sum_t gamma_tk u_t^j [R, K] and Sj_k = sum_t gamma_tk
    u_t^j x_t [R, K, d] (j = 0, and j = 1, 2 with drift; module docstring, eqs. 1-2)."""
    starts = run_starts(lengths)

    def per_run(values: np.ndarray) -> np.ndarray:  # the runs are contiguous blocks of rows
        return np.add.reduceat(values, starts, axis=0)

    sums = {"G0": per_run(posteriors), "S0": per_run(posteriors[:, :, None] * X[:, None, :])}
    if drift:
        weighted = posteriors * time[:, None]
        sums["G1"] = per_run(weighted)
        sums["G2"] = per_run(weighted * time[:, None])
        sums["S1"] = per_run(weighted[:, :, None] * X[:, None, :])
    return sums


def offset_system(
    sums: Mapping[str, np.ndarray], means: np.ndarray, precisions: np.ndarray,
    ridge: tuple[float, float], drift: bool, scales: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The normal equations of every run's terms: matrices [R, m, m] and right-hand sides [R, m]
    (m = d, or 2d with drift; eqs. 1 and 2 of the module docstring). ``scales`` a_r [R] (a scale
    per run): the system of eq. 3, mu_k -> a_r mu_k, sums over k divided by a_r^2."""
    d = means.shape[1]
    eye = np.eye(d)
    scales = np.ones(len(sums["G0"])) if scales is None else scales  # a_r = 1: eqs. 1-2 exactly
    inverse_square = 1.0 / scales**2

    def block(g: np.ndarray) -> np.ndarray:  # sum_k g_rk P_k / a_r^2
        return np.einsum("rk,kij->rij", g * inverse_square[:, None], precisions)

    def rhs(g: np.ndarray, s: np.ndarray) -> np.ndarray:  # sum_k P_k (s - g a mu_k) / a^2
        shifted = s - (g * scales[:, None])[:, :, None] * means[None]
        return np.einsum("kij,rkj->ri", precisions, shifted * inverse_square[:, None, None])

    top_left = block(sums["G0"]) + ridge[0] * eye
    top = rhs(sums["G0"], sums["S0"])
    if not drift:
        return top_left, top
    corner = block(sums["G1"])
    bottom_right = block(sums["G2"]) + ridge[1] * eye
    matrix = np.block([[top_left, corner], [corner, bottom_right]])
    return matrix, np.concatenate([top, rhs(sums["G1"], sums["S1"])], axis=1)


def solve_run_terms(
    matrix: np.ndarray, rhs: np.ndarray, drift: bool, centre: bool,
    weights: np.ndarray | None = None,
) -> np.ndarray:  # fmt: skip
    """Every run's terms [R, m] from its normal equations (eqs. 1-2); ``centre`` with drift: under
    the constraint sum_r w_r c_r = 0 (``weights`` w, default 1), by the Lagrange multiplier
    nu = (sum_r w_r W_r^cc)^-1 sum_r w_r c_r^0 of the module docstring."""
    inverse = np.linalg.inv(matrix)
    terms = np.einsum("rij,rj->ri", inverse, rhs)
    if not (drift and centre):
        return terms
    d = matrix.shape[1] // 2
    w = np.ones(len(terms)) if weights is None else weights
    multiplier = np.linalg.solve(np.einsum("r,rij->ij", w, inverse[:, d:, d:]), w @ terms[:, d:])
    return terms - np.einsum("rij,j->ri", inverse[:, :, d:], multiplier)


def scale_sums(
    shifted: np.ndarray, posteriors: np.ndarray, lengths: Sequence[int], means: np.ndarray,
    precisions: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Per run r, with y'_t = x_t - b_r - c_r u_t (``shifted`` [N, d]): A_r = sum_t sum_k
    gamma_tk y'_t^T P_k y'_t and B_r = sum_t sum_k gamma_tk y'_t^T P_k mu_k, [R] each (CM-step 3
    of the module docstring)."""
    starts = run_starts(lengths)
    quadratic = np.empty_like(posteriors)
    linear = np.empty_like(posteriors)
    for k in range(len(means)):
        pulled = shifted @ precisions[k]  # P_k y'_t (P_k symmetric)
        quadratic[:, k] = np.einsum("nd,nd->n", pulled, shifted)
        linear[:, k] = pulled @ means[k]
    A = np.add.reduceat((posteriors * quadratic).sum(axis=1), starts)
    B = np.add.reduceat((posteriors * linear).sum(axis=1), starts)
    return A, B


def solve_scales(A: np.ndarray, B: np.ndarray, lengths: Sequence[int], d: int) -> np.ndarray:
    """a_r maximising -T_r d log a - A_r / (2 a^2) + B_r / a: the positive root of
    T_r d a^2 + B_r a - A_r = 0, (-B + sqrt(B^2 + 4 T_r d A)) / (2 T_r d), written as
    2 A / (B + sqrt(B^2 + 4 T_r d A)) where B > 0 (no cancellation)."""
    n = np.asarray(lengths, dtype=float) * d
    root = np.sqrt(B**2 + 4 * n * A)
    with np.errstate(divide="ignore", invalid="ignore"):
        scales = np.where(B > 0, 2 * A / (B + root), (root - B) / (2 * n))
    return scales
