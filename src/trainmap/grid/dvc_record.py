"""Finished work under DVC: what a plain Snakemake run leaves in the directory ``dvc.yaml``
versions.

``dvc exp run`` (and ``dvc checkout``) first restore every output ``dvc.yaml`` declares to the
``dvc.lock`` it starts from, before any stage command runs: a file under ``results/`` that the lock
and the DVC cache do not hold is deleted, even when its stage is skipped ("didn't change") and its
outputs are ``persist``ed (DVC issues #2802, #1326: a tracked directory is restored to its record by
design). A plain ``snakemake`` run writes there without DVC knowing. So at the end of a successful
plain run of the study ``dvc.yaml`` runs (``params.yaml``'s ``dvc.configfile``, its default target,
no ``--config`` overrides), the workflow records its outputs in DVC as ``make run`` does (``dvc
commit --force``: cache and ``dvc.lock``), and ``dvc exp run`` then starts from them. A run of
another study into ``results/`` (its config, targets or overrides are not the ones ``dvc.yaml``
runs) cannot be recorded as those stages' outputs without making ``dvc.lock`` claim what was not
run, so the run ends with a warning naming the risk and the ways to keep the work.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from trainmap.faults import armed, kill_when_cached
from trainmap.grid.effective import under_dvc
from trainmap.grid.study import results_root
from trainmap.grid.tracking_checks import DVC_RESULTS_ROOT

#: The config file the Snakefile always reads after params.yaml: naming it again changes nothing.
DEFAULT_STUDY = "config/config.yaml"


def runs_dvc_study(config: dict, configfiles: Sequence[str | Path], overrides: dict,
                   targets: Sequence[str], base_dir: Path = Path(".")) -> bool:  # fmt: skip
    """Whether a Snakemake run in ``base_dir`` is the one ``dvc.yaml`` runs: ``params.yaml``'s
    ``dvc.configfile`` (and no other ``--configfile``; Snakemake gives them as absolute paths), no
    ``--config`` overrides, the default target."""

    def resolved(name: str | Path) -> Path:
        return (base_dir / name).resolve()  # an absolute name stays itself

    default = resolved(DEFAULT_STUDY)
    wanted = resolved(config.get("dvc", {}).get("configfile", DEFAULT_STUDY))
    given = [resolved(name) for name in configfiles if resolved(name) != default]
    expected = [] if wanted == default else [wanted]
    return given == expected and not overrides and not targets


def record_finished_work(
    config: dict,
    base_dir: Path,
    configfiles: Sequence[str],
    overrides: dict,
    targets: Sequence[str],
) -> str:
    """After a successful plain Snakemake run in ``base_dir`` (``overrides``: its ``--config``
    values, not its config files' contents): record its outputs in DVC when it
    ran ``dvc.yaml``'s study (:func:`runs_dvc_study`), else say what DVC would delete. Returns the
    line to print ("" where there is nothing to say: not a DVC project, another results root, or a
    DVC stage, whose outputs DVC records itself)."""
    if under_dvc() or results_root(config) != DVC_RESULTS_ROOT or not (base_dir / ".dvc").is_dir():
        return ""
    keep = (f"`dvc exp run` and `dvc checkout` restore {DVC_RESULTS_ROOT}/ to dvc.lock and delete "
            "what it does not record")  # fmt: skip
    if not runs_dvc_study(config, configfiles, overrides, targets, base_dir):
        return (
            f"warning: this run wrote to {DVC_RESULTS_ROOT}/, which dvc.yaml versions, but is not "
            f"the run dvc.yaml makes (params.yaml dvc.configfile, its default target, no --config), "
            f"so DVC has not recorded it: {keep}. Keep the work by giving the config a results "
            f"root of its own (results: results-mine) or by running `make run` (or `dvc commit` "
            f"when these outputs are what dvc.yaml's stages would make) before any `dvc exp run`"
        )
    failed = commit_outputs(base_dir)
    if failed:
        return (f"warning: {failed}, so DVC has not recorded this run: {keep}. Run `dvc commit` "
                "before any `dvc exp run`")  # fmt: skip
    return "Recorded the results in DVC (dvc commit): `dvc exp run` starts from them"


def commit_outputs(base_dir: Path) -> str:
    """Record every output of ``dvc.yaml``'s stages in DVC: each stage's directories made first
    (:func:`stage_directories`), then ``dvc commit --force`` (cache and ``dvc.lock``). Returns ""
    or what failed.

    The outputs stay plain files, not links into the cache (no ``dvc checkout --relink``): before
    a stage runs, DVC replaces its persisted outputs that are cache links by copies, which gives
    them new modification times, and the stage's Snakemake then finds them newer than the
    upstream results an earlier stage just remade and skips the jobs (measured: a `dvc exp run`
    that retrained a model kept its old evaluation)."""
    for stage_dir in stage_directories(base_dir):
        (base_dir / stage_dir).mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "dvc", "commit", "--force", "--quiet"]
    if armed("dvc-commit"):  # the fault tier: killed once N files of the run are in the cache
        kill_when_cached(subprocess.Popen(command, cwd=base_dir), base_dir / ".dvc" / "cache")
    done = subprocess.run(command, cwd=base_dir, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return f"`dvc commit` failed ({last})"
    return ""


def stage_directories(base_dir: Path) -> list[str]:
    """The directories ``dvc.yaml``'s stage commands create first (``mkdir -p ... && ...``): a grid
    without some cells still gives DVC each directory to record."""
    import yaml

    stages = yaml.safe_load((base_dir / "dvc.yaml").read_text())["stages"]
    made = []
    for stage in stages.values():
        command = str(stage.get("cmd", ""))
        if command.startswith("mkdir -p "):
            made += command.split(" && ")[0].removeprefix("mkdir -p ").split()
    return made


def main() -> int:
    """``python -m trainmap.grid.dvc_record``: :func:`commit_outputs` in this directory (``make
    run``, after the run's timing sidecar is written)."""
    failed = commit_outputs(Path.cwd())
    if failed:
        print(f"error: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
