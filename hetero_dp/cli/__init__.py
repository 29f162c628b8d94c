"""The ``hetero-dp`` command: thin click commands that parse and call."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, MutableMapping

import click

from hetero_dp.cli.main import main


class LazyCommands(MutableMapping[str, click.Command]):
    """A group's commands, some imported only when first asked for (by name, or by
    listing them all as ``--help`` does): ``run`` then never loads the modules of
    commands it is not (start-up, issue 35 point 7)."""

    def __init__(self, loaded: Mapping[str, click.Command], lazy: Mapping[str, str]) -> None:
        self._loaded = dict(loaded)
        self._lazy = dict(lazy)  # name -> "module:attribute"

    def __getitem__(self, name: str) -> click.Command:
        if name not in self._loaded and name in self._lazy:
            module, _, attr = self._lazy.pop(name).partition(":")
            self._loaded[name] = getattr(importlib.import_module(module), attr)
        return self._loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._lazy.pop(name, None)
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        if self._lazy.pop(name, None) is None:
            del self._loaded[name]

    def __iter__(self) -> Iterator[str]:
        return iter([*self._loaded, *(n for n in self._lazy if n not in self._loaded)])

    def __len__(self) -> int:
        return len(self._loaded.keys() | self._lazy.keys())


# here, not in main.py: one module per command family
main.commands = LazyCommands(
    main.commands,
    {"top": "hetero_dp.cli.top:top", "cleanup": "hetero_dp.cli.cleanup:cleanup_command"},
)

__all__ = ["main"]
