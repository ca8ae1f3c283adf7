"""The docs site builds with warnings as errors, and every link of the README's front door lands.

`make docs` runs the same `mkdocs build --strict`: a broken link, a missing page or a heading a link
names that its page lacks fails the build (mkdocs.yml's `validation`). The README is not part of the
site, so its links are checked here against the pages the build wrote.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from conftest import run_command


@pytest.fixture(scope="module")
def site(repo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site `mkdocs build --strict` writes from docs/, in a temporary directory."""
    site_dir = tmp_path_factory.mktemp("site")
    result = run_command(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
        cwd=repo_root, NO_MKDOCS_2_WARNING="1",
    )  # fmt: skip
    warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING")]
    assert not warnings, "\n".join(warnings)
    return site_dir


def built_page(site: Path, page: Path) -> Path:
    """Where the build writes ``docs/<page>`` (directory URLs: ``x.md`` -> ``x/index.html``)."""
    folder = page.parent if page.name == "index.md" else page.with_suffix("")
    return site / folder / "index.html"


@pytest.mark.integration  # starts a program (a subprocess)
def test_every_docs_page_is_built(site: Path, repo_root: Path) -> None:
    pages = sorted(p.relative_to(repo_root / "docs") for p in (repo_root / "docs").rglob("*.md"))
    assert Path("index.md") in pages
    missing = [str(page) for page in pages if not built_page(site, page).is_file()]
    assert not missing, f"not built: {missing}"


@pytest.mark.integration  # starts a program (a subprocess)
def test_every_link_of_the_readme_lands(site: Path, repo_root: Path) -> None:
    """Each relative link or image of README.md names a file that exists, and a link into a docs
    page with an anchor names a heading the built page has."""
    readme = (repo_root / "README.md").read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", readme)
    local = [target for target in targets if not re.match(r"[a-z]+://", target)]
    assert any(target.startswith("docs/") for target in local), "the README links into no page"
    for target in local:
        path, _, anchor = target.partition("#")
        assert (repo_root / path).exists(), f"README links to a missing {path}"
        if anchor and path.startswith("docs/") and path.endswith(".md"):
            built = built_page(site, Path(path).relative_to("docs"))
            has_heading = f'id="{anchor}"' in built.read_text()
            assert has_heading, f"{path} has no heading #{anchor}"
