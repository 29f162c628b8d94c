"""The ``hetero-dp`` command: thin click commands that parse and call."""

from hetero_dp.cli.main import main

__all__ = ["main"]
