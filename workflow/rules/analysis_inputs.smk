# The training-map groups and joint comparisons, and the analysis rules' input, params and
# resources functions and report labels (rules in analysis.smk).

from trainmap.io import load_json

#: Training-map groups: (task, arch, method) -> their cells.
HMM_GROUPS = grid.analysis_groups(config)
#: Joint comparisons: name -> the grid's cells they pool.
JOINT_COMPARISONS = grid.joint_comparisons(config)
JOINT_SPECS = {
    spec["name"]: spec for spec in grid.analysis_settings(config).get("joint", [])
}
ADAPTIVE_NAMES = grid.names_regex(ADAPTIVE)


def group_cells(wildcards):
    """The cells of one training-map group."""
    return HMM_GROUPS[f"{wildcards.task}/{wildcards.arch}/{wildcards.method}"]


def joint_cells(wildcards):
    """A joint comparison's cells: the grid's, or an adaptive round's (rule joint_round), whose
    seeds grow by round; none for the final rule of an adaptive comparison (its rounds did the
    analysis)."""
    name = wildcards.name
    if "round" in wildcards.keys():
        return ADAPTIVE[name].cells(JOINT_COMPARISONS[name], int(wildcards.round))
    return [] if name in ADAPTIVE else JOINT_COMPARISONS[name]


def grid_cells_of_joint(wildcards):
    """The grid's cells of a joint comparison (its rounds' added seeds left out)."""
    return JOINT_COMPARISONS.get(wildcards.name, [])


@input_function
def adaptive_round_of_joint(wildcards):
    """What a round of an adaptive comparison needs to decide whether to stop (rule joint_round)."""
    return ADAPTIVE[wildcards.name].round_params(int(wildcards.round))


@input_function
def is_adaptive_joint(wildcards):
    return wildcards.name in ADAPTIVE


@input_function
def settings_of_joint(wildcards):
    """A joint comparison's analysis settings (its own ``analysis`` entry over ``analysis``)."""
    return grid.joint_settings(config, wildcards.name)


@input_function
def settings_of_round(wildcards):
    """The analysis settings of an adaptive round: the comparison's, with its stability targets."""
    return (
        grid.joint_settings(config, wildcards.name) | ADAPTIVE[wildcards.name].targets
    )


@input_function
def adaptive_trace_of_joint(wildcards):
    """An adaptive comparison's trace of rounds (rule adaptive_rounds), none for a fixed one."""
    if wildcards.name not in ADAPTIVE:
        return []
    return [f"{RESULTS}/joint/{wildcards.name}/adaptive.json"]


@input_function
def rounds_of_joint(wildcards):
    """An adaptive comparison's round decisions, round 0 on, up to the one that stopped: each
    round is a checkpoint, so Snakemake runs the next only when the last one asked for it.
    """
    if wildcards.name not in ADAPTIVE:
        return []
    decisions = []
    for round_ in range(ADAPTIVE[wildcards.name].rounds + 1):
        job = checkpoints.joint_round.get(name=wildcards.name, round=round_)
        decisions.append(job.output.decision)
        if load_json(job.output.decision)["stop"]:
            break
    return decisions


@input_function
def external_runs_of_joint(wildcards):
    """The external runs a joint comparison pools: set, run id, metric table, evaluation."""
    spec = JOINT_SPECS[wildcards.name]
    return [
        {
            "set": name,
            "run": run,
            "metrics": external_run_file(name, run, "metrics.csv"),
            "evaluation": external_run_file(name, run, "evaluation.json"),
        }
        for name in grid.joint_external_sets(spec)
        for run in EXTERNAL_RUNS[name]
    ]


@input_function
def external_manifests_of_joint(wildcards):
    return [
        f"{RESULTS}/external/{name}/metrics.json"
        for name in grid.joint_external_sets(JOINT_SPECS[wildcards.name])
    ]


# The report's category of the joint comparisons, first in its menu; within a comparison the
# report sorts its results by label, so each label starts with its place on the page: the
# answers (stability line and verdict table) first, then the map, occupancy, stability and the rest.
ANSWERS = "Answers"


def answer_labels(place, item):
    """A joint comparison's report labels: the comparison, and the item with its place."""
    return {"comparison": "{name}", "item": f"{place}. {item}"}


def analysis_outputs():
    """Every trained run's metric tables (as block manifests), and the grid's training maps,
    regressions and joint comparisons; the external sets' tables and maps (external.smk).
    """
    files = BLOCKS["collect_metrics"].grid_manifests()
    for group in HMM_GROUPS:
        # hmm.npz too: a killed (forced) fit's missing model is refitted by a plain run, and the
        # map and regression after it (else Snakemake keeps the old ones).
        files += [
            f"{RESULTS}/hmm/{group}/{name}"
            for name in ("hmm.npz", "map.json", "detours.json")
        ]
    files += [f"{RESULTS}/joint/{name}/joint.json" for name in JOINT_COMPARISONS]
    return files + external_outputs()
