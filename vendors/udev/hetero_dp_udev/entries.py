"""One entry of a rules file, checked field by field into a
:class:`~.ruletypes.Rule`: every error names the file, the entry and the field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import re2

from hetero_dp import ConfigError, Mount, resource_name_problem, unknown_key

from .ruletypes import (
    ID_KINDS,
    SCOPES,
    TARGETS,
    Companion,
    HealthRule,
    Match,
    Pattern,
    Rule,
    render,
    template_fields,
)


class _Entry:
    """Error helper: names the file, the entry and the field."""

    def __init__(self, source: str, position: int, name: str, section: str = "resources") -> None:
        self.source = source
        self.position = position
        self.name = name
        self.section = section

    def error(self, fld: str, reason: str) -> ConfigError:
        label = f"{self.section}[{self.position}]" + (f".{fld}" if fld else "")
        who = f"entry {self.name!r}: " if self.name else ""
        return ConfigError(f"{who}{reason}", field=label, source=self.source)

    def no_unknown(self, obj: Mapping[Any, Any], allowed: set[str], fld: str = "") -> None:
        """Refuse keys outside ``allowed``, naming the first under ``fld``."""
        unknown = _unknown(obj, allowed)
        if unknown:
            raise self.error(f"{fld}.{unknown[0]}" if fld else unknown[0], unknown[1])


ENTRY_KEYS = {
    "name",
    "match",
    "id",
    "drivers",
    "index",
    "primaryNode",
    "companions",
    "nodeTemplates",
    "sharedNodes",
    "permissions",
    "mounts",
    "env",
    "annotations",
    "limit",
    "product",
    "health",
}
MATCH_KEYS = {"subsystem", "sysname", "devnode", "vendor", "device", "driver", "attributes"}
MATCH_KEYS |= {"properties"}
COMPANION_KEYS = {"subsystem", "sysname", "devnode", "scope"}
HEALTH_KEYS = {"attribute", "equals", "regex", "target", "interval"}
MOUNT_KEYS = {"hostPath", "containerPath", "readOnly"}


def _unknown(obj: Mapping[Any, Any], allowed: set[str]) -> tuple[str, str] | None:
    """(the first unknown key, the reason in the config's one style: the closest known
    key and the known ones), or None."""
    unknown = sorted(str(k) for k in obj if k not in allowed)
    if not unknown:
        return None
    return unknown[0], unknown_key(unknown[0], sorted(allowed))


def no_unknown(obj: Mapping[str, Any], allowed: set[str], source: str, fld: str) -> None:
    unknown = _unknown(obj, allowed)
    if unknown:
        key = f"{fld}.{unknown[0]}" if fld else unknown[0]
        raise ConfigError(unknown[1], field=key, source=source)


def parse_entry(raw: object, source: str, position: int, section: str = "resources") -> Rule:
    name = raw.get("name") if isinstance(raw, dict) else None
    ctx = _Entry(source, position, name if isinstance(name, str) else "", section)
    if not isinstance(raw, dict):
        raise ctx.error("", "each entry must be a mapping")
    ctx.no_unknown(raw, ENTRY_KEYS)
    problem = resource_name_problem(_sample_name(name, ctx))
    if problem:
        raise ctx.error("name", f"invalid resource name: {problem}")
    assert isinstance(name, str)
    if "match" not in raw:
        raise ctx.error("match", "is required")
    match = _parse_match(raw["match"], ctx)

    id_kind, id_attribute, id_template = _parse_id(raw.get("id", "pci"), ctx)
    drivers = frozenset(_globs(raw.get("drivers", []), ctx, "drivers"))
    index = _parse_index(raw.get("index", "order"), ctx)
    primary = raw.get("primaryNode", True)
    if not isinstance(primary, bool):
        raise ctx.error("primaryNode", f"must be true or false, got {primary!r}")
    companions = tuple(
        _parse_companion(c, ctx, f"companions[{i}]")
        for i, c in enumerate(_list(raw.get("companions", []), ctx, "companions"))
    )
    templates = tuple(
        _template(t, ctx, f"nodeTemplates[{i}]", node=True)
        for i, t in enumerate(_list(raw.get("nodeTemplates", []), ctx, "nodeTemplates"))
    )
    shared = tuple(
        _dev_path(p, ctx, f"sharedNodes[{i}]")
        for i, p in enumerate(_list(raw.get("sharedNodes", []), ctx, "sharedNodes"))
    )
    permissions = raw.get("permissions", "rw")
    if not isinstance(permissions, str) or not permissions or set(permissions) - set("rwm"):
        raise ctx.error("permissions", f"must be made of r, w, m, got {permissions!r}")
    mounts = tuple(
        _parse_mount(m, ctx, f"mounts[{i}]")
        for i, m in enumerate(_list(raw.get("mounts", []), ctx, "mounts"))
    )
    env = _string_map(raw.get("env", {}), ctx, "env", templates=True)
    annotations = _string_map(raw.get("annotations", {}), ctx, "annotations", templates=True)
    limit = raw.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ctx.error("limit", f"must be a positive integer, got {limit!r}")
    product = raw.get("product")
    if product is not None and not isinstance(product, str):
        raise ctx.error("product", f"must be a string, got {product!r}")
    health = _parse_health(raw["health"], ctx) if raw.get("health") is not None else None
    return Rule(
        resource=name,
        source=source,
        position=position,
        match=match,
        id_kind=id_kind,
        id_attribute=id_attribute,
        id_template=id_template,
        drivers=drivers,
        index=index,
        primary_node=primary,
        companions=companions,
        node_templates=templates,
        shared_nodes=shared,
        permissions=permissions,
        mounts=mounts,
        env=env,
        annotations=annotations,
        limit=limit,
        product=product,
        health=health,
        section=section,
    )


def _list(value: object, ctx: _Entry, fld: str) -> list[Any]:
    if isinstance(value, (str, dict)):
        return [value]
    if not isinstance(value, list):
        raise ctx.error(fld, f"must be a list, got {value!r}")
    return value


def _globs(value: object, ctx: _Entry, fld: str) -> tuple[str, ...]:
    items = _list(value, ctx, fld)
    for item in items:
        if not isinstance(item, str) or not item:
            raise ctx.error(fld, f"must be a glob string or a list of them, got {item!r}")
    return tuple(items)


def _ids(value: object, ctx: _Entry, fld: str) -> frozenset[int]:
    out = set()
    for item in _list([value] if isinstance(value, int) else value, ctx, fld):
        if isinstance(item, bool):
            raise ctx.error(fld, f"must be a hex ID like '0x1002', got {item!r}")
        if isinstance(item, int):  # YAML reads an unquoted 0x1002 as the integer
            number = item
        elif isinstance(item, str):
            try:
                number = int(item, 16)
            except ValueError:
                raise ctx.error(fld, f"must be a hex ID like '0x1002', got {item!r}") from None
        else:
            raise ctx.error(fld, f"must be a hex ID like '0x1002', got {item!r}")
        if not 0 <= number <= 0xFFFF:
            raise ctx.error(fld, f"PCI IDs are 16 bits, got {item!r}")
        out.add(number)
    return frozenset(out)


def attribute_name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a sysfs attribute of the device, or None: attributes
    are read only inside the device's own sysfs directory (and the directories its
    glob head names), so no ``..``, ``.``, empty part or absolute path."""
    if not isinstance(name, str) or not name:
        return f"must be a sysfs attribute name, got {name!r}"
    if name.startswith("/") or any(p in ("", ".", "..") for p in name.split("/")):
        return (
            f"{name!r} must be a path inside the device's sysfs directory "
            "(no leading '/', no '.' or '..' parts)"
        )
    if any(ord(c) < 0x20 or c == "\x7f" for c in name):
        return f"{name!r} holds control characters"
    return None


def _attribute_name(name: object, ctx: _Entry, fld: str) -> str:
    problem = attribute_name_problem(name)
    if problem:
        raise ctx.error(fld, problem)
    assert isinstance(name, str)
    return name


def _pattern(value: object, ctx: _Entry, fld: str) -> Pattern:
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return Pattern(equals=str(value))
    if isinstance(value, dict) and set(value) == {"regex"}:
        return Pattern(regex=_regex(value["regex"], ctx, f"{fld}.regex"))
    if isinstance(value, dict) and set(value) == {"equals"}:
        return Pattern(equals=str(value["equals"]))
    raise ctx.error(fld, f"must be a value, {{equals: value}} or {{regex: pattern}}, got {value!r}")


def _regex(value: object, ctx: _Entry, fld: str) -> Any:
    """A rule regex compiled by RE2 (google-re2): matching takes time linear in the
    value, so no pattern can hang discovery or hold the interpreter lock past a
    SIGTERM, as Python's backtracking ``re`` does with ``(a+)+b`` (issue #29). RE2
    has no backreferences or lookaround; such a pattern is refused here. Its syntax:
    https://github.com/google/re2/wiki/Syntax"""
    if not isinstance(value, str):
        raise ctx.error(fld, f"must be a string, got {value!r}")
    try:
        return re2.compile(value, _RE2_OPTIONS)
    except re2.error as exc:
        detail = exc.args[0].decode(errors="replace") if exc.args else str(exc)
        if isinstance(exc.args[0] if exc.args else None, str):
            detail = exc.args[0]
        raise ctx.error(
            fld,
            f"bad regex {value!r}: {detail} (rules use RE2 syntax, which runs in linear "
            "time: no backreferences or lookaround)",
        ) from None


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # the refusal is our ConfigError, not a line on stderr
_RE2_OPTIONS.max_mem = 8 << 20  # a pattern that needs more is refused at load


def _parse_match(raw: object, ctx: _Entry) -> Match:
    if not isinstance(raw, dict) or not raw:
        raise ctx.error("match", "must be a non-empty mapping")
    ctx.no_unknown(raw, MATCH_KEYS, "match")
    subsystem = raw.get("subsystem")
    if subsystem is not None and (not isinstance(subsystem, str) or not subsystem):
        raise ctx.error("match.subsystem", f"must be a subsystem name, got {subsystem!r}")
    drivers = _globs(raw.get("driver", []), ctx, "match.driver")
    devnodes = _globs(raw.get("devnode", []), ctx, "match.devnode")
    for glob in devnodes:
        if not glob.startswith("/dev/"):
            raise ctx.error("match.devnode", f"must be a path under /dev/, got {glob!r}")
    return Match(
        subsystem=subsystem,
        sysname=_globs(raw.get("sysname", []), ctx, "match.sysname"),
        devnode=devnodes,
        vendor=_ids(raw.get("vendor", []), ctx, "match.vendor"),
        device=_ids(raw.get("device", []), ctx, "match.device"),
        driver=frozenset(drivers),
        attributes=_patterns(raw.get("attributes", {}), ctx, "match.attributes"),
        properties=_patterns(raw.get("properties", {}), ctx, "match.properties"),
    )


def _patterns(raw: object, ctx: _Entry, fld: str) -> dict[str, Pattern]:
    if not isinstance(raw, dict):
        raise ctx.error(fld, f"must be a mapping of name to value or {{regex: ...}}, got {raw!r}")
    if fld.endswith("attributes"):
        for k in raw:
            _attribute_name(k, ctx, f"{fld}.{k}")
    return {str(k): _pattern(v, ctx, f"{fld}.{k}") for k, v in raw.items()}


def _parse_id(raw: object, ctx: _Entry) -> tuple[str, str | None, str | None]:
    if isinstance(raw, str) and raw in ID_KINDS:
        return raw, None, None
    if isinstance(raw, str) and "{" in raw:  # a template: Ascend910-{index}
        return "template", None, _template(raw, ctx, "id")
    if isinstance(raw, str) and raw.startswith("attribute:") and raw[10:]:
        return "attribute", _attribute_name(raw[10:], ctx, "id"), None
    raise ctx.error(
        "id",
        f"must be one of {', '.join(ID_KINDS)}, attribute:<name> or a template "
        f"such as 'Ascend910-{{index}}', got {raw!r}",
    )


def _parse_index(raw: object, ctx: _Entry) -> tuple[str, ...]:
    items = _list(raw, ctx, "index")
    for item in items:
        ok = item in ("order", "sysnum") or (
            isinstance(item, str)
            and item.startswith(("attribute:", "property:", "child:"))
            and item.split(":", 1)[1]
        )
        if not ok:
            raise ctx.error(
                "index",
                "each source must be order, sysnum, attribute:<name>, property:<name> or "
                f"child:<subsystem>, got {item!r}",
            )
    for item in items:
        if item.startswith("attribute:"):
            _attribute_name(item[10:], ctx, "index")
    if not items:
        raise ctx.error("index", "must name at least one source")
    return tuple(items)


def _parse_companion(raw: object, ctx: _Entry, fld: str) -> Companion:
    if not isinstance(raw, dict) or not raw:
        raise ctx.error(fld, "must be a mapping with subsystem, sysname and/or devnode")
    ctx.no_unknown(raw, COMPANION_KEYS, fld)
    scope = raw.get("scope", "pci")
    if scope not in SCOPES:
        raise ctx.error(f"{fld}.scope", f"must be one of {', '.join(SCOPES)}, got {scope!r}")
    subsystem = raw.get("subsystem")
    if subsystem is not None and not isinstance(subsystem, str):
        raise ctx.error(f"{fld}.subsystem", f"must be a subsystem name, got {subsystem!r}")
    comp = Companion(
        subsystem=subsystem,
        sysname=_globs(raw.get("sysname", []), ctx, f"{fld}.sysname"),
        devnode=_globs(raw.get("devnode", []), ctx, f"{fld}.devnode"),
        scope=scope,
    )
    if not (comp.subsystem or comp.sysname or comp.devnode):
        raise ctx.error(fld, "needs at least one of subsystem, sysname, devnode")
    if comp.everywhere and not (comp.subsystem and comp.sysname):
        raise ctx.error(
            fld,
            "scope: index needs subsystem and sysname (the node is looked up by them "
            "anywhere in sysfs and paired by the number in its name)",
        )
    return comp


def _template(value: object, ctx: _Entry, fld: str, node: bool = False) -> str:
    if not isinstance(value, str):
        raise ctx.error(fld, f"must be a string, got {value!r}")
    try:
        fields = template_fields(value)
    except ValueError as exc:
        raise ctx.error(fld, f"bad template {value!r}: {exc}") from None
    for f in fields:
        if f.startswith("attribute:"):
            _attribute_name(f[10:], ctx, fld)
    if node:
        _dev_path(render(value, _Sample()), ctx, fld, shown=value)
    return value


def _sample_name(name: object, ctx: _Entry) -> object:
    """A resource name with its placeholders filled by a sample value, to check the
    fixed part (``xilinx.com/fpga-{attribute:rom.*/VBNV}``: one resource per value,
    each checked again when a device renders it)."""
    if not isinstance(name, str) or "{" not in name:
        return name
    _template(name, ctx, "name")
    if "/" in name.partition("{")[0]:
        return render(name, _Sample())
    raise ctx.error("name", f"placeholders may only follow the '/' of {name!r}")


class _Sample(dict[str, object]):
    def get(self, key: object, default: object = None) -> object:
        return "x"


def _dev_path(value: object, ctx: _Entry, fld: str, shown: object = None) -> str:
    shown = value if shown is None else shown
    if not isinstance(value, str) or not value.startswith("/dev/"):
        raise ctx.error(fld, f"must be a path under /dev/, got {shown!r}")
    if _normal(value) != value:
        raise ctx.error(
            fld, f"must be a normalised path under /dev/ (no '.', '..', '//'), got {shown!r}"
        )
    return value


def _normal(path: str) -> str:
    import posixpath

    return posixpath.normpath(path) if not path.startswith("//") else path[1:]


def _parse_mount(raw: object, ctx: _Entry, fld: str) -> Mount:
    if not isinstance(raw, dict):
        raise ctx.error(fld, "must be a mapping with hostPath, containerPath, readOnly")
    ctx.no_unknown(raw, MOUNT_KEYS, fld)
    host = raw.get("hostPath")
    if not isinstance(host, str) or not host.startswith("/") or _normal(host) != host:
        raise ctx.error(f"{fld}.hostPath", f"must be an absolute, normalised path, got {host!r}")
    container = raw.get("containerPath", host)
    if (
        not isinstance(container, str)
        or not container.startswith("/")
        or _normal(container) != container
    ):
        raise ctx.error(
            f"{fld}.containerPath", f"must be an absolute, normalised path, got {container!r}"
        )
    read_only = raw.get("readOnly", True)
    if not isinstance(read_only, bool):
        raise ctx.error(f"{fld}.readOnly", f"must be true or false, got {read_only!r}")
    return Mount(host_path=host, container_path=container, read_only=read_only, shared=True)


def _string_map(raw: object, ctx: _Entry, fld: str, templates: bool) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise ctx.error(fld, f"must be a mapping of name to value, got {raw!r}")
    out = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not key:
            raise ctx.error(fld, f"keys must be strings, got {key!r}")
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise ctx.error(f"{fld}.{key}", f"must be a string, got {value!r}")
        out[key] = _template(str(value), ctx, f"{fld}.{key}") if templates else str(value)
    return out


def _parse_health(raw: object, ctx: _Entry) -> HealthRule:
    if not isinstance(raw, dict):
        raise ctx.error("health", "must be a mapping with attribute and equals or regex")
    ctx.no_unknown(raw, HEALTH_KEYS, "health")
    attribute = _attribute_name(raw.get("attribute"), ctx, "health.attribute")
    if ("equals" in raw) == ("regex" in raw):
        raise ctx.error("health", "needs exactly one of equals, regex")
    if "regex" in raw:
        pattern = Pattern(regex=_regex(raw["regex"], ctx, "health.regex"))
    else:
        pattern = Pattern(equals=str(raw["equals"]))
    target = raw.get("target", "device")
    if target not in TARGETS:
        raise ctx.error("health.target", f"must be one of {', '.join(TARGETS)}, got {target!r}")
    interval = raw.get("interval")
    if interval is not None and (
        isinstance(interval, bool) or not isinstance(interval, (int, float)) or interval <= 0
    ):
        raise ctx.error(
            "health.interval", f"must be a positive number of seconds, got {interval!r}"
        )
    return HealthRule(
        attribute=attribute,
        pattern=pattern,
        target=target,
        interval=float(interval) if interval is not None else None,
    )
