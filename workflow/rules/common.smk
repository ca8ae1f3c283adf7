# Grid expansion, input functions and the one-time tracking set-up. No rule lives here.
from trainmap import config as grid
from trainmap.tracking import experiment_name, init_tracking, tracking_uri

grid.check_config(config, base_dir=Path(workflow.basedir))
CELLS = grid.expand_grid(config)
TASKS = grid.grid_tasks(config)


wildcard_constraints:
    task=r"[A-Za-z][A-Za-z0-9_]*",
    arch=r"[A-Za-z][A-Za-z0-9_]*",
    method=r"[A-Za-z][A-Za-z0-9_]*",
    seed=r"\d+",


onstart:
    # Create the tracking database and experiment once, before parallel jobs (FACTS.md: a fresh
    # SQLite database migrated by 8 jobs at once lost 7 of their runs).
    init_tracking(tracking_uri(config), experiment_name(config))


def dataset_of_task(wildcards):
    return f"results/data/{wildcards.task}/dataset.pt"


def data_settings_of_task(wildcards):
    return grid.data_settings(config, wildcards.task)


def model_settings_of_cell(wildcards):
    return grid.model_settings(config, wildcards.task, wildcards.arch)


def train_settings_of_task(wildcards):
    return grid.train_settings(config, wildcards.task)


def evaluate_settings_of_task(wildcards):
    return grid.evaluate_settings(config, wildcards.task)


def files_of_grid(rule_dir, filename):
    """One path per grid cell, e.g. every ``results/evaluate/<cell>/evaluation.json``."""
    return [f"results/{rule_dir}/{cell.id}/{filename}" for cell in CELLS]


def datasets_of_grid():
    return [f"results/data/{task}/dataset.pt" for task in TASKS]
