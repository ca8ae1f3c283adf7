"""Rule effective_settings: the settings the grid's jobs read, as DVC metrics (dvc exp show)."""

from contextlib import redirect_stderr, redirect_stdout

from trainmap.grid import save_effective_settings

with open(snakemake.log[0], "w") as log, redirect_stdout(log), redirect_stderr(log):
    save_effective_settings(snakemake.params.settings, snakemake.output.settings)
