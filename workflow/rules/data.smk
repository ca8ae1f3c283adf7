rule data:
    input:
        data_files_of_task,
        plugins=PLUGIN_FILES,
    output:
        f"{RESULTS}/data/{{task}}/dataset.pt",
    log:
        "logs/data/{task}.log",
    conda:
        "../envs/trainmap.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        settings=data_settings_of_task,
    script:
        "../scripts/make_data.py"


rule all_data:
    input:
        datasets_of_grid(),
