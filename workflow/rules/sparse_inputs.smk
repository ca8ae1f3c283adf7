# The sparse rules' wildcard constraint, input and params functions (rules in sparse.smk).

#: The methods with a sparse stage (a wildcard constraint).
SPARSE_METHODS = grid.methods_with_stage("sparse")


@input_function
def sparse_settings_of_task(wildcards):
    return grid.stage_job_settings(config, "sparse", wildcards.task)


@input_function
def teacher_manifest_of_block(wildcards):
    """The dense models a sparse block retrains: the kaiming block of the same seed range."""
    return BLOCKS.teacher_manifest(BLOCKS["sparse_retrain"][block_id(wildcards)])


def retrained_sparse_cells():
    """The sparse cells that retrain (their masks flip)."""
    return [c for c in CELLS if grid.is_sparse(c) and grid.retrains(c)]


def transformed_models_of_grid():
    """Deploy, sparse and quantised models of the grid, as block manifests."""
    return (
        BLOCKS["reparam"].grid_manifests()
        + BLOCKS["sparse_retrain"].grid_manifests()
        + BLOCKS["quantize"].grid_manifests()
    )
