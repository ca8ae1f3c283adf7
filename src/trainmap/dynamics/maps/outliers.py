"""Outlier runs: the runs whose training path leaves the others', and from which checkpoint on.

On a map fitted to many runs of one recipe (a suite's seeds), a state's **visit share** is the
fraction of runs whose decoded path enters it at least once. A state is **rare** when its visit
share is below ``share`` (default 0.2: with 9 seeds, a state only one run enters). A run is an
**outlier** when its decoded path enters a rare state; it leaves the others' path **from** the
first checkpoint at which it does. Nothing is tested here: with one run in a state there is no
distribution to test against, and the map's own stability (its bootstrap) says whether the state is
one the data support. :func:`outlier_runs` gives each outlier's first rare state and step.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from trainmap.schema import defaults_at

#: A state entered by fewer than this share of the runs is rare (the schema's
#: ``external[i].outlier_share``).
DEFAULT_SHARE: float = defaults_at("external")["outlier_share"]


def visit_shares(states: Mapping[str, np.ndarray]) -> dict[int, float]:
    """State -> the fraction of runs whose decoded path (``states``: run -> state per checkpoint)
    enters it at least once."""
    runs = len(states)
    counts: dict[int, int] = {}
    for path in states.values():
        for state in np.unique(np.asarray(path)):
            counts[int(state)] = counts.get(int(state), 0) + 1
    return {state: count / runs for state, count in sorted(counts.items())}


def outlier_runs(
    states: Mapping[str, np.ndarray], steps: Mapping[str, np.ndarray], share: float = DEFAULT_SHARE
) -> dict[str, dict[str, float | int]]:
    """Run -> ``{"from_step", "checkpoint", "state", "visit_share"}`` for each run whose decoded
    path enters a state fewer than ``share`` of the runs enter: the first such checkpoint (its
    step and index), the state and that state's visit share. Runs that stay on states most runs
    visit are left out; in run order."""
    if not 0 < share <= 1:
        raise ValueError(f"outlier share {share}: give a fraction in (0, 1], e.g. 0.2")
    shares = visit_shares(states)
    rare = {state for state, visited in shares.items() if visited < share}
    outliers: dict[str, dict[str, float | int]] = {}
    for run, path in states.items():
        path = np.asarray(path)
        hits = np.flatnonzero(np.isin(path, sorted(rare)))
        if hits.size:
            first = int(hits[0])
            state = int(path[first])
            outliers[run] = {"from_step": int(np.asarray(steps[run])[first]), "checkpoint": first,
                             "state": state, "visit_share": shares[state]}  # fmt: skip
    return outliers
