"""``trainmap map`` (``python -m trainmap.dynamics``) itself, once its arguments are parsed
(:mod:`trainmap.dynamics.__main__`): the runs found or resolved, their metric tables written, the
map fitted, the detours regressed and, with groups, the joint comparison (:func:`run`).
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from trainmap.dynamics.maps.settings import AnalysisSettings
from trainmap.dynamics.metrics.tables import REGENERATE, MetricTableError, read_metric_table
from trainmap.dynamics.pipeline import (
    Outcomes,
    analysis_runs,
    convergence_from_tables,
    joint_group,
    map_runs,
)
from trainmap.dynamics.runs.external import (
    HYPERPARAMETER_FILES,
    ExternalRun,
    ExternalRunError,
    check_run_shapes,
    external_run_metrics,
    read_external_run,
    run_hyperparameters,
)
from trainmap.dynamics.runs.heldout import with_heldout_loss
from trainmap.dynamics.runs.hub import HubSpec, Manifest, suite_run_curve
from trainmap.dynamics.runs.layouts import run_layouts
from trainmap.dynamics.runs.names import CHECKPOINT_SUFFIXES
from trainmap.io import write_atomic

#: How deep :func:`find_runs` looks for run directories below a directory it is given.
RUN_SEARCH_DEPTH = 4


def hub_runs(args: argparse.Namespace, write: bool = True) -> dict[str, ExternalRun]:
    """The runs of the ``hf://`` suites among ``args.tables``, resolved offline in the Hub cache
    (:mod:`trainmap.dynamics.runs.hub`), their resolution written to ``--out``/revisions.json (one
    suite) or ``revisions-<i>.json``; each run's curve from ``--curves``/<run>.csv, or none (a
    curve of no accuracy: metric tables only). ``write=False``: no manifest written."""
    from trainmap.dynamics.runs.hub import (
        MANIFEST_FILE,
        hub_run_checkpoints,
        parse_hub_source,
        write_manifest,
    )

    sources = [source for source in args.tables if isinstance(source, str)]
    runs: dict[str, ExternalRun] = {}
    for index, source in enumerate(sources):
        try:
            spec = parse_hub_source(source, seeds=args.seeds, steps=args.steps,
                                    revision_pattern=args.revision_pattern,
                                    cache_dir=args.hf_cache)  # fmt: skip
            manifest = _resolved(spec, args)
        except (ValueError, ExternalRunError) as error:
            raise SystemExit(f"error: {source}: {error}") from None
        name = MANIFEST_FILE if len(sources) == 1 else f"revisions-{index}.json"
        if write and args.out is not None:
            write_manifest(manifest, args.out / name)
        for run in manifest.runs:
            checkpoints = hub_run_checkpoints(manifest, run)
            curve = suite_curve(args, run, checkpoints)
            runs[run] = (ExternalRun(Path(source) / run, checkpoints, curve)
                         if manifest.fetch_from is None
                         else FetchedRun(Path(source) / run, checkpoints, curve, manifest))  # fmt: skip
    return runs


@dataclass(frozen=True)
class FetchedRun(ExternalRun):
    """A run of a suite given with ``--fetch``: its checkpoints are fetched as they are measured,
    by its ``manifest`` (resolved online)."""

    manifest: Manifest


def _resolved(spec: HubSpec, args: argparse.Namespace) -> Manifest:
    """``spec`` resolved in the cache, or, with ``--fetch``, on the Hub (refs and headers only);
    with ``--fetch`` and ``--out``, a ``revisions.json`` already there that was resolved from the
    same spec is read instead (a rerun lists nothing again)."""
    from trainmap.dynamics.runs.hub import MANIFEST_FILE, read_manifest, resolve_hub_runs

    if not getattr(args, "fetch", False):
        return resolve_hub_runs(spec)
    from trainmap.dynamics.runs.hub_fetch import resolve_online

    kept = None if args.out is None else args.out / MANIFEST_FILE
    if kept is not None and kept.is_file():
        manifest = read_manifest(kept)
        if manifest.spec == spec and manifest.fetch_from is not None:
            return manifest
    return resolve_online(spec, endpoint=args.hf_endpoint)


def suite_curve(args: argparse.Namespace, run: str, checkpoints: dict[int, Path]) -> pd.DataFrame:
    """``--curves``/<run>.csv read as an evaluation curve (holding ``--curve`` when a threshold
    is given), or none (:func:`~trainmap.dynamics.runs.external.no_curve`)."""
    curve_file = None if args.curves is None else args.curves / f"{run}.csv"
    try:
        return suite_run_curve(curve_file, list(checkpoints), needed_curve(args))
    except ExternalRunError as error:
        raise SystemExit(f"error: --curves: {error}") from None


#: Why a map made without ``--threshold`` has no convergence step (each left-out result says so).
NO_THRESHOLD = "no convergence criterion was given (--threshold, with --curve and --direction)"


def needed_curve(args: argparse.Namespace) -> str | None:
    """The curve column each run must have: ``--curve`` with a ``--threshold``, else none."""
    return args.curve if args.threshold is not None else None


def find_tables(paths: list[Path]) -> dict[str, Path]:
    """Run id -> CSV path; directories are searched for ``metrics.csv`` files."""
    return {run: path for run, path in find_runs(paths).items() if path.is_file()}


def find_runs(paths: list[Path]) -> dict[str, Path]:
    """Run id -> metric CSV or external run directory (:func:`is_external_run`). A directory is an
    external run, a directory of external runs, or searched for trainmap metric tables
    (``metrics.csv`` files whose header names a step and trainmap's metrics: another tool's
    ``metrics.csv``, such as Lightning's, is not one). With fewer than 2 runs the error lists each
    place looked at and why it is not a run."""
    found: list[Path] = []
    passed_over: list[str] = []
    for path in paths:
        if is_external_run(path):
            found.append(path)
        elif path.is_dir():
            runs = sorted(d for d in path.iterdir() if is_external_run(d))
            if runs:
                found += runs
                continue
            tables = []
            for table in sorted(path.rglob("metrics.csv")):
                why = not_a_metric_table(table)
                tables += [table] if why is None else []
                passed_over += [] if why is None else [f"{table}: {why}"]
            # without trainmap tables, runs deeper down (a sweep's lr0.1/lightning_logs/version_0)
            found += tables or runs_below(path)
            passed_over += [f"{d}: {why_not_a_run(d)}" for d in sorted(path.iterdir())
                            if d.is_dir() and not any(f.is_relative_to(d) for f in found)]  # fmt: skip
        elif path.is_file():
            found.append(path)
        else:
            raise SystemExit(f"error: {path} is neither a metrics CSV nor a directory")
    if len(found) < 2:
        shown = passed_over[:20] + ([f"... and {len(passed_over) - 20} more"]
                                    if len(passed_over) > 20 else [])  # fmt: skip
        looked = "".join(f"\n  {line}" for line in shown) or f"\n  (nothing under {paths})"
        raise SystemExit(f"error: found {len(found)} run(s) (metric tables or checkpoint "
                         f"directories); a training map needs >= 2. Looked at:{looked}\nA run is "
                         f"a directory of checkpoints named by step ({', '.join(CHECKPOINT_SUFFIXES)}, "
                         "e.g. step_100.pt) with an evaluation.csv, or a trainmap metrics.csv")  # fmt: skip
    parent = Path(os.path.commonpath([_run_dir(f).resolve().parent for f in found]))
    return {_run_id(f, parent): f for f in found}


def not_a_metric_table(path: Path) -> str | None:
    """None when ``path``'s header is a trainmap metric table's (``step`` and at least one of the
    14 metrics); else why it is not."""
    from trainmap.dynamics.metrics.weights import METRIC_NAMES

    with open(path, newline="") as handle:
        header = [name.strip() for name in handle.readline().strip().split(",")]
    if "step" in header and set(header) & set(METRIC_NAMES):
        return None
    shown = ", ".join(header[:6]) + (", ..." if len(header) > 6 else "")
    return (
        f"not a trainmap metric table (header: {shown}; a trainmap table has 'step' and the "
        f"weight metrics, e.g. {', '.join(METRIC_NAMES[:3])})"
    )


def why_not_a_run(directory: Path) -> str:
    """Why ``directory`` (holding no checkpoint files of its own) is not a run: what it holds."""
    children = sorted(directory.iterdir())
    folders = [c.name for c in children if c.is_dir()]
    files = [c.name for c in children if c.is_file()]
    if not children:
        return "empty"
    held = ", ".join((folders + files)[:5]) + (", ..." if len(children) > 5 else "")
    return (
        f"no checkpoint files ({', '.join(CHECKPOINT_SUFFIXES)}) directly inside, no "
        "checkpoint-<step>/ folders with weights (Hugging Face), no checkpoints/*.ckpt "
        f"(Lightning); it holds {held}"
    )


def is_external_run(path: Path) -> bool:
    """Whether ``path`` is a directory holding checkpoint files (an external run), a Hugging
    Face Trainer output directory (``checkpoint-<step>/`` folders) or a Lightning run
    (``checkpoints/*.ckpt``)."""
    return bool(run_layouts(path))


def runs_below(directory: Path, depth: int = RUN_SEARCH_DEPTH) -> list[Path]:
    """The run directories (:func:`is_external_run`) below ``directory``, at most ``depth``
    levels down, not looking inside a run (its ``checkpoint-<n>/`` or ``checkpoints/``)."""
    found = []
    for child in sorted(d for d in directory.iterdir() if d.is_dir()):
        if is_external_run(child):
            found.append(child)
        elif depth > 1:
            found += runs_below(child, depth - 1)
    return found


class GroupingError(ValueError):
    """The runs cannot be grouped as asked; the message names the run, the key or the file."""


def run_groups(runs: dict[str, Path], args: argparse.Namespace) -> dict[str, str]:
    """Run id -> group, from ``--groups`` (a CSV of run,group: every run found needs a group, and
    every run it names must have been found), ``--group-by`` (a hyperparameter of each run's own
    files, :func:`trainmap.dynamics.runs.external.run_hyperparameters`) or ``--group-by-path`` (a
    regular expression's first group in the run id); empty without any of them. Every check
    runs before anything is fitted, and a grouping with fewer than 2 groups is refused."""
    if args.groups:
        groups = read_groups_file(args.groups, list(runs))
    elif args.group_by:
        groups = {}
        for run, path in runs.items():
            folder = path if path.is_dir() else path.parent
            values = run_hyperparameters(folder)
            if args.group_by not in values:
                shown = ", ".join(sorted(values)[:12]) or "none"
                raise GroupingError(f"--group-by {args.group_by}: run {run} ({folder}) has no such "
                                    f"hyperparameter (found: {shown}; read from "
                                    f"{', '.join(HYPERPARAMETER_FILES)})")  # fmt: skip
            groups[run] = f"{args.group_by}={values[args.group_by]}"
    elif args.group_by_path:
        try:
            pattern = re.compile(args.group_by_path)
        except re.error as error:
            raise GroupingError(f"--group-by-path {args.group_by_path!r}: not a regular "
                                f"expression ({error})") from None  # fmt: skip
        if pattern.groups < 1:
            raise GroupingError(f"--group-by-path {args.group_by_path!r}: no group in it; put "
                                "the part that names the group in parentheses, e.g. 'lr=([^/]+)'")  # fmt: skip
        groups = {}
        for run in runs:
            match = pattern.search(run)
            if match is None or match.group(1) is None:
                raise GroupingError(f"--group-by-path {args.group_by_path!r} does not match run "
                                    f"{run!r}; runs found: {', '.join(list(runs)[:5])}")  # fmt: skip
            groups[run] = match.group(1)
    else:
        return {}
    if len(set(groups.values())) < 2:
        raise GroupingError(f"the runs form {len(set(groups.values()))} group(s) "
                            f"({', '.join(sorted(set(groups.values())))}); a joint comparison "
                            "needs >= 2")  # fmt: skip
    return groups


def read_groups_file(path: Path, runs: list[str]) -> dict[str, str]:
    """``--groups``: run -> group, checked against the run ids found (``runs``)."""
    try:
        table = pd.read_csv(path, dtype=str)
    except (OSError, ValueError) as error:
        raise GroupingError(f"--groups {path}: not a readable CSV ({error})") from None
    missing = [column for column in ("run", "group") if column not in table]
    if missing:
        raise GroupingError(f"--groups {path}: no column {' or '.join(missing)} (it has "
                            f"{', '.join(table.columns)}); write run,group")  # fmt: skip
    blank = table.index[table["run"].isna() | table["group"].isna()]
    if len(blank):
        raise GroupingError(f"--groups {path}: row {int(blank[0]) + 2} has an empty run or group")
    repeated = sorted(table["run"][table["run"].duplicated()].unique())
    if repeated:
        raise GroupingError(f"--groups {path}: runs listed twice: {repeated[:5]}")
    groups = dict(zip(table["run"], table["group"], strict=True))
    unknown = sorted(set(groups) - set(runs))
    if unknown:
        raise GroupingError(f"--groups {path} names runs that were not found: {unknown[:5]}; the "
                            f"runs found are named {', '.join(sorted(runs)[:5])}"
                            f"{', ...' if len(runs) > 5 else ''} (their paths relative to "
                            "their common parent)")  # fmt: skip
    ungrouped = sorted(set(runs) - set(groups))
    if ungrouped:
        raise GroupingError(f"--groups {path} has no group for runs {ungrouped[:5]}"
                            f"{' and more' if len(ungrouped) > 5 else ''}; add a row per run")  # fmt: skip
    return groups


def _run_dir(path: Path) -> Path:
    return path / "metrics.csv" if path.is_dir() else path


def _run_id(file: Path, parent: Path) -> str:
    file = _run_dir(file)
    relative = file.resolve().relative_to(parent)
    name = relative.parent.as_posix() if file.name == "metrics.csv" else relative.with_suffix("")
    return str(name) if str(name) not in ("", ".") else file.stem


def suite_tables(runs: dict[str, ExternalRun], args: argparse.Namespace) -> dict[str, Path]:
    """The metric tables of the suites' runs, written to ``--out``/metrics/<run>/metrics.csv."""
    model = _external_model(args)
    written = {}
    try:
        tokens = _eval_tokens(args, runs)  # once: every revision is scored on the same tokens
        for run, external in tqdm(runs.items(), desc="suite runs", unit="run"):
            if isinstance(external, FetchedRun):
                table = _fetched_table(run, external, args, model, tokens)
            else:
                check_run_shapes(external)
                table = with_heldout_loss(
                    external_run_metrics(external, args.convention, args.heads, model),
                    external.checkpoints, tokens, args.eval_context)  # fmt: skip
            path = args.out / "metrics" / run / "metrics.csv"
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, lambda tmp, t=table: t.to_csv(tmp, index=False))
            written[run] = path
    except ExternalRunError as error:
        raise SystemExit(f"error: {error}") from None
    print(f"{len(written)} suite run(s): metric tables in {args.out / 'metrics'}")
    return written


def _fetched_table(
    run: str, external: FetchedRun, args: argparse.Namespace, model, tokens: np.ndarray | None
) -> pd.DataFrame:
    """A ``--fetch`` suite run's table: each revision fetched, measured alone (its row written to
    ``--out``/rows/<run>/<settings key>/ at once) and deleted unless ``--keep-weights``
    (:func:`trainmap.dynamics.runs.hub_fetch.measured_revisions`), then joined to the run's
    curve."""
    from trainmap.dynamics.runs.hub_fetch import measured_revisions, with_curve

    arch = args.arch and {"arch": args.arch, "meta": args.meta, "options": args.arch_options}
    table = measured_revisions(external.manifest, run, args.out / "rows" / run,
                               convention=args.convention, heads=args.heads, model=model,
                               arch=arch, tokens=tokens, context=args.eval_context,
                               keep_weights=args.keep_weights, fetch_jobs=args.fetch_jobs)  # fmt: skip
    return with_curve(table, external.evaluation, tokens is not None)


def _eval_tokens(args: argparse.Namespace, runs: dict[str, ExternalRun]) -> np.ndarray | None:
    """The scored tokens: ``--eval-tokens``' (:func:`~trainmap.dynamics.runs.heldout.read_tokens`),
    or ``--eval-text`` tokenized by the suite's tokenizer, that of the first run's first revision
    (:func:`~trainmap.dynamics.runs.heldout.tokenize_text`; fetched alone with ``--fetch``, and
    deleted again), kept in ``--out``/eval_tokens.npy; None without either."""
    from trainmap.dynamics.runs.heldout import read_tokens, tokenize_text

    if args.eval_tokens is not None:
        return read_tokens(args.eval_tokens, args.eval_token_budget, args.eval_context)
    if args.eval_text is None:
        return None
    run, first = next(iter(runs.items()))
    step = next(iter(first.checkpoints))
    if isinstance(first, FetchedRun):
        from trainmap.dynamics.runs.hub_fetch import release_checkpoint, tokenizer_folder

        manifest = first.manifest
        checkpoint = manifest.runs[run][step]  # a suite run's id is its manifest's run name
        folder, fetched = tokenizer_folder(checkpoint, manifest.cache_dir, manifest.fetch_from)
        try:
            tokens = tokenize_text(args.eval_text, folder, args.eval_token_budget,
                                   args.eval_context)  # fmt: skip
        finally:
            if fetched:
                release_checkpoint(checkpoint, manifest.cache_dir)
    else:
        tokens = tokenize_text(args.eval_text, first.checkpoints[step].parent,
                               args.eval_token_budget, args.eval_context)  # fmt: skip
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)

        def save(tmp: Path) -> None:
            with open(tmp, "wb") as handle:  # a handle: np.save would add .npy to the name
                np.save(handle, tokens)

        write_atomic(args.out / "eval_tokens.npy", save)
    return tokens


def external_tables(runs: dict[str, Path], args: argparse.Namespace) -> dict[str, Path]:
    """Metric tables of the external runs among ``runs``, written to ``--out``/metrics/<run>/;
    every run is read and checked before the first table is written. Runs whose checkpoints hold
    NaN or infinite weights are added to ``args.diverged``."""
    external = {run: path for run, path in runs.items() if path.is_dir()}
    if not external:
        return runs
    model = _external_model(args)
    try:
        read = {run: read_external_run(path, args.evaluation, args.accuracy_key,
                                       needed_curve(args))
                for run, path in external.items()}  # fmt: skip
        tables = {run: external_run_metrics(r, args.convention, args.heads, model)
                  for run, r in tqdm(read.items(), desc="external runs", unit="run")}  # fmt: skip
    except ExternalRunError as error:
        raise SystemExit(f"error: {error}") from None
    written = dict(runs)
    for run, table in tables.items():
        path = args.out / "metrics" / run / "metrics.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, lambda tmp, t=table: t.to_csv(tmp, index=False))
        written[run] = path
        if table["skipped_matrices"].any() and run not in args.diverged:
            print(f"warning: external run {run} has non-finite weights; treated as diverged")
            args.diverged.append(run)
    print(f"{len(tables)} external run(s): metric tables in {args.out / 'metrics'}")
    return written


def _external_model(args: argparse.Namespace):
    """The ``--arch`` model whose layout reads the external state dicts, or None."""
    if args.arch is None:
        return None
    from trainmap.grid import ConfigError
    from trainmap.models import build_model
    from trainmap.plugins import load_plugins

    if args.meta is None:
        raise SystemExit("error: --arch needs --meta, the data description the architecture "
                         'is built for, e.g. \'{"input_kind": "vector", "input_shape": [40], '
                         '"num_classes": 2}\'')  # fmt: skip
    try:
        load_plugins(args.plugins, Path.cwd())
        return build_model(args.arch, args.meta, **args.arch_options)
    except (ConfigError, ValueError, KeyError) as error:
        raise SystemExit(f"error: --arch {args.arch}: {error}") from None


def show_layouts(args: argparse.Namespace) -> int:
    """``--show-layout``: for each external run given, the layout its metrics would use (by
    --convention, --heads, --arch) on its first checkpoint, printed: the family recognised
    (:mod:`trainmap.dynamics.runs.families`), else "generic rules" or the architecture; each
    counted matrix, counted bias and left-out entry with its reason. Nothing is fitted or written."""
    from trainmap.dynamics.runs.external import run_layout
    from trainmap.dynamics.runs.families import FAMILIES, describe_layout, detect_family
    from trainmap.dynamics.runs.layouts import checkpoint_shapes

    model = _external_model(args)
    suites = hub_runs(args, write=False)  # an hf:// suite: its first run stands for all
    shown = {**{path: None for path in args.tables if isinstance(path, Path)},
             **({next(iter(suites.values())).directory: next(iter(suites.values()))}
                if suites else {})}  # fmt: skip
    for path, resolved in shown.items():
        try:
            run = resolved or read_external_run(
                path, args.evaluation, args.accuracy_key, curve=None
            )
            step, first = next(iter(run.checkpoints.items()))
            shapes = checkpoint_shapes(first)
            layout = run_layout(shapes, first, args.convention, args.heads, model)
        except ExternalRunError as error:
            raise SystemExit(f"error: {error}") from None
        family = detect_family(shapes)
        source = (f"architecture {args.arch}" if model is not None
                  else FAMILIES[family].title if family else "generic rules")  # fmt: skip
        print(f"{path}: first checkpoint {first.name} (step {step}), convention "
              f"{args.convention}, heads {args.heads or 'not given (projections whole)'}")  # fmt: skip
        print("\n".join(describe_layout(shapes, layout, source)))
    return 0


def run(args: argparse.Namespace) -> int:
    """The command with its parsed arguments (:func:`trainmap.dynamics.__main__.parse_args`)."""
    if args.show_layout:
        return show_layouts(args)
    if args.out is None:
        raise SystemExit("error: --out is required (or --show-layout)")
    if args.curve == "test_loss" and args.direction == "rising" and args.threshold is not None:
        print("note: --curve test_loss with --direction rising: a run converges at the first "
              "checkpoint whose loss is at or ABOVE --threshold; for a loss that falls to it, "
              "give --direction falling")  # fmt: skip
    held_out = args.eval_tokens is not None or args.eval_text is not None
    if held_out and args.curves is not None:
        raise SystemExit("error: --eval-tokens/--eval-text and --curves both give the suite's "
                         "curve; give one of them")  # fmt: skip
    suites = hub_runs(args)
    if held_out and not suites:
        raise SystemExit("error: --eval-tokens/--eval-text score a suite's revisions: give an "
                         "hf:// suite")  # fmt: skip
    if suites and args.threshold is not None and args.curves is None and not held_out:
        raise SystemExit("error: --threshold needs each suite run's curve: give --curves DIR "
                         "(a <run>.csv of step,test_acc per run), --eval-tokens TOKENS.npy or "
                         "--eval-text TEXT.txt (a held-out loss per revision), or map with "
                         "--metrics-only")  # fmt: skip
    paths = [source for source in args.tables if isinstance(source, Path)]
    found = find_runs(paths) if paths or not suites else {}
    if suites:
        found.update(suite_tables(suites, args))
    try:
        groups = run_groups(found, args)  # a wrong groups file stops here, before any work
    except (GroupingError, ExternalRunError) as error:
        raise SystemExit(f"error: {error}") from None
    files = external_tables(found, args)
    if args.metrics_only:
        return 0
    unknown = sorted(set(args.diverged) - set(files))
    if unknown:
        raise SystemExit(f"error: --diverged names runs without a table: {unknown[:5]}")
    fix = f"{REGENERATE}; if the run diverged, name it with --diverged"
    curve = needed_curve(args)
    try:
        runs = {run: read_metric_table(path, [*args.features, *([curve] if curve else [])],
                                       diverged=run in args.diverged, fix=fix)
                for run, path in files.items()}  # fmt: skip
    except MetricTableError as error:
        raise SystemExit(f"error: {error}") from error
    status = {run: "diverged" if run in args.diverged else "completed" for run in runs}
    if curve is None:
        outcomes = Outcomes(dict.fromkeys(runs), status, NO_THRESHOLD)
        print(f"no --threshold: {NO_THRESHOLD}; the map, its states, occupancy and path verdicts "
              "are made, and what needs convergence is left out")  # fmt: skip
    else:
        outcomes = Outcomes(convergence_from_tables(runs, args.threshold, args.direction, curve),
                            status)  # fmt: skip
    settings = AnalysisSettings.of({
        "k_max": args.k_max, "restarts": args.restarts, "holdout": args.holdout,
        "seed": args.seed, "features": args.features, "bootstrap": args.bootstrap,
        "stability": args.stability, "alpha": args.alpha, "covariance_type": args.covariance_type,
        "standardisation": args.standardisation, "selection": args.selection, "folds": args.folds,
        "min_gain": args.min_gain, "min_gain_scale": args.min_gain_scale,
        "emission": args.emission,
    } | ({"degrees_of_freedom": args.degrees_of_freedom} if args.emission == "student_t"
         else {}))  # fmt: skip
    runs, outcomes = analysis_runs(runs, outcomes, settings)
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"{len(runs)} runs; fitting K = 1..{args.k_max} with {args.restarts} restarts each")
    _, regression, _ = map_runs(runs, outcomes, settings, args.out, n_jobs=args.jobs)
    detours = regression.summary
    fitted = (f"R^2 = {detours['r2']:.3f} (adjusted {detours['r2_adjusted']:.3f}), F-test p = "
              f"{detours['f_pvalue']:.3g}" if detours["fitted"]
              else f"no regression: {detours['not_fitted']}")  # fmt: skip
    ceiling = " (BIC still falling at K_max: a ceiling)" if detours["selection_at_ceiling"] else ""
    print(f"K = {detours['n_states']}{ceiling}, {fitted}, detour states = "
          f"{detours['detour_states']}, dissimilarity = {detours['dissimilarity']:.3f}")  # fmt: skip
    if groups:
        groups = {run: group for run, group in groups.items() if run in runs}
        joint = joint_group(runs, groups, outcomes, settings, args.out / "joint", n_jobs=args.jobs)
        print(joint.verdict_markdown())
        print(f"joint comparison written to {args.out / 'joint'}")
    print(f"outputs in {args.out}")
    return 0
