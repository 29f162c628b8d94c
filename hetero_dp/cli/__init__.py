"""The ``hetero-dp`` command: thin click commands that parse and call."""

from hetero_dp.cli.cleanup import cleanup_command
from hetero_dp.cli.main import main
from hetero_dp.cli.top import top

main.add_command(top)  # here, not in main.py: one module per command family
main.add_command(cleanup_command)

__all__ = ["main"]
