"""``python fixed_status_checks.py ARGS``: Snakemake, its SLURM executor checking the jobs' status
every ``--seconds-between-status-checks`` seconds.

snakemake-executor-plugin-slurm (2.8) lengthens the pause between two status checks by 10 s after
every check that finds no job finished, up to 180 s (``Executor.check_active_jobs``), which spares
a cluster's scheduler; on the tests' one-node SLURM, whose jobs finish within seconds to a minute,
it leaves the workflow waiting on jobs that have finished. Everything else (the profile, sbatch,
squeue, the jobs) is the plugin's and Snakemake's own.
"""

from __future__ import annotations

from snakemake_executor_plugin_slurm import Executor


def _fixed(self: Executor) -> float:
    return self.workflow.remote_execution_settings.seconds_between_status_checks


Executor.next_seconds_between_status_checks = property(_fixed, lambda self, value: None)

if __name__ == "__main__":
    from snakemake.cli import main

    main()
