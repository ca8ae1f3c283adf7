# The data rules' params and input functions (rules in data.smk).

from trainmap.data import data_kind

TASKS = grid.grid_tasks(config)


@input_function
def data_settings_of_task(wildcards):
    return grid.data_settings(config, wildcards.task)


def data_files_of_task(wildcards):
    """The file of a task whose kind reads one file (``arrays``, a plugin's): an input, so editing
    it remakes the data and all that follows."""
    settings = grid.data_settings(config, wildcards.task)
    return [settings["path"]] if data_kind(settings["kind"]).reads == "file" else []


def datasets_of_grid():
    return [DATASET.format(task=task) for task in TASKS]
