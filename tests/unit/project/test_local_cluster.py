"""``profiles/slurm/local_cluster.sh`` keeps its root-owned state in a private directory.

The script runs as root and writes (slurm.conf, logs) and reads (pid files it kills by) its state
directory. It used a fixed /tmp/trainmap-slurm, where any local user could plant a symbolic link.
These checks run the harmless `env` and `status` commands (no daemon is started); `start` runs the
same check first, and tests/integration/test_slurm.py starts a real cluster in a private pytest
directory.
"""

from __future__ import annotations

import os
import pwd
import subprocess
from pathlib import Path

import pytest
from conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "profiles/slurm/local_cluster.sh"


def script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=30)


@pytest.mark.integration  # starts a program (a subprocess)
def test_the_default_directory_is_private_and_in_the_project() -> None:
    result = script("env")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"export SLURM_CONF={REPO_ROOT.resolve()}/.slurm/slurm.conf"
    assert "/.slurm/" in (REPO_ROOT / ".gitignore").read_text()
    assert "SLURM_DIR ?= $(CURDIR)/.slurm" in (REPO_ROOT / "Makefile").read_text()


@pytest.mark.integration  # starts a program (a subprocess)
def test_a_private_directory_is_accepted(tmp_path: Path) -> None:
    directory = tmp_path / "cluster"
    directory.mkdir(mode=0o755)
    result = script("env", str(directory))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"export SLURM_CONF={directory.resolve()}/slurm.conf"
    assert oct(directory.stat().st_mode & 0o777) == "0o700", "made private"


@pytest.mark.integration  # starts a program (a subprocess)
def test_a_symbolic_link_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    link = tmp_path / "trainmap-slurm"
    link.symlink_to(victim)
    for command in ("env", "status", "stop", "start"):
        if command == "start" and os.geteuid() != 0:
            continue  # start refuses non-root callers before it looks at the directory
        result = script(command, str(link))
        assert result.returncode != 0, (command, result.stdout)
        assert f"{link} is a symbolic link; refusing to follow it" in result.stderr, result.stderr
    assert list(victim.iterdir()) == [], "nothing may be written through the link"


@pytest.mark.integration  # starts a program (a subprocess)
def test_symbolic_links_inside_are_refused(tmp_path: Path) -> None:
    directory = tmp_path / "cluster"
    directory.mkdir(mode=0o700)
    victim = tmp_path / "victim.conf"
    victim.write_text("precious\n")
    (directory / "slurm.conf").symlink_to(victim)
    result = script("status", str(directory))
    assert result.returncode != 0
    assert "holds symbolic links" in result.stderr and "refusing to follow them" in result.stderr
    assert victim.read_text() == "precious\n"


@pytest.mark.integration  # starts a program (a subprocess)
def test_a_directory_others_can_write_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "shared"
    directory.mkdir()
    directory.chmod(0o777)
    result = script("env", str(directory))
    assert result.returncode != 0
    assert "is writable by others (mode 777); refusing to use it" in result.stderr


@pytest.mark.integration  # starts a program (a subprocess)
@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "theirs"
    directory.mkdir(mode=0o700)
    nobody = pwd.getpwnam("nobody").pw_uid
    os.chown(directory, nobody, -1)
    result = script("env", str(directory))
    assert result.returncode != 0
    assert f"belongs to uid {nobody}, not to you" in result.stderr
