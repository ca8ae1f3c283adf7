"""The names of the run layouts trainmap reads, without torch: what ``trainmap map --help`` shows.

File names, suffixes and keys of the layouts :mod:`trainmap.dynamics.runs.layouts` reads
(checkpoint directories, Hugging Face Trainer and Lightning output directories), the files a run's
own hyperparameters are read from (:mod:`trainmap.dynamics.runs.external`), and the ``hf://`` scheme and
suite defaults of :mod:`trainmap.dynamics.runs.hub` (the config schema's, ``external[i].hub``). Those
modules import torch; the command line parses its arguments with these names before it does.
"""

from __future__ import annotations

from trainmap.schema import defaults_at

#: A checkpoint file of a run directory ends in one of these.
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".safetensors", ".ckpt")
#: A run directory's evaluation curve.
EVALUATION_FILE = "evaluation.csv"
#: A Hugging Face Trainer run's state, and the ``log_history`` key its accuracy is read from
#: unless one is named.
HF_STATE = "trainer_state.json"
HF_ACCURACY_KEY = "eval_accuracy"
#: The ``metrics.csv`` column a Lightning run's accuracy is read from unless one is named.
LIGHTNING_ACCURACY_KEY = "val_acc"
#: A run's own hyperparameters (``--group-by``), looked for in the run's directory and its parent:
#: Lightning's, a Hugging Face model's config and the Trainer's state.
HYPERPARAMETER_FILES = ("hparams.yaml", "config.json", HF_STATE)
#: A checkpoint suite in the Hugging Face cache, on the command line: ``hf://ORG/NAME``.
HUB_SCHEME = "hf://"
#: The defaults of a suite's settings: the config schema's (``external[i].hub``), declared there
#: once for the workflow and the command line alike.
HUB_DEFAULTS: dict[str, object] = defaults_at("external", "hub")
#: The source files (under the trainmap package) whose code makes a fetched revision's metrics
#: row: rows measured under other code or settings are not reused
#: (trainmap.dynamics.runs.hub_fetch.rows_folder); the workflow's revision jobs take them as inputs.
ROW_DEFINITIONS = ("dynamics/metrics/weights.py", "dynamics/runs/families.py",
                   "dynamics/runs/bounded.py", "dynamics/runs/heldout.py")  # fmt: skip
