"""Adaptive seeds: a joint comparison grows by rounds until its stability curve
meets the target, checked on the grid model, the round decision, bad settings, and a real
Snakemake run on a small grid."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import copy_workflow, snakemake

from trainmap.dynamics.verdicts.adaptive import adaptive_trace, round_decision
from trainmap.dynamics.verdicts.stability_results import MapStability, StabilityCurve
from trainmap.grid import (
    Cell,
    ConfigError,
    adaptive_cells,
    adaptive_joints,
    load_config,
    round_ranges,
)

SMALL = {
    "grid": [{"task": "sparse_parity", "archs": ["mlp"], "methods": ["kaiming", "gradinit"],
              "seeds": [0, 1, 2, 3]}],
    "train": {"sparse_parity": {"steps": 800, "checkpoint_every": 20, "resume_every": 400,
                                "seed_block": 4}},
    "gradinit": {"sparse_parity": {"iterations": 10}},
    "quantize": {"methods": []},
    "analysis": {"group_maps": "none", "bootstrap": 10, "permutations": 200, "stability": 4,
                 "selection": "holdout",  # the rounds are under test, not the rule: the cheapest
                 "stability_step": 2,
                 "joint": [{"name": "parity_init", "task": "sparse_parity", "archs": ["mlp"],
                            "methods": ["kaiming", "gradinit"],
                            "adaptive": {"step": 2, "max": 8, "ari": 1.0, "share": 1.0}}]},
    "evaluate": {"sparse_parity": {"latency_repeats": 3}},
    "mlflow": {"experiment": "trainmap-adaptive"},
}  # fmt: skip


def small_config(repo_root: Path, tmp_path: Path, **adaptive) -> dict:
    config = json.loads(json.dumps(SMALL))
    config["analysis"]["joint"][0]["adaptive"] |= adaptive
    path = tmp_path / "adaptive.yaml"
    path.write_text(yaml.safe_dump(config))
    return load_config(repo_root / "params.yaml", repo_root / "config/config.yaml", path,
                       check_paths_from=repo_root)  # fmt: skip


def test_rounds_add_the_same_new_seeds_to_every_method(repo_root, tmp_path):
    config = small_config(repo_root, tmp_path)
    joint = adaptive_joints(config)["parity_init"]
    assert (joint.base_n, joint.first_seed, joint.rounds) == (4, 4, 2)  # 4 -> 6 -> 8 per method
    assert [joint.seeds_per_method(r) for r in range(3)] == [4, 6, 8]
    assert joint.added_cells(2) == [Cell("sparse_parity", "mlp", m, s)
                                    for m in ("gradinit", "kaiming") for s in (6, 7)]  # fmt: skip
    joints = adaptive_joints(config)
    assert len(joint.cells([], 2)) == 8 and len(adaptive_cells(joints)) == 8
    # One block per (method, round): adding round 2 never retrains round 1's seeds.
    names = sorted(block.name for block in round_ranges(config, adaptive_cells(joints), joints))
    assert names == ["seeds4-5", "seeds4-5", "seeds6-7", "seeds6-7"]
    assert joint.targets == {"stability_ari": 1.0, "stability_share": 1.0}
    # A maximum that is not a whole number of steps stops at the last round under it.
    assert adaptive_joints(small_config(repo_root, tmp_path, max=9))["parity_init"].rounds == 2


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"step": 0}, r"analysis.joint\[0\].adaptive.step"),
        ({"max": 3}, "analysis.joint\\[0\\].adaptive.max: 3 is below the 4 seeds per method"),
        ({"ari": 1.5}, r"analysis.joint\[0\].adaptive.ari"),
        ({"share": 0}, r"analysis.joint\[0\].adaptive.share"),
    ],
)
def test_bad_adaptive_settings_are_refused_naming_the_key(repo_root, tmp_path, change, message):
    with pytest.raises(ConfigError, match=message):
        small_config(repo_root, tmp_path, **change)


def test_adaptive_needs_the_stability_curve(repo_root, tmp_path):
    config = json.loads(json.dumps(SMALL))
    config["analysis"]["stability"] = 0
    path = tmp_path / "off.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(
        ConfigError, match=r"adaptive: adaptive seeds stop .* analysis.stability is 0"
    ):
        load_config(repo_root / "params.yaml", repo_root / "config/config.yaml", path,
                    check_paths_from=repo_root)  # fmt: skip


#: Round 0 of a comparison with 4 grid seeds per method, step 2, max 8 (rounds 0, 1, 2).
ROUND_0 = {"round": 0, "rounds": 2, "step": 2, "max": 8, "seeds_per_method": 4, "first_seed": 4,
           "task": "sparse_parity"}  # fmt: skip


def curve(sufficient: int | None) -> MapStability:
    ks = [2, 2]  # a map of two states: one of one state is never stable by itself
    summary = {"targets": {"ari": 0.9, "share": 0.9, "require_k": False}, "full_n": 8,
               "n_states": 2, "detour_states": [], "max_fraction": 0.8, "groups": ["a", "b"],
               "seed": 0, "points": [{"n": 4, "ks": ks, "detour_found": {},
                                      "ari": [1.0, 1.0] if sufficient else [0.1, 0.1]}]}  # fmt: skip
    return MapStability(StabilityCurve.from_dict(summary))


def test_a_round_stops_when_stable_at_the_maximum_or_unmeasured():
    state = dict(ROUND_0)
    assert round_decision(curve(4), state)["stop"]
    going = round_decision(curve(None), state)
    assert not going["stop"] and "round 1 adds 2 more" in going["reason"]
    last = round_decision(curve(None), state | {"round": 2, "seeds_per_method": 8})
    assert last["stop"] and last["reason"].startswith("maximum reached: 8 seeds per method")
    unmeasured = round_decision(MapStability(None, "analysis.stability is 0"), state)
    assert unmeasured["stop"] and unmeasured["reason"].startswith("stability not measured")
    trace = adaptive_trace([going, last | {"round": 2}])
    assert trace["seeds_added"] == [4, 5, 6, 7] and not trace["stable"]
    assert [r["seeds_per_method"] for r in trace["rounds"]] == [4, 8]


def test_the_trace_refuses_rounds_that_did_not_stop():
    state = dict(ROUND_0)
    with pytest.raises(ValueError, match="the last round did not stop"):
        adaptive_trace([round_decision(curve(None), state)])


@pytest.mark.integration  # runs the workflow round by round (Snakemake, minutes)
def test_an_adaptive_comparison_adds_seeds_until_it_stops(repo_root, tmp_path):
    """4 seeds per method are not enough for the stability target (ARI 1 in every subsample, every
    followed verdict held again in every one), so round 0 asks for more; the rounds go on until one meets the target or the maximum (8 per method, round 2)
    is reached. Only the seeds of the rounds reached train, a rerun does nothing, and the trace is
    in adaptive.json, joint.json and verdicts.md. The comparison is first run fixed: made
    adaptive, its existing results do not stand in for the rounds."""
    root = copy_workflow(tmp_path / "wf")
    fixed = json.loads(json.dumps(SMALL))
    del fixed["analysis"]["joint"][0]["adaptive"]
    (root / "fixed.yaml").write_text(yaml.safe_dump(fixed))
    snakemake("--cores", "2", "--configfile", "fixed.yaml", cwd=root, timeout=1200)
    assert "adaptive" not in json.loads((root / "results/joint/parity_init/joint.json").read_text())
    (root / "adaptive.yaml").write_text(yaml.safe_dump(SMALL))
    snakemake("--cores", "2", "--configfile", "adaptive.yaml", cwd=root, timeout=1200)
    rounds = root / "results/joint/parity_init/rounds"
    reached = sorted(int(path.name[len("round") :]) for path in rounds.iterdir())
    decisions = [json.loads((rounds / f"round{r}/round.json").read_text()) for r in reached]
    assert reached == list(range(len(reached))) and 2 <= len(reached) <= 3
    assert "round 1 adds 2 more" in decisions[0]["reason"], decisions[0]
    # Every round but the last asked for the next; the last stopped, stable or at the maximum.
    assert [d["stop"] for d in decisions] == [False] * (len(reached) - 1) + [True]
    final, n = reached[-1], 4 + 2 * reached[-1]
    stable = decisions[-1]["reason"].startswith("stable: ")  # stable from n, or one state whose
    # verdicts hold again
    assert stable or (final == 2 and decisions[-1]["reason"].startswith("maximum reached"))
    seeds = [f"seed{s}" for s in range(n)]
    blocks = ["seeds0-3.json"] + [f"seeds{4 + 2 * r}-{5 + 2 * r}.json" for r in range(final)]
    trained = sorted(p.name for p in (root / "results/train/sparse_parity/mlp/kaiming").iterdir())
    assert trained == sorted(seeds + blocks)  # only the rounds reached trained
    trace = json.loads((root / "results/joint/parity_init/adaptive.json").read_text())
    assert [r["seeds_per_method"] for r in trace["rounds"]] == [4 + 2 * r for r in reached]
    summary = json.loads((root / "results/joint/parity_init/joint.json").read_text())
    assert summary["adaptive"]["seeds_per_method"] == n == summary["groups"]["kaiming"]["runs"]
    assert summary["adaptive"]["seeds_added"] == list(range(4, n))
    assert summary["adaptive"]["stable"] == stable
    verdicts = (root / "results/joint/parity_init/verdicts.md").read_text().split("\n\n")
    assert verdicts[0] == "**Answer** (start, where the metrics differ, path):"
    line = verdicts.index(f"**Stability:** {decisions[-1]['line']}.")
    assert verdicts[line + 1].startswith(f"**Adaptive seeds:** {n} seeds per method after {final} "
                                  f"round(s) (seeds 4-{n - 1} added); K by round: 4 seeds: K = ")  # fmt: skip
    assert "; stopped because " in verdicts[line + 1]
    assert trace["rounds"][0]["map"] == "first" and "n_states" in trace["rounds"][-1]
    if final:  # each later round says whether its map is the previous one's
        assert trace["rounds"][1]["map"] in ("changed", "unchanged")
    again = snakemake("--cores", "2", "--configfile", "adaptive.yaml", "-n", cwd=root)
    assert "Nothing to be done" in again.stdout + again.stderr


def test_two_adaptive_comparisons_of_one_task_need_one_step(repo_root, tmp_path):
    config = json.loads(json.dumps(SMALL))
    second = config["analysis"]["joint"][0] | {"name": "parity_kaiming", "methods": ["kaiming"],
                                               "adaptive": {"step": 4, "max": 8}}  # fmt: skip
    config["analysis"]["joint"].append(second)
    path = tmp_path / "two.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match=r"analysis.joint\[0\].adaptive.step: 2 differs from "
                                          "adaptive joint comparison 'parity_kaiming'"):  # fmt: skip
        load_config(repo_root / "params.yaml", repo_root / "config/config.yaml", path,
                    check_paths_from=repo_root)  # fmt: skip


def test_each_round_says_whether_more_seeds_changed_the_map(tmp_path):
    from trainmap.dynamics.verdicts.adaptive import adaptive_line, map_changes

    def round_dir(name: str, k: int, states: dict[str, list[int]]) -> str:
        directory = tmp_path / name
        directory.mkdir()
        (directory / "hmm.json").write_text(
            json.dumps({"n_states": k, "estimator": {"reproduce_ari": 0.8}})
        )
        rows = [f"{run},{step * 10},{s}" for run, seq in states.items()
                for step, s in enumerate(seq)]  # fmt: skip
        (directory / "states.csv").write_text("run,step,state\n" + "\n".join(rows) + "\n")
        return str(directory)

    first = {"a": [0, 0, 1, 1], "b": [0, 1, 1, 1]}
    relabelled = {"a": [1, 1, 0, 0], "b": [1, 0, 0, 0], "c": [1, 1, 1, 0]}  # same map, new names
    split = {"a": [0, 2, 1, 1], "b": [0, 1, 1, 2], "c": [0, 0, 1, 2]}  # a third state
    changes = map_changes([round_dir("r0", 2, first), round_dir("r1", 2, relabelled),
                           round_dir("r2", 3, split)])  # fmt: skip
    assert [c["map"] for c in changes] == ["first", "unchanged", "changed"]
    assert changes[1]["ari_with_previous"] == pytest.approx(1.0) and changes[1]["common_runs"] == 2
    assert [c["n_states"] for c in changes] == [2, 2, 3]
    rounds = [{"seeds_per_method": n} | c for n, c in zip((40, 56, 72), changes, strict=True)]
    trace = {"seeds_per_method": 72, "final_round": 2, "seeds_added": list(range(40, 72)),
             "stopped_because": "maximum reached", "rounds": rounds}  # fmt: skip
    line = adaptive_line(trace)
    assert (
        "40 seeds: K = 2, 56 seeds: K = 2 (map unchanged, ARI with the previous map 1.00)" in line
    )
    assert "72 seeds: K = 3 (map changed" in line
