"""Screenshots of what a researcher sees, from a headless browser: the report's answers page of a
comparison, its MLflow run page and the chart ``make mlflow-ui`` links (every method's mean and
interval on one chart). Run after ``make run`` and ``make report`` in the project directory::

    .venv/bin/python docs/screenshots/take.py [--comparison parity_init] [--metric test_acc]

Needs the dev group's playwright and Debian's chromium (``apt-get install chromium``); writes
``report_answers.png``, ``mlflow_run.png`` and ``mlflow_chart.png`` beside this file.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

from trainmap.seed_groups import seed_chart_urls

HERE = Path(__file__).parent


def serve(store: Path, port: int) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri",
                                f"sqlite:///{store}", "--host", "127.0.0.1", "--port", str(port),
                                "--workers", "1"], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)  # fmt: skip
    for _ in range(240):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return process
        except OSError:
            time.sleep(0.5)
    process.terminate()
    raise SystemExit("mlflow server did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--comparison", default="parity_init")
    parser.add_argument("--metric", default="test_acc")
    parser.add_argument("--report", type=Path, default=Path("results/report.html"))
    parser.add_argument("--store", type=Path, default=Path("mlflow.db"))
    parser.add_argument("--port", type=int, default=5123)
    args = parser.parse_args()
    server = serve(args.store.resolve(), args.port)
    address = f"http://127.0.0.1:{args.port}"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium",
                                                 args=["--no-sandbox"])  # fmt: skip
            page = browser.new_page(viewport={"width": 1900, "height": 1000})
            page.goto(args.report.resolve().as_uri())
            page.get_by_role("link", name="Answers", exact=True).click()
            comparison = page.get_by_role("link", name=args.comparison, exact=True)
            if comparison.count():
                comparison.click()
            page.locator("table tbody tr").first.locator("a").first.click()
            page.wait_for_timeout(1000)
            page.screenshot(path=HERE / "report_answers.png")

            from mlflow import MlflowClient

            client = MlflowClient(address)
            (run,) = client.search_runs(
                [e.experiment_id for e in client.search_experiments()],
                f"attributes.run_name = 'joint {args.comparison}'", max_results=1,
                order_by=["attributes.start_time DESC"])  # fmt: skip
            page.goto(f"{address}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}")
            page.get_by_text("verdict/").first.wait_for(timeout=60_000)
            page.screenshot(path=HERE / "mlflow_run.png", full_page=True)

            line = next(line for line in seed_chart_urls(f"sqlite:///{args.store.resolve()}",
                                                         address, args.metric)
                        if f" {args.comparison} (" in line)  # fmt: skip
            page.goto(line.rsplit(": ", 1)[1])
            page.get_by_text(f"{args.metric}/mean vs").first.wait_for(timeout=60_000)
            page.wait_for_timeout(2000)
            page.screenshot(path=HERE / "mlflow_chart.png")
            browser.close()
    finally:
        server.terminate()
    print(f"screenshots in {HERE}")


if __name__ == "__main__":
    main()
