"""The folder sets the marker: every test under tests/integration/ is marked ``integration``, the
set `make test-fast` (``pytest -m "not integration"``) leaves out. Shared fixtures and helpers stay
in tests/conftest.py, which applies here too."""

from __future__ import annotations

from pathlib import Path

import pytest

INTEGRATION = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the items collected from this folder before ``-m`` selects (a test elsewhere keeps the
    marks it has; an explicit ``integration`` mark here is harmless)."""
    for item in items:
        if item.path.resolve().is_relative_to(INTEGRATION):
            item.add_marker(pytest.mark.integration)
