"""Selection curves: K's score from its fits, over restarts and splits, and the choice of K.

Hu et al. (sec. 2.1, appendix C) choose K by the held-out BIC, -2 log L + p log n (hmmlearn's
``bic``): each (split, K, restart) fit's row holds its training objective and held-out scores
(:func:`~trainmap.dynamics.maps.hmm.selection.fit_restarts`). K's model is its restart with the best
*training* objective (:func:`best_restart`); K's score is that restart's held-out BIC
(``restart_rule="best"``) or the mean over its restarts (``"mean"``, the authors' script)
(:func:`selection_curve`); with folds, the mean over the folds (:func:`folds_curve`); with the
``reproducible`` rule, the two-fold BIC and the agreement of the two half maps
(:func:`reproducibility_curve`); with the ``gain`` rule, the folds' held-out log-likelihood per
checkpoint and the smallest K no larger K beats by more than a tolerance (:func:`gain_curve`).
:func:`choose_k` reads the curve. Why these rules and their
defaults: docs/decisions/hmm-selection.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from trainmap.dynamics.maps.hmm.splits import SelectionFailed
from trainmap.schema import section_defaults

RESTART_RULES = ("best", "mean")
#: The ``reproducible`` rule's agreement of two half maps (adjusted Rand index of their decodings
#: of every run) and the share of splits that must reach it: the config schema's defaults of
#: ``analysis.reproduce_ari`` and ``analysis.reproduce_share`` (chosen by
#: bench/selection_reproducible.py; docs/decisions/hmm-selection.md).
DEFAULT_REPRODUCE_ARI: float = section_defaults("analysis")["reproduce_ari"]
DEFAULT_REPRODUCE_SHARE: float = section_defaults("analysis")["reproduce_share"]
#: Which reproducing K the ``reproducible`` rule takes: the schema's default of
#: ``analysis.reproduce_k``.
DEFAULT_REPRODUCE_K: str = section_defaults("analysis")["reproduce_k"]
#: Which K the ``reproducible`` rule takes up to K_BIC (setting ``reproduce_k``): ``largest``, the
#: largest K whose half maps reproduce; ``nested``, the largest K such that K and every smaller K
#: reproduce (one less than the first K that fails). Measured by bench/selection_reproducible.py
#: and bench/selection_settle.py (docs/decisions/hmm-selection.md).
REPRODUCE_K = ("largest", "nested")


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
        restarts = [fit for fit in fits if fit["n_states"] == n_states]
        usable = [fit for fit in restarts if fit["model"] is not None]
        bics = np.array([fit["bic"] for fit in usable])
        row = {"n_states": n_states, "train_log_likelihood": math.nan,
               "heldout_log_likelihood": math.nan, "heldout_observations": 0,
               "bic": math.inf, "aic": math.inf,
               "bic_best_restart": math.inf, "bic_mean": float(bics.mean()) if len(bics) else math.inf,
               "bic_sd": float(bics.std()) if len(bics) else math.nan,
               "restarts_ok": len(usable),
               "restarts_converged": sum(f["converged"] for f in restarts),
               "restart": -1}  # fmt: skip
        if usable:
            best = best_restart(usable)
            row |= {key: best[key] for key in ("train_log_likelihood", "heldout_log_likelihood",
                                               "aic", "restart")}  # fmt: skip
            row["heldout_observations"] = int(best.get("heldout_observations", 0))
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
            "heldout_observations": int(folds["heldout_observations"].sum()),
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
    reproduce_k: str = DEFAULT_REPRODUCE_K,
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


def gain_curve(curve: pd.DataFrame, min_gain: float) -> pd.DataFrame:
    """The ``gain`` rule on a :func:`folds_curve` (every run held out once): each K's held-out
    log-likelihood per checkpoint (``ll_per_checkpoint``, nats) and the K it chooses
    (``gain_chosen``): the smallest K that no larger K beats by more than ``min_gain`` per added
    state, (l(K') - l(K)) / (K' - K) <= ``min_gain`` for every scored K' > K. A likelihood
    criterion keeps adding states as runs are added when the model is misspecified (its penalty
    per checkpoint, p log n / n, vanishes); a tolerance per checkpoint does not shrink with n
    (Miller & Dunson 2019's coarsening: a model is not asked to fit the data better than its
    misspecification allows). A K whose folds could not all be scored is never chosen."""
    curve = curve.copy()
    observations = curve["heldout_observations"].to_numpy(dtype=float)
    scored = np.isfinite(curve["bic"].to_numpy(dtype=float)) & (observations > 0)
    per = np.where(scored, curve["heldout_log_likelihood"].to_numpy(dtype=float)
                   / np.maximum(observations, 1), np.nan)  # fmt: skip
    curve["ll_per_checkpoint"] = per
    ks = curve["n_states"].to_numpy(dtype=int)
    chosen = None
    for i in np.flatnonzero(scored):
        later = [j for j in np.flatnonzero(scored) if ks[j] > ks[i]]
        if all((per[j] - per[i]) / (ks[j] - ks[i]) <= min_gain for j in later):
            chosen = int(ks[i])
            break
    curve["gain_chosen"] = ks == chosen if chosen is not None else False
    return curve


def bic_minimum(selection: pd.DataFrame) -> int | None:
    """The K with the lowest criterion ``bic`` (the smaller K on a tie); None when no K scored."""
    finite = selection[np.isfinite(selection["bic"])]
    if finite.empty:
        return None
    return int(finite.sort_values(["bic", "n_states"], kind="stable").iloc[0]["n_states"])


def choose_k(selection: pd.DataFrame, reproduce_k: str = DEFAULT_REPRODUCE_K) -> int:
    """The K with the lowest criterion ``bic`` (the smaller K on a tie); with the ``reproducible``
    rule's curve (a ``reproducible`` column), up to that K: the largest K whose half maps
    reproduce (``reproduce_k="largest"``), or the largest K such that K and every smaller K
    reproduce (``"nested"``: one less than the first K that fails). More states than the held-out
    BIC supports are not selected however well they reproduce; fewer are, when the BIC's extra
    states differ between halves of the runs. With none reproducing (no K could be decoded): the
    BIC's K (``largest``) or the smallest K (``nested``). With the ``gain`` rule's curve (a
    ``gain_chosen`` column, :func:`gain_curve`): the K it marks, whatever the BIC's."""
    best = bic_minimum(selection)
    if best is None:
        raise SelectionFailed("no K could be scored: every restart of every K failed")
    if "gain_chosen" in selection:  # the gain rule (gain_curve)
        chosen = selection.loc[selection["gain_chosen"].astype(bool), "n_states"]
        return int(chosen.iloc[0]) if len(chosen) else best
    if "reproducible" not in selection:
        return best
    below = selection[selection["n_states"] <= best].sort_values("n_states")
    reproduced = below["reproducible"].astype(bool).to_numpy()
    ks = below["n_states"].astype(int).to_numpy()
    if reproduce_k == "nested":
        failed = np.flatnonzero(~reproduced)
        return int(ks[max(failed[0] - 1, 0)] if failed.size else ks[-1])
    return int(ks[reproduced].max()) if reproduced.any() else best
