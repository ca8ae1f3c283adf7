"""trainmap: how networks train, as a declarative experiment workflow."""

__version__ = "0.1.0"
