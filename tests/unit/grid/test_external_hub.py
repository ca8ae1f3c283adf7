"""config key external with a hub: form: a checkpoint suite in the local Hugging Face cache as a
run set. The config check resolves it once into results/external/<name>/revisions.json and later
checks read that file alone (untouched, its modification time too) until the settings change; the
run ids, input files and memory come from it; the metric job writes what ``trainmap map hf://...``
writes; each bad setting is refused naming its key and the fix."""

from __future__ import annotations

import inspect
import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO_ROOT

from trainmap.dynamics.runs import hub as hub_module
from trainmap.dynamics.runs.hub import MANIFEST_FILE, HubCacheError, read_manifest, write_manifest
from trainmap.grid import ConfigError, load_config
from trainmap.grid.external import (
    EXTERNAL_BASE_MB,
    EXTERNAL_DEFAULTS,
    check_external,
    external_metrics_memory_mb,
    external_runs,
    external_set,
    memory_mb,
)

from ..dynamics.runs.test_hub_cache import (
    SHAPES,
    add_checkpoint,
    add_revision,
    sharded_files,
    weights,
)

SUITE = "EleutherAI/pythia-14m-seed{seed}"
RUNS = ["pythia-14m-seed1", "pythia-14m-seed2", "pythia-14m-seed3"]


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    """PolyPythias in small: a repository per seed 1-3, branches step0, step100 and step200."""
    cache = tmp_path / "hub"
    for seed in (1, 2, 3):
        for revision in ("step0", "step100", "step200"):
            add_checkpoint(cache, SUITE.format(seed=seed), revision)
    return cache


def hub_config(cache: Path, **hub: object) -> dict:
    """A config holding one hub set named suite (the results root is the schema's default)."""
    return {"external": [{"name": "suite", "hub": {"repo": SUITE, "seeds": "1-3",
                                                   "cache": str(cache), **hub}}]}  # fmt: skip


def manifest_path(project: Path) -> Path:
    return project / "results" / "external" / "suite" / MANIFEST_FILE


def test_the_check_resolves_a_suite_once_and_the_workflow_reads_only_its_manifest(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = hub_config(cache)
    check_external(config, tmp_path)
    path = manifest_path(tmp_path)
    manifest = read_manifest(path)
    assert list(manifest.runs) == RUNS
    assert all(list(steps) == [0, 100, 200] for steps in manifest.runs.values())
    assert manifest.spec is not None and manifest.spec.seeds == (1, 2, 3)

    # Up to date: neither resolved again nor rewritten; runs, inputs and memory from the file.
    stamp = path.stat().st_mtime_ns
    monkeypatch.setattr(hub_module, "resolve_hub_runs", lambda spec: pytest.fail("resolved again"))
    check_external(config, tmp_path)
    suite = external_set(config, config["external"][0], tmp_path)
    assert path.stat().st_mtime_ns == stamp
    assert list(suite.runs) == RUNS
    assert suite.runs["pythia-14m-seed2"] == f"hf://{SUITE}/pythia-14m-seed2"
    inputs = suite.inputs()
    snapshots = [str(c.snapshot / "model.safetensors") for steps in manifest.runs.values()
                 for c in steps.values()]  # fmt: skip
    assert inputs == {"files": snapshots, "hub": str(path)}
    largest = max(Path(file).stat().st_size for file in snapshots)
    assert suite.memory_mb() == memory_mb(largest) > EXTERNAL_BASE_MB
    monkeypatch.undo()

    # Changed settings (the same seeds written otherwise change nothing): resolved again.
    check_external(hub_config(cache, seeds=[1, 2, 3]), tmp_path)
    assert path.stat().st_mtime_ns == stamp
    check_external(hub_config(cache, steps="0-100"), tmp_path)
    assert all(list(steps) == [0, 100] for steps in read_manifest(path).runs.values())


def test_a_cache_cleaned_since_is_resolved_again_or_refused_naming_the_revision(
    cache: Path, tmp_path: Path
) -> None:
    config = hub_config(cache)
    check_external(config, tmp_path)
    checkpoint = read_manifest(manifest_path(tmp_path)).runs["pythia-14m-seed2"][100]
    blob = (checkpoint.snapshot / "model.safetensors").resolve()
    data = blob.read_bytes()
    blob.unlink()
    with pytest.raises(ConfigError, match=r"config key external\[0\]\.hub: EleutherAI/pythia-14m-"
                       r"seed2 revision step100: model.safetensors links to a deleted blob .*"
                       "hf download EleutherAI/pythia-14m-seed2 --revision step100"):  # fmt: skip
        check_external(config, tmp_path)
    blob.write_bytes(data)  # downloaded again
    check_external(config, tmp_path)
    assert read_manifest(manifest_path(tmp_path)).runs["pythia-14m-seed2"][100].files


@pytest.mark.parametrize(
    ("hub", "extra", "message"),
    [
        ({"seeds": "1-3,7"}, {}, r"config key external\[0\]\.hub: EleutherAI/pythia-14m-seed7: "
         r"not in the Hugging Face cache .*hf download EleutherAI/pythia-14m-seed7 --revision "
         "step0"),
        ({"steps": "0,300"}, {}, r"config key external\[0\]\.hub: EleutherAI/pythia-14m-seed1: "
         r"steps 300 not in the cache \(cached steps: 0, 100, 200\)"),
        ({"repo": "EleutherAI/pythia-14m-seed1", "seeds": None}, {},
         r"config key external\[0\]\.hub: EleutherAI/pythia-14m-seed1 gives 1 run "
         r"\(pythia-14m-seed1\); a training map needs at least 2"),
        ({"steps": "9-1"}, {}, r"config key external\[0\]\.hub: hub steps '9-1': '9-1' ends "
         "before it starts"),
        ({}, {"threshold": 0.5}, r"config key external\[0\]\.threshold: a suite ships no curve.*"
         "give curves"),
        ({}, {"threshold": 2.5}, r"config key external\[0\]\.threshold: 2\.5 is above 1, but "
         "test_acc is a fraction"),
        ({}, {"evaluation": "eval.csv"}, r"config key external\[0\]\.evaluation: a hub set has no "
         "use for evaluation"),
        ({}, {"curves": "curves", "threshold": 0.5}, r"config key external\[0\]\.curves: "
         r".*pythia-14m-seed1\.csv: missing"),
    ],
)  # fmt: skip
def test_bad_hub_sets_are_refused_naming_the_key(cache: Path, tmp_path: Path, hub: dict,
                                                 extra: dict, message: str) -> None:  # fmt: skip
    config = hub_config(cache, **hub)
    settings = config["external"][0]
    settings["hub"] = {key: value for key, value in settings["hub"].items() if value is not None}
    settings.update(extra)
    with pytest.raises(ConfigError, match=message):
        check_external(config, tmp_path)


def test_without_huggingface_hub_the_check_says_which_extra_in_one_line(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [m for m in sys.modules if m.split(".")[0] == "huggingface_hub"]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ConfigError) as raised:
        check_external(hub_config(cache), tmp_path)
    assert str(raised.value) == (
        "config key external[0].hub: reading checkpoint suites from the Hugging Face cache needs "
        "huggingface_hub: pip install 'trainmap[hub]'"
    )


def test_the_schema_takes_runs_or_hub_and_fills_no_default_into_the_settings(
    cache: Path, tmp_path: Path
) -> None:
    """Through the whole config check: a hub set with a loss threshold and curves is accepted as
    written (the schema's defaults are read where they are used, not added to the settings);
    runs and hub together, or neither, and a malformed seeds string are refused."""

    def load(external: str) -> dict:
        (tmp_path / "c.yaml").write_text(f"dvc: {{configfile: c.yaml}}\nexternal: {external}\n")
        return load_config(REPO_ROOT / "params.yaml", REPO_ROOT / "config/config.yaml",
                           tmp_path / "c.yaml", check_paths_from=tmp_path)  # fmt: skip

    curves = tmp_path / "curves"
    curves.mkdir()
    for run in RUNS:
        (curves / f"{run}.csv").write_text("step,test_loss\n0,6.0\n100,3.5\n200,2.5\n")
    hub = f'{{repo: "{SUITE}", seeds: 1-3, cache: hub}}'
    config = load(f"[{{name: suite, hub: {hub}, curves: curves, threshold: 3.0, "
                  "curve: test_loss, direction: falling}]")  # fmt: skip
    assert config["external"][0]["hub"] == {"repo": SUITE, "seeds": "1-3", "cache": "hub"}
    assert list(read_manifest(manifest_path(tmp_path)).runs) == RUNS
    for external, key in (
        (
            f'[{{name: suite, hub: {hub}, runs: ["r*"]}}]',
            r"external\[0\]: give exactly one of runs, hub \(it has both runs and hub\)",
        ),
        ("[{name: suite}]", r"external\[0\]: give exactly one of runs, hub \(it has neither\)"),
        ('[{name: suite, hub: {repo: "a/b{seed}", seeds: "1-x"}}]', r"external\[0\]\.hub\.seeds"),
    ):
        with pytest.raises(ConfigError, match=f"config key {key}"):
            load(external)


def test_a_sharded_checkpoint_counts_its_shards_together_in_the_jobs_memory(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "hub"
    for seed in (1, 2):
        repo = f"EleutherAI/pythia-sharded-seed{seed}"
        add_revision(cache, repo, "step0", sharded_files(weights(repo, "step0")))
    config = {"external": [{"name": "suite", "hub": {
        "repo": "EleutherAI/pythia-sharded-seed{seed}", "seeds": [1, 2], "cache": str(cache)}}]}  # fmt: skip
    suite = external_set(config, config["external"][0], tmp_path)
    (checkpoint,) = suite.hub.runs["pythia-sharded-seed2"].values()
    sizes = [(checkpoint.snapshot / name).stat().st_size for name in checkpoint.files]
    assert len(sizes) == 3 and sum(sizes) > max(sizes)
    assert suite.memory_mb() == memory_mb(sum(sizes))
    assert set(suite.inputs()["files"]) >= {str(checkpoint.snapshot / n) for n in checkpoint.files}


def write_two_runs(directory: Path) -> None:
    """Runs ``a`` and ``b`` under ``directory``: two checkpoints and an evaluation each."""
    import torch

    for run in ("a", "b"):
        folder = directory / run
        folder.mkdir(parents=True)
        for step in (0, 10):
            torch.save({"l1.weight": torch.randn(8, 4)}, folder / f"step_{step}.pt")
        (folder / "evaluation.csv").write_text("step,test_acc\n0,0.5\n10,0.9\n")


def test_a_runs_set_reads_as_before(tmp_path: Path) -> None:
    """A set of run directories: its runs, inputs and memory as before the hub form."""

    from trainmap.dynamics.runs.external import run_files

    write_two_runs(tmp_path / "runs")
    spec = {"name": "plain", "runs": ["runs/*"], "threshold": 0.8}
    plain = external_set({"external": [spec]}, spec, tmp_path)
    assert plain.runs == external_runs(spec, tmp_path) and plain.hub is None
    assert plain.inputs() == {"files": [str(p) for run_dir in plain.runs.values()
                                        for p in run_files(run_dir)]}  # fmt: skip
    assert plain.memory_mb() == external_metrics_memory_mb(plain.runs)


def test_a_run_matched_by_two_patterns_counts_once_with_one_warning(tmp_path: Path) -> None:
    """Two patterns of one set matching one run directory (``runs/*`` and ``*/a``): the run is
    counted once, and the config check names it and both patterns in one warning."""

    write_two_runs(tmp_path / "runs")
    spec = {"name": "plain", "runs": ["runs/*", "*/a"]}
    assert external_runs(spec, tmp_path) == {
        "a": str((tmp_path / "runs" / "a").resolve()),
        "b": str((tmp_path / "runs" / "b").resolve()),
    }
    with pytest.warns(UserWarning) as caught:
        check_external({"external": [spec]}, tmp_path)
    assert [str(w.message) for w in caught] == [
        f"config key external[0].runs: run a ({(tmp_path / 'runs' / 'a').resolve()}) of set "
        "'plain' is matched by patterns 'runs/*' and '*/a' (counted once); drop or narrow a "
        "pattern if each was meant to match other runs"
    ]


def test_the_job_writes_the_command_lines_tables_and_records_the_criterion(
    cache: Path, tmp_path: Path
) -> None:
    """external_metrics_job on a hub set: the metric tables ``trainmap map hf://... --metrics-only``
    writes; without a threshold the records say there is no criterion; with curves, a loss
    threshold and falling, each run's convergence step on that loss."""
    from trainmap.dynamics.__main__ import main
    from trainmap.jobs.external import external_metrics_job

    main([f"hf://{SUITE}", "--seeds", "1-3", "--hf-cache", str(cache), "--out",
          str(tmp_path / "cli"), "--metrics-only"])  # fmt: skip
    config = hub_config(cache)
    check_external(config, tmp_path)
    suite = external_set(config, config["external"][0], tmp_path)
    tracking = {"uri": f"sqlite:///{tmp_path / 'mlflow.db'}", "experiment": "hub"}
    out = tmp_path / "job"
    external_metrics_job("suite", suite.runs, out, out / "metrics.json", tracking,
                         hub=suite.inputs()["hub"])  # fmt: skip
    for run in RUNS:
        pd.testing.assert_frame_equal(pd.read_csv(out / "runs" / run / "metrics.csv"),
                                      pd.read_csv(tmp_path / "cli/metrics" / run / "metrics.csv"))  # fmt: skip
        record = json.loads((out / "runs" / run / "evaluation.json").read_text())
        assert (record["convergence_step"], record["converged"], record["curve"]) == (None,) * 3
        assert record["directory"] == f"hf://{SUITE}/{run}"

    curves = tmp_path / "curves"
    curves.mkdir()
    losses = {"pythia-14m-seed1": (6.0, 3.5, 2.9), "pythia-14m-seed2": (6.0, 5.0, 4.0),
              "pythia-14m-seed3": (6.0, 2.5, 2.0)}  # fmt: skip
    for run, values in losses.items():
        rows = "".join(f"{step},{loss}\n" for step, loss in zip((0, 100, 200), values, strict=True))
        (curves / f"{run}.csv").write_text("step,test_loss\n" + rows)
    files = [str(curves / f"{run}.csv") for run in reversed(RUNS)]  # matched by name, not order
    external_metrics_job("suite", suite.runs, out, out / "metrics.json", tracking,
                         hub=suite.inputs()["hub"], curves=files, threshold=3.0,
                         curve="test_loss", direction="falling")  # fmt: skip
    records = json.loads((out / "metrics.json").read_text())["runs"]
    assert {run: r["convergence_step"] for run, r in records.items()} == {
        "pythia-14m-seed1": 200, "pythia-14m-seed2": None, "pythia-14m-seed3": 100}  # fmt: skip
    assert {(r["curve"], r["direction"], r["threshold"]) for r in records.values()} == {
        ("test_loss", "falling", 3.0)}  # fmt: skip
    table = pd.read_csv(out / "runs" / "pythia-14m-seed1" / "metrics.csv")
    assert list(table["test_loss"]) == [6.0, 3.5, 2.9]


def test_the_curve_settings_are_the_codes_and_the_jobs_defaults_the_schemas() -> None:
    from trainmap.dynamics.metrics.columns import CURVES, DIRECTIONS
    from trainmap.jobs.external import external_map_job, external_metrics_job
    from trainmap.schema import config_schema

    item = config_schema()["properties"]["external"]["items"]["properties"]
    assert tuple(item["curve"]["enum"]) == CURVES and tuple(item["direction"]["enum"]) == DIRECTIONS
    job = inspect.signature(external_metrics_job).parameters
    job = {**job, **inspect.signature(external_map_job).parameters}
    assert {key: job[key].default for key in EXTERNAL_DEFAULTS} == EXTERNAL_DEFAULTS
    assert (
        hub_module.DEFAULT_REVISION_PATTERN
        == item["hub"]["properties"]["revision_pattern"]["default"]
    )


def test_a_fetched_set_reads_only_the_manifest_trainmap_resolve_wrote(tmp_path: Path) -> None:
    """hub.fetch: the check lists nothing on the Hub; a set not resolved yet, resolved from the
    cache, or resolved from other settings is refused naming the command; once resolved, its
    runs come in blocks of revisions_per_job and its memory from the headers' sizes."""
    pytest.importorskip("huggingface_hub")
    from hub_server import HubServer

    from trainmap.grid.external import UnresolvedSuite
    from trainmap.grid.external_hub import resolve_fetched_sets

    from ..dynamics.runs.test_hub_fetch import suite

    config = {"external": [{"name": "suite", "hub": {
        "repo": "EleutherAI/pythia-tiny-seed{seed}", "seeds": "1-2", "steps": "0-2",
        "fetch": True, "revisions_per_job": 2, "cache": str(tmp_path / "hub")}}]}  # fmt: skip
    with pytest.raises(UnresolvedSuite, match=r"external\[0\]\.hub: .*not resolved yet; run "
                       r"`trainmap resolve --configfile CONFIG --set suite` first"):  # fmt: skip
        check_external(config, tmp_path)
    with HubServer(suite()) as server:
        resolved = resolve_fetched_sets(config, tmp_path, endpoint=server.endpoint)
        assert resolved["suite"][1] is True
        assert resolve_fetched_sets(config, tmp_path, endpoint=server.endpoint)["suite"][1] is False
        with pytest.raises(HubCacheError, match=r"--set other: no fetched set of that name"):
            resolve_fetched_sets(config, tmp_path, ["other"], server.endpoint)
        served = len(server.log)
        check_external(config, tmp_path)
        external = external_set(config, config["external"][0], tmp_path)
        assert len(server.log) == served, "the check reached the Hub"
    assert external.fetched and external.inputs() == {
        "files": [],
        "hub": str(manifest_path(tmp_path)),
    }
    assert external.blocks == {
        "pythia-tiny-seed1": [[0, 1], [2]],
        "pythia-tiny-seed2": [[0, 1], [2]],
    }
    sizes = [c.size for steps in external.hub.runs.values() for c in steps.values()]
    assert all(size == 4 * sum(math.prod(shape) for shape in SHAPES.values()) for size in sizes)
    assert external.memory_mb() == memory_mb(max(sizes))
    # Another step range in the config: the manifest is refused, naming what differs.
    config["external"][0]["hub"]["steps"] = "0-1"
    with pytest.raises(UnresolvedSuite, match=r"no longer matches the config \(steps: \(\(0, 2\),\) "
                       r"there, \(\(0, 1\),\) in the config\); run `trainmap resolve"):  # fmt: skip
        check_external(config, tmp_path)
    # A manifest resolved from the cache is not a fetched one.
    config["external"][0]["hub"]["steps"] = "0-2"
    manifest = read_manifest(manifest_path(tmp_path))
    write_manifest(replace(manifest, fetch_from=None), manifest_path(tmp_path))
    with pytest.raises(
        UnresolvedSuite,
        match=r"no longer matches the config \(it is not a fetched suite's manifest\); run `trainmap resolve",
    ):
        check_external(config, tmp_path)
