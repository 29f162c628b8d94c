"""The flags of ``hetero-dp run`` that set core settings, generated from their
declarations (:mod:`hetero_dp.engine.settings`): a setting that declares ``flag`` gets
that flag, typed as declared, with its help. What the flags give becomes
``load_config``'s overrides; the environment variables are read there, by the same
declarations."""

from __future__ import annotations

import os
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

from hetero_dp.engine.settings import SETTINGS
from hetero_dp.model.options import Declared

_F = TypeVar("_F", bound=Callable[..., Any])

#: the settings that have a flag, in declaration order
FLAGGED = tuple(s for s in SETTINGS if s.info.flag)


def param_name(setting: Declared) -> str:
    """The click parameter a setting's flag fills (an identifier: ``s_metrics__address``)."""
    return "s_" + setting.key.replace(".", "__")


def _click_type(hint: Any) -> Any:
    if typing.get_origin(hint) is typing.Literal:
        return click.Choice([str(a) for a in typing.get_args(hint)])
    if hint is float:
        return float
    if hint is int:
        return int
    return None  # text: the options reader converts and checks it, naming the flag


def _is_mapping(hint: Any) -> bool:
    return typing.get_origin(hint) in (dict, Mapping) or hint is dict


def _help(setting: Declared) -> str:
    text = setting.info.help[:1].upper() + setting.info.help[1:]
    env = f"; env {setting.info.env}" if setting.info.env else ""
    return f"{text} (config {setting.key}{env})."


def setting_flags(command: _F) -> _F:
    """Add a flag for every core setting that declares one."""
    for s in reversed(FLAGGED):
        assert s.info.flag is not None
        if _is_mapping(s.hint):
            option = click.option(
                s.info.flag,
                param_name(s),
                multiple=True,
                metavar="[KEY=]VALUE",
                help=_help(s) + " Repeatable.",
            )
        else:
            option = click.option(
                s.info.flag, param_name(s), type=_click_type(s.hint), help=_help(s)
            )
        command = option(command)
    return command


def overrides(values: Mapping[str, Any]) -> dict[str, Any]:
    """The settings the flags gave (``values``: the command's parameters), as
    ``load_config``'s overrides: top-level keys, a section's keys under the section. A
    relative path setting is the shell's: made absolute here. A repeatable
    ``KEY=VALUE`` flag gives a mapping (a bare ``VALUE`` under the key ``""``)."""
    out: dict[str, Any] = {}
    for s in FLAGGED:
        value = values.get(param_name(s))
        if value is None or value == ():
            continue
        if _is_mapping(s.hint):
            value = {k if sep else "": v for k, sep, v in (i.rpartition("=") for i in value)}
        elif s.hint is Path:
            value = os.path.abspath(value)
        if "." in s.key:
            section, key = s.key.split(".", 1)
            out.setdefault(section, {})[key] = value
        else:
            out[s.key] = value
    return out
