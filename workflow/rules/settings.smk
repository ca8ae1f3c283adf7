# What the grid's jobs read (trainmap.grid.effective_settings), written where DVC reads metrics:
# `dvc exp show` shows the settings a run trained with, whichever config file set them.


rule effective_settings:
    output:
        settings=f"{RESULTS}/summary/settings.json",
    log:
        "logs/effective_settings.log",
    conda:
        "../envs/trainmap.yaml"
    threads: 1
    resources:
        mem_mb=500,
        runtime=5,
    params:
        settings=grid.effective_settings(config),
    script:
        "../scripts/effective_settings.py"
