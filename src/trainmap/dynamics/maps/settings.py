"""The analysis settings (``params.yaml`` ``analysis:``) as one typed, frozen object,
:class:`AnalysisSettings`, and the :class:`~trainmap.dynamics.maps.hmm.estimator.TrainingHMM` they
configure.

Each setting's type, allowed values and default are declared once, in the config schema
(``workflow/schemas/config.schema.yaml``, section ``analysis``): :data:`ANALYSIS_DEFAULTS` is read
from it, and so are :class:`TrainingHMM`'s keyword defaults and ``python -m trainmap.dynamics``'s
options. ``params.yaml`` repeats every default (DVC sets a key only where it is written), and
tests/unit/test_defaults.py checks that it repeats them exactly.

:meth:`AnalysisSettings.of` builds the object once, at the door (a workflow job from the plain
mapping Snakemake passes, the ``trainmap map`` command from its options): the keys given, the rest
completed from the schema's defaults, an unknown key refused. Every analysis step reads it, or the
view of it that it needs: :attr:`~AnalysisSettings.hmm_settings` (TrainingHMM's keyword arguments),
:attr:`~AnalysisSettings.bootstrap_settings`, :attr:`~AnalysisSettings.stability_settings` and
:attr:`~AnalysisSettings.verdict_settings`. :meth:`~AnalysisSettings.as_dict` is what the jobs
record (MLflow's params, the settings hash): the keys that were given, as they were given, so a
study's records and hashes do not change with the object. Its own module so that every analysis
step (:mod:`~trainmap.dynamics.pipeline`, :mod:`~trainmap.dynamics.verdicts.joint`) reads the same
settings without importing another step.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainmap.dynamics.maps.hmm.estimator import TrainingHMM
from trainmap.schema import READ_ONLY_WITH, schema_name, section_defaults, section_schema

#: The analysis settings and their defaults: the schema's, in its order. ``min_covar``, ``n_jobs``
#: and ``features`` have none there (nor in params.yaml): they take :class:`TrainingHMM`'s;
#: ``joint`` has none either (no joint comparison).
ANALYSIS_DEFAULTS: dict[str, Any] = section_defaults("analysis")
#: The analysis settings :class:`TrainingHMM` takes (its keyword arguments, read from its
#: signature; ``random_state`` is ``seed``).
HMM_SETTINGS: tuple[str, ...] = tuple(
    name for name in TrainingHMM.param_names() if name != "random_state"
)


@dataclass(frozen=True)
class BootstrapSettings:
    """What the bootstrap over runs reads
    (:func:`~trainmap.dynamics.verdicts.certainty.bootstrap_map`'s keywords)."""

    n_resamples: int  # analysis.bootstrap (0: no bootstrap)
    max_iter: int  # analysis.bootstrap_iter: EM iterations of each warm-started refit
    alpha: float  # the refits' detour regressions
    seed: int


@dataclass(frozen=True)
class StabilitySettings:
    """What the stability curve reads
    (:func:`~trainmap.dynamics.verdicts.stability.map_stability`)."""

    subsamples: int  # analysis.stability: subsamples per seed count (0: no curve)
    step: int  # analysis.stability_step
    max_fraction: float  # analysis.stability_max_fraction
    ari: float  # analysis.stability_ari
    share: float  # analysis.stability_share
    restarts: int  # analysis.stability_restarts
    max_iter: int  # analysis.bootstrap_iter
    seed: int
    alpha: float
    permutations: int
    confidence: float


@dataclass(frozen=True)
class VerdictSettings:
    """What a joint comparison's verdicts read
    (:func:`~trainmap.dynamics.verdicts.joint.compare_groups`); the names are the settings'."""

    alpha: float
    confidence: float
    permutations: int
    seed: int
    dissimilarity: str
    trajectory_points: int
    start_window: int | str


@dataclass(frozen=True)
class AnalysisSettings:
    """Every setting of the config's ``analysis`` section (the schema's keys, in its order; a test
    holds the fields to them). Build it with :meth:`of`; the comments say what a ``None`` means
    where the schema gives no default."""

    k_max: int
    restarts: int
    holdout: float
    selection: str
    folds: int
    min_gain: float
    min_gain_scale: str
    halves: int | None
    reproduce_ari: float
    reproduce_share: float
    half_size: int | None
    reproduce_k: str
    seed: int
    group_maps: str
    metrics: str
    repvgg_weights: str
    covariance_type: str
    standardisation: str
    restart_rule: str
    init: str
    emission: str
    degrees_of_freedom: float
    n_iter: int
    tol: float
    tol_scale: str
    checkpoints_per_run: int | None
    first_n: int | None
    nan_runs: str
    min_covar: float | None  # None: not set, TrainingHMM's own
    n_jobs: int | None  # None: not set, TrainingHMM's own (a job sets its threads)
    features: tuple[str, ...] | None  # None: not set, every metric
    baseline_k_max: int
    alpha: float
    dissimilarity: str
    bootstrap: int
    bootstrap_iter: int
    stability: int
    stability_restarts: int
    stability_step: int
    stability_max_fraction: float
    stability_ari: float
    stability_share: float
    permutations: int
    trajectory_points: int
    start_window: int | str
    confidence: float
    joint: tuple[dict[str, Any], ...] | None  # None: not set, no joint comparison

    def __post_init__(self) -> None:
        # The keys that were given, in their order (what as_dict records); built directly, all.
        object.__setattr__(self, "_given", tuple(field.name for field in dataclasses.fields(self)))

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> AnalysisSettings:
        """The settings of the mapping ``settings`` (the config's ``analysis``, validated against
        the schema before any job runs), every key it lacks at the schema's default (``None``
        where the schema has none). A key the schema does not know is refused (ValueError naming
        it). The values are kept as given; ``features`` and ``joint`` become tuples."""
        allowed = section_schema("analysis")["properties"]
        unknown = sorted(set(settings) - set(allowed), key=str)
        if unknown:
            raise ValueError(f"unknown analysis settings {unknown}; allowed: {sorted(allowed)} "
                             f"(schema: {schema_name()})")  # fmt: skip
        values = dict.fromkeys(allowed) | ANALYSIS_DEFAULTS | copy.deepcopy(dict(settings))
        for key in ("features", "joint"):
            if values[key] is not None:
                values[key] = tuple(values[key])
        built = cls(**values)
        object.__setattr__(built, "_given", tuple(settings))
        return built

    def replace(self, **changes: Any) -> AnalysisSettings:
        """These settings with ``changes`` over them (a new object); the changed keys join the
        given ones (:meth:`as_dict`), as ``dict | changes`` orders them."""
        return type(self).of(self.as_dict() | changes)

    def as_dict(self) -> dict[str, Any]:
        """The settings that were given, in their order and as given (``features`` and ``joint``
        as lists): what the jobs record (MLflow's params, the settings hash) and Snakemake passes.
        A key completed from the schema's defaults is not in it, so a record made before the key
        existed reads the same; nor is a key no other setting's value reads
        (:data:`~trainmap.schema.READ_ONLY_WITH`: ``degrees_of_freedom`` without the ``student_t``
        emission)."""
        given = {key: copy.deepcopy(getattr(self, key)) for key in self.__dict__["_given"]
                 if key not in READ_ONLY_WITH
                 or getattr(self, READ_ONLY_WITH[key][0]) in READ_ONLY_WITH[key][1]}  # fmt: skip
        for key in ("features", "joint"):
            if given.get(key) is not None:
                given[key] = list(given[key])
        return given

    @property
    def hmm_settings(self) -> dict[str, Any]:
        """:class:`TrainingHMM`'s keyword arguments: every HMM setting (:data:`HMM_SETTINGS`; one
        the schema gives no default only when set) and ``seed`` as its ``random_state``."""
        kwargs = {key: getattr(self, key) for key in HMM_SETTINGS
                  if key in ANALYSIS_DEFAULTS or getattr(self, key) is not None}  # fmt: skip
        return kwargs | {"random_state": self.seed}

    @property
    def bootstrap_settings(self) -> BootstrapSettings:
        """The bootstrap's view."""
        return BootstrapSettings(n_resamples=self.bootstrap, max_iter=self.bootstrap_iter,
                                 alpha=self.alpha, seed=self.seed)  # fmt: skip

    @property
    def stability_settings(self) -> StabilitySettings:
        """The stability curve's view."""
        return StabilitySettings(
            subsamples=self.stability, step=self.stability_step,
            max_fraction=self.stability_max_fraction, ari=self.stability_ari,
            share=self.stability_share, restarts=self.stability_restarts,
            max_iter=self.bootstrap_iter, seed=self.seed, alpha=self.alpha,
            permutations=self.permutations, confidence=self.confidence,
        )  # fmt: skip

    @property
    def verdict_settings(self) -> VerdictSettings:
        """The verdicts' view."""
        return VerdictSettings(alpha=self.alpha, confidence=self.confidence,
                               permutations=self.permutations, seed=self.seed,
                               dissimilarity=self.dissimilarity,
                               trajectory_points=self.trajectory_points,
                               start_window=self.start_window)  # fmt: skip


def make_hmm(settings: AnalysisSettings) -> TrainingHMM:
    """An unfitted :class:`TrainingHMM` of the analysis settings (``seed`` is the random state)."""
    return TrainingHMM(**settings.hmm_settings)
