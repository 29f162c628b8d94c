"""Did-you-mean hints for names typed on the command line."""

from __future__ import annotations

from collections.abc import Sequence

import click

from hetero_dp.model.names import closest


def flag_hint(args: Sequence[str]) -> str:
    """'; did you mean --fake-kubelet?' for the first of ``args`` close to a flag of the
    command being run, else ''."""
    ctx = click.get_current_context(silent=True)
    known = [o for p in (ctx.command.params if ctx else []) for o in p.opts if o.startswith("--")]
    for arg in args:
        close = closest(arg.partition("=")[0], known) if arg.startswith("--") else None
        if close:
            return f"; did you mean {close}?"
    return ""
