"""trainmap: how networks train, as a declarative experiment workflow."""

__version__ = "0.1.0"

#: The oldest torch trainmap supports (pyproject.toml's bound).
MIN_TORCH = (2, 10)


def check_torch(found: str) -> None:
    """Refuse a torch older than :data:`MIN_TORCH` (installed with ``--no-deps``, or pinned) in
    one line with the fix. ``found`` is ``torch.__version__``; the entry points that import torch
    anyway call it (the recorder, the ``trainmap`` command), so importing trainmap costs nothing."""
    release = tuple(int(part) for part in found.split("+")[0].split(".")[:2] if part.isdigit())
    if release < MIN_TORCH:
        wanted = ".".join(map(str, MIN_TORCH))
        raise ImportError(f"trainmap needs torch >= {wanted}; this environment has torch {found}: "
                          f"pip install 'torch>={wanted}' (or a matching build for your CUDA)")  # fmt: skip


def exports_on_first_use(package: str, exports: dict[str, str]):  # noqa: ANN201
    """A package's PEP 562 ``__getattr__``: ``package.<name>`` imports ``exports[name]`` (the
    module that defines it) on first use, so importing the package costs nothing."""
    import importlib

    def __getattr__(name: str) -> object:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    return __getattr__
