"""Integration: portable mode through the workflow. The smoke grid's training (data, GradInit and
every train block) run by `snakemake` under the CPU's own code paths (the shared smoke study) and
under code paths forced from outside gives byte-identical result files with the pin (the job server
and its forked jobs apply it before their first operation), and other bytes without it, so the test
can fail."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SMOKE, copy_workflow, snakemake

from trainmap.digest import result_hashes
from trainmap.portable import SWITCH_ENV, cpu_problem

pytestmark = pytest.mark.integration

#: This CPU's own fast paths, forced from outside: the default level must override each.
FORCED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
          "DNNL_MAX_CPU_ISA": "AVX2", "OPENBLAS_CORETYPE": "Haswell"}  # fmt: skip


def hashes_under(workdir: Path) -> dict[str, str]:
    """The sha256 of every result file of a workflow copy, by path under ``results/``."""
    hashes = result_hashes(workdir / "results")
    return {path.split("/results/", 1)[1]: digest for path, digest in hashes.items()}


def trained(tmp_path: Path, name: str, **env: str) -> dict[str, str]:
    """The sha256 of every result file of the smoke grid's training, run in a fresh copy, by
    path under ``results/``."""
    workdir = copy_workflow(tmp_path / name)
    snakemake("all_train", "--cores", "2", "--configfile", SMOKE, cwd=workdir, **env)
    return hashes_under(workdir)


def test_the_pin_gives_the_same_bits_whatever_path_is_forced_and_other_bits_off(
    tmp_path: Path, smoke_run: Path
) -> None:
    if cpu_problem("avx2"):
        pytest.skip(cpu_problem("avx2"))
    forced = trained(tmp_path, "forced", **FORCED)
    # the default (portable, level baseline): the shared smoke study, whose whole run made the
    # same training files (and more, after them)
    whole = hashes_under(smoke_run)
    assert set(forced) <= set(whole), sorted(set(forced) - set(whole))
    pinned = {path: whole[path] for path in forced}
    assert any(path.endswith("/checkpoints/") for path in pinned)  # each run's archive, one entry
    assert pinned == forced, sorted(p for p in pinned if pinned[p] != forced.get(p))
    unpinned = trained(tmp_path, "unpinned", **{SWITCH_ENV: "0"}, **FORCED)
    assert set(unpinned) == set(pinned)
    differ = [path for path in pinned if pinned[path] != unpinned[path]]
    # unpinned, the forced paths give other bits: the digits CNNs (oneDNN) and the MLPs (ATen)
    assert any("digits/" in path for path in differ), differ
    assert any("sparse_parity/" in path for path in differ), differ
