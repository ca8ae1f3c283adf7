"""trainmap.grid.blocks: which seed ranges each block rule runs (the grid's and adaptive rounds'),
where their manifests and per-seed files go, and how a manifest's path leads back to its range."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from trainmap import grid, plan
from trainmap.grid import BLOCK_RULES, Cell, load_config, names_regex, study_blocks

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def smoke() -> dict:
    return load_config(REPO / "params.yaml", REPO / "config/config.yaml",
                       REPO / "config/smoke.yaml", check_paths_from=REPO)  # fmt: skip


@pytest.fixture(scope="module")
def adaptive(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Kaiming and GradInit on sparse parity, 4 grid seeds each, then rounds of 2 seeds up to 8;
    kaiming is quantised."""
    study = {
        "grid": [{"task": "sparse_parity", "archs": ["mlp"], "methods": ["kaiming", "gradinit"],
                  "seeds": [0, 1, 2, 3]}],
        "train": {"sparse_parity": {"steps": 40, "checkpoint_every": 20, "seed_block": 4}},
        "quantize": {"methods": ["kaiming"]},
        "analysis": {"group_maps": "none",
                     "joint": [{"name": "parity_init", "task": "sparse_parity", "archs": ["mlp"],
                                "methods": ["kaiming", "gradinit"],
                                "adaptive": {"step": 2, "max": 8}}]},
    }  # fmt: skip
    path = tmp_path_factory.mktemp("adaptive") / "adaptive.yaml"
    path.write_text(yaml.safe_dump(study))
    return load_config(REPO / "params.yaml", REPO / "config/config.yaml", path,
                       check_paths_from=REPO)  # fmt: skip


def ids(blocks) -> list[str]:
    return list(blocks)


def test_each_block_rule_runs_its_cells_of_the_smoke_grid(smoke: dict) -> None:
    blocks = study_blocks(smoke, "results", grid.expand_grid(smoke), {})
    digits = f"seeds0-{grid.seed_block(smoke, 'digits') - 1}"
    assert list(blocks) == [rule.name for rule in BLOCK_RULES]
    assert ids(blocks["gradinit"]) == ["sparse_parity/mlp/gradinit/seeds0-1"]
    # The dense cells and the kaiming teacher of the sparse cells (digits/vgg_bn/kaiming).
    assert ids(blocks["train"]) == [f"digits/repvgg/kaiming/{digits}",
                                    f"digits/vgg_bn/kaiming/{digits}",
                                    "sparse_parity/mlp/gradinit/seeds0-1",
                                    "sparse_parity/mlp/kaiming/seeds0-1"]  # fmt: skip
    assert ids(blocks["sparse_retrain"]) == [f"digits/vgg_bn/ast/{digits}",
                                             f"digits/vgg_bn/oneshot/{digits}"]  # fmt: skip
    assert ids(blocks["reparam"]) == [f"digits/repvgg/kaiming/{digits}"]
    assert ids(blocks["quantize"]) == [f"digits/vgg_bn/ast/{digits}"]  # quantize.methods: [ast]
    assert len(blocks["evaluate"]) == 6
    # One-shot pruning does not train: no trajectory, no metric table.
    assert f"digits/vgg_bn/oneshot/{digits}" not in blocks["collect_metrics"]
    assert len(blocks["collect_metrics"]) == 5


def test_a_manifest_path_leads_back_to_its_block(smoke: dict) -> None:
    blocks = study_blocks(smoke, "results-x/cpu", grid.expand_grid(smoke), {})
    train = blocks["train"]
    block = train["sparse_parity/mlp/kaiming/seeds0-1"]
    assert train.manifest(block) == "results-x/cpu/train/sparse_parity/mlp/kaiming/seeds0-1.json"
    sparse = blocks["sparse_retrain"]
    assert sparse.manifest(next(iter(sparse.values()))).startswith("results-x/cpu/sparse/")
    for rule_blocks in blocks.values():
        for found in rule_blocks.values():
            assert blocks.of_manifest(rule_blocks.manifest(found)) is found
    assert set(blocks.by_directory()) == {rule.directory for rule in BLOCK_RULES}


def test_runs_teachers_and_per_cell_files(smoke: dict) -> None:
    blocks = study_blocks(smoke, "results", grid.expand_grid(smoke), {})
    digits = f"seeds0-{grid.seed_block(smoke, 'digits') - 1}"
    ast = blocks["evaluate"][f"digits/vgg_bn/ast/{digits}"]
    kaiming = blocks["evaluate"][f"digits/vgg_bn/kaiming/{digits}"]
    assert blocks.run_manifest(ast) == f"results/sparse/digits/vgg_bn/ast/{digits}.json"
    assert blocks.run_manifest(kaiming) == f"results/train/digits/vgg_bn/kaiming/{digits}.json"
    assert blocks.teacher_manifest(ast) == blocks.run_manifest(kaiming)
    assert grid.run_rule_of(ast.cells[0]) == "sparse_retrain"
    assert blocks.run_files([ast.cells[0], kaiming.cells[0]], "history.csv") == [
        "results/sparse/digits/vgg_bn/ast/seed0/history.csv",
        "results/train/digits/vgg_bn/kaiming/seed0/history.csv",
    ]
    assert blocks["collect_metrics"].cell_files([ast.cells[0]], "metrics.csv") == [
        "results/metrics/digits/vgg_bn/ast/seed0/metrics.csv"
    ]


def test_manifests_of_cells_are_their_blocks_once_each_in_block_order(smoke: dict) -> None:
    blocks = study_blocks(smoke, "results", grid.expand_grid(smoke), {})["collect_metrics"]
    cells = [Cell("sparse_parity", "mlp", "kaiming", 1), Cell("digits", "vgg_bn", "oneshot", 0),
             Cell("sparse_parity", "mlp", "gradinit", 0),
             Cell("sparse_parity", "mlp", "kaiming", 0)]  # fmt: skip
    assert blocks.manifests_of_cells(cells) == [
        "results/metrics/sparse_parity/mlp/gradinit/seeds0-1.json",
        "results/metrics/sparse_parity/mlp/kaiming/seeds0-1.json",
    ]  # the one-shot cell has no metrics block: left out


def test_adaptive_rounds_have_blocks_of_their_own_outside_the_targets(adaptive: dict) -> None:
    joints = grid.adaptive_joints(adaptive)
    blocks = study_blocks(adaptive, "results", grid.expand_grid(adaptive), joints)
    grid_ids = ["sparse_parity/mlp/gradinit/seeds0-3", "sparse_parity/mlp/kaiming/seeds0-3"]
    rounds = [f"sparse_parity/mlp/{method}/{name}"
              for method in ("gradinit", "kaiming") for name in ("seeds4-5", "seeds6-7")]  # fmt: skip
    for rule in ("train", "evaluate", "collect_metrics"):
        assert ids(blocks[rule]) == grid_ids + rounds, rule
        assert [block.id for block in blocks[rule].grid] == grid_ids
        assert blocks[rule].grid_manifests() == [f"results/{blocks[rule].rule.directory}/{id}.json"
                                                 for id in grid_ids]  # fmt: skip
    # A round's seeds are never quantised: quantize runs the grid's cells only.
    assert ids(blocks["quantize"]) == ["sparse_parity/mlp/kaiming/seeds0-3"]
    added = blocks["evaluate"]["sparse_parity/mlp/kaiming/seeds6-7"]
    assert blocks.of_manifest(blocks["evaluate"].manifest(added)) is added
    assert joints["parity_init"].round_params(2) == {
        "round": 2, "rounds": 2, "step": 2, "task": "sparse_parity", "max": 8,
        "seeds_per_method": 8, "first_seed": 4,
    }  # fmt: skip


def test_the_plan_runs_the_blocks_the_workflow_runs(smoke: dict) -> None:
    blocks = study_blocks(smoke, "results", grid.expand_grid(smoke), {})
    planned = [(job.rule, job.job) for job in plan.block_jobs(smoke) if job.rule != "data"]
    assert planned == [(name, id) for name, rule_blocks in blocks.items() for id in rule_blocks]


@pytest.mark.parametrize("names", [["a"], ["parity_init", "lr"], []])
def test_names_regex_matches_exactly_the_names(names: list[str]) -> None:
    pattern = re.compile(names_regex(names))
    for candidate in ["a", "parity_init", "lr", "", "parity", "lr_x", "x|a"]:
        assert bool(pattern.fullmatch(candidate)) == (candidate in names), candidate
