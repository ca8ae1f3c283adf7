# The training-maps paper's tables side by side (config key paper; trainmap.dynamics.paper): each
# setting's runs mapped twice, by the authors' analysis settings and by trainmap's, and one table.
# Target: `snakemake ... paper` (make paper), not part of the default target.
from trainmap.schema import section_defaults


rule paper_map:
    input:
        metrics=of_cells("metric_manifests", setting_cells),
        evaluations=of_cells("evaluation_manifests", setting_cells),
    output:
        detours=f"{RESULTS}/paper/{{setting}}/{{analysis}}/detours.json",
        bootstrap=f"{RESULTS}/paper/{{setting}}/{{analysis}}/bootstrap.json",
        stability=f"{RESULTS}/paper/{{setting}}/{{analysis}}/stability.json",
        baselines=f"{RESULTS}/paper/{{setting}}/{{analysis}}/baselines.csv",
        states=f"{RESULTS}/paper/{{setting}}/{{analysis}}/states.csv",
        map=report(
            f"{RESULTS}/paper/{{setting}}/{{analysis}}/map.png",
            caption="../report/training_map.rst",
            category="Paper tables",
            subcategory="{setting}",
            labels={"setting": "{setting}", "analysis": "{analysis}", "figure": "map"},
        ),
    log:
        "logs/paper_map/{setting}/{analysis}.log",
    wildcard_constraints:
        setting=grid.names_regex(PAPER_GROUPS),
        analysis="|".join(PAPER_ANALYSES),
    conda:
        "../envs/trainmap.yaml"
    threads: 2
    resources:
        mem_mb=4000,
        runtime=60,
    params:
        settings=grid.analysis_settings(config),
        cells=of_cells("cells", setting_cells),
        metrics=of_cells("metric_tables", setting_cells),
        evaluations=of_cells("evaluation_files", setting_cells),
    script:
        "../scripts/paper_map.py"


rule paper_table:
    input:
        detours=paper_maps("detours.json"),
        bootstrap=paper_maps("bootstrap.json"),
        stability=paper_maps("stability.json"),
        states=paper_maps("states.csv"),
        baselines=paper_maps("baselines.csv"),
    output:
        table=report(
            f"{RESULTS}/paper/table.md",
            caption="../report/paper_table.rst",
            category="Paper tables",
            labels={"table": "the paper's tables side by side"},
        ),
        csv=f"{RESULTS}/paper/table.csv",
        claims=f"{RESULTS}/paper/claims.csv",
        figure=report(
            f"{RESULTS}/paper/table.png",
            caption="../report/paper_table.rst",
            category="Paper tables",
            labels={"figure": "the paper's tables side by side"},
        ),
    log:
        "logs/paper_table.log",
    localrule: True
    conda:
        "../envs/trainmap.yaml"
    params:
        settings=list(PAPER_GROUPS),
        analyses=PAPER_ANALYSES,
        confidence=grid.analysis_settings(config).get(
            "confidence", section_defaults("analysis")["confidence"]
        ),
    script:
        "../scripts/paper_table.py"


rule paper:
    input:
        f"{RESULTS}/paper/table.md",
