"""One verdict, everywhere: a verdict is a finding only when it is significant after Holm *and*
holds again on subsamples at the stability target; the label says which, and the same label
reaches verdicts.md, verdicts.html (the report's page), verdicts.csv, verdicts.png and MLflow."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest

from trainmap.dynamics.verdicts.compare import NO_EVIDENCE, NOT_ENOUGH_RUNS, verdict_markdown
from trainmap.dynamics.verdicts.labels import (
    label_verdicts,
    supported_detours,
    verdict_label,
    write_verdicts,
)
from trainmap.dynamics.verdicts.stability_results import (
    MapStability,
    StabilityCurve,
    StabilityPoint,
    StabilityTargets,
    verdict_key,
)
from trainmap.jobs.analysis import verdict_tags

ROW = {"first": "kaiming", "second": "gradinit", "quantity": "time in detour states",
       "verdict": "gradinit lower", "n_first": 40, "n_second": 40, "effect": -0.2, "low": -0.3,
       "high": -0.1, "p_holm": 0.0035}  # fmt: skip


def stability(held: dict[int, float], row: dict = ROW) -> MapStability:
    """A joint comparison's curve over n = 8, 16, 24, 32 seeds per method whose one followed
    verdict holds again in ``held[n]`` of the subsamples."""
    key = verdict_key(row)
    points = [StabilityPoint(n=n, n_states=3, ks=[3] * 10, ari=[1.0] * 10, detour_found={},
                             verdict_held={key: share}) for n, share in held.items()]  # fmt: skip
    curve = StabilityCurve(points=points, targets=StabilityTargets(ari=0.9, share=0.9), full_n=40,
                           n_states=3, detour_states=[], groups=["kaiming", "gradinit"],
                           verdicts=[key])  # fmt: skip
    return MapStability(curve)


def test_a_significant_verdict_that_holds_again_is_a_finding() -> None:
    label, finding = verdict_label(ROW, stability({8: 0.5, 16: 0.9, 24: 1.0, 32: 1.0}))
    assert finding
    assert label == "gradinit lower (significant; holds again from n = 16 seeds per method)"


def test_a_significant_verdict_that_does_not_hold_again_says_so() -> None:
    label, finding = verdict_label(ROW, stability({8: 0.0, 16: 0.0, 24: 0.1, 32: 0.0}))
    assert not finding
    assert label == ("gradinit lower: significant at n = 40 vs 40 runs, holds again in 0% of "
                     "subsamples of 32 seeds per method: not reproducible")  # fmt: skip
    # holding at a smaller n but not at the largest is not holding "from n on"
    assert not verdict_label(ROW, stability({8: 1.0, 16: 1.0, 24: 1.0, 32: 0.5}))[1]


def test_without_a_stability_curve_nothing_is_a_finding() -> None:
    label, finding = verdict_label(ROW, MapStability(None, reason="analysis.stability is 0"))
    assert not finding
    assert "not tested on subsamples (analysis.stability is 0): not a finding yet" in label


def test_a_detour_the_group_regression_rejects_is_not_a_finding_about_detours() -> None:
    label, finding = verdict_label(ROW, stability({16: 1.0, 32: 1.0}), explained_detours=[2])
    assert not finding and "detour state(s) 2 are no detours once the group" in label
    assert supported_detours([1, 2], explained=[2]) == [1]
    other = ROW | {"quantity": "occupancy of state 1", "verdict": "gradinit higher"}
    assert not verdict_label(other, stability({16: 1.0}), explained_detours=[2])[1]  # not followed


@pytest.mark.parametrize("verdict", [NOT_ENOUGH_RUNS, NO_EVIDENCE])
def test_verdicts_without_a_difference_keep_their_words(verdict: str) -> None:
    assert verdict_label(ROW | {"verdict": verdict}, stability({16: 1.0})) == (verdict, False)


def test_the_same_label_reaches_the_table_the_markdown_and_mlflow() -> None:
    verdicts = pd.DataFrame([ROW, ROW | {"quantity": "convergence step", "verdict": NO_EVIDENCE,
                                         "p_holm": 0.4}])  # fmt: skip
    labelled = label_verdicts(verdicts, stability({8: 0.0, 16: 0.0, 24: 0.0, 32: 0.0}))
    assert list(labelled["finding"]) == [False, False]
    assert "not reproducible" in labelled.loc[0, "label"]
    assert list(verdicts.columns) == list(labelled.columns)[:-2]  # the input is left as it was
    text = verdict_markdown(labelled, 0.95)
    assert labelled.loc[0, "label"] in text and "**finding:**" not in text
    tags = verdict_tags(labelled)
    assert tags["verdict/gradinit vs kaiming/time in detour states"] == labelled.loc[0, "label"]
    found = label_verdicts(verdicts, stability({8: 1.0, 16: 1.0, 24: 1.0, 32: 1.0}))
    assert "**finding:** gradinit lower (significant" in verdict_markdown(found, 0.95)
    assert verdict_tags(found)["verdict/gradinit vs kaiming/time in detour states"].startswith(
        "finding: gradinit lower"
    )


def test_a_verdicts_note_reads_the_same_in_the_table_and_in_mlflow() -> None:
    row = ROW | {"quantity": "convergence step", "verdict": NOT_ENOUGH_RUNS,
                 "note": "no run of either method converged"}  # fmt: skip
    labelled = label_verdicts(pd.DataFrame([row]), stability({16: 1.0}))
    (tag,) = verdict_tags(labelled).values()
    assert tag == "not enough runs (no run of either method converged)"
    assert f"| {tag} |" in verdict_markdown(labelled, 0.95)


class _Cells(HTMLParser):
    """The text of every table cell of a page, and whether it loads anything from outside."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: list[str] = []
        self.external: list[str] = []
        self._in_cell = False

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self._in_cell = tag in ("td", "th") or (self._in_cell and tag == "strong")
        if tag in ("td", "th"):
            self.cells.append("")
        self.external += [value for name, value in attrs if name in ("src", "href")]
        self.external += ["<script>"] if tag == "script" else []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th"):
            self._in_cell = False

    def handle_data(self, data: str) -> None:
        if self._in_cell:
            self.cells[-1] += data


def test_the_report_page_renders_the_stability_line_and_the_verdict_table(tmp_path: Path) -> None:
    verdicts = pd.DataFrame([ROW, ROW | {"quantity": "occupancy of state 1 <x>"}])
    labelled = label_verdicts(verdicts, stability({8: 1.0, 16: 1.0, 24: 1.0, 32: 1.0}))
    markdown = (
        f"**Stability:** stable from n = 16 seeds per method.\n\n{verdict_markdown(labelled, 0.95)}"
    )
    write_verdicts(tmp_path, markdown, "parity_init")
    assert (tmp_path / "verdicts.md").read_text() == markdown
    page = (tmp_path / "verdicts.html").read_text()
    assert page.index("Stability:") < page.index("<table>")  # the line first, then the table
    cells = _Cells()
    cells.feed(page)
    assert not cells.external  # self-contained: the report embeds it as it is
    assert "occupancy of state 1 <x>" in cells.cells  # escaped, and shown as written
    header = cells.cells[: cells.cells.index("gradinit vs kaiming")]
    row = cells.cells[len(header) : 2 * len(header)]
    assert row[header.index("verdict")] == "finding: " + labelled.loc[0, "label"]
    assert "<strong>finding:</strong>" in page
