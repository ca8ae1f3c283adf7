"""Integration: the Snakemake workflow end to end on config/smoke.yaml, in a temporary copy."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from conftest import SMOKE, dry_run_job_counts, snakemake
from mlflow import MlflowClient

from trainmap.grid import expand_grid, is_sparse, load_config, retrains

pytestmark = pytest.mark.integration


def smoke_cells(workdir: Path):
    config = load_config(workdir / "params.yaml", workdir / "config/config.yaml", workdir / SMOKE,
                         check_paths_from=workdir)  # fmt: skip
    return config, expand_grid(config)


def test_every_cell_has_its_outputs(smoke_run: Path) -> None:
    config, cells = smoke_cells(smoke_run)
    assert len(cells) == 8
    for cell in cells:
        stage = "sparse" if is_sparse(cell) else "train"
        run_dir = smoke_run / "results" / stage / cell.id
        for name in ("checkpoint_metrics.csv", "checkpoints/step_00000000.safetensors",
                     "model.pt", "history.csv", "train.json"):  # fmt: skip
            assert (run_dir / name).stat().st_size > 0, f"{cell.id}: {name} missing or empty"
        evaluation = json.loads(
            (smoke_run / "results/evaluate" / cell.id / "evaluation.json").read_text()
        )
        assert evaluation["status"] == "completed"
        assert 0.0 <= evaluation["test_acc"] <= 1.0
        assert not (run_dir / "resume.pt").exists(), "resume state must be removed after a run"
        forms = [form["form"] for form in evaluation["forms"]]
        expected = ["sparse" if is_sparse(cell) else "trained"]
        expected += ["deploy"] if cell.arch == "repvgg" else []
        expected += config["quantize"]["schemes"] if cell.method == "ast" else []
        assert forms == expected, cell.id
        if retrains(cell):
            metrics = pd.read_csv(smoke_run / "results/metrics" / cell.id / "metrics.csv")
            history = pd.read_csv(run_dir / "history.csv")
            assert list(metrics["step"]) == list(history["step"])
            assert metrics["l2"].notna().all()
    assert not list((smoke_run / "results").rglob("*.resume.pt")), "block resume files remain"


def test_method_stages_left_their_outputs(smoke_run: Path) -> None:
    results = smoke_run / "results"
    scales = json.loads((results / "gradinit/sparse_parity/mlp/gradinit/seed0/scales.json")
                        .read_text())  # fmt: skip
    assert scales["iterations"] == 10 and scales["scales"]
    check = json.loads((results / "reparam/digits/repvgg/kaiming/seed0/equivalence.json")
                       .read_text())  # fmt: skip
    assert check["predictions_identical"] and check["max_abs_logit_diff"] < 1e-3
    assert json.loads((results / "sparse/digits/vgg_bn/ast/seed0/train.json").read_text())[
        "nm_valid"]  # fmt: skip
    manifest = json.loads((results / "quantize/digits/vgg_bn/ast/seed0/quantize.json").read_text())
    assert [form["form"] for form in manifest["forms"]] == ["int8", "int4", "awq_int4"]


def test_training_maps_and_joint_comparison(smoke_run: Path) -> None:
    for method in ("kaiming", "gradinit"):
        group = smoke_run / "results/hmm/sparse_parity/mlp" / method
        for name in ("hmm.npz", "hmm.json", "selection.csv", "baselines.csv", "states.csv",
                     "map.json", "map.png", "map.svg", "detours.json", "coefficients.csv"):  # fmt: skip
            assert (group / name).stat().st_size > 0, f"{group}/{name}"
        detours = json.loads((group / "detours.json").read_text())
        assert {"r2", "r2_adjusted", "f_pvalue", "fitted", "not_fitted", "detour_states",
                "dissimilarity", "dissimilarity_ground_metric", "excluded"} <= set(detours)  # fmt: skip
        # 2 runs per group: too few for any regression, and the output says why.
        assert detours["fitted"] is False and "add seeds" in detours["not_fitted"]
        bootstrap = json.loads((group / "bootstrap.json").read_text())
        assert bootstrap["n_resamples"] == 20 and sum(bootstrap["k_counts"].values()) == 20
        meta = json.loads((group / "hmm.json").read_text())
        assert meta["estimator"]["covariance_type"] == "full"
        assert isinstance(meta["selection_at_ceiling"], bool)
    joint_dir = smoke_run / "results/joint/parity_init"
    joint = json.loads((joint_dir / "joint.json").read_text())
    assert set(joint["groups"]) == {"kaiming", "gradinit"}
    verdicts = pd.read_csv(joint_dir / "verdicts.csv")
    # 2 seeds per method: every verdict must say that this cannot be told.
    assert set(verdicts["verdict"]) == {"not enough runs"}
    assert (joint_dir / "verdicts.png").read_bytes()[:4] == b"\x89PNG"
    assert "not enough runs" in (joint_dir / "verdicts.md").read_text()
    metrics = pd.read_csv(smoke_run / "results/metrics/digits/vgg_bn/kaiming/seed0/metrics.csv")
    assert metrics["trace"].notna().all()  # paper convention: from the Linear classifier only


def test_summary_table_and_metrics(smoke_run: Path) -> None:
    table = pd.read_csv(smoke_run / "results/summary/evaluation.csv")
    assert len(table) == 8
    forms = pd.read_csv(smoke_run / "results/summary/compression.csv")
    assert len(forms) == 8 + 1 + 3  # every run, + the RepVGG deploy form, + AST's 3 quantisations
    assert (smoke_run / "results/summary/compression.png").read_bytes()[:4] == b"\x89PNG"
    assert {"task", "arch", "method", "seed", "test_acc", "convergence_step", "converged",
            "n_params", "bytes_on_disk"} <= set(table.columns)  # fmt: skip
    assert (table["bytes_on_disk"] > 0).all()
    # Measured times live beside the table (not versioned by DVC), one row per run.
    times = pd.read_csv(smoke_run / "results/summary/evaluation.timing.csv")
    assert list(times.columns) == ["task", "arch", "method", "seed", "latency_ms",
                                   "train_wall_time_s"]  # fmt: skip
    assert len(times) == 8 and (times["latency_ms"] > 0).all()
    metrics = json.loads((smoke_run / "results/summary/metrics.json").read_text())
    assert metrics["sparse_parity"]["mlp"]["kaiming"]["runs"] == 2
    assert (smoke_run / "results/summary/learning_curves.png").read_bytes()[:4] == b"\x89PNG"


def test_every_rule_invocation_is_an_mlflow_run(smoke_run: Path) -> None:
    config, cells = smoke_cells(smoke_run)
    client = MlflowClient(tracking_uri=f"sqlite:///{smoke_run / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(config["mlflow"]["experiment"])
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    children = [run for run in runs if "rule" in run.data.tags]
    parents = {run.info.run_id: run for run in runs if run.data.tags.get("role") == "cell"}
    rules = pd.Series([run.data.tags["rule"] for run in children]).value_counts().to_dict()
    planned = json.loads((smoke_run / "planned_jobs.json").read_text())
    expected = {rule: count for rule, count in planned.items() if not rule.startswith("all")}
    expected |= cells_of_block_rules(smoke_run)  # a block job logs one run per cell
    assert rules == expected
    assert all(run.info.status == "FINISHED" for run in runs)
    assert len(parents) == len(cells)
    for run in children:
        if run.data.tags["rule"] in ("train", "evaluate"):
            parent = parents[run.data.tags["mlflow.parentRunId"]]
            assert parent.data.tags["cell"] == run.data.tags["cell"]
            assert {"task", "arch", "method", "seed", "git_commit", "config_hash"} <= set(
                run.data.tags
            )
    # Each cell's parent carries its headline metrics (and, for mapped cells, its occupancy), so
    # "group by method" over the parents compares methods.
    for parent in parents.values():
        assert {"final_test_acc", "best_test_acc", "bytes_on_disk", "converged"} <= set(
            parent.data.metrics
        ), parent.data.tags["cell"]
    parity = [p for p in parents.values() if p.data.tags["task"] == "sparse_parity"]
    assert all("map.occupancy.state0" in p.data.metrics for p in parity)
    assert all("joint.parity_init.detour_share" in p.data.metrics for p in parity)
    train_run = next(run for run in children if run.data.tags["rule"] == "train")
    history = client.get_metric_history(train_run.info.run_id, "test_acc")
    assert len(history) > 3 and history[0].step == 0
    # A comparison's run and its seed groups: one name, the seed groups nested inside it.
    by_name = {run.info.run_name: run for run in runs}
    joint, seeds = by_name["joint parity_init"], by_name["seeds parity_init"]
    assert seeds.data.tags["mlflow.parentRunId"] == joint.info.run_id
    assert joint.data.tags["seed_group_run"] == seeds.info.run_id
    assert len([run for run in runs if run.info.run_name == "joint parity_init"]) == 1
    # its description, what the run page shows first: the answer in words, start before path
    description = joint.data.tags["mlflow.note.content"]
    assert description.startswith("# parity_init")
    assert description.index("start:") < description.index("path:")


def test_second_run_has_nothing_to_do(smoke_run: Path) -> None:
    result = snakemake("-n", "--cores", "2", "--configfile", SMOKE, cwd=smoke_run)
    assert "Nothing to be done" in result.stdout + result.stderr


def test_changed_threshold_reruns_evaluation_not_training(smoke_run: Path) -> None:
    override = smoke_run / "threshold.yaml"
    override.write_text("evaluate:\n  sparse_parity: {threshold: 0.5}\n")
    result = snakemake("-n", "--cores", "2", "--configfile", SMOKE, str(override), cwd=smoke_run)
    jobs = dry_run_job_counts(result.stdout)
    assert jobs.get("evaluate") == 2 and jobs.get("summary") == 1  # two blocks of two seeds
    assert "train" not in jobs and "data" not in jobs and "gradinit" not in jobs


def test_changed_metric_definitions_rerun_analysis_not_training(smoke_run: Path) -> None:
    """collect-metrics and what follows depend on the metrics code; training does not."""
    definitions = smoke_run / "src/trainmap/dynamics/metrics/weights.py"
    original, stat = definitions.read_text(), definitions.stat()
    try:
        definitions.write_text(original + "\n# a changed metric definition\n")
        result = snakemake("-n", "--cores", "2", "--configfile", SMOKE, cwd=smoke_run)
    finally:
        definitions.write_text(original)
        os.utime(definitions, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    jobs = dry_run_job_counts(result.stdout)
    assert jobs.get("collect_metrics") == 5 and jobs.get("fit_hmm") == 2  # 7 runs in 5 blocks
    assert jobs.get("joint_comparison") == 1
    assert not {"train", "gradinit", "sparse_retrain", "evaluate", "data"} & set(jobs)


def cells_of_block_rules(workdir: Path) -> dict[str, int]:
    """How many cells each per-seed rule handled, from the block manifests it wrote."""
    counts: dict[str, int] = {}
    for path in (workdir / "results").rglob("seeds*.json"):
        manifest = json.loads(path.read_text())
        counts[manifest["rule"]] = counts.get(manifest["rule"], 0) + len(manifest["cells"])
    return counts


def test_block_jobs_write_manifests_and_per_seed_files(smoke_run: Path) -> None:
    """sparse_parity trains its two seeds per method as one block (train.sparse_parity.seed_block:
    2): one job, one manifest, per-seed files, and each seed's summary says it was in a block."""
    manifest = json.loads(
        (smoke_run / "results/train/sparse_parity/mlp/kaiming/seeds0-1.json").read_text()
    )
    assert manifest["block"]["seeds"] == [0, 1]
    assert [c["cell"] for c in manifest["cells"]] == [
        "sparse_parity/mlp/kaiming/seed0", "sparse_parity/mlp/kaiming/seed1"]  # fmt: skip
    for seed in (0, 1):
        summary = json.loads((smoke_run / f"results/train/sparse_parity/mlp/kaiming/seed{seed}"
                              "/train.json").read_text())  # fmt: skip
        assert summary["seed_block"] == 2 and summary["status"] == "completed"
    planned = json.loads((smoke_run / "planned_jobs.json").read_text())
    assert planned["train"] == 4  # 2 sparse-parity blocks + 2 digits cells (seed_block 1)


def test_snakemake_lint_is_clean(repo_root: Path) -> None:
    result = snakemake("--lint", "--configfile", SMOKE, cwd=repo_root)
    assert "Congratulations, your workflow is in a good condition!" in result.stdout + result.stderr


def test_snakefmt_is_clean(repo_root: Path) -> None:
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "snakefmt", "--check", "Snakefile", "workflow/rules"],
        cwd=repo_root, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


def test_the_findings_page_is_written_from_the_results_and_checked(smoke_run: Path, tmp_path):
    """`python -m trainmap.findings write` on the smoke study: a page with each comparison's runs,
    K, bootstrap, stability line and verdict table (from the results, not typed); `check` finds it
    equal to the run's, the run's time aside, and names the first line that differs from an edited
    page; `python -m trainmap.digest check` (make run's last step) reports the page too."""
    import sys

    from conftest import run_command

    from trainmap.dynamics.verdicts.stability_results import states_sentence

    page = tmp_path / "smoke.findings.md"
    python = [sys.executable, "-m", "trainmap.findings"]
    run_command([*python, "write", str(page), "results", "--title", "Smoke findings"],
                cwd=smoke_run)  # fmt: skip
    text = page.read_text()
    joint = json.loads((smoke_run / "results/joint/parity_init/joint.json").read_text())
    bootstrap = json.loads((smoke_run / "results/joint/parity_init/bootstrap.json").read_text())
    assert text.splitlines()[2] == "# Smoke findings"
    assert "## parity_init" in text and "gradinit 2 runs, kaiming 2 runs" in text
    assert f"- K = {joint['n_states']} (selection rule `holdout`, K_max 8)." in text
    # Refits at the full map's K: each state's mean Jaccard agreement over the resamples.
    where = f"over {bootstrap['n_resamples']} resamples"
    assert f"- Bootstrap: {states_sentence(bootstrap['state_jaccard'], where)}." in text, text
    verdicts = (smoke_run / "results/joint/parity_init/verdicts.md").read_text().strip()
    assert verdicts in text and "**Stability:**" in text
    assert "Run time:" not in text  # the smoke run was not started by make run

    checked = run_command([*python, "check", str(page), "results"], cwd=smoke_run)
    assert checked.stdout.strip() == f"Findings match {page}."
    timed = tmp_path / "timed"
    (timed / "joint").mkdir(parents=True)
    (timed / "joint/parity_init").symlink_to(smoke_run / "results/joint/parity_init")
    run_command([*python, "time", str(timed), "75", "--cores", "2"], cwd=smoke_run)
    with_time = run_command([*python, "write", str(tmp_path / "timed.md"), str(timed)],
                            cwd=smoke_run).stdout  # fmt: skip
    assert with_time and "Run time: Snakemake 1 min 15 s on 2 cores" in (
        tmp_path / "timed.md").read_text()  # fmt: skip
    same = run_command([*python, "check", str(page), str(timed)], cwd=smoke_run).stdout
    assert same.startswith("Findings match"), same  # the run's time is no finding
    page.write_text(text.replace(f"- K = {joint['n_states']} ", "- K = 9 "))
    differs = run_command([*python, "check", str(page), "results"], cwd=smoke_run).stdout
    assert "Findings differ" in differs and "K = 9" in differs, differs

    published = tmp_path / "smoke.results.sha256"
    run_command([sys.executable, "-m", "trainmap.digest", "write", str(published), "results"],
                cwd=smoke_run)  # fmt: skip
    assert page.read_text() == text  # digest write rewrote the page beside the listing
    both = run_command([sys.executable, "-m", "trainmap.digest", "check", str(published),
                        "results"], cwd=smoke_run).stdout.splitlines()  # fmt: skip
    assert both[0].startswith("Results match") and both[1] == f"Findings match {page}."


def test_the_smoke_study_gives_its_published_bits_or_says_where_they_start(
    smoke_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """config/published/smoke.results.sha256: on a machine like the one that published it (the
    same CPU model, kernel flags and library versions) the smoke study gives every published bit; on
    another, the check matches too or says where the difference starts and how the machines
    differ (the portable mode's promise and its limits: docs/running.md, Portable numbers)."""
    from conftest import REPO_ROOT

    from trainmap.digest import check_digest, environment_path
    from trainmap.io import load_json, published_digest_of
    from trainmap.portable import environment_differences, numeric_environment

    published = published_digest_of(REPO_ROOT / "config/smoke.yaml")
    monkeypatch.chdir(smoke_run)
    check = check_digest(published, "results")
    machine = environment_differences(load_json(environment_path(published), timing=False),
                                      numeric_environment())  # fmt: skip
    report = "\n".join(check.lines())
    if not machine:
        assert check.matches, report
    else:
        assert check.matches or (check.environment and check.origins.lines()), report


def test_the_answer_blocks_are_written_from_the_results_and_checked(smoke_run: Path, tmp_path):
    """`python -m trainmap.findings answers` writes each comparison's answer (start, where, path)
    between the generated block's lines of each file, leaves the rest, and `--check` says when a
    block differs; a file without a block is named."""
    import sys

    from conftest import run_command

    from trainmap.findings import BLOCK_END, BLOCK_START

    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nBefore.\n\n{BLOCK_START}\nstale words\n{BLOCK_END}\n\nAfter.\n")
    python = [sys.executable, "-m", "trainmap.findings", "answers", "results"]
    stale = run_command([*python, str(readme), "--check"], cwd=smoke_run, check=False)
    assert stale.returncode == 1 and "Answers differ" in stale.stdout
    run_command([*python, str(readme)], cwd=smoke_run)
    text = readme.read_text()
    assert text.startswith("# Title\n\nBefore.") and text.endswith("After.\n")
    assert "stale words" not in text
    assert "- `parity_init`, **gradinit vs kaiming**: start:" in text
    assert run_command([*python, str(readme), "--check"], cwd=smoke_run).returncode == 0
    bare = tmp_path / "bare.md"
    bare.write_text("no block\n")
    refused = run_command([*python, str(bare)], cwd=smoke_run, check=False)
    assert refused.returncode == 2 and "bare.md: no generated block" in refused.stderr


def test_findings_of_a_tree_without_comparisons_name_the_fix(tmp_path):
    import sys

    from conftest import run_command

    refused = run_command([sys.executable, "-m", "trainmap.findings", "write",
                           str(tmp_path / "page.md"), str(tmp_path)], cwd=tmp_path, check=False)  # fmt: skip
    assert refused.returncode == 2
    assert "no joint comparison's results" in refused.stderr and "make run" in refused.stderr
    assert not (tmp_path / "page.md").exists()


def test_a_grid_past_the_free_disk_is_refused_before_any_job(tmp_path):
    """A plain ``snakemake`` run (not ``make run``) of a grid that would write more than the
    results' disk holds stops in its onstart, naming the size, the disk and the key."""
    import shutil

    from conftest import copy_workflow

    workdir = copy_workflow(tmp_path / "project")
    per_seed = 2001 * 4 * 2000**2  # 2001 float32 checkpoints of a 2000 x 2000 hidden layer
    seeds = list(range(int(2 * shutil.disk_usage(workdir).free / per_seed) + 1))
    (workdir / "big.yaml").write_text(
        "results: results-big\n"
        f"grid: [{{task: sparse_parity, archs: [mlp], methods: [kaiming], seeds: {seeds}}}]\n"
        "model: {sparse_parity: {mlp: {hidden: [2000, 2000]}}}\n"
        "train: {sparse_parity: {steps: 20000, checkpoint_every: 10, seed_block: 1,\n"
        "                        archive: {schedule: all}}}\n"
    )
    refused = snakemake("--cores", "1", "--configfile", "big.yaml", cwd=workdir, check=False)
    assert refused.returncode == 1, refused.stderr
    assert "error: the plan does not fit: disk: the grid writes " in refused.stderr, refused.stderr
    assert "GB free" in refused.stderr and "train.sparse_parity.archive" in refused.stderr
    assert "nothing ran" in refused.stderr and not (workdir / "results-big").exists()
