"""Integration: what a researcher sees in a real browser. The smoke study's Snakemake report and
its MLflow run page, opened in headless Chromium (Debian's package, installed here if absent),
show the comparison's stability line and its verdict table as visible text, with the labels of
``verdicts.md``; the chart ``make mlflow-ui`` links shows every method's mean and interval on one
chart."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import SMOKE, MlflowServer, snakemake

pytestmark = pytest.mark.integration

COMPARISON = "parity_init"


def chromium() -> str:
    """The path of a Chromium binary: Debian's ``chromium``, installed with apt-get when absent;
    the test is skipped, saying why, only when it cannot be installed."""
    found = shutil.which("chromium")
    if found is None and shutil.which("apt-get") is not None:
        install = subprocess.run(["apt-get", "install", "-y", "-q", "chromium"],
                                 capture_output=True, text=True, timeout=900)  # fmt: skip
        if install.returncode != 0:  # the package index may be missing on a fresh image
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, timeout=900)
            install = subprocess.run(["apt-get", "install", "-y", "-q", "chromium"],
                                     capture_output=True, text=True, timeout=900)  # fmt: skip
        found = shutil.which("chromium")
        if found is None:
            pytest.skip(f"Chromium is not installed and apt-get could not install it "
                        f"(exit {install.returncode}): {install.stderr.strip()[-300:]}")  # fmt: skip
    if found is None:
        pytest.skip("Chromium is not installed and there is no apt-get to install it: install "
                    "Debian's `chromium` package to run the browser tests")  # fmt: skip
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator:
    sync_api = pytest.importorskip("playwright.sync_api", reason="the dev group's playwright")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        yield launched
        launched.close()


def answers(smoke_run: Path) -> tuple[str, list[str]]:
    """The stability line and the verdict labels of ``verdicts.md`` (the last column of its table,
    Markdown emphasis dropped)."""
    text = (smoke_run / "results/joint" / COMPARISON / "verdicts.md").read_text()
    line = re.search(r"^\*\*Stability:\*\* (.+?)\.?$", text, re.M)
    assert line, text
    rows = [row for row in text.splitlines() if row.startswith("| ") and " vs " in row]
    labels = [row.rstrip(" |").rsplit(" | ", 1)[1].replace("**", "") for row in rows]
    assert labels, text
    return line[1], labels


def visible(text: str) -> str:
    """Text as a browser lays it out, whitespace runs as one space."""
    return " ".join(text.split())


def test_the_report_opens_each_comparison_with_its_answers(
    smoke_run: Path, browser, tmp_path: Path
) -> None:
    report = tmp_path / "report.html"
    snakemake("--cores", "1", "--configfile", SMOKE, "--report", str(report), cwd=smoke_run)
    line, labels = answers(smoke_run)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(report.as_uri())
    page.get_by_role("link", name="Answers", exact=True).click()
    comparison = page.get_by_role("link", name=COMPARISON, exact=True)
    if comparison.count():  # one link per comparison; with one, the category lists its results
        comparison.click()
    rows = page.locator("table tbody tr")
    first = rows.first
    assert "1. the answers" in first.inner_text(), rows.all_inner_texts()
    items = [visible(text) for text in rows.all_inner_texts()]
    order = [next(i for i, text in enumerate(items) if f"{n}. " in text) for n in (1, 2, 3, 4)]
    assert order == sorted(order), items  # answers, then the map, the occupancy, the stability
    first.locator("a").first.click()  # the eye: show it
    shown = visible(page.frame_locator("iframe").locator("body").inner_text())
    assert visible(line) in shown
    for label in labels:
        assert visible(label) in shown
    assert page.frame_locator("iframe").locator("table td").count() >= 7 * len(labels)


def test_the_mlflow_run_page_shows_the_stability_line_and_the_verdicts(
    smoke_run: Path, browser, tmp_path: Path
) -> None:
    from mlflow import MlflowClient

    line, labels = answers(smoke_run)
    server = MlflowServer(tmp_path / "mlflow", backend=f"sqlite:///{smoke_run / 'mlflow.db'}")
    try:
        client = MlflowClient(server.uri)
        experiment = client.get_experiment_by_name("trainmap-smoke")
        (run,) = client.search_runs([experiment.experiment_id],
                                    f"attributes.run_name = 'joint {COMPARISON}'")  # fmt: skip
        page = browser.new_page(viewport={"width": 1600, "height": 1200})
        page.goto(f"{server.uri}/#/experiments/{experiment.experiment_id}/runs/{run.info.run_id}")
        page.get_by_text("joint " + COMPARISON).first.wait_for(timeout=60_000)
        page.get_by_text("verdict/", exact=False).first.wait_for(timeout=60_000)  # the tags
        shown = visible(page.locator("body").inner_text())
        assert visible(line) in shown, shown[:3000]
        for label in labels:
            assert visible(label) in shown, shown[:3000]
    finally:
        server.stop()


def test_make_mlflow_ui_links_a_chart_of_each_methods_mean_and_interval(
    smoke_run: Path, browser, tmp_path: Path
) -> None:
    from trainmap.seed_groups import seed_chart_urls

    server = MlflowServer(tmp_path / "mlflow", backend=f"sqlite:///{smoke_run / 'mlflow.db'}")
    try:
        (line,) = seed_chart_urls(f"sqlite:///{smoke_run / 'mlflow.db'}", server.uri)
        assert line.startswith(f"trainmap-smoke {COMPARISON} (test_acc, every method): ")
        page = browser.new_page(viewport={"width": 2200, "height": 1200})
        page.goto(line.rsplit(": ", 1)[1])
        title = page.get_by_text("test_acc/mean vs test_acc/lo vs test_acc/hi")
        title.first.wait_for(timeout=60_000)  # one chart, the three keys
        page.get_by_text(f"seeds {COMPARISON}: kaiming (test_acc/hi)").first.wait_for()
        legend = visible(page.locator("body").inner_text())  # the chart's legend: a line per curve
        for method in ("kaiming", "gradinit"):
            for key in ("test_acc/mean", "test_acc/lo", "test_acc/hi"):
                assert f"seeds {COMPARISON}: {method} ({key})" in legend, legend[:2000]
    finally:
        server.stop()
