"""The training map: an HMM's states and the transitions runs actually take (Hu et al., sec. 2.2).

Nodes are the hidden states; an edge j -> k (j != k) exists only where some Viterbi-decoded run
moves from state j to state k (the paper prunes the transition matrix to the transitions that occur).
Each edge carries:

* ``frequency``: the fraction of runs that take it at least once (runs / total runs);
* ``mean_convergence_step``: the mean convergence step of the runs that take it (converged runs);
* ``top_features``: the three features most influential for the belief in the target state k,
  ranked by the posterior-derivative importance |d log p(s_t = k | z_1:t) / d z_t| (appendix A,
  vector form, filtered posteriors), averaged over every occurrence of the transition in every run,
  each labelled with its change mu_k - mu_j in z-units.

:func:`draw_training_map` draws it in the style of the paper's figure 2: states as circles from left
to right by when runs first reach them (states every run visits on the centre line, optional ones
above and below), arrows whose width grows with frequency, and labels with the top features.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from trainmap.dynamics.maps.hmm.estimator import TrainingHMM
from trainmap.figures import save_figure
from trainmap.io import save_json

TOP_FEATURES = 3
X_SPACING, Y_SPACING = 2.0, 1.6


@dataclass
class FeatureChange:
    """One of an edge's most influential features."""

    feature: str
    importance: float
    change: float  # mu_k - mu_j, z-units


@dataclass
class Edge:
    """A transition j -> k taken by at least one decoded run."""

    source: int
    target: int
    runs: int
    frequency: float
    mean_convergence_step: float | None
    occurrences: int
    top_features: list[FeatureChange] = field(default_factory=list)
    runs_by_group: dict[str, int] = field(default_factory=dict)  # a joint map: group -> runs


@dataclass
class TrainingMap:
    """States, the transitions runs take, and when runs first reach each state."""

    n_states: int
    n_runs: int
    edges: list[Edge]
    visited_by: list[int]
    first_visit: list[float | None]  # mean first-visit checkpoint index of the runs visiting
    start_states: dict[int, int]  # state -> runs starting there
    # a joint map: group -> its runs, and per state how many of them visit it
    group_runs: dict[str, int] = field(default_factory=dict)
    visited_by_group: dict[str, list[int]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """JSON-ready."""
        return asdict(self)

    def save(self, path: str | os.PathLike) -> None:
        """Write the map as JSON."""
        save_json(self.to_dict(), path)


def transitions(states: np.ndarray) -> list[tuple[int, int, int]]:
    """``(t, j, k)`` for every time step t where the state changes from j to k."""
    changes = np.flatnonzero(states[1:] != states[:-1]) + 1
    return [(int(t), int(states[t - 1]), int(states[t])) for t in changes]


def build_training_map(
    hmm: TrainingHMM,
    runs: Mapping[str, pd.DataFrame],
    states: Mapping[str, np.ndarray],
    convergence: Mapping[str, int | None],
    groups: Mapping[str, str] | None = None,
) -> TrainingMap:
    """The map of ``hmm`` on the decoded ``runs`` (``states``: Viterbi sequences); with
    ``groups`` (run -> method, a joint map) each state's visitors and each edge's runs are also
    counted per group."""
    n_states, features = hmm.n_states_, list(hmm.features_)
    importance_sum: dict[tuple[int, int], np.ndarray] = {}
    occurrences: dict[tuple[int, int], int] = {}
    takers: dict[tuple[int, int], set[str]] = {}
    for run, sequence in states.items():
        moves = transitions(sequence)
        if not moves:
            continue
        z = hmm.residuals(hmm.transform(runs[run]))  # the run's residuals with run terms
        posteriors = hmm.filtered_posteriors(z, residualised=True)
        pulls_all = hmm.state_pulls(z)
        for t, j, k in moves:
            gradient = pulls_all[t, k] - posteriors[t] @ pulls_all[t]
            importance_sum[(j, k)] = importance_sum.get((j, k), 0) + np.abs(gradient)
            occurrences[(j, k)] = occurrences.get((j, k), 0) + 1
            takers.setdefault((j, k), set()).add(run)
    means = hmm.model_.means_
    edges = []
    for (j, k), total in sorted(importance_sum.items()):
        mean_importance = total / occurrences[(j, k)]
        top = np.argsort(-mean_importance, kind="stable")[:TOP_FEATURES]
        steps = [convergence[r] for r in takers[(j, k)] if convergence.get(r) is not None]
        edges.append(
            Edge(
                source=j,
                target=k,
                runs=len(takers[(j, k)]),
                runs_by_group=_by_group(takers[(j, k)], groups),
                frequency=len(takers[(j, k)]) / len(states),
                mean_convergence_step=float(np.mean(steps)) if steps else None,
                occurrences=occurrences[(j, k)],
                top_features=[
                    FeatureChange(
                        features[i], float(mean_importance[i]), float(means[k, i] - means[j, i])
                    )
                    for i in top
                ],  # fmt: skip
            )
        )
    group_runs = _by_group(states, groups)
    return TrainingMap(
        n_states=n_states,
        n_runs=len(states),
        edges=edges,
        visited_by=[sum(int((s == k).any()) for s in states.values()) for k in range(n_states)],
        first_visit=_first_visits(states, n_states),
        start_states={
            int(k): int(v)
            for k, v in zip(
                *np.unique([s[0] for s in states.values()], return_counts=True), strict=True
            )
        },  # fmt: skip
        group_runs=group_runs,
        visited_by_group={
            group: [
                sum(int((s == k).any()) for run, s in states.items() if groups[run] == group)
                for k in range(n_states)
            ]
            for group in group_runs
        },  # fmt: skip
    )


def _by_group(runs: Iterable[str], groups: Mapping[str, str] | None) -> dict[str, int]:
    """Runs per group, in the groups' order of first appearance in ``groups`` (empty without)."""
    if not groups:
        return {}
    taken = set(runs)
    counts = {group: 0 for group in dict.fromkeys(groups.values())}
    for run, group in groups.items():
        counts[group] += run in taken
    return counts


def _first_visits(states: Mapping[str, np.ndarray], n_states: int) -> list[float | None]:
    visits: list[float | None] = []
    for k in range(n_states):
        firsts = [int(np.argmax(s == k)) for s in states.values() if (s == k).any()]
        visits.append(float(np.mean(firsts)) if firsts else None)
    return visits


# --- drawing -----------------------------------------------------------------------------------


def _layout(training_map: TrainingMap) -> dict[int, tuple[float, float]]:
    """x by order of first visit; states every run visits on y = 0, optional ones off it."""
    visited = [k for k in range(training_map.n_states) if training_map.first_visit[k] is not None]
    order = sorted(visited, key=lambda k: (training_map.first_visit[k], k))
    positions, optional = {}, 0
    for x, k in enumerate(order):
        if training_map.visited_by[k] == training_map.n_runs:
            positions[k] = (X_SPACING * x, 0.0)
        else:  # alternate above and below the main line, further out as they accumulate
            level, sign = optional // 2 + 1, 1 if optional % 2 == 0 else -1
            positions[k] = (X_SPACING * x, sign * Y_SPACING * level)
            optional += 1
    return positions


def _edge_label(edge: Edge, group_runs: Mapping[str, int] | None = None) -> str:
    """An edge's label: the share of runs taking it (per group in a joint map), their mean
    convergence step and its top features."""
    arrows = [
        f"{'↑' if c.change > 0 else '↓'}{c.feature} {c.change:+.1f}" for c in edge.top_features
    ]
    converged = (
        f"conv {edge.mean_convergence_step:.0f}" if edge.mean_convergence_step is not None else ""
    )
    if group_runs:
        shares = [f"{group} {edge.runs_by_group.get(group, 0) / n:.0%}"
                  for group, n in group_runs.items() if n]  # fmt: skip
        return "\n".join([*shares, *([converged] if converged else []), *arrows])
    return f"{edge.frequency:.0%}{', ' + converged if converged else ''}\n" + "\n".join(arrows)


def _state_label(training_map: TrainingMap, k: int) -> str:
    """Who visits state ``k``: runs of all runs, or per group in a joint map."""
    if training_map.group_runs:
        return "\n".join(f"{group} {training_map.visited_by_group[group][k]}/{n}"
                         for group, n in training_map.group_runs.items())  # fmt: skip
    return f"{training_map.visited_by[k]}/{training_map.n_runs} runs"


#: Where along an edge's arc its label may sit (Bezier parameter), the middle first.
LABEL_SPOTS = (0.5, 0.38, 0.62, 0.28, 0.72, 0.2, 0.8)


def _circle_box(axis: Any, x: float, y: float, radius: float) -> Any:
    """A state circle's extent in display coordinates."""
    from matplotlib.transforms import Bbox

    return Bbox([[x - radius, y - radius], [x + radius, y + radius]]).transformed(axis.transData)


def _place_on_arc(label: Any, start: tuple[float, float], end: tuple[float, float], rad: float,
                  taken: list[Any], renderer: Any) -> Any:  # fmt: skip
    """Move ``label`` to the first spot of :data:`LABEL_SPOTS` along matplotlib's arc3 curve
    from ``start`` to ``end`` (just outside it) where it overlaps none of the boxes ``taken``
    (display coordinates: other labels, the state circles); where every spot overlaps, the one
    that overlaps least. Returns the label's box there."""
    (x0, y0), (x1, y1) = start, end
    # arc3's control point: off the chord's midpoint by rad times the chord, to its side
    cx, cy = (x0 + x1) / 2 + rad * (y1 - y0), (y0 + y1) / 2 - rad * (x1 - x0)
    best, best_overlap = None, None
    for t in LABEL_SPOTS:
        bx = (1 - t) ** 2 * x0 + 2 * t * (1 - t) * cx + t**2 * x1
        by = (1 - t) ** 2 * y0 + 2 * t * (1 - t) * cy + t**2 * y1
        outward = t * (1 - t)  # just outside the curve, most at its middle
        label.set_position((bx + outward * rad * (y1 - y0), by - outward * rad * (x1 - x0)))
        box = label.get_window_extent(renderer)
        overlap = sum(max(0.0, min(box.x1, other.x1) - max(box.x0, other.x0))
                      * max(0.0, min(box.y1, other.y1) - max(box.y0, other.y0))
                      for other in taken)  # fmt: skip
        if best_overlap is None or overlap < best_overlap:
            best, best_overlap = (label.get_position(), box), overlap
        if overlap == 0:
            break
    label.set_position(best[0])
    return best[1]


def draw_training_map(
    training_map: TrainingMap,
    png_path: str | os.PathLike,
    svg_path: str | os.PathLike | None = None,
    title: str = "",
    detour_states: list[int] | None = None,
) -> str:
    """Draw the map (paper figure 2 style); returns the figure's caption."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Circle, FancyArrowPatch

    positions = _layout(training_map)
    detours = set(detour_states or [])
    xs = [p[0] for p in positions.values()] or [0.0]
    ys = [p[1] for p in positions.values()] or [0.0]
    limits_x = (min(xs) - 1.6, max(xs) + 1.0)  # room on the left for the start marker
    limits_y = (min(ys) - 1.0, max(ys) + 1.3)
    inches = 1.2  # per data unit; the axes keep an equal aspect, so circles stay round
    figure, axis = plt.subplots(figsize=(inches * (limits_x[1] - limits_x[0]),
                                         inches * (limits_y[1] - limits_y[0]) + 0.4))  # fmt: skip
    axis.set_xlim(*limits_x)
    axis.set_ylim(*limits_y)
    axis.set_aspect("equal")
    axis.apply_aspect()
    renderer = figure.canvas.get_renderer()
    taken = [_circle_box(axis, x, y, 0.3) for x, y in positions.values()]  # labels keep off these
    rad = -0.25  # forward edges (left to right) arc above the line, backward ones below
    for edge in training_map.edges:
        (x0, y0), (x1, y1) = positions[edge.source], positions[edge.target]
        axis.add_patch(FancyArrowPatch(
            (x0, y0), (x1, y1), connectionstyle=f"arc3,rad={rad}", arrowstyle="-|>",
            mutation_scale=14, lw=0.8 + 4 * edge.frequency, color="0.35",
            shrinkA=26, shrinkB=26, zorder=1))  # fmt: skip
        label = axis.text(0, 0, _edge_label(edge, training_map.group_runs), fontsize=8,
                          ha="center", va="center", zorder=3,
                          bbox={"boxstyle": "round", "fc": "white", "ec": "0.8", "alpha": 0.9})  # fmt: skip
        taken.append(_place_on_arc(label, (x0, y0), (x1, y1), rad, taken, renderer))
    for k, (x, y) in positions.items():
        colour = "#e8a33d" if k in detours else "#8fb3d9"
        axis.add_patch(Circle((x, y), 0.28, fc=colour, ec="0.2", lw=1.2, zorder=2))
        axis.text(x, y, str(k), ha="center", va="center", fontsize=13, weight="bold", zorder=4)
        axis.text(x, y - 0.34, _state_label(training_map, k), ha="center", va="top", fontsize=8,
                  zorder=4)  # fmt: skip
    # The start: an arrow into each state runs begin in, with how many begin there.
    for k, count in training_map.start_states.items():
        if k not in positions:
            continue
        x, y = positions[k]
        axis.annotate(f"start\n{count} runs", xy=(x - 0.3, y), xytext=(x - 1.0, y + 0.35),
                      fontsize=8, ha="center", va="center", color="0.25",
                      arrowprops={"arrowstyle": "-|>", "color": "0.25", "lw": 1.2})  # fmt: skip
    axis.axis("off")
    axis.set_title(title or f"training map: {training_map.n_states} states, "
                   f"{training_map.n_runs} runs", fontsize=10)  # fmt: skip
    figure.tight_layout()
    # trainmap.figures writes the same bytes for the same figure (no SVG date, fixed SVG ids).
    save_figure(figure, png_path, "png", dpi=130, close=svg_path is None)
    if svg_path is not None:
        save_figure(figure, svg_path, "svg", dpi=figure.dpi)
    return (
        "Training map: hidden states (circles, with how many runs visit them, per method in a "
        "joint map; orange = a detour the regression keeps) from left to right by when runs first "
        "reach them, 'start' where runs begin, and an arrow wherever a decoded run changes state. "
        "Labels: fraction of runs taking the transition (per method in a joint map), their mean "
        "convergence "
        "step, and the three most influential features for the target state with their change in "
        "standard units."
    )
