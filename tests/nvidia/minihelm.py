"""A tiny renderer for the subset of Helm templates our chart once used; the chart is
now rendered by a real helm (tests/nvidia/test_deploy.py), and only
:func:`referenced_values` (which ``.Values`` paths the templates name) is used.

Supported: ``{{ .Values.a.b }}``, ``.Release.Name``/``.Release.Namespace``, pipes
``quote``, ``nindent N``, ``trimSuffix "s"``, the function ``toYaml X``, and
``if X`` / ``if not X`` ... ``end`` (nesting allowed), with ``{{-``/``-}}`` trimming.
Anything else raises, so the chart cannot drift into syntax this check ignores.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

ACTION = re.compile(r"{{(-?)\s*(.*?)\s*(-?)}}", re.S)


def lookup(path: str, values: Mapping[str, Any], release: Mapping[str, str]) -> Any:
    if path.startswith(".Release."):
        return release[path[len(".Release.") :]]
    if not path.startswith(".Values."):
        raise ValueError(f"unsupported reference {path!r}")
    node: Any = values
    for part in path[len(".Values.") :].split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(f"{path} is not in values.yaml")
        node = node[part]
    return node


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def evaluate(expr: str, values: Mapping[str, Any], release: Mapping[str, str]) -> str:
    stages = [s.strip() for s in expr.split("|")]
    head = stages[0].split()
    if head[0] == "toYaml":
        data = lookup(head[1], values, release)
        out = yaml.safe_dump(data, default_flow_style=False, sort_keys=False).rstrip("\n")
    elif len(head) == 1:
        out = _scalar(lookup(head[0], values, release))
    else:
        raise ValueError(f"unsupported expression {expr!r}")
    for stage in stages[1:]:
        name, *args = stage.split(None, 1)
        if name == "quote":
            out = '"' + out.replace("\\", "\\\\").replace('"', '\\"') + '"'
        elif name == "nindent":
            pad = " " * int(args[0])
            out = "\n" + "\n".join(pad + line if line else line for line in out.split("\n"))
        elif name == "trimSuffix":
            suffix = args[0].strip().strip('"')
            out = out[: -len(suffix)] if suffix and out.endswith(suffix) else out
        else:
            raise ValueError(f"unsupported pipe {name!r}")
    return out


def truthy(value: Any) -> bool:
    return bool(value) and value != "false"


def render(template: str, values: Mapping[str, Any], release: Mapping[str, str]) -> str:
    out: list[str] = []
    active: list[bool] = []
    pos = 0
    for m in ACTION.finditer(template):
        text = template[pos : m.start()]
        if m.group(1):
            text = text.rstrip(" \t\n")
        if all(active):
            out.append(text)
        pos = m.end()
        if m.group(3):
            while pos < len(template) and template[pos] in " \t\n":
                pos += 1
        action = m.group(2)
        if action.startswith("if "):
            cond = action[3:].strip()
            negate = cond.startswith("not ")
            value = truthy(lookup(cond[4:].strip() if negate else cond, values, release))
            active.append(value != negate)
        elif action == "end":
            active.pop()
        elif all(active):
            out.append(evaluate(action, values, release))
    if active:
        raise ValueError("unclosed if")
    out.append(template[pos:])
    return "".join(out)


def referenced_values(template: str) -> set[str]:
    return set(re.findall(r"\.Values\.([A-Za-z0-9_.]+)", template))
