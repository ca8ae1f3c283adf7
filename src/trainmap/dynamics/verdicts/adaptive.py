"""Adaptive seeds: grow a joint comparison by rounds until its stability curve meets the target.

A joint comparison with ``adaptive: {step, max}`` (``analysis.joint[i]``) runs in rounds
(:class:`trainmap.grid.AdaptiveJoint` says which seeds each round pools; in
workflow/rules/analysis.smk the checkpoint ``joint_round`` runs a round, rule ``adaptive_rounds``
walks the rounds into ``adaptive.json`` and ``joint_comparison`` presents the last one):

* round 0 pools the grid's seeds; round r adds ``step`` more seeds to every compared (arch,
  method), the same seeds for each, following the largest seed the grid trains for the task;
* each round fits the shared map, its bootstrap and its stability curve (with the adaptive
  targets) exactly as a fixed comparison does, then decides (:func:`round_decision`,
  ``round.json``): stop when the curve calls its seeds sufficient ("stable from n = ..."), when
  another round would pass ``max`` seeds per method, or when no curve could be measured;
  otherwise ask for the next round, whose seeds only then train (a Snakemake checkpoint). A map of
  one state never calls its seeds sufficient by itself (only its verdicts can), and its reason
  says "one state";
* the comparison's own files are the last round's, with the trace of every round, the final seed
  count and why it stopped in ``joint.json`` (``adaptive``) and at the top of ``verdicts.md``
  (:func:`present_final_round`).

The rounds are a function of the config alone, so a rerun asks for the same seeds and, the files
being there, reruns nothing.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from trainmap.dynamics.verdicts.labels import write_verdicts
from trainmap.dynamics.verdicts.stability_results import MapStability
from trainmap.io import load_json, save_json, write_atomic

STABLE = "stable"
AT_MAXIMUM = "maximum reached"
NOT_MEASURED = "stability not measured"


def round_decision(stability: MapStability, adaptive_round: Mapping[str, Any]) -> dict[str, Any]:
    """Whether an adaptive comparison stops after this round (``round.json``), and why.

    ``adaptive_round``: ``round``, ``rounds`` (the most after round 0), ``step``, ``max``,
    ``seeds_per_method`` and ``first_seed`` (:class:`trainmap.grid.AdaptiveJoint`)."""
    curve = stability.curve
    sufficient = curve.sufficient_n if curve is not None else None
    n = adaptive_round["seeds_per_method"]
    if sufficient is not None:
        stop, reason = True, f"{STABLE}: {stability.line}"
    elif curve is None:
        stop, reason = True, f"{NOT_MEASURED}: {stability.line}"
    elif adaptive_round["round"] >= adaptive_round["rounds"]:
        stop, reason = True, (f"{AT_MAXIMUM}: {n} seeds per method, and another "
                              f"{adaptive_round['step']} would pass adaptive.max = "
                              f"{adaptive_round['max']}; {stability.line}")  # fmt: skip
    else:
        # A map of one state is no evidence of enough seeds: more may separate states.
        status = "one state" if curve.one_state else "not stable"
        stop, reason = False, (f"{status} at {n} seeds per method ({stability.line}); round "
                               f"{adaptive_round['round'] + 1} adds {adaptive_round['step']} "
                               "more")  # fmt: skip
    return dict(adaptive_round) | {"stop": stop, "reason": reason, "sufficient_n": sufficient,
                                   "line": stability.line}  # fmt: skip


def map_changes(round_dirs: Sequence[str | os.PathLike]) -> list[dict[str, Any]]:
    """Per round (its directory: ``hmm.json``, ``states.csv``): its K and whether its map is the
    previous round's: both maps decode the previous round's runs (their common runs and
    checkpoints), and the map is ``unchanged`` when K is the same and the two decodings agree
    (adjusted Rand index >= the map's ``reproduce_ari``, the selection rule's own agreement
    target), else ``changed``; round 0 has no previous map (``first``)."""
    import pandas as pd
    from sklearn.metrics import adjusted_rand_score

    from trainmap.dynamics.maps.hmm.curves import DEFAULT_REPRODUCE_ARI

    rows: list[dict[str, Any]] = []
    previous = None
    for directory in map(Path, round_dirs):
        meta = load_json(directory / "hmm.json")
        states = pd.read_csv(directory / "states.csv", dtype={"run": str})
        target = meta["estimator"].get("reproduce_ari", DEFAULT_REPRODUCE_ARI)
        row = {"n_states": int(meta["n_states"]), "ari_with_previous": None, "map": "first"}
        if previous is not None:
            common = previous[1].merge(states, on=["run", "step"], suffixes=("_before", ""))
            ari = float(adjusted_rand_score(common["state_before"], common["state"]))
            same = row["n_states"] == previous[0] and ari >= target
            row |= {"ari_with_previous": ari, "common_runs": int(common["run"].nunique()),
                    "map": "unchanged" if same else "changed"}  # fmt: skip
        rows.append(row)
        previous = (row["n_states"], states)
    return rows


def adaptive_trace(decisions: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``joint.json``'s ``adaptive`` entry (and ``adaptive.json``): every round's seed count and
    line, the final seed count and why it stopped. Raises ValueError when the last round did not
    stop (the rounds are incomplete)."""
    final = decisions[-1]
    if not final["stop"]:
        raise ValueError(f"round {final['round']}: the last round did not stop; the rounds are "
                         "incomplete")  # fmt: skip
    first = final["first_seed"]
    added = list(range(first, first + final["round"] * final["step"]))
    return {
        "rounds": [{"round": d["round"], "seeds_per_method": d["seeds_per_method"],
                    "sufficient_n": d["sufficient_n"], "line": d["line"]} for d in decisions],
        "final_round": final["round"],
        "seeds_per_method": final["seeds_per_method"],
        "seeds_added": added,
        "stopped_because": final["reason"],
        "stable": final["reason"].startswith(STABLE),
        "step": final["step"],
        "max": final["max"],
        "task": final["task"],
    }  # fmt: skip


def adaptive_line(trace: Mapping[str, Any]) -> str:
    """The sentence under the stability line of ``verdicts.md``."""
    seeds = trace["seeds_added"]
    added = f"seeds {seeds[0]}-{seeds[-1]} added" if seeds else "no seeds added"
    maps = ""
    if all("n_states" in entry for entry in trace["rounds"]):
        maps = "; K by round: " + ", ".join(
            f"{entry['seeds_per_method']} seeds: K = {entry['n_states']}"
            + ("" if entry["map"] == "first" else f" (map {entry['map']}, ARI with the previous "
               f"map {entry['ari_with_previous']:.2f})")
            for entry in trace["rounds"])  # fmt: skip
    return (f"{trace['seeds_per_method']} seeds per method after {trace['final_round']} "
            f"round(s) ({added}){maps}; stopped because {trace['stopped_because']}")  # fmt: skip


def present_final_round(trace: Mapping[str, Any], out_dir: str | os.PathLike) -> None:
    """Copy the last round's files (the directory of ``trace``'s last decision file, ``adaptive.json``
    as rule ``adaptive_rounds`` wrote it) into ``out_dir``, each atomically, then add the trace to
    ``joint.json`` and a line to ``verdicts.md``."""
    source, out = Path(trace["decisions"][-1]).parent, Path(out_dir)
    for path in sorted(source.iterdir()):
        if path.is_file() and path.name not in (
            "round.json",
            "joint.json",
            "verdicts.md",
            "verdicts.html",
        ):
            write_atomic(out / path.name, lambda tmp, path=path: shutil.copyfile(path, tmp))
    entry = {key: value for key, value in trace.items() if key != "decisions"}
    save_json(load_json(source / "joint.json") | {"adaptive": entry}, out / "joint.json")
    verdicts = (source / "verdicts.md").read_text()
    # the adaptive line goes after the stability line (after the answer, which opens the page)
    paragraphs = verdicts.split("\n\n")
    after = next((i for i, part in enumerate(paragraphs) if part.startswith("**Stability:**")), 0)
    paragraphs.insert(after + 1, f"**Adaptive seeds:** {adaptive_line(trace)}.")
    write_verdicts(out, "\n\n".join(paragraphs), out.name)
