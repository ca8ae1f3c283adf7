"""Metrics streamed from the training loop: the 14 weight metrics (appendix B of Hu et al.) of
every convention, computed at each checkpoint from the weights in memory.

The training-maps authors compute their metrics inside the training loop at each evaluation step
(michahu/modeling-training, ``scripts/00_training/computer_vision.py``) and keep only the final
model. trainmap does the same, vectorised over a seed block: :class:`StreamedMetrics` takes the
block's state stacked over its seeds (``[S, *shape]`` per state-dict entry, on the training device)
and returns one row per seed for every variant, i.e. every metric convention
(:data:`trainmap.dynamics.metrics.columns.CONVENTIONS`) and, for a RepVGG, both weight spaces (``train``:
its branches; ``deploy``: the fused form, :func:`trainmap.models.repvgg.deploy_trajectory`). The
computation is :func:`trainmap.dynamics.metrics.weights.trajectory_metrics` itself, with the seeds where a
stored trajectory has its checkpoints, so the numbers equal those computed afterwards from stored
checkpoints (tests/unit/dynamics/metrics/test_streamed_metrics.py: bit for bit on the CPU, 1e-12 required).

A run's streamed table (``checkpoint_metrics.csv``, :data:`STREAMED_COLUMNS`) records with every row
the :func:`definitions_hash` of the metric code that computed it; the ``collect_metrics`` rule takes
its convention's rows from it (:func:`metrics_table`) while the definitions are the current ones,
and otherwise recomputes them from the run's checkpoint archive, or says which runs must retrain.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

import pandas as pd
import torch
from torch import nn

from trainmap.dynamics.metrics import weights as metric_definitions
from trainmap.dynamics.metrics.columns import CONVENTIONS, METRIC_NAMES
from trainmap.dynamics.metrics.weights import (
    PendingMetrics,
    WeightLayout,
    grouped_singular_values,
    layout_of_model,
    metric_frames,
    pending_metrics,
    singular_inputs,
    statistics_rules,
    with_history,
)

STREAMED_FILE = "checkpoint_metrics.csv"
VARIANT_COLUMNS = ["convention", "weights"]
STREAMED_COLUMNS = ["step", *VARIANT_COLUMNS, *METRIC_NAMES, "n_matrices", "skipped_matrices",
                    "definitions"]  # fmt: skip


#: The hashes of definition texts that differ from an earlier text in trainmap's module paths
#: alone, with the earlier text's hash: the same definitions keep their earlier name, so the tables
#: streamed before a move of modules stay current. The move of 2026-12-06 (dynamics/ split by
#: concern: ``trainmap.dynamics.metrics`` became ``trainmap.dynamics.metrics.weights``) changed
#: four lines of the file, three of them docstring references; tests/unit/dynamics/metrics/
#: test_streamed_metrics.py rebuilds the earlier text from the current one to show it. Any other
#: edit gives a hash not listed here and marks every streamed table stale, as it should.
MOVED_DEFINITIONS = {"9afd562c70e1a8ff": "3e954adf0c8166ba"}


def definitions_hash() -> str:
    """The first 16 hex digits of the sha256 of the metric definitions' source
    (``trainmap/dynamics/metrics/weights.py``, the ``collect_metrics`` rule's ``definitions`` input),
    or the earlier name :data:`MOVED_DEFINITIONS` gives it. Every byte counts, its docstrings'
    too: an edit to that file marks every streamed table stale and changes every result
    downstream, so its text (the test paths it names included) changes only with the metrics."""
    source = Path(metric_definitions.__file__).read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:16]
    return MOVED_DEFINITIONS.get(digest, digest)


def weight_spaces(structure: nn.Module, deploy: bool = True) -> list[str]:
    """The weight spaces a run's metrics are streamed in: ``train``, and ``deploy`` for a RepVGG
    when ``deploy``."""
    from trainmap.models.repvgg import RepVGG

    return ["train", "deploy"] if deploy and isinstance(structure, RepVGG) else ["train"]


class StreamedMetrics:
    """The metrics of every variant of one architecture's checkpoints, a seed block at a time.

    ``structure``: a model of the run's architecture (the dense one for a sparse run: its
    checkpoints hold the effective weights under the dense names), used only for its layout.
    ``deploy``: also a RepVGG's deploy form (fusing every checkpoint costs about as much as its
    metrics; a run whose archive keeps every checkpoint leaves it to ``collect_metrics``, which
    fuses the archived checkpoints when ``analysis.repvgg_weights: deploy`` asks for it).
    Conventions that count the same matrices with the same rules (``paper`` and
    ``paper_shortcuts`` of a model without shortcut convs) are computed once.
    """

    def __init__(self, structure: nn.Module, deploy: bool = True) -> None:
        self.structure = structure
        self.spaces = weight_spaces(structure, deploy)
        self.layouts: dict[str, WeightLayout] = {
            convention: layout_of_model(structure, convention) for convention in CONVENTIONS
        }
        self.deploy_layouts: dict[str, WeightLayout] | None = None
        self.definitions = definitions_hash()

    def rows(self, state: Mapping[str, torch.Tensor], step: int) -> list[list[dict]]:
        """One list of rows per seed of ``state`` (``[S, *shape]`` per entry): a row per variant,
        with :data:`STREAMED_COLUMNS`. A convention that counts no matrix of the architecture
        (e.g. ``paper`` on an embedding and its readout) has no rows; ``collect_metrics`` then
        names the problem. Each matrix's float64 copy and singular values are computed once for
        all conventions (same-shape matrices in one batched call on an accelerator), and every
        variant's values reach the host in one copy per checkpoint (one more read where a matrix
        takes the Gram route: which matrices keep it)."""
        size = next(iter(state.values())).shape[0]
        variants: list[tuple[str, str, str]] = []  # (space, convention, computation)
        pending: dict[str, PendingMetrics] = {}
        for space in self.spaces:
            weights, layouts = self._space(state, space)
            # The conventions that count a matrix here (not: an embedding table and its readout).
            counted = [c for c in CONVENTIONS if layouts[c].matrices]
            cache: dict = {}  # each matrix's float64 copy and singular values once for all
            inputs: dict = {}
            for convention in counted:
                inputs |= singular_inputs(weights, layouts[convention],
                                          statistics_rules(convention), cache)  # fmt: skip
            cache |= grouped_singular_values(inputs)
            for convention in counted:
                layout = layouts[convention]
                same = repr((space, statistics_rules(convention), layout.matrices, layout.biases))
                if same not in pending:
                    pending[same] = pending_metrics(weights, layout, convention, cache)
                variants.append((space, convention, same))
        frames = dict(zip(pending, metric_frames(list(pending.values())), strict=True))
        records = {same: frame.to_dict("records") for same, frame in frames.items()}
        per_seed: list[list[dict]] = [[] for _ in range(size)]
        for space, convention, same in variants:
            for index, values in enumerate(records[same]):
                per_seed[index].append({"step": step, "convention": convention,
                                        "weights": space, **values,
                                        "definitions": self.definitions})  # fmt: skip
        return per_seed

    def _space(self, state: Mapping[str, torch.Tensor],
               space: str) -> tuple[Mapping[str, torch.Tensor], dict[str, WeightLayout]]:  # fmt: skip
        if space == "train":
            return state, self.layouts
        from trainmap.models.repvgg import deploy_trajectory

        fused, deploy = deploy_trajectory(state, self.structure)
        if self.deploy_layouts is None:
            self.deploy_layouts = {c: layout_of_model(deploy, c) for c in CONVENTIONS}
        return fused, self.deploy_layouts


def read_streamed(path: str | Path) -> pd.DataFrame:
    """A run's streamed table (pandas reads every float back exactly as written)."""
    return pd.read_csv(path)


def variant_rows(streamed: pd.DataFrame, convention: str, weights: str) -> pd.DataFrame:
    """The rows of one variant, in step order, with :data:`STREAMED_COLUMNS`."""
    chosen = (streamed["convention"] == convention) & (streamed["weights"] == weights)
    return streamed[chosen].sort_values("step", kind="stable").reset_index(drop=True)


def stale_definitions(rows: pd.DataFrame) -> bool:
    """Whether ``rows`` were computed by other metric definitions than the current ones."""
    return bool((rows["definitions"].astype(str) != definitions_hash()).any())


def metrics_table(rows: pd.DataFrame, history: pd.DataFrame) -> pd.DataFrame:
    """A run's metric table (:func:`trainmap.dynamics.metrics.weights.collect_run_metrics`'s format) from
    its streamed rows of one variant and its history."""
    frame = rows[["step", *METRIC_NAMES, "n_matrices", "skipped_matrices"]].copy()
    return with_history(frame, history)
