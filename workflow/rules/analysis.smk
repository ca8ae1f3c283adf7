# Training maps: each block's metric tables (collect_metrics), a map per (task, arch, method)
# group (fit_hmm, training_map, regress_detours) and joint comparisons of several methods or archs
# (joint_comparison; adaptive ones by rounds: joint_round, adaptive_rounds).
from trainmap.schema import section_defaults

GROUP = "{task}/{arch}/{method}"


rule collect_metrics:
    input:
        run=run_manifest_of_block,
        # The metric definitions are an input: changing them reruns this rule and the analysis
        # after it, never training.
        definitions="src/trainmap/dynamics/metrics/weights.py",
    output:
        manifest=f"{RESULTS}/metrics/{BLOCK}.json",
    log:
        f"logs/collect_metrics/{BLOCK}.log",
    conda:
        "../envs/trainmap.yaml"
    threads: 1
    resources:
        mem_mb=planned("collect_metrics", "mem_mb"),
        runtime=planned("collect_metrics", "runtime"),
    params:
        block=seed_range_of_job,
        cell_hashes=cell_hashes_of_block,
        # paper (the authors' conventions), paper_shortcuts (paper counting ResNet shortcut
        # convs) or extended: trainmap.dynamics.metrics.weights
        convention=grid.analysis_settings(config).get(
            "metrics", section_defaults("analysis")["metrics"]
        ),
        # RepVGG runs: metrics of the training-time branches (train) or of the deploy form (deploy)
        repvgg_weights=grid.analysis_settings(config).get(
            "repvgg_weights", section_defaults("analysis")["repvgg_weights"]
        ),
    script:
        "../scripts/collect_metrics.py"


rule fit_hmm:
    input:
        metrics=of_cells("metric_manifests", group_cells),
        evaluations=of_cells("evaluation_manifests", group_cells),
    output:
        model=f"{RESULTS}/hmm/{GROUP}/hmm.npz",
        meta=f"{RESULTS}/hmm/{GROUP}/hmm.json",
        selection=f"{RESULTS}/hmm/{GROUP}/selection.csv",
        selection_plot=report(
            f"{RESULTS}/hmm/{GROUP}/selection.png",
            caption="../report/selection.rst",
            category="Training maps",
            subcategory=GROUP,
            labels={"group": GROUP, "figure": "model selection"},
        ),
        baselines=f"{RESULTS}/hmm/{GROUP}/baselines.csv",
        states=f"{RESULTS}/hmm/{GROUP}/states.csv",
        state_means=f"{RESULTS}/hmm/{GROUP}/state_means.csv",
        states_plot=report(
            f"{RESULTS}/hmm/{GROUP}/states.png",
            caption="../report/states.rst",
            category="Training maps",
            subcategory=GROUP,
            labels={"group": GROUP, "figure": "state sequences"},
        ),
        bootstrap=f"{RESULTS}/hmm/{GROUP}/bootstrap.json",
        bootstrap_plot=report(
            f"{RESULTS}/hmm/{GROUP}/bootstrap.png",
            caption="../report/bootstrap.rst",
            category="Certainty",
            subcategory=GROUP,
            labels={"group": GROUP, "figure": "bootstrap over runs"},
        ),
        stability=f"{RESULTS}/hmm/{GROUP}/stability.json",
        stability_plot=report(
            f"{RESULTS}/hmm/{GROUP}/stability.png",
            caption="../report/stability.rst",
            category="Certainty",
            subcategory=GROUP,
            labels={"group": GROUP, "figure": "stability over seed counts"},
        ),
    log:
        f"logs/fit_hmm/{GROUP}.log",
    conda:
        "../envs/trainmap.yaml"
    # (K, restart) fits and bootstrap resamples run in parallel processes
    threads: 2
    resources:
        mem_mb=planned("fit_hmm", "mem_mb", group_cells),
        runtime=planned("fit_hmm", "runtime", group_cells),
    params:
        settings=grid.analysis_settings(config),
        group=GROUP,
        cells=of_cells("cells", group_cells),
        metrics=of_cells("metric_tables", group_cells),
        evaluations=of_cells("evaluation_files", group_cells),
    script:
        "../scripts/fit_hmm.py"


rule training_map:
    input:
        model=f"{RESULTS}/hmm/{GROUP}/hmm.npz",
        meta=f"{RESULTS}/hmm/{GROUP}/hmm.json",
        states=f"{RESULTS}/hmm/{GROUP}/states.csv",
        detours=f"{RESULTS}/hmm/{GROUP}/detours.json",
        metrics=of_cells("metric_manifests", group_cells),
        evaluations=of_cells("evaluation_manifests", group_cells),
    output:
        map=f"{RESULTS}/hmm/{GROUP}/map.json",
        png=report(
            f"{RESULTS}/hmm/{GROUP}/map.png",
            caption="../report/training_map.rst",
            category="Training maps",
            subcategory=GROUP,
            labels={"group": GROUP, "figure": "training map"},
        ),
        svg=f"{RESULTS}/hmm/{GROUP}/map.svg",
    log:
        f"logs/training_map/{GROUP}.log",
    conda:
        "../envs/trainmap.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        group=GROUP,
        cells=of_cells("cells", group_cells),
        metrics=of_cells("metric_tables", group_cells),
        evaluations=of_cells("evaluation_files", group_cells),
    script:
        "../scripts/training_map.py"


rule regress_detours:
    input:
        model=f"{RESULTS}/hmm/{GROUP}/hmm.npz",
        meta=f"{RESULTS}/hmm/{GROUP}/hmm.json",
        states=f"{RESULTS}/hmm/{GROUP}/states.csv",
        # how often the bootstrap finds each detour again
        bootstrap=f"{RESULTS}/hmm/{GROUP}/bootstrap.json",
        evaluations=of_cells("evaluation_manifests", group_cells),
    output:
        detours=f"{RESULTS}/hmm/{GROUP}/detours.json",
        coefficients=report(
            f"{RESULTS}/hmm/{GROUP}/coefficients.csv",
            caption="../report/coefficients.rst",
            category="Training maps",
            subcategory=GROUP,
            labels={"group": GROUP, "table": "detour regression"},
        ),
        coefficients_plot=report(
            f"{RESULTS}/hmm/{GROUP}/coefficients.png",
            caption="../report/coefficients_plot.rst",
            category="Training maps",
            subcategory=GROUP,
            labels={"group": GROUP, "figure": "detour regression"},
        ),
        convergence_plot=report(
            f"{RESULTS}/hmm/{GROUP}/convergence.png",
            caption="../report/convergence.rst",
            category="Training maps",
            subcategory=GROUP,
            labels={"group": GROUP, "figure": "convergence steps"},
        ),
    log:
        f"logs/regress_detours/{GROUP}.log",
    conda:
        "../envs/trainmap.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        settings=grid.analysis_settings(config),
        group=GROUP,
        cells=of_cells("cells", group_cells),
        # each cell's parent MLflow run gets its state occupancy
        cell_hashes=of_cells("cell_hashes", group_cells),
        evaluations=of_cells("evaluation_files", group_cells),
    script:
        "../scripts/regress_detours.py"


# An adaptive joint comparison (analysis.joint[i].adaptive) runs in rounds: round r pools the
# grid's seeds and r further steps of seeds per method, and decides (round.json) whether the
# stability target is met or the maximum reached. Each round is a checkpoint: the final
# joint_comparison job below asks for round r + 1 only once round r has asked for it, and then
# presents the last round's comparison with the trace of all rounds.
checkpoint joint_round:
    input:
        metrics=of_cells("metric_manifests", joint_cells),
        evaluations=of_cells("evaluation_manifests", joint_cells),
        external=external_manifests_of_joint,
    output:
        summary=f"{RESULTS}/joint/{{name}}/rounds/round{{round}}/joint.json",
        decision=f"{RESULTS}/joint/{{name}}/rounds/round{{round}}/round.json",
    log:
        "logs/joint_round/{name}/round{round}.log",
    wildcard_constraints:
        name=ADAPTIVE_NAMES,
        round=r"\d+",
    conda:
        "../envs/trainmap.yaml"
    threads: 2
    resources:
        mem_mb=4000,
        runtime=60,
    params:
        settings=settings_of_round,
        adaptive_round=adaptive_round_of_joint,
        groups=of_cells("labels", joint_cells),
        cells=of_cells("cells", joint_cells),
        cell_hashes=of_cells("cell_hashes", joint_cells),
        metrics=of_cells("metric_tables", joint_cells),
        evaluations=of_cells("evaluation_files", joint_cells),
        external=external_runs_of_joint,
    script:
        "../scripts/joint_comparison.py"


# The rounds an adaptive comparison took, up to the one that stopped. Its own file (not one of
# joint_comparison's), so a comparison made adaptive over a fixed one's results walks its rounds
# and reruns joint_comparison: an existing joint.json never stands in for the rounds.
rule adaptive_rounds:
    input:
        rounds=rounds_of_joint,
    output:
        trace=report(
            f"{RESULTS}/joint/{{name}}/adaptive.json",
            caption="../report/adaptive.rst",
            category=ANSWERS,
            subcategory="{name}",
            labels=answer_labels("4", "adaptive seeds: the rounds"),
        ),
    log:
        "logs/adaptive_rounds/{name}.log",
    wildcard_constraints:
        name=ADAPTIVE_NAMES,
    localrule: True
    conda:
        "../envs/trainmap.yaml"
    script:
        "../scripts/adaptive_rounds.py"


rule joint_comparison:
    input:
        metrics=of_cells("metric_manifests", joint_cells),
        evaluations=of_cells("evaluation_manifests", joint_cells),
        external=external_manifests_of_joint,
        adaptive=adaptive_trace_of_joint,
    output:
        summary=f"{RESULTS}/joint/{{name}}/joint.json",
        verdicts_page=report(
            f"{RESULTS}/joint/{{name}}/verdicts.html",
            caption="../report/verdicts_page.rst",
            category=ANSWERS,
            subcategory="{name}",
            labels=answer_labels("1", "the answers: stability line and verdicts"),
        ),
        map=report(
            f"{RESULTS}/joint/{{name}}/map.png",
            caption="../report/joint_map.rst",
            category=ANSWERS,
            subcategory="{name}",
            labels=answer_labels("2", "shared training map"),
        ),
        occupancy=report(
            f"{RESULTS}/joint/{{name}}/occupancy.png",
            caption="../report/joint_occupancy.rst",
            category=ANSWERS,
            subcategory="{name}",
            labels=answer_labels("3", "state occupancy per method"),
        ),
        stability_plot=report(
            f"{RESULTS}/joint/{{name}}/stability.png",
            caption="../report/stability.rst",
            category=ANSWERS,
            subcategory="{name}",
            labels=answer_labels("4", "stability over seed counts"),
        ),
        verdicts_plot=report(
            f"{RESULTS}/joint/{{name}}/verdicts.png",
            caption="../report/verdicts_plot.rst",
            category=ANSWERS,
            subcategory="{name}",
            labels=answer_labels("5", "verdicts per method pair (figure)"),
        ),
        paths_plot=report(
            f"{RESULTS}/joint/{{name}}/paths.png",
            caption="../report/paths_plot.rst",
            category=ANSWERS,
            subcategory="{name}",
            labels=answer_labels("5b", "where the trajectories differ (figure)"),
        ),
        convergence=report(
            f"{RESULTS}/joint/{{name}}/convergence.png",
            caption="../report/joint_convergence.rst",
            category=ANSWERS,
            subcategory="{name}",
            labels=answer_labels("6", "convergence steps"),
        ),
        verdicts=report(
            f"{RESULTS}/joint/{{name}}/verdicts.csv",
            caption="../report/verdicts.rst",
            category=ANSWERS,
            subcategory="{name}",
            labels=answer_labels("7", "verdicts per method pair (table)"),
        ),
        verdicts_markdown=f"{RESULTS}/joint/{{name}}/verdicts.md",
        bootstrap=f"{RESULTS}/joint/{{name}}/bootstrap.json",
        stability=report(
            f"{RESULTS}/joint/{{name}}/stability.json",
            caption="../report/stability_json.rst",
            category=ANSWERS,
            subcategory="{name}",
            labels=answer_labels("8", "stability curve (data)"),
        ),
        regression=report(
            f"{RESULTS}/joint/{{name}}/regression.csv",
            caption="../report/joint_regression.rst",
            category=ANSWERS,
            subcategory="{name}",
            labels=answer_labels("9", "regression with method indicators"),
        ),
    log:
        "logs/joint_comparison/{name}.log",
    conda:
        "../envs/trainmap.yaml"
    threads: 2
    resources:
        mem_mb=planned("joint_comparison", "mem_mb", grid_cells_of_joint),
        runtime=planned("joint_comparison", "runtime", grid_cells_of_joint),
    params:
        adaptive=is_adaptive_joint,
        settings=settings_of_joint,
        groups=of_cells("labels", joint_cells),
        cells=of_cells("cells", joint_cells),
        # each cell's parent MLflow run gets its occupancy of the shared states
        cell_hashes=of_cells("cell_hashes", joint_cells),
        metrics=of_cells("metric_tables", joint_cells),
        evaluations=of_cells("evaluation_files", joint_cells),
        # runs of external sets pooled beside the cells (external.smk)
        external=external_runs_of_joint,
    script:
        "../scripts/joint_comparison.py"


rule all_analysis:
    input:
        analysis_outputs(),
