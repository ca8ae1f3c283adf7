# The evaluate and summary rules' input and params functions, and the summary files of the
# default target (rules in evaluate.smk).


@input_function
def evaluate_settings_of_task(wildcards):
    return grid.evaluate_settings(config, wildcards.task)


@input_function
def training_device_of_task(wildcards):
    return grid.training_device(config, wildcards.task)


@input_function
def evaluation_inputs_of_block(wildcards):
    """The block's runs and every other form of its models that evaluate measures (deploy,
    quantised), as manifests."""
    block = BLOCKS["evaluate"][block_id(wildcards)]
    files = {
        "run": BLOCKS.run_manifest(block),
        "dataset": DATASET.format(task=block.task),
    }
    for form, rule_name in (("deploy", "reparam"), ("quantized", "quantize")):
        if block.id in BLOCKS[rule_name]:
            files[form] = BLOCKS[rule_name].manifest(BLOCKS[rule_name][block.id])
    return files


def grid_summary():
    """The evaluation summary of the grid's cells and its figures, the flip rates too when the
    grid retrains sparse models; none for a study of external run sets alone (an empty grid).
    """
    if not CELLS:
        return []
    flip_rates = (
        [f"{RESULTS}/summary/flip_rates.png"] if retrained_sparse_cells() else []
    )
    return [
        f"{RESULTS}/summary/evaluation.csv",
        f"{RESULTS}/summary/metrics.json",
        f"{RESULTS}/summary/learning_curves.png",
        *flip_rates,
    ]
