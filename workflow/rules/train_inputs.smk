# The train rule's input and params functions (rules in train.smk).


@input_function
def train_settings_of_task(wildcards):
    return grid.train_settings(config, wildcards.task)


@input_function
def dataset_and_init_of_block(wildcards):
    """The dataset, and GradInit's manifest for blocks of a gradinit-stage method."""
    block = BLOCKS["train"][block_id(wildcards)]
    files = {"dataset": DATASET.format(task=block.task)}
    if grid.method_of(block.cells[0]).has_stage("gradinit"):
        files["init"] = BLOCKS["gradinit"].manifest(block)
    return files
