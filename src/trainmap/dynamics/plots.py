"""Figures of the training-map analysis; each function writes a PNG atomically and returns its caption."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from trainmap.figures import save_png  # noqa: E402


def _save(figure: plt.Figure, path: str | os.PathLike) -> None:
    figure.tight_layout()
    save_png(figure, path, dpi=120)


def plot_selection(
    curves: Mapping[str, pd.DataFrame], chosen: int, path: str | os.PathLike, title: str = "",
    at_ceiling: bool = False,
) -> str:  # fmt: skip
    """BIC against K for the HMM and the baselines (one panel each: BICs are not comparable).

    The HMM panel shades the spread of the BIC over restarts; ``at_ceiling`` marks a selection
    whose BIC was still falling at K_max.
    """
    figure, axes = plt.subplots(1, len(curves), figsize=(3.6 * len(curves), 3.2), squeeze=False)
    for axis, (name, curve) in zip(axes[0], curves.items(), strict=True):
        finite = curve[np.isfinite(curve["bic"])]
        axis.plot(finite["n_states"], finite["bic"], "o-", label="BIC (held out)")
        if "bic_mean" in finite and "bic_sd" in finite:
            axis.fill_between(finite["n_states"], finite["bic_mean"] - finite["bic_sd"],
                              finite["bic_mean"] + finite["bic_sd"], alpha=0.2,
                              label="restarts: mean ± SD")  # fmt: skip
        if "aic" in finite:
            axis.plot(finite["n_states"], finite["aic"], "s--", alpha=0.6, label="AIC (held out)")
        best = finite.loc[finite["bic"].idxmin()]
        axis.axvline(best["n_states"], color="C3", lw=0.8, ls=":")
        label = f"{name}: K = {int(best['n_states'])}"
        if int(best["n_states"]) == int(finite["n_states"].max()):
            label += " (ceiling)"
        axis.set(title=label, xlabel="hidden states K", ylabel="criterion")
        axis.legend(fontsize=7)
    heading = title or "model selection"
    heading += f" (HMM: K = {chosen})"
    if at_ceiling:
        heading += ": BIC still falling at K_max, raise analysis.k_max"
    figure.suptitle(heading, fontsize=10, color="C3" if at_ceiling else "black")
    _save(figure, path)
    return (
        "Held-out BIC (and AIC) against the number of hidden states for the HMM and the appendix C "
        "baselines; the dotted line marks each model's minimum, the chosen K, and the band the "
        "spread of the BIC over restarts. A panel marked '(ceiling)' chose its largest K: its BIC "
        "was still falling, so K is a lower bound, not an estimate."
    )


def plot_bootstrap(bootstrap: Any, path: str | os.PathLike, title: str = "") -> str:
    """Bootstrap over runs. Refits at the full map's K (the default): each state's Jaccard
    agreement over the resamples (Hennig 2007; >= 0.75 reproduces, < 0.5 dissolved), and how
    often each detour is found again. Refits that reselected K (older results, or
    ``reselect_k``): the distribution of the selected K beside the states found again."""
    from trainmap.dynamics.verdicts.stability_results import (
        DISSOLVED_JACCARD,
        STATE_JACCARD,
        reports_states,
    )

    figure, (left, right) = plt.subplots(1, 2, figsize=(8.5, 3.2))
    states = np.arange(bootstrap.n_states)
    per_state = reports_states(bootstrap.reselect_k, bootstrap.jaccards)
    if per_state:
        values = np.asarray(bootstrap.jaccards, dtype=float)
        left.boxplot([values[:, state] for state in states], positions=states, widths=0.5)
        left.axhline(STATE_JACCARD, color="C2", lw=1, ls="--",
                     label=f"reproduces (>= {STATE_JACCARD:g})")  # fmt: skip
        left.axhline(DISSOLVED_JACCARD, color="C3", lw=1, ls=":",
                     label=f"dissolved (< {DISSOLVED_JACCARD:g})")  # fmt: skip
        left.set(xlabel="state of the full map", ylabel="Jaccard with the matched refit state",
                 ylim=(-0.02, 1.05), title=f"each state over {bootstrap.n_resamples} resamples "
                 f"(K = {bootstrap.n_states} kept)")  # fmt: skip
        left.set_xticks(states)
        left.legend(fontsize=7, loc="lower left")
    elif bootstrap.k_counts:
        ks = sorted(bootstrap.k_counts)
        counts = [bootstrap.k_counts[k] / bootstrap.n_resamples for k in ks]
        colours = ["C3" if k == bootstrap.n_states else "0.6" for k in ks]
        left.bar(ks, counts, color=colours)
        left.set(xlabel="K selected in a resample", ylabel="fraction of resamples",
                 title=f"K over {bootstrap.n_resamples} resamples (full data: K = "
                 f"{bootstrap.n_states})")  # fmt: skip
    found = bootstrap.state_jaccard if per_state else bootstrap.state_found
    right.bar(states - 0.2, found, width=0.4, color="#8fb3d9",
              label="mean Jaccard" if per_state else "state found again")  # fmt: skip
    detours = [bootstrap.detour_found.get(int(k), np.nan) for k in states]
    right.bar(states + 0.2, detours, width=0.4, color="#e8a33d", label="detour found again")
    if per_state:
        right.axhline(STATE_JACCARD, color="C2", lw=1, ls="--")
    right.set(xlabel="state of the full map", ylabel="mean Jaccard / share of resamples",
              ylim=(0, 1.05), title="states and detours found again")  # fmt: skip
    right.set_xticks(states)
    right.legend(fontsize=7)
    figure.suptitle(title or "bootstrap over runs", fontsize=10)
    _save(figure, path)
    if per_state:
        return (
            "Bootstrap over runs (seeds resampled within each method, the map refitted at the full "
            "map's K and matched to it state by state): left, each state's Jaccard agreement with "
            "its matched refit state over the resamples (box: quartiles; green dashed, 0.75: the "
            "state reproduces; red dotted, 0.5: below it the state dissolved, Hennig 2007); right, "
            "each state's mean Jaccard and, for detour states, how often it is again a significant "
            "detour. A split or merge of one state lowers that state only."
        )
    return (
        "Bootstrap over runs (seeds resampled, the map refitted, K reselected): left, how often "
        "each K is selected (red: the full data's K); right, for each state of the full map, how "
        "often a state with nearly the same emission mean is found again, and for detour states how "
        "often it is again a significant detour. Low fractions mean another draw of seeds could "
        "tell a different story."
    )


#: Colour, line style and marker of the stability figure's verdict lines, in order: told apart
#: by style as well as by colour.
VERDICT_STYLES = (("C2", "-", "v"), ("C4", "--", "P"), ("C5", "-.", "X"), ("C6", ":", "*"),
                  ("C8", "-", "h"), ("C9", "--", "p"))  # fmt: skip


def plot_stability(stability: Any, path: str | os.PathLike, title: str = "") -> str:
    """The stability curve: per seed count n, the share of subsamples whose map agrees with the
    full map (ARI at the target), the mean ARI, how often K is the full map's and each detour is
    found again, with the target share."""
    figure, axis = plt.subplots(figsize=(9, 3.6))
    curve = stability.curve
    if curve is None or not curve.points:
        axis.axis("off")
        axis.text(0.5, 0.5, textwrap.fill(stability.line, 90), ha="center", va="center",
                  fontsize=9)  # fmt: skip
    else:
        ns = [point.n for point in curve.points]
        axis.plot(ns, [p.ari_share for p in curve.points], "o-", color="C0", lw=2,
                  label=f"share with ARI >= {curve.targets.ari:g}")  # fmt: skip
        axis.plot(ns, [p.ari_mean for p in curve.points], "s--", color="C0", alpha=0.6,
                  label="mean ARI")  # fmt: skip
        if all(point.per_state for point in curve.points):
            axis.plot(ns, [min(p.state_jaccard, default=np.nan) for p in curve.points], "^:",
                      color="0.4", label="lowest state's mean Jaccard")  # fmt: skip
            axis.axhline(curve.targets.jaccard, color="0.4", lw=1, ls=":",
                         label=f"Jaccard target {curve.targets.jaccard:g}")  # fmt: skip
        else:
            axis.plot(ns, [p.k_same for p in curve.points], "^:", color="0.4",
                      label=f"share with K = {curve.n_states}")  # fmt: skip
        for detour in curve.detour_states:
            axis.plot(ns, [p.detour_found.get(detour, np.nan) for p in curve.points], "d-",
                      color="#e8a33d", label=f"detour {detour} found again")  # fmt: skip
        for index, verdict in enumerate(curve.verdicts):
            colour, style, marker = VERDICT_STYLES[index % len(VERDICT_STYLES)]
            axis.plot(ns, [p.verdict_held.get(verdict, np.nan) for p in curve.points],
                      linestyle=style, marker=marker, color=colour,
                      label=textwrap.fill(f"holds again: {verdict}", 42))  # fmt: skip
        axis.axhline(curve.targets.share, color="C3", lw=1, ls="--",
                     label=f"target share {curve.targets.share:.0%}")  # fmt: skip
        if curve.sufficient_n is not None:
            axis.axvline(curve.sufficient_n, color="C2", lw=1, label="stable from here")
        axis.set(xlabel="seeds" + (" per method" if curve.groups else "") + " in a subsample",
                 ylabel="share of subsamples / ARI / Jaccard", ylim=(-0.02, 1.05),
                 xticks=ns)  # fmt: skip
        axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0)
    figure.suptitle(title or "stability over seed counts", fontsize=10)
    _save(figure, path)
    return (
        "Stability curve: subsamples of n seeds (per method) refitted as the full map was; solid "
        "blue, the share whose decoding of all runs agrees with the full map's (adjusted Rand "
        "index at the target); dashed, the mean ARI; grey, the lowest mean Jaccard of a state of the "
        "full map with its matched refit state (its target dotted; refits that reselect K: the "
        "share selecting the same K); orange, "
        "each detour found again; one line per verdict of the comparison (each its own colour, "
        "style and marker): the share of subsamples in which it holds again (same direction, "
        "significant after Holm). Red dashed: the target share; green: the n from which the map "
        f"is stable. The legend sits beside the data. {stability.line}."
    )


def plot_verdicts(
    verdicts: pd.DataFrame, confidence: float, path: str | os.PathLike, title: str = "", *,
    alpha: float,
) -> str:  # fmt: skip
    """A labelled verdict table (:func:`trainmap.dynamics.verdicts.labels.label_verdicts`) in three
    panels: the Holm p-values of every verdict that is not about one state (every statistic on
    one scale; its family in brackets), the step effects (convergence step, first passage) and the
    state-level effects (each state's occupancy, the time in detours) with their intervals;
    coloured by verdict: green marks findings only, orange a significant difference that is not
    one."""
    from trainmap.dynamics.verdicts.compare import (
        NO_EVIDENCE,
        NOT_ENOUGH_RUNS,
        OCCUPANCY,
        TIME_IN_DETOURS,
    )
    from trainmap.dynamics.verdicts.compare import family as family_of
    from trainmap.dynamics.verdicts.paths import FIRST_PASSAGE

    rows = verdicts.reset_index(drop=True)
    families = rows["family"] if "family" in rows else rows["quantity"].map(family_of)
    rows = rows.assign(family=families)
    in_steps = rows["quantity"].isin(["convergence step", FIRST_PASSAGE])
    one_state = rows["quantity"].str.startswith(OCCUPANCY) | (rows["quantity"] == TIME_IN_DETOURS)
    panels = [("p", rows[~one_state]), ("steps", rows[in_steps]),
              ("occupancy", rows[one_state])]  # fmt: skip
    panels = [(kind, part) for kind, part in panels if len(part)]
    # one panel under another, each row tall enough for its two- or three-line label
    sizes = [len(part) for _, part in panels]
    figure, axes = plt.subplots(len(panels), 1, figsize=(10, 1.0 + 0.5 * sum(sizes) + 0.6 * len(sizes)),
                                squeeze=False, gridspec_kw={"height_ratios": sizes})  # fmt: skip

    def colour(row: Any) -> str:
        return ("0.6" if row.verdict == NOT_ENOUGH_RUNS else "C2" if getattr(row, "finding", False)
                else "C0" if row.verdict == NO_EVIDENCE else "C1")  # fmt: skip

    for axis, (kind, part) in zip(axes[:, 0], panels, strict=True):
        for position, row in enumerate(part.itertuples()):
            if kind == "p":
                value = row.p_holm if np.isfinite(row.p_holm) else 1.0
                axis.barh(position, -np.log10(max(value, 1e-12)), color=colour(row))
            else:
                axis.plot([row.low, row.high], [position] * 2, color=colour(row), lw=2)
                axis.plot([row.effect], [position], "o", color=colour(row))
        if kind == "p":
            axis.axvline(-np.log10(alpha), color="C3", ls="--", lw=0.8)
            axis.set_xlabel(f"-log10 p (Holm); dashed: alpha {alpha:g}")
        else:
            axis.axvline(0, color="0.3", lw=0.8)
            axis.set_xlabel("difference of restricted mean steps" if kind == "steps"
                            else "occupancy difference")  # fmt: skip
        axis.set_yticks(range(len(part)), [f"{r.second} vs {r.first}: {r.quantity} [{r.family}]\n"
                                           + textwrap.fill(str(getattr(r, "label", r.verdict)), 70)
                                           for r in part.itertuples()], fontsize=7)  # fmt: skip
        axis.invert_yaxis()
    figure.suptitle(title or "verdicts", fontsize=10)
    _save(figure, path)
    return (
        "Verdicts per method pair. Top: every verdict that is not about one state (its family "
        "in brackets: start, the intervention's direct effect; primary, the path; secondary, "
        "where in this map) as -log10 of the Holm-corrected p-value (Holm within each family); "
        f"right of the dashed line is significant at alpha {alpha:g}. "
        "Then the step effects (convergence step, first passage to the final state: the "
        "difference of restricted mean steps of the Kaplan-Meier curves, second method minus "
        f"first, {confidence:.0%} bootstrap interval) and the state-level verdicts (occupancy "
        "differences with their intervals: where in this map a difference lies). Green: a "
        "finding (significant after Holm's correction and holding again on subsamples of the "
        "seeds), orange: significant but not a finding (its label says why), blue: no evidence "
        "of a difference, grey: not enough runs to tell."
    )


def plot_path_difference(
    bands: Mapping[tuple[str, str], Any], path: str | os.PathLike, title: str = ""
) -> str:
    """Where the methods' metrics differ: per method pair a heat map of the standardised mean
    difference (second minus first, over that step's pooled within-method SD) of each metric
    (rows) at each shared checkpoint (columns), the cells whose max-T adjusted p is below alpha
    dotted, and under it the checkpoints at which any metric differs
    (:class:`trainmap.dynamics.verdicts.timecourse.TimeResolved`)."""
    pairs = list(bands.items())
    if not pairs:
        figure, axis = plt.subplots(figsize=(4, 1))
        axis.text(0.5, 0.5, "no pair of methods with 2 runs each", ha="center", va="center")
        axis.axis("off")
        _save(figure, path)
        return "No pair of methods has two runs each to compare."
    limit = max(float(np.nanmax(np.abs(band.effect.to_numpy()))) for _, band in pairs) or 1.0
    limit = min(limit, 5.0)  # a start difference of 20 SDs would wash out every later one
    rows = max(len(band.effect) for _, band in pairs)
    figure, axes = plt.subplots(len(pairs), 1, figsize=(9, 1.0 + (0.22 * rows + 0.9) * len(pairs)),
                                squeeze=False)  # fmt: skip
    for axis, ((first, second), band) in zip(axes[:, 0], pairs, strict=True):
        table, hit = band.effect, band.p.to_numpy() < band.alpha
        image = axis.imshow(table.to_numpy(), aspect="auto", cmap="RdBu_r", vmin=-limit,
                            vmax=limit, interpolation="nearest")  # fmt: skip
        marked = np.argwhere(hit)
        if len(marked):
            axis.scatter(marked[:, 1], marked[:, 0], s=3, c="black", marker=".", linewidths=0)
        steps = hit.any(axis=0)
        axis.scatter(np.flatnonzero(steps), np.full(int(steps.sum()), len(table) - 0.3), s=6,
                     c="black", marker="|", clip_on=False)  # fmt: skip
        axis.set_yticks(range(len(table)), list(table.index), fontsize=7)
        ticks = np.linspace(0, table.shape[1] - 1, min(table.shape[1], 6)).round().astype(int)
        axis.set_xticks(ticks, [f"{table.columns[t]:.0f}" for t in ticks], fontsize=7)
        axis.set_title(f"{second} vs {first}: {band.sentence()}", fontsize=7, wrap=True)
        figure.colorbar(image, ax=axis, label="standardised difference", shrink=0.8)
    axes[-1, 0].set_xlabel("step (shared checkpoints)")
    figure.suptitle(title or "where the metrics differ", fontsize=10)
    _save(figure, path)
    return (
        "Where in training and in which metrics the methods' runs differ: per method pair, the "
        "difference of the two methods' means (second minus first) of each metric at each "
        "checkpoint every run saved, over that step's pooled within-method standard deviation "
        "(red: higher in the second method; colours capped at 5). Dotted cells differ after "
        "max-T correction over all checkpoints x metrics (family-wise alpha; relabelling runs); "
        "the ticks under each map mark the checkpoints at which any metric differs. Levels count "
        "here: a different start shows as a difference at the first steps."
    )


def plot_state_sequences(
    states: Mapping[str, np.ndarray],
    steps: Mapping[str, np.ndarray],
    convergence: Mapping[str, int | None],
    n_states: int,
    path: str | os.PathLike,
    title: str = "",
) -> str:
    """One row per run (sorted by convergence step), coloured by Viterbi state, against step."""
    order = sorted(states, key=lambda r: (convergence.get(r) is None, convergence.get(r) or 0, r))
    colours = plt.get_cmap("tab10" if n_states <= 10 else "tab20")
    figure, axis = plt.subplots(figsize=(9, 0.9 + 0.28 * len(order)))
    for row, run in enumerate(order):
        run_steps, run_states = np.asarray(steps[run]), np.asarray(states[run])
        edges = np.append(
            run_steps, run_steps[-1] + (run_steps[-1] - run_steps[-2] if len(run_steps) > 1 else 1)
        )
        for start, stop, state in zip(edges[:-1], edges[1:], run_states, strict=True):
            axis.barh(row, stop - start, left=start, height=0.8, color=colours(state), lw=0)
        if convergence.get(run) is not None:
            axis.plot([convergence[run]] * 2, [row - 0.45, row + 0.45], color="black", lw=1.5)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours(k)) for k in range(n_states)]
    axis.legend(handles, [f"state {k}" for k in range(n_states)], fontsize=7, ncol=min(n_states, 8),
                loc="upper center", bbox_to_anchor=(0.5, -0.15 if len(order) > 4 else -0.3))  # fmt: skip
    axis.set_yticks(range(len(order)), order, fontsize=6)
    axis.set(xlabel="step", title=title or "Viterbi state sequences (tick: convergence step)")
    _save(figure, path)
    return "Viterbi states of every run against step; black ticks mark convergence steps."


def plot_coefficients(
    table: pd.DataFrame, path: str | os.PathLike, title: str = "", note: str | None = None
) -> str:
    """Regression coefficients per state with 95 % intervals; detour states highlighted. ``note``
    (why no regression was fitted) replaces the bars when there is no fit."""
    rows = table.dropna(subset=["coefficient"])
    figure, axis = plt.subplots(figsize=(max(4.0, 0.7 * len(rows) + 2), 3.2))
    if note:
        axis.text(0.5, 0.5, "no regression fitted:\n" + note, ha="center", va="center",
                  wrap=True, fontsize=8, transform=axis.transAxes)  # fmt: skip
    colours = ["#e8a33d" if detour else "#8fb3d9" for detour in rows["detour"]]
    positions = np.arange(len(rows))
    axis.bar(positions, rows["coefficient"], yerr=1.96 * rows["std_error"], color=colours,
             capsize=3)  # fmt: skip
    axis.axhline(0, color="0.3", lw=0.8)
    axis.set_xticks(positions, [str(s) for s in rows["state"]], rotation=0)
    axis.set(xlabel="state (or covariate)", ylabel="coefficient (steps)",
             title=title or "convergence step ~ state distribution (orange: detour)")  # fmt: skip
    _save(figure, path)
    return "Per-state coefficients with 95 % intervals; orange bars are detour states."


def plot_convergence_histogram(
    convergence: Mapping[str, int | None],
    status: Mapping[str, str],
    path: str | os.PathLike,
    title: str = "",
    no_curve: str = "",
) -> str:
    """Histogram of convergence steps; diverged and never-converged runs counted in the title.
    ``no_curve``: why the runs have no convergence step (the figure says so instead)."""
    if no_curve:
        return _without_curve(path, title or "convergence steps", no_curve)
    steps = [s for r, s in convergence.items() if s is not None and status.get(r) != "diverged"]
    diverged = sum(1 for r in convergence if status.get(r) == "diverged")
    never = sum(1 for r, s in convergence.items() if s is None and status.get(r) != "diverged")
    figure, axis = plt.subplots(figsize=(5, 3.2))
    if steps:
        axis.hist(steps, bins=min(20, max(5, len(steps) // 2)), color="#8fb3d9", ec="white")
    axis.set(xlabel="convergence step", ylabel="runs",
             title=title or f"{len(steps)} converged, {never} never, {diverged} diverged")  # fmt: skip
    _save(figure, path)
    return "Convergence steps of the group's runs; never-converged and diverged runs are counted."


def plot_occupancy(
    occupancy: pd.DataFrame, detour_states: list[int], path: str | os.PathLike, title: str = ""
) -> str:
    """Mean state occupancy per group (rows of ``occupancy``: groups, columns: states)."""
    figure, axis = plt.subplots(figsize=(max(5.0, 0.9 * occupancy.shape[1] + 3), 3.4))
    width = 0.8 / max(1, len(occupancy))
    for index, (group, row) in enumerate(occupancy.iterrows()):
        axis.bar(np.arange(occupancy.shape[1]) + index * width, row.to_numpy(), width, label=group)
    ticks = [f"{k}{' (detour)' if k in detour_states else ''}" for k in occupancy.columns]
    axis.set_xticks(np.arange(occupancy.shape[1]) + width * (len(occupancy) - 1) / 2, ticks,
                    fontsize=8)  # fmt: skip
    axis.set(xlabel="shared state", ylabel="mean fraction of checkpoints",
             title=title or "state occupancy per group")  # fmt: skip
    axis.legend(fontsize=7)
    _save(figure, path)
    return "Mean fraction of checkpoints each group's runs spend in each shared state."


def _without_curve(path: str | os.PathLike, title: str, reason: str) -> str:
    """A convergence figure for runs without a convergence step: the reason in its place; the
    caption."""
    figure, axis = plt.subplots(figsize=(5, 3.2))
    axis.text(0.5, 0.5, textwrap.fill(f"No convergence steps: {reason}", 48), ha="center",
              va="center", fontsize=9, transform=axis.transAxes)  # fmt: skip
    axis.set_axis_off()
    axis.set_title(title)
    _save(figure, path)
    return f"No convergence steps to show: {reason}."


def plot_group_convergence(
    convergence: pd.DataFrame, visit_rates: Mapping[str, float], path: str | os.PathLike,
    title: str = "", no_curve: str = "",
) -> str:  # fmt: skip
    """Convergence steps per group: boxes plus every run; the labels give detour visit rates
    (none when ``visit_rates`` is empty: no detour the group regression keeps). ``no_curve``: why
    the runs have no convergence step (the figure says so instead)."""
    if no_curve:
        return _without_curve(path, title or "convergence step per group", no_curve)
    groups = list(dict.fromkeys(convergence["group"]))
    figure, axis = plt.subplots(figsize=(max(4.5, 1.3 * len(groups) + 2), 3.4))
    data = [convergence.loc[convergence["group"] == g, "convergence_step"].dropna() for g in groups]
    axis.boxplot([d.to_numpy() for d in data], showfliers=False)
    rng = np.random.default_rng(0)  # jitter only; fixed so the figure is reproducible
    for index, values in enumerate(data, start=1):
        axis.scatter(index + rng.uniform(-0.12, 0.12, len(values)), values, s=12, alpha=0.7)
    labels = [f"{g}\ndetour rate {visit_rates[g]:.0%}" if g in visit_rates else g for g in groups]
    axis.set_xticks(range(1, len(groups) + 1), labels, fontsize=8)
    axis.set(ylabel="convergence step", title=title or "convergence step per group")
    _save(figure, path)
    if not visit_rates:
        return ("Convergence step per group (box: quartiles; dots: runs); no detour rates: no "
                "state is a detour once the group enters the regression.")  # fmt: skip
    return "Convergence step per group (box: quartiles; dots: runs) with each group's detour rate."


def plot_paper(rows: Any, path: str | os.PathLike, confidence: float) -> str:
    """The paper's tables 1 and 4 against trainmap's maps: R^2, dissimilarity (eq. 1) and K per
    setting, the paper's value beside each analysis pass with its bootstrap interval (``rows``:
    :func:`trainmap.dynamics.paper.paper_row` dicts)."""
    from trainmap.dynamics.paper import label_of, paper_of, percentile_interval

    settings = list(dict.fromkeys(row["setting"] for row in rows))
    analyses = list(dict.fromkeys(row["analysis"] for row in rows))
    by_key = {(row["setting"], row["analysis"]): row for row in rows}
    panels = (("R^2 of the detour regression", "r2", lambda r: r["bootstrap_r2"], "r2"),
              ("dissimilarity, eq. 1 (state index)", "dissimilarity_state_index",
               lambda r: r["bootstrap_dissimilarity"].get("state_index", []), "dissimilarity"),
              ("hidden states K", "k", lambda r: r["bootstrap_k_draws"], "k"))  # fmt: skip
    figure, axes = plt.subplots(1, 3, figsize=(4.2 * 3, 3.6))
    x = np.arange(len(settings))
    width = 0.8 / (len(analyses) + 1)
    for axis, (title, key, draws, paper_key) in zip(axes, panels, strict=True):
        labelled: set[str] = set()
        paper = [getattr(paper_of(s), paper_key) for s in settings]
        axis.scatter(x - 0.4 + width / 2, paper, marker="*", s=90, color="black", label="paper")
        for i, analysis in enumerate(analyses):
            offset = -0.4 + width * (i + 1.5)
            for j, setting in enumerate(settings):
                row = by_key.get((setting, analysis))
                if row is None or row[key] is None:
                    continue
                low, high, n = percentile_interval(draws(row), confidence)
                if n:
                    axis.plot([j + offset] * 2, [low, high], color=f"C{i}", lw=2, alpha=0.5)
                axis.scatter(j + offset, row[key], color=f"C{i}", s=30,
                             label=None if analysis in labelled else analysis)  # fmt: skip
                labelled.add(analysis)
        labels = [label_of(s) for s in settings]
        axis.set_xticks(x, labels, rotation=25, ha="right", fontsize=8)
        axis.set_title(title, fontsize=9)
    axes[0].legend(fontsize=7)
    figure.suptitle(f"training maps: the paper's tables against trainmap ({confidence:.0%} "
                    "bootstrap intervals)", fontsize=10)  # fmt: skip
    _save(figure, path)
    return (
        "Per setting: the paper's value (star) and trainmap's map under the authors' analysis "
        "settings and under trainmap's defaults (dots), each with the percentile interval of "
        "its bootstrap resamples (bars): the detour regression's R^2, eq. 1's dissimilarity "
        "and the number of hidden states K."
    )
