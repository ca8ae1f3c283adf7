# The gradinit rule's wildcard constraint and params functions (rules in gradinit.smk).

#: The methods with a GradInit stage (a wildcard constraint): the stage that makes a cell's
#: model depends on its method.
GRADINIT_METHODS = grid.methods_with_stage("gradinit")


@input_function
def gradinit_settings_of_task(wildcards):
    return grid.stage_job_settings(config, "gradinit", wildcards.task)
