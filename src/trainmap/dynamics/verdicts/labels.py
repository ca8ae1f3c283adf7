"""One verdict, everywhere: the label each verdict of a joint comparison carries in
``verdicts.md``, ``verdicts.csv``, ``verdicts.png`` and MLflow, made once from all its evidence.

A verdict (:func:`trainmap.dynamics.verdicts.compare.compare_methods`: one quantity, one pair of methods)
is a **finding** only when both hold:

1. the difference is significant after Holm's correction (permutation test; log-rank test for the
   convergence step), and
2. it holds again on subsamples of the seeds at the stability target: from some n of the
   stability curve's ladder on, in a share >= the target of the subsamples, in the same direction
   and significant (:meth:`trainmap.dynamics.verdicts.stability_results.StabilityCurve.verdict_sufficient_n`).

Everything else is said as what it is: "significant at n = 40 vs 40 runs, holds again in 0 % of
subsamples of 32 seeds per method: not reproducible"; "not tested on subsamples (stability 0)";
and a time-in-detour verdict whose detour states the group regression rejects (the group predicts
the slower convergence as well as the state does) is not a finding about detours. The map draws as
detours only the states the group regression keeps (:func:`supported_detours`).

``verdicts.md`` is written together with ``verdicts.html``, the same page rendered
(:func:`write_verdicts`): the first page of a comparison in the Snakemake report, which shows HTML
in place where it would offer a Markdown or CSV file for download.
"""

from __future__ import annotations

import html
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from markdown_it import MarkdownIt

from trainmap.dynamics.verdicts.compare import NO_EVIDENCE, NOT_ENOUGH_RUNS, TIME_IN_DETOURS
from trainmap.dynamics.verdicts.stability_results import MapStability, verdict_key
from trainmap.io import write_atomic

#: The label's ending for a significant verdict that is not a finding (and a stand-alone word).
NOT_REPRODUCIBLE = "not reproducible"
NOT_TESTED = "not tested on subsamples"


def verdict_label(
    row: Mapping[str, Any], stability: MapStability, explained_detours: Sequence[int] = (),
    evidence: Mapping[str, tuple[int | None, int, float]] | None = None,
) -> tuple[str, bool]:  # fmt: skip
    """The label of one verdict row and whether it is a finding (module docstring).

    ``row``: a row of the verdict table (``first``, ``second``, ``quantity``, ``verdict``,
    ``n_first``, ``n_second``); ``stability``: the comparison's stability (its curve follows the
    verdicts that found a difference); ``explained_detours``: detour states that are no detours
    once the group indicators enter the regression; ``evidence``: the curve's
    :meth:`~trainmap.dynamics.verdicts.stability_results.StabilityCurve.verdict_evidence` when already at hand."""
    verdict = str(row["verdict"])
    if verdict in (NOT_ENOUGH_RUNS, NO_EVIDENCE):
        return verdict, False
    significant = f"significant at n = {int(row['n_second'])} vs {int(row['n_first'])} runs"
    if row["quantity"] == TIME_IN_DETOURS and explained_detours:
        states = ", ".join(map(str, explained_detours))
        return (f"{verdict}: {significant}, but detour state(s) {states} are no detours once the "
                "group enters the regression: not a finding about detours", False)  # fmt: skip
    curve = stability.curve
    if evidence is None:
        evidence = curve.verdict_evidence() if curve is not None else {}
    key = verdict_key(row)
    if key not in evidence:
        why = stability.reason or "the stability curve does not follow it"
        return f"{verdict}: {significant}; {NOT_TESTED} ({why}): not a finding yet", False
    sufficient, largest, share = evidence[key]
    if sufficient is not None:
        return f"{verdict} (significant; holds again from n = {sufficient} {curve.unit})", True
    return (f"{verdict}: {significant}, holds again in {share:.0%} of subsamples of {largest} "
            f"{curve.unit}: {NOT_REPRODUCIBLE}", False)  # fmt: skip


def label_verdicts(
    verdicts: pd.DataFrame, stability: MapStability, explained_detours: Sequence[int] = ()
) -> pd.DataFrame:
    """``verdicts`` with two columns added: ``label`` (:func:`verdict_label`) and ``finding``."""
    labelled = verdicts.copy()
    evidence = stability.curve.verdict_evidence() if stability.curve is not None else {}
    pairs = [verdict_label(row, stability, explained_detours, evidence)
             for row in verdicts.to_dict(orient="records")]  # fmt: skip
    labelled["label"] = [label for label, _ in pairs]
    labelled["finding"] = [finding for _, finding in pairs]
    return labelled


def supported_detours(detour_states: Sequence[int], explained: Sequence[int]) -> list[int]:
    """The detour states the map draws as detours: those the group regression keeps."""
    return [state for state in detour_states if state not in set(explained)]


#: The rendered page's style: a readable table at the report's width, findings' bold in green.
_PAGE_STYLE = """
body { font-family: system-ui, sans-serif; font-size: 15px; line-height: 1.45; margin: 1em 1.5em;
       max-width: 70em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 14px; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
tr:nth-child(even) td { background: #fafafa; }
td strong { color: #1a7f37; }
"""


def verdict_page(markdown: str, title: str) -> str:
    """``verdicts.md`` (``markdown``: the stability line, the verdict table with its labels and
    notes) as one self-contained HTML page headed ``title``: CommonMark with tables, raw HTML in it
    escaped (method names are the user's), no scripts, no external resources."""
    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown)
    return (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}"
            f"</title><style>{_PAGE_STYLE}</style></head>\n<body>\n<h2>{html.escape(title)}</h2>\n"
            f"{body}</body></html>\n")  # fmt: skip


def write_verdicts(out_dir: str | os.PathLike, markdown: str, name: str) -> None:
    """Write ``verdicts.md`` and its rendering ``verdicts.html`` (:func:`verdict_page`, headed by
    the comparison's ``name``) to ``out_dir``, each atomically: the one writer of both, so the
    report's page never lags the Markdown."""
    out = Path(out_dir)
    write_atomic(out / "verdicts.md", lambda tmp: tmp.write_text(markdown))
    page = verdict_page(markdown, f"{name}: the answers, read these first")
    write_atomic(out / "verdicts.html", lambda tmp: tmp.write_text(page))
