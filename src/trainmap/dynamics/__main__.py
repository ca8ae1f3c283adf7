"""``python -m trainmap.dynamics``: training maps from per-run metric tables, outside Snakemake.

Reads one CSV per run in the format of :mod:`trainmap.dynamics.metrics.weights` (``step``, the 14 metric
columns, ``test_acc``; the workflow writes them as ``results/metrics/<cell>/metrics.csv``), fits the
HMM, draws the training map, runs the detour regression and, with ``--groups``, the joint comparison.
Runs trainmap did not train are read from their checkpoints (:mod:`trainmap.dynamics.runs.external`): a
directory of state dicts named by step plus ``evaluation.csv``; their metric tables are written to
``--out``/metrics first, so external runs and trainmap's own tables share one map.
Tables are read strictly (:func:`trainmap.dynamics.metrics.tables.read_metric_table`): a missing column, text
in a numeric cell or a NaN/Inf metric in a run not named by ``--diverged`` stops it with an error
naming the file, the column and the step.

Its arguments are parsed before anything heavy is imported (``--help`` answers at once, without
torch, pandas or the analysis): the choices and defaults come from the config schema
(:mod:`trainmap.schema`) and the layouts' names from :mod:`trainmap.dynamics.runs.names`; the
command itself is :mod:`trainmap.dynamics.map_command`, whose names (``find_runs``,
``run_groups``, ...) this module also gives.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any

from trainmap.dynamics.metrics.columns import CONVENTIONS, CURVES, DIRECTIONS, METRIC_NAMES
from trainmap.dynamics.runs.names import (
    EVALUATION_FILE,
    HF_ACCURACY_KEY,
    HUB_DEFAULTS,
    HUB_SCHEME,
    HYPERPARAMETER_FILES,
    LIGHTNING_ACCURACY_KEY,
)
from trainmap.schema import defaults_at, section_choices, section_defaults

#: An external set's settings' defaults (the config schema's): --eval-token-budget, --eval-context.
EXTERNAL_SETTINGS = defaults_at("external")

#: The analysis settings' defaults and allowed values: the config schema's (the workflow's too).
ANALYSIS_DEFAULTS = section_defaults("analysis")
ANALYSIS_CHOICES = section_choices("analysis")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m trainmap.dynamics",
        description="Fit a training map (Gaussian HMM over per-checkpoint weight metrics of many "
        "runs), find detour states by regression and, with --groups, compare groups on one "
        "shared map. Writes hmm.npz/json, selection, states, map (PNG/SVG/JSON), detours.json and "
        "figures to --out.",
    )
    parser.add_argument("tables", nargs="+", type=_run_source, metavar="RUNS",
                        help="per-run metric CSV files, directories searched for metrics.csv, "
                        "or external runs: a directory of checkpoints (step_100.pt, "
                        "checkpoint-100.safetensors, ...) with evaluation.csv (step, test_acc), "
                        "a Hugging Face Trainer output directory (checkpoint-<step>/ folders), "
                        "a Lightning run (version_<n>/ with checkpoints/*.ckpt and metrics.csv), "
                        "or a directory with such runs below it (a run is named by its path "
                        "relative to the common parent); or hf://ORG/NAME, a checkpoint suite in "
                        "the local Hugging Face cache (see --seeds, --steps)")  # fmt: skip
    parser.add_argument("--out", type=Path,
                        help="output directory (required unless --show-layout)")  # fmt: skip
    parser.add_argument("--threshold", type=float,
                        help="convergence = the first checkpoint whose --curve reaches this "
                        "(see --direction); without it the map, its states, occupancy and path "
                        "verdicts are made and what needs convergence (the detour regression, "
                        "the convergence verdict and its stability line) is left out, each "
                        "saying why, and runs need no curve")  # fmt: skip
    parser.add_argument("--curve", choices=CURVES, default=CURVES[0],
                        help="the column of each run's curve convergence reads (default "
                        "%(default)s; test_loss: a held-out loss, with --direction falling)")  # fmt: skip
    parser.add_argument("--direction", choices=DIRECTIONS, default=DIRECTIONS[0],
                        help="rising: converged at the first checkpoint at or above --threshold "
                        "(an accuracy); falling: at or below it (a loss); default %(default)s")  # fmt: skip
    defaults = ANALYSIS_DEFAULTS  # the config schema's: the workflow's defaults too
    external = parser.add_argument_group("external runs (checkpoint directories)")
    external.add_argument("--heads", type=int,
                          help="attention heads: split query/key/value projections per head, as "
                          "the paper does (default: whole matrices)")  # fmt: skip
    external.add_argument(
        "--convention",
        choices=CONVENTIONS,
        default=defaults["metrics"],
        help="metric convention (trainmap.dynamics.metrics.weights; default %(default)s)",
    )
    external.add_argument(
        "--evaluation",
        default=EVALUATION_FILE,
        help=f"each run's evaluation curve (default {EVALUATION_FILE})",
    )
    external.add_argument(
        "--accuracy-key",
        default=None,
        help="a Hugging Face Trainer run's accuracy: this key of trainer_state.json's "
        f"log_history (default {HF_ACCURACY_KEY}); a Lightning run's: this column of its "
        f"metrics.csv (default {LIGHTNING_ACCURACY_KEY})",
    )
    external.add_argument(
        "--arch",
        help="read the state dicts through this registered architecture "
        "(e.g. a plugin's) instead of by name and shape; needs --meta",
    )
    external.add_argument("--meta", type=json.loads, default=None,
                          help='the architecture\'s data description as JSON, e.g. \'{"input_kind": '
                          '"vector", "input_shape": [40], "num_classes": 2}\'')  # fmt: skip
    external.add_argument(
        "--arch-options",
        type=json.loads,
        default={},
        help="the architecture's options as JSON (default {})",
    )
    external.add_argument(
        "--plugins",
        nargs="+",
        default=[],
        help="plugin modules or .py files registering the architecture",
    )
    external.add_argument(
        "--metrics-only",
        action="store_true",
        help="write the external runs' metric tables and stop",
    )
    external.add_argument(
        "--show-layout",
        action="store_true",
        help="print which matrices of each external run's first checkpoint the metrics count "
        "(the checkpoint family recognised, the counted matrices and heads, what is left out and "
        "why) and stop, fitting and writing nothing",
    )
    suites = parser.add_argument_group(
        "checkpoint suites in the Hugging Face cache (hf://ORG/NAME)"
    )
    suites.add_argument("--seeds", help="a repository per seed: the seeds filling {seed} in the "
                        "name, e.g. 1-9 or 0,2,4")  # fmt: skip
    suites.add_argument("--steps", help="the steps to read, e.g. 0-1000,2000 (default: every "
                        "cached step)")  # fmt: skip
    suites.add_argument("--revision-pattern", default=HUB_DEFAULTS["revision_pattern"],
                        help="a branch per revision: the regular expression whose first group is "
                        "the step (default %(default)s)")  # fmt: skip
    suites.add_argument(
        "--hf-cache",
        type=Path,
        default=None,
        help="the Hub cache (default: huggingface_hub's, HF_HUB_CACHE / HF_HOME)",
    )
    suites.add_argument("--fetch", action="store_true",
                        help="fetch the suite from the Hub instead of reading it from the cache: "
                        "its branches and safetensors headers are read first (revisions.json), "
                        "then each revision is downloaded, measured, its metrics row written "
                        "(--out/rows/<run>/) and the revision deleted from the cache; a rerun "
                        "reads no revision that has its row")  # fmt: skip
    suites.add_argument("--keep-weights", action="store_true",
                        help="with --fetch: keep each fetched revision in the cache (default: "
                        "deleted once measured; a revision that was already cached always stays)")  # fmt: skip
    suites.add_argument("--fetch-jobs", type=int, default=HUB_DEFAULTS["fetch_jobs"], metavar="N",
                        help="with --fetch: revisions fetched ahead, the next ones downloading "
                        "while one is measured; the cache then holds at most N of them (default "
                        "%(default)s; --jobs is the fits')")  # fmt: skip
    suites.add_argument("--hf-endpoint", default=None,
                        help="with --fetch: the Hub's address (default: huggingface_hub's, "
                        "HF_ENDPOINT)")  # fmt: skip
    held_out = suites.add_mutually_exclusive_group()
    held_out.add_argument("--eval-tokens", type=Path, default=None, metavar="TOKENS.npy",
                          help="a 1-D array of token ids (the suite's tokenizer; numpy.save): "
                          "each revision's held-out next-token loss on its first "
                          "--eval-token-budget tokens is written as the curve test_loss (map "
                          "with --curve test_loss --direction falling --threshold X); needs "
                          "transformers")  # fmt: skip
    held_out.add_argument("--eval-text", type=Path, default=None, metavar="TEXT.txt",
                          help="as --eval-tokens, from a UTF-8 text file tokenized by the suite's "
                          "own tokenizer (its first revision's; the ids kept in "
                          "--out/eval_tokens.npy)")  # fmt: skip
    suites.add_argument("--eval-token-budget", type=int, metavar="N",
                        default=EXTERNAL_SETTINGS["eval_token_budget"],
                        help="tokens scored per revision (default %(default)s)")  # fmt: skip
    suites.add_argument("--eval-context", type=int, metavar="N",
                        default=EXTERNAL_SETTINGS["eval_context"],
                        help="tokens per scored sequence (default %(default)s)")  # fmt: skip
    suites.add_argument("--curves", type=Path, default=None,
                        help="a directory of <run>.csv files (step and the --curve column, "
                        "e.g. step,test_loss): each suite run's curve (a suite ships none; "
                        "needed for a map with --threshold)")  # fmt: skip
    grouping = parser.add_mutually_exclusive_group()
    grouping.add_argument("--groups", type=Path,
                          help="CSV with columns run,group: also fit one shared map of all runs "
                          "and compare the groups (joint comparison); checked against the runs "
                          "found before anything is fitted")  # fmt: skip
    grouping.add_argument("--group-by", metavar="KEY",
                          help="group the runs by this hyperparameter of their own files "
                          f"({', '.join(HYPERPARAMETER_FILES)} in the run's directory or its "
                          "parent), e.g. --group-by lr")  # fmt: skip
    grouping.add_argument("--group-by-path", metavar="REGEX",
                          help="group the runs by the first group of this regular expression "
                          "searched in each run's id (its path), e.g. 'lr=([^/]+)'")  # fmt: skip
    parser.add_argument("--k-max", type=int, default=defaults["k_max"],
                        help="largest K tried (default %(default)s)")  # fmt: skip
    parser.add_argument("--restarts", type=int, default=defaults["restarts"],
                        help="seeded restarts per K (default %(default)s)")  # fmt: skip
    parser.add_argument("--holdout", type=float, default=defaults["holdout"],
                        help="fraction of runs held out for BIC (default %(default)s)")  # fmt: skip
    parser.add_argument("--selection", choices=ANALYSIS_CHOICES["selection"],
                        default=defaults["selection"],
                        help="gain (the smallest K no larger K beats by more than --min-gain "
                        "nats of held-out log-likelihood per checkpoint per added state, every run "
                        "held out once over --folds folds), reproducible (the largest K whose maps "
                        "fitted on two halves of the runs decode every run alike, per group with "
                        "--groups; needs >= 2 runs per group), holdout (held-out BIC on one split, "
                        "the paper's) or folds (its mean over folds of the runs); default "
                        "%(default)s")  # fmt: skip
    parser.add_argument("--folds", type=int, default=defaults["folds"],
                        help="folds of the runs for --selection folds and gain (default "
                        "%(default)s)")  # fmt: skip
    parser.add_argument("--min-gain", type=float, default=defaults["min_gain"],
                        help="--selection gain: held-out nats per checkpoint each added state must "
                        "raise (default %(default)s)")  # fmt: skip
    parser.add_argument("--min-gain-scale", choices=ANALYSIS_CHOICES["min_gain_scale"],
                        default=defaults["min_gain_scale"],
                        help="--min-gain at the paper's 14 metrics, scaled by d / 14 for d metrics "
                        "(metrics), or the same for any d (fixed); default %(default)s")  # fmt: skip
    parser.add_argument("--seed", type=int, default=defaults["seed"],
                        help="random state (default %(default)s)")  # fmt: skip
    parser.add_argument("--features", nargs="+", default=list(METRIC_NAMES),
                        help="metric columns to model (default: the 14 metrics)")  # fmt: skip
    parser.add_argument("--diverged", nargs="+", default=[], metavar="RUN",
                        help="runs that diverged: their metrics may be NaN or infinite, and the "
                        "regression leaves them out (default: none)")  # fmt: skip
    parser.add_argument(
        "--covariance-type",
        choices=ANALYSIS_CHOICES["covariance_type"],
        default=defaults["covariance_type"],
        help="HMM covariances: full (the metrics are correlated) or diag (default %(default)s)",
    )
    parser.add_argument(
        "--standardisation",
        choices=ANALYSIS_CHOICES["standardisation"],
        default=defaults["standardisation"],
        help="z-scores pooled over all runs (pooled) or per run (per_run, the paper's; default "
        "%(default)s)",
    )
    parser.add_argument(
        "--emission",
        choices=ANALYSIS_CHOICES["emission"],
        default=defaults["emission"],
        help="emission model: plain (the paper's Gaussian HMM), run_offset (a per-run offset of "
        "the metrics, fitted with the states), run_offset_drift (offset and linear drift per "
        "run) or run_affine (offset, linear drift and scale per run): K holds better under "
        "run-to-run nuisance, at ~10-20x the cost; student_t (Student-t emissions of "
        "--degrees-of-freedom: heavy-tailed metrics do not split into extra states, at about "
        "the plain cost) (default %(default)s)",
    )
    parser.add_argument(
        "--degrees-of-freedom",
        type=float,
        default=defaults["degrees_of_freedom"],
        help="--emission student_t: the t emission's degrees of freedom nu, in (0, 1000]; "
        "smaller is heavier-tailed (default %(default)s)",
    )
    parser.add_argument(
        "--bootstrap",
        type=int,
        default=defaults["bootstrap"],
        help="bootstrap resamples of the runs (default %(default)s; 0: none)",
    )
    parser.add_argument(
        "--stability",
        type=int,
        default=defaults["stability"],
        help="subsamples per seed count of the stability curve (default %(default)s; 0: none)",
    )
    parser.add_argument(
        "--alpha",
        type=float,
        default=defaults["alpha"],
        help="significance level of detours and verdicts (default %(default)s)",
    )
    parser.add_argument("--jobs", type=int, default=1,
                        help="parallel processes for the fits and the bootstrap")  # fmt: skip
    return parser.parse_args(argv)


def _run_source(text: str) -> Path | str:
    """A ``RUNS`` argument: ``hf://...`` as it is (a Hub suite), anything else a path."""
    return text if text.startswith(HUB_SCHEME) else Path(text)


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, then run the command (:func:`trainmap.dynamics.map_command.run`)."""
    args = parse_args(argv)
    from trainmap.dynamics.map_command import run

    return run(args)


def __getattr__(name: str) -> Any:
    """The command's names (``find_runs``, ``run_groups``, ``GroupingError``, ...), from
    :mod:`trainmap.dynamics.map_command`, imported on first use (never for a dunder name, which
    the import system asks for, e.g. ``__path__``)."""
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    command = importlib.import_module("trainmap.dynamics.map_command")
    try:
        return getattr(command, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


if __name__ == "__main__":
    sys.exit(main())
