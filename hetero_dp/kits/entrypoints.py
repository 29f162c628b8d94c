"""Entry points read straight from the installed distributions' ``entry_points.txt``.

``importlib.metadata.entry_points`` answers the same question, but importing it
loads ``email``, ``zipfile``, ``csv`` and more for metadata the daemon never reads:
13 ms of CPU and 1.8 MiB of resident memory in every daemon (benchmarks/
_import_costs.py), the largest single cost of finding a backend. This reads what
it needs the way importlib.metadata does (PEP 376/610 ``*.dist-info`` and
``*.egg-info`` directories on ``sys.path``, in ``sys.path`` order, the first
distribution of a name winning, the INI-like ``entry_points.txt`` of the
packaging specification). Zipped eggs and distributions inside zip files on
``sys.path`` are not searched; tests/core/test_entrypoints.py checks that the
answers agree with importlib.metadata's in this environment.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from dataclasses import dataclass

_SUFFIXES = (".dist-info", ".egg-info")


@dataclass(frozen=True)
class EntryPoint:
    """``name = module[:attr.path] [extras]`` from a group of ``entry_points.txt``."""

    name: str
    value: str
    group: str

    def load(self) -> object:
        """Import the module and follow the attribute path, as importlib.metadata does."""
        module, _, attr = self.value.partition(":")
        obj: object = importlib.import_module(module.strip())
        attr = attr.split("[", 1)[0].strip()
        for part in attr.split(".") if attr else ():
            obj = getattr(obj, part)
        return obj


def _dist_name(directory: str) -> str:
    """The normalized project name of a ``name-version.dist-info`` (or egg-info) dir."""
    stem = directory.rsplit(".", 1)[0]
    return re.sub(r"[-_.]+", "_", stem.split("-", 1)[0]).lower()


def _parse(text: str, group: str) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif section == group and "=" in line:
            name, _, value = line.partition("=")
            found.append((name.strip(), value.strip()))
    return found


def entry_points(*, group: str) -> list[EntryPoint]:
    """The entry points of ``group`` of every distribution on ``sys.path``."""
    seen: set[str] = set()
    out: list[EntryPoint] = []
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:  # missing, not a directory, or a zip file
            continue
        for name in names:
            if not name.lower().endswith(_SUFFIXES):
                continue
            dist = _dist_name(name)
            if dist in seen:  # an earlier sys.path entry has this project: it wins
                continue
            seen.add(dist)
            path = os.path.join(entry or ".", name)
            try:
                with open(os.path.join(path, "entry_points.txt"), encoding="utf-8") as f:
                    text = f.read()
            except OSError:
                continue
            out += [EntryPoint(n, v, group) for n, v in _parse(text, group)]
    return out
