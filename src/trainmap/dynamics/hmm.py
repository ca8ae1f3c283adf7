"""A Gaussian HMM over per-checkpoint metrics of many runs (Hu et al., sec. 2.1, appendix C).

:class:`TrainingHMM` follows the paper's recipe, made reproducible:

1. Standardise each feature per run with the mean and standard deviation of its first (up to) 1000
   checkpoints (sec. 2.1: z~_t = (f(w_t) - mu) / sigma). A feature that is constant (or not finite)
   in some run cannot be standardised there; it is dropped from the whole fit with a warning.
2. Hold out 20 % of the runs, chosen by a seeded permutation of the sorted run ids (the authors'
   split depended on file order).
3. For K = 1..K_max fit hmmlearn's ``GaussianHMM`` (Baum-Welch) with R restarts, each seeded from
   ``random_state``, K and the restart index (the authors' restarts were unseeded); keep the restart
   with the best training log-likelihood, score it on the held-out runs and choose the K with the
   lowest held-out BIC (hmmlearn's ``bic``: -2 log L + p log n, p its free-parameter count for the
   covariance type). The selection curve (train and held-out log-likelihood, BIC, AIC per K) is kept.
   The search over K runs in parallel with ``n_jobs`` and gives the same numbers as serially.
4. Decode runs with Viterbi; filtered posteriors p(s_t | z_1:t) come from the forward algorithm
   (:meth:`TrainingHMM.filtered_posteriors`), as appendix A's feature importance needs.

Covariances are diagonal by default (the authors' default; ``covariance_type="full"`` is available).
The fitted model saves as plain arrays (``.npz``) plus JSON, never as a pickle.

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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.special import logsumexp
from scipy.stats import multivariate_normal

from trainmap.dynamics.metrics import METRIC_NAMES
from trainmap.io import save_json, write_atomic

STANDARDISE_WINDOW = 1000
#: A feature whose standard deviation is below this is constant up to float32 rounding.
NUMERICALLY_CONSTANT = 1e-7


def standardise(values: np.ndarray, window: int = STANDARDISE_WINDOW) -> tuple[np.ndarray, ...]:
    """``(z, mean, std)``: z-scores of ``values`` [T, d] with the statistics of its first rows."""
    head = values[:window]
    mean, std = head.mean(axis=0), head.std(axis=0)
    return (values - mean) / std, mean, std


def restart_seed(random_state: int, n_states: int, restart: int) -> int:
    """The seed of one restart: a function of the estimator's seed, K and the restart index."""
    return int(np.random.SeedSequence([random_state, n_states, restart]).generate_state(1)[0])


def _holdout_split(run_ids: Sequence[str], holdout: float, random_state: int) -> tuple[list, list]:
    ordered = sorted(run_ids)
    if len(ordered) < 2:
        raise ValueError(
            f"a training map needs at least 2 runs (one to hold out), got {len(ordered)}"
        )
    n_heldout = min(len(ordered) - 1, max(1, round(holdout * len(ordered))))
    order = np.random.default_rng(random_state).permutation(len(ordered))
    heldout = sorted(ordered[i] for i in order[:n_heldout])
    return [run for run in ordered if run not in heldout], heldout


def _stack(sequences: Sequence[np.ndarray]) -> tuple[np.ndarray, list[int]]:
    return np.concatenate(sequences), [len(sequence) for sequence in sequences]


def _fit_one_k(
    n_states: int,
    train: tuple[np.ndarray, list[int]],
    heldout: tuple[np.ndarray, list[int]],
    settings: dict[str, Any],
) -> dict[str, Any]:
    """The best of R seeded restarts at K = ``n_states``, scored on the held-out runs.

    BLAS runs single-threaded here, so the sums come out bit-identical whether K values are fitted
    one after another or in parallel processes.
    """
    from hmmlearn.hmm import GaussianHMM
    from threadpoolctl import threadpool_limits

    # hmmlearn logs every EM step that lowers the likelihood by rounding; the fits are judged by
    # their final likelihood instead.
    logging.getLogger("hmmlearn").setLevel(logging.ERROR)
    with threadpool_limits(limits=1):
        return _best_restart(GaussianHMM, n_states, train, heldout, settings)


def _best_restart(
    model_class: Any,
    n_states: int,
    train: tuple[np.ndarray, list[int]],
    heldout: tuple[np.ndarray, list[int]],
    settings: dict[str, Any],
) -> dict[str, Any]:
    best, best_ll = None, -math.inf
    for restart in range(settings["restarts"]):
        model = model_class(
            n_components=n_states,
            covariance_type=settings["covariance_type"],
            n_iter=settings["n_iter"],
            tol=settings["tol"],
            min_covar=settings["min_covar"],
            random_state=restart_seed(settings["random_state"], n_states, restart),
        )
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # hmmlearn's per-restart convergence chatter
                model.fit(*train)
            train_ll = model.score(*train)
        except ValueError:  # EM left a state without mass (NaN parameters): a failed restart
            continue
        if np.isfinite(train_ll) and train_ll > best_ll:
            best, best_ll = model, train_ll
    if best is None:  # every restart failed: this K cannot be selected
        return {"n_states": n_states, "model": None, "train_log_likelihood": math.nan,
                "heldout_log_likelihood": math.nan, "bic": math.inf, "aic": math.inf}  # fmt: skip
    return {
        "n_states": n_states,
        "model": best,
        "train_log_likelihood": best_ll,
        "heldout_log_likelihood": best.score(*heldout),
        "bic": best.bic(*heldout),
        "aic": best.aic(*heldout),
    }


class TrainingHMM:
    """A Gaussian HMM over standardised per-checkpoint metrics of many runs (see module docstring).

    ``fit(runs)`` takes a mapping run id -> metrics table (columns named by ``features``); after
    fitting: ``n_states_``, ``features_`` (used), ``dropped_features_``, ``train_runs_``,
    ``heldout_runs_``, ``selection_`` (a DataFrame), ``standardisation_`` (per run mean and std) and
    the hmmlearn model ``model_``.
    """

    def __init__(
        self,
        k_max: int = 8,
        restarts: int = 5,
        holdout: float = 0.2,
        covariance_type: str = "diag",
        n_iter: int = 200,
        tol: float = 1e-2,
        min_covar: float = 1e-3,
        random_state: int = 0,
        n_jobs: int = 1,
        features: Sequence[str] = METRIC_NAMES,
    ) -> None:
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {k_max}")
        if restarts < 1:
            raise ValueError(f"restarts must be >= 1, got {restarts}")
        if not 0 < holdout < 1:
            raise ValueError(f"holdout must be in (0, 1), got {holdout}")
        self.k_max, self.restarts, self.holdout = k_max, restarts, holdout
        self.covariance_type, self.n_iter, self.tol = covariance_type, n_iter, tol
        self.min_covar, self.random_state, self.n_jobs = min_covar, random_state, n_jobs
        self.features = tuple(features)

    # --- fitting -------------------------------------------------------------------------------

    def fit(self, runs: Mapping[str, pd.DataFrame]) -> TrainingHMM:
        """Standardise, split, select K by held-out BIC and keep the chosen model."""
        self.features_, self.dropped_features_ = self._usable_features(runs)
        self.train_runs_, self.heldout_runs_ = _holdout_split(
            list(runs), self.holdout, self.random_state
        )
        self.standardisation_ = {}
        standardised = {run: self._standardise_new(run, table) for run, table in runs.items()}
        train = _stack([standardised[run] for run in self.train_runs_])
        heldout = _stack([standardised[run] for run in self.heldout_runs_])
        settings = self._settings()
        candidates = range(1, self.k_max + 1)
        if self.n_jobs == 1:
            fits = [_fit_one_k(k, train, heldout, settings) for k in candidates]
        else:
            from joblib import Parallel, delayed

            fits = Parallel(n_jobs=self.n_jobs)(
                delayed(_fit_one_k)(k, train, heldout, settings) for k in candidates
            )
        self.selection_ = pd.DataFrame([{k: v for k, v in f.items() if k != "model"} for f in fits])
        usable = [fit for fit in fits if fit["model"] is not None]
        if not usable:
            raise ValueError("every HMM fit failed (EM lost all states); the runs may be too short "
                             "or the features degenerate")  # fmt: skip
        chosen = min(usable, key=lambda fit: (fit["bic"], fit["n_states"]))
        self.n_states_, self.model_ = chosen["n_states"], chosen["model"]
        return self

    def _settings(self) -> dict[str, Any]:
        return {
            "restarts": self.restarts,
            "covariance_type": self.covariance_type,
            "n_iter": self.n_iter,
            "tol": self.tol,
            "min_covar": self.min_covar,
            "random_state": self.random_state,
        }

    def _usable_features(self, runs: Mapping[str, pd.DataFrame]) -> tuple[list[str], list[str]]:
        missing = [f for f in self.features if any(f not in table for table in runs.values())]
        if missing:
            raise ValueError(f"metric tables lack the feature columns {missing}")
        used, dropped = [], []
        for feature in self.features:
            bad = [
                run
                for run, table in runs.items()
                if not self._standardisable(table[feature].to_numpy(dtype=float))
            ]
            if bad:
                dropped.append(feature)
                warnings.warn(
                    f"feature {feature!r} is constant or not finite in run(s) {bad[:3]}"
                    f"{' ...' if len(bad) > 3 else ''}; dropped from the HMM (it cannot be "
                    "standardised per run)",
                    stacklevel=3,
                )
            else:
                used.append(feature)
        if not used:
            raise ValueError(f"no usable feature: all of {list(self.features)} were dropped")
        return used, dropped

    @staticmethod
    def _standardisable(values: np.ndarray) -> bool:
        """Finite, and varying by more than float32 rounding (metrics come from float32 weights:
        e.g. the mean classifier bias under cross-entropy moves only by ~1e-9 of rounding)."""
        head = values[:STANDARDISE_WINDOW]
        return bool(np.isfinite(values).all() and head.std() > NUMERICALLY_CONSTANT)

    def _standardise_new(self, run: str, table: pd.DataFrame) -> np.ndarray:
        z, mean, std = standardise(table[self.features_].to_numpy(dtype=float))
        self.standardisation_[run] = {"mean": mean.tolist(), "std": std.tolist()}
        return z

    # --- using a fitted model ------------------------------------------------------------------

    def transform(self, table: pd.DataFrame) -> np.ndarray:
        """A run's observations z~_1:T, standardised with that run's own first checkpoints."""
        values = table[self.features_].to_numpy(dtype=float)
        z, _, std = standardise(values)
        if not (np.isfinite(z).all() and (std > 0).all()):
            bad = [f for f, s in zip(self.features_, std, strict=True) if not s > 0]
            raise ValueError(f"the run cannot be standardised: constant features {bad}")
        return z

    def predict(self, table: pd.DataFrame) -> np.ndarray:
        """The Viterbi state sequence of one run."""
        return self.model_.predict(self.transform(table))

    def decode(self, runs: Mapping[str, pd.DataFrame]) -> dict[str, np.ndarray]:
        """Viterbi state sequences of many runs."""
        return {run: self.predict(table) for run, table in runs.items()}

    def log_emissions(self, z: np.ndarray) -> np.ndarray:
        """log p(z_t | s_t = k), [T, K]."""
        covars = self.model_.covars_  # full matrices for every covariance type
        return np.column_stack(
            [
                multivariate_normal(self.model_.means_[k], covars[k]).logpdf(z)
                for k in range(self.n_states_)
            ]
        ).reshape(len(z), self.n_states_)

    def filtered_posteriors(self, z: np.ndarray) -> np.ndarray:
        """p(s_t = k | z_1:t) by the forward algorithm, [T, K] (not the smoothed posterior)."""
        log_emission = self.log_emissions(z)
        log_transition = np.log(np.maximum(self.model_.transmat_, 1e-300))
        log_alpha = np.log(np.maximum(self.model_.startprob_, 1e-300)) + log_emission[0]
        filtered = [log_alpha - logsumexp(log_alpha)]
        for t in range(1, len(z)):
            predicted = logsumexp(filtered[-1][:, None] + log_transition, axis=0)
            log_alpha = predicted + log_emission[t]
            filtered.append(log_alpha - logsumexp(log_alpha))
        return np.exp(np.array(filtered))

    def precisions(self) -> np.ndarray:
        """Sigma_k^-1 of every state, [K, d, d]."""
        return np.linalg.inv(self.model_.covars_)

    def feature_importance(self, z: np.ndarray, state: int, t: int) -> np.ndarray:
        """|d log p(s_t = k | z_1:t) / d z_t| (appendix A, the vector form):

        | Sigma_k^-1 (mu_k - z_t) - sum_h p(s_t = h | z_1:t) Sigma_h^-1 (mu_h - z_t) |.
        """
        return np.abs(self.log_posterior_gradient(z, state, t))

    def log_posterior_gradient(self, z: np.ndarray, state: int, t: int) -> np.ndarray:
        """d log p(s_t = k | z_1:t) / d z_t (appendix A, before the absolute value)."""
        posterior = self.filtered_posteriors(z[: t + 1])[t]
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

    def save(self, npz_path: str | os.PathLike, json_path: str | os.PathLike) -> None:
        """Parameters as arrays (npz) and everything else as JSON; no pickle."""
        arrays = {
            "startprob": self.model_.startprob_,
            "transmat": self.model_.transmat_,
            "means": self.model_.means_,
            "covars": _covars_in_own_shape(self.model_),
        }
        write_atomic(npz_path, lambda tmp: _save_npz(tmp, arrays))
        meta = {
            "estimator": {
                "k_max": self.k_max,
                "restarts": self.restarts,
                "holdout": self.holdout,
                "covariance_type": self.covariance_type,
                "n_iter": self.n_iter,
                "tol": self.tol,
                "min_covar": self.min_covar,
                "random_state": self.random_state,
                "features": list(self.features),
            },
            "n_states": self.n_states_,
            "features": self.features_,
            "dropped_features": self.dropped_features_,
            "train_runs": self.train_runs_,
            "heldout_runs": self.heldout_runs_,
            "standardisation": self.standardisation_,
            "selection": self.selection_.to_dict(orient="records"),
        }
        save_json(meta, json_path)

    @classmethod
    def load(cls, npz_path: str | os.PathLike, json_path: str | os.PathLike) -> TrainingHMM:
        """Rebuild a fitted estimator saved by :meth:`save`; predictions are identical."""
        from hmmlearn.hmm import GaussianHMM

        meta = json.loads(Path(json_path).read_text())
        estimator = cls(**meta["estimator"])
        with np.load(npz_path, allow_pickle=False) as arrays:
            model = GaussianHMM(
                n_components=meta["n_states"],
                covariance_type=estimator.covariance_type,
                min_covar=estimator.min_covar,
            )
            model.startprob_ = arrays["startprob"]
            model.transmat_ = arrays["transmat"]
            model.means_ = arrays["means"]
            model.covars_ = arrays["covars"]
            model.n_features = arrays["means"].shape[1]
        estimator.model_, estimator.n_states_ = model, meta["n_states"]
        estimator.features_, estimator.dropped_features_ = (
            meta["features"],
            meta["dropped_features"],
        )
        estimator.train_runs_, estimator.heldout_runs_ = meta["train_runs"], meta["heldout_runs"]
        estimator.standardisation_ = meta["standardisation"]
        estimator.selection_ = pd.DataFrame(meta["selection"])
        return estimator


def _covars_in_own_shape(model: Any) -> np.ndarray:
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


def kmeans_selection(hmm: TrainingHMM, runs: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """k-means with K = 1..K_max on the HMM's standardised training runs, BIC on its held-out runs."""
    from sklearn.cluster import KMeans

    train = np.concatenate([hmm.transform(runs[run]) for run in hmm.train_runs_])
    heldout = np.concatenate([hmm.transform(runs[run]) for run in hmm.heldout_runs_])
    rows = []
    for k in range(1, hmm.k_max + 1):
        kmeans = KMeans(n_clusters=k, n_init=hmm.restarts, random_state=hmm.random_state)
        labels = kmeans.fit_predict(train)
        weights = np.maximum(np.bincount(labels, minlength=k) / len(labels), 1e-12)
        variance = max(kmeans.inertia_ / train.size, 1e-12)
        rows.append({"n_states": k, "bic": kmeans_bic(kmeans.cluster_centers_, heldout, weights,
                                                       variance)})  # fmt: skip
    return pd.DataFrame(rows)


def baseline_table(
    hmm: TrainingHMM, runs: Mapping[str, pd.DataFrame], l2_feature: str = "l2"
) -> tuple[pd.DataFrame, dict[str, pd.DataFrame]]:
    """Appendix C, table 4's form: components and held-out BIC chosen by k-means, HMM-1 and HMM.

    Returns the table and the selection curves of the two baselines.
    """
    curves = {"k-means": kmeans_selection(hmm, runs)}
    hmm1 = TrainingHMM(
        k_max=hmm.k_max,
        restarts=hmm.restarts,
        holdout=hmm.holdout,
        covariance_type=hmm.covariance_type,
        n_iter=hmm.n_iter,
        tol=hmm.tol,
        min_covar=hmm.min_covar,
        random_state=hmm.random_state,
        n_jobs=hmm.n_jobs,
        features=(l2_feature,),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hmm1.fit(runs)
    curves["HMM-1"] = hmm1.selection_[["n_states", "bic"]]
    curves["HMM"] = hmm.selection_[["n_states", "bic"]]
    rows = []
    for name, curve in curves.items():
        best = curve.loc[curve["bic"].idxmin()]
        rows.append({"model": name, "components": int(best["n_states"]), "bic": float(best["bic"])})
    return pd.DataFrame(rows), curves
