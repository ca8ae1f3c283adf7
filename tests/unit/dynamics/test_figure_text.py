"""Figures a researcher can read: every figure of a group's analysis and of a joint comparison
is rendered as the jobs render it, and no text (title, axis label, tick label, legend entry,
annotation) leaves the canvas; the stability legend sits beside the data; a joint map counts its
states' and edges' runs per method."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import trainmap.dynamics.maps.training_map as training_map_module
import trainmap.figures as figures
from trainmap.dynamics.pipeline import fit_group, joint_group, map_group, regress_group

from .test_analysis_results import ANALYSIS, read_runs
from .test_cli import write_tables


@pytest.fixture
def cut(monkeypatch) -> dict[str, list[str]]:
    """Figure file name -> its texts that leave the canvas, for every figure saved meanwhile."""
    found: dict[str, list[str]] = {}
    save = figures.save_figure

    def checked(figure, path, *args, **kwargs):
        found[Path(path).name] = figures.text_outside(figure)
        return save(figure, path, *args, **kwargs)

    monkeypatch.setattr(figures, "save_figure", checked)
    monkeypatch.setattr(training_map_module, "save_figure", checked)
    return found


def test_text_outside_finds_a_cut_label() -> None:
    """Positive control: a y label pushed off the canvas is found, the same label inside is not."""
    figure, axis = figures.plt.subplots(figsize=(4, 3))
    axis.set_ylabel("test accuracy")
    figure.tight_layout()
    assert figures.text_outside(figure) == []
    figure.subplots_adjust(left=0.0)
    assert "test accuracy" in figures.text_outside(figure)
    figures.plt.close(figure)


@pytest.mark.slow  # in-process, seconds
def test_no_analysis_figure_cuts_a_word(tmp_path, cut) -> None:
    write_tables(tmp_path / "tables", n_runs=8, seed=3)
    runs, outcomes = read_runs(tmp_path / "tables")
    groups = {run: "gradinit" if int(run[-1]) % 2 else "kaiming" for run in runs}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = fit_group(runs, outcomes, ANALYSIS, tmp_path / "group", title="sparse_parity/mlp")
        regression = regress_group(fit, outcomes, ANALYSIS, regression=fit.regression,
                                   bootstrap=fit.bootstrap, out_dir=tmp_path / "group",
                                   title="sparse_parity/mlp")  # fmt: skip
        group_map = map_group(fit, runs, outcomes, regression.detour_states, tmp_path / "group",
                              title="sparse_parity/mlp")  # fmt: skip
        joint = joint_group(runs, groups, outcomes, ANALYSIS.replace(stability=4),
                            tmp_path / "joint", title="parity_init")  # fmt: skip
    expected = {"selection.png", "states.png", "bootstrap.png", "stability.png", "verdicts.png",
                "coefficients.png", "convergence.png", "map.png", "occupancy.png"}  # fmt: skip
    assert expected <= set(cut), sorted(cut)
    assert {name: words for name, words in cut.items() if words} == {}
    # the joint map counts each state's visitors and each edge's runs per method
    shared = joint.training_map
    assert shared.group_runs == {"kaiming": 4, "gradinit": 4}
    for k in range(shared.n_states):
        assert sum(visits[k] for visits in shared.visited_by_group.values()) == shared.visited_by[k]
    for edge in shared.edges:
        assert sum(edge.runs_by_group.values()) == edge.runs
    assert sum(shared.start_states.values()) == len(runs)
    assert group_map.training_map.group_runs == {} == group_map.training_map.visited_by_group


def test_the_stability_legend_sits_beside_the_data_and_the_verdicts_differ_in_style(
    tmp_path, monkeypatch
) -> None:
    from trainmap.dynamics.plots import plot_stability
    from trainmap.dynamics.verdicts.stability_results import (
        MapStability,
        StabilityCurve,
        StabilityPoint,
        StabilityTargets,
    )

    verdicts = [f"gradinit vs kaiming, occupancy of state {k}: gradinit lower" for k in range(3)]
    points = [StabilityPoint(n=n, n_states=6, ks=[6] * 10, ari=[0.5 + n / 100] * 10,
                             detour_found={2: 0.1}, verdict_held=dict.fromkeys(verdicts, 0.2))
              for n in (8, 16, 24, 32)]  # fmt: skip
    curve = StabilityCurve(points=points, targets=StabilityTargets(), full_n=40, n_states=6,
                           detour_states=[2], groups=["kaiming", "gradinit"], verdicts=verdicts)  # fmt: skip
    shown = {}
    save = figures.save_figure

    def keep(figure, path, *args, **kwargs):
        axis = figure.axes[0]
        legend = axis.get_legend()
        figure.canvas.draw()
        renderer = figure.canvas.get_renderer()
        shown.update(
            outside=figures.text_outside(figure),
            beside=legend.get_window_extent(renderer).x0 >= axis.get_window_extent(renderer).x1,
            styles={(line.get_color(), line.get_linestyle(), line.get_marker())
                    for line in axis.get_lines() if line.get_label().startswith("holds again")},
        )  # fmt: skip
        return save(figure, path, *args, **kwargs)

    monkeypatch.setattr(figures, "save_figure", keep)
    plot_stability(MapStability(curve), tmp_path / "stability.png", "parity_init")
    assert shown["outside"] == [] and shown["beside"]
    assert len(shown["styles"]) == 3 and len({style for _, style, _ in shown["styles"]}) == 3


def test_edge_labels_keep_off_each_other_and_the_states(monkeypatch, tmp_path) -> None:
    """A map whose edges' middles crowd one place (every forward edge of 5 states, two of them
    off the main line, and two backward edges; drawn at the arcs' middles, two labels overlap):
    each label finds a spot along its arc where it overlaps no other label and no state circle."""
    from trainmap.dynamics.maps import training_map as module
    from trainmap.dynamics.maps.training_map import Edge, FeatureChange, TrainingMap

    figures = []
    monkeypatch.setattr(module, "save_figure", lambda figure, *a, **k: figures.append(figure))
    features = [FeatureChange("l2", 1.0, 0.5), FeatureChange("w_var", 0.5, -0.3),
                FeatureChange("l1_l2", 0.2, 0.1)]  # fmt: skip
    pairs = [(a, b) for a in range(5) for b in range(a + 1, 5)] + [(3, 2), (4, 1)]
    edges = [Edge(a, b, 5, 0.5, 1000.0, 6, features) for a, b in pairs]
    # states 1 and 3 visited by some runs only: drawn off the line, their edges cross the others
    drawn = TrainingMap(5, 10, edges, [10, 6, 10, 4, 10], [0.0, 1.0, 2.0, 3.0, 4.0], {0: 10})
    module.draw_training_map(drawn, tmp_path / "map.png")
    (figure,) = figures
    renderer = figure.canvas.get_renderer()
    figure.draw(renderer)
    axis = figure.axes[0]
    labels = [t.get_window_extent(renderer) for t in axis.texts if t.get_bbox_patch()]
    circles = [patch.get_window_extent(renderer) for patch in axis.patches
               if type(patch).__name__ == "Circle"]  # fmt: skip
    assert len(labels) == len(pairs) and len(circles) == 5

    def overlap(a, b) -> float:
        return max(0.0, min(a.x1, b.x1) - max(a.x0, b.x0)) * max(
            0.0, min(a.y1, b.y1) - max(a.y0, b.y0)
        )

    crowded = [(i, j) for i in range(len(labels)) for j in range(i + 1, len(labels))
               if overlap(labels[i], labels[j]) > 1.0]  # fmt: skip
    assert not crowded, [(pairs[i], pairs[j]) for i, j in crowded]
    assert not [i for i, box in enumerate(labels) if any(overlap(box, c) > 1.0 for c in circles)]
    import matplotlib.pyplot as plt

    plt.close(figure)


def test_the_bootstrap_figure_shows_each_states_jaccard_when_refits_keep_k(tmp_path, monkeypatch):
    """Refits at the full map's K: one box of Jaccard values per state (a state that dissolved
    in most resamples sits below the 0.5 line) and its mean beside the detours; a result whose
    refits reselected K keeps the histogram of K. No word leaves the canvas in either."""
    from trainmap.dynamics.plots import plot_bootstrap
    from trainmap.dynamics.verdicts.certainty import BootstrapResult

    jaccards = [[0.95, 0.9, 0.3], [0.9, 0.85, 0.4], [0.97, 0.8, 0.2], [0.92, 0.9, 0.9]]
    kept = BootstrapResult(n_resamples=4, n_states=3, k_counts={3: 4}, state_found=[1, 1, 1],
                           detour_states=[2], detour_found={2: 0.25}, seconds=1.0,
                           state_jaccard=[0.935, 0.8625, 0.45], jaccards=jaccards,
                           reselect_k=False)  # fmt: skip
    drawn = {}
    save = figures.save_figure

    def keep(figure, path, *args, **kwargs):
        left, right = figure.axes
        drawn[Path(path).name] = {
            "outside": figures.text_outside(figure),
            "left": left.get_xlabel(), "right": [b.get_height() for b in right.patches[:3]],
        }  # fmt: skip
        return save(figure, path, *args, **kwargs)

    monkeypatch.setattr(figures, "save_figure", keep)
    caption = plot_bootstrap(kept, tmp_path / "kept.png", "parity_init")
    assert "Jaccard" in caption and "Hennig 2007" in caption
    assert drawn["kept.png"]["left"] == "state of the full map"
    assert drawn["kept.png"]["right"] == pytest.approx([0.935, 0.8625, 0.45])
    reselected = BootstrapResult(n_resamples=4, n_states=3, k_counts={3: 3, 2: 1},
                                 state_found=[1.0, 0.75, 0.5], detour_states=[],
                                 detour_found={}, seconds=1.0, reselect_k=True)  # fmt: skip
    assert "K reselected" in plot_bootstrap(reselected, tmp_path / "old.png")
    assert drawn["old.png"]["left"] == "K selected in a resample"
    assert drawn["old.png"]["right"] == [1.0, 0.75, 0.5]
    assert drawn["kept.png"]["outside"] == [] == drawn["old.png"]["outside"]
