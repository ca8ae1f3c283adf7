"""trainmap: how networks train, as a declarative experiment workflow."""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _installed_version

__version__ = "0.1.0"

#: The oldest torch trainmap supports (pyproject.toml's bound).
MIN_TORCH = (2, 10)


def _check_torch() -> None:
    """An environment whose torch is older than :data:`MIN_TORCH` (installed with ``--no-deps``,
    or pinned) is refused at import, in one line with the fix; read from the package metadata,
    without importing torch."""
    try:
        found = _installed_version("torch")
    except PackageNotFoundError:
        return  # importing a module that needs torch then says it is missing
    release = tuple(int(part) for part in found.split("+")[0].split(".")[:2] if part.isdigit())
    if release < MIN_TORCH:
        wanted = ".".join(map(str, MIN_TORCH))
        raise ImportError(f"trainmap needs torch >= {wanted}; this environment has torch {found}: "
                          f"pip install 'torch>={wanted}' (or a matching build for your CUDA)")  # fmt: skip


_check_torch()
