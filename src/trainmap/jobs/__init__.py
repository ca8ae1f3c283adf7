"""One function per workflow rule (``*_job``): read inputs, call the library, write outputs, log to
MLflow. One module per rule family; :mod:`trainmap.jobs.common` holds what they share (the seed
range's manifest and per-seed directories, the loop over a seed range's cells, job logs).

The Snakemake scripts in ``workflow/scripts/`` only unpack ``snakemake.input/params/output`` and call
one of these (through the job server, :mod:`trainmap.worker`, which runs only the ``*_job``
functions of :data:`JOB_MODULES`), so every rule can also run from Python without Snakemake.
"""

#: The modules whose public ``*_job`` functions are the workflow's jobs, one per rule family.
JOB_MODULES = tuple(
    f"trainmap.jobs.{family}"
    for family in ("data", "gradinit", "train", "reparam", "sparse", "quantize", "evaluate",
                   "metrics", "analysis", "external", "paper", "settings")
)  # fmt: skip
