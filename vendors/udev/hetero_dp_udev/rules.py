"""Rules files: which udev devices become which Kubernetes resources.

A rules file is YAML with one entry per resource (see docs/udev.md for the full
reference). Loading is strict: unknown keys, bad regexes, bad templates and
invalid resource names are ``ConfigError``s naming the file and the entry.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import re2
import yaml

from hetero_dp import ConfigError, Mount, resource_name_problem, unknown_key

SHIPPED_PACKAGE = "hetero_dp_udev.rulesets"

ID_KINDS = ("pci", "node", "sysname", "serial")
SCOPES = ("pci", "device", "slot", "index")
TEMPLATE_KEYS = ("index", "id", "pci", "sysname", "sysnum", "node", "serial", "vendor", "device")
TARGETS = ("device", "pci")
NAMES = ("vendor", "generic")


@dataclass(frozen=True)
class Pattern:
    """A value test: equality with ``equals`` or a full match of ``regex``."""

    equals: str | None = None
    regex: Any = None  # an RE2 pattern (linear-time matching): see _regex

    def matches(self, value: str | None) -> bool:
        if value is None:
            return False
        if self.regex is not None:
            return self.regex.fullmatch(value) is not None
        return value == self.equals

    def __str__(self) -> str:
        return f"regex {self.regex.pattern!r}" if self.regex else repr(self.equals)


@dataclass(frozen=True)
class Match:
    """What a udev device must look like to become a device of the resource."""

    subsystem: str | None = None
    sysname: tuple[str, ...] = ()
    devnode: tuple[str, ...] = ()
    vendor: frozenset[int] = frozenset()
    device: frozenset[int] = frozenset()
    driver: frozenset[str] = frozenset()
    attributes: Mapping[str, Pattern] = field(default_factory=dict)
    properties: Mapping[str, Pattern] = field(default_factory=dict)


@dataclass(frozen=True)
class Companion:
    """Extra per-device nodes found in sysfs near the matched device."""

    subsystem: str | None = None
    sysname: tuple[str, ...] = ()
    devnode: tuple[str, ...] = ()
    scope: str = "pci"

    @property
    def everywhere(self) -> bool:
        """Whether the node may live outside the device's own subtree (``scope: index``:
        a virtual device without a parent, paired with the device by its number)."""
        return self.scope == "index"


@dataclass(frozen=True)
class HealthRule:
    """An optional sysfs attribute that must match for the device to be healthy."""

    attribute: str
    pattern: Pattern
    target: str = "device"
    interval: float | None = None


@dataclass(frozen=True)
class Rule:
    resource: str
    source: str
    position: int
    match: Match
    id_kind: str = "pci"
    id_attribute: str | None = None
    id_template: str | None = None
    drivers: frozenset[str] = frozenset()
    index: tuple[str, ...] = ("order",)
    primary_node: bool = True
    companions: tuple[Companion, ...] = ()
    node_templates: tuple[str, ...] = ()
    shared_nodes: tuple[str, ...] = ()
    permissions: str = "rw"
    mounts: tuple[Mount, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    limit: int | None = None
    product: str | None = None
    health: HealthRule | None = None
    section: str = "resources"
    # a templated name's last rendering per device (syspath), so a device whose
    # driver is unbound (its attributes gone) keeps its resource, Unhealthy
    names_seen: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    @property
    def templated(self) -> bool:
        """Whether the resource name is a template: one resource per rendered name."""
        return "{" in self.resource

    @property
    def label(self) -> str:
        """The resource name for people: a template's placeholders as ``<VBNV>``."""
        return render(self.resource, _Placeholders()) if self.templated else self.resource

    @property
    def where(self) -> str:
        """Where the rule came from, for messages."""
        return f"{self.source}: {self.section}[{self.position}] ({self.label})"

    @property
    def usable_drivers(self) -> frozenset[str]:
        """Globs of the drivers a usable device is bound to (``drivers``, else
        ``match.driver``); empty: the driver is not checked."""
        return self.drivers or self.match.driver

    @property
    def template_attributes(self) -> tuple[str, ...]:
        """Attributes named by ``{attribute:<name>}`` placeholders in env, annotations,
        node templates and the ID template."""
        names: list[str] = []
        texts = [self.resource, *self.env.values(), *self.annotations.values()]
        texts += self.node_templates
        if self.id_template:
            texts.append(self.id_template)
        for text in texts:
            for _, name, spec, _ in string.Formatter().parse(text):
                if name == "attribute" and spec and spec not in names:
                    names.append(spec)
        return tuple(names)

    @property
    def order_sensitive(self) -> bool:
        """Whether one device's arrival can change another's record beyond its
        ``order`` index (``limit``, or the index rendered into IDs or node paths):
        such rules are rescanned whole on events instead of device by device."""
        return self.limit is not None or (
            "order" in self.index and bool(self.id_template or self.node_templates)
        )

    @property
    def wants_nodes(self) -> bool:
        """Whether a device without any per-device node is incomplete (its driver is
        still creating them). A primary node is only expected when udev names one."""
        return bool(self.companions or self.node_templates)


# --------------------------------------------------------------------------- loading


def shipped_rule_sets() -> list[str]:
    """Names of the rule sets shipped inside the package."""
    folder = resources.files(SHIPPED_PACKAGE)
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_rules(spec: object, names: str = "vendor") -> list[Rule]:
    """Load rules from ``spec``: a path, a list of shipped names and/or paths, or a
    comma-separated string of shipped names. ``names`` picks a file's ``generic``
    resources instead of its ``resources`` where it has them (``generic``)."""
    if names not in NAMES:
        raise ConfigError(f"must be one of {', '.join(NAMES)}, got {names!r}", field="names")
    if isinstance(spec, (str, Path)):
        text = str(spec)
        items: list[str] = (
            [text] if _looks_like_path(text) else [s.strip() for s in text.split(",") if s.strip()]
        )
    elif isinstance(spec, Sequence) and all(isinstance(s, (str, Path)) for s in spec):
        items = [str(s) for s in spec]
    else:
        raise ConfigError(
            "must be a rules file path or a list of shipped rule-set names "
            f"({', '.join(shipped_rule_sets())}), got {spec!r}",
            field="rules",
        )
    if not items:
        raise ConfigError(
            f"no rules given; shipped rule sets: {', '.join(shipped_rule_sets())}", field="rules"
        )
    rules: list[Rule] = []
    for item in items:
        if _looks_like_path(item):
            path = Path(item)
            try:
                text = path.read_text(encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"cannot read rules file: {exc.strerror}", source=item) from exc
            rules.extend(parse_rules(text, source=item, names=names))
        else:
            rules.extend(load_shipped(item, names=names))
    _check_unique(rules)
    return rules


def load_shipped(name: str, names: str = "vendor") -> list[Rule]:
    known = shipped_rule_sets()
    if name not in known:
        raise ConfigError(
            f"unknown shipped rule set {name!r}; shipped: {', '.join(known)}", field="rules"
        )
    resource = resources.files(SHIPPED_PACKAGE).joinpath(f"{name}.yaml")
    return parse_rules(
        resource.read_text(encoding="utf-8"), source=f"shipped rule set {name!r}", names=names
    )


def _looks_like_path(text: str) -> bool:
    return "/" in text or text.endswith((".yaml", ".yml"))


def _check_unique(rules: Iterable[Rule]) -> None:
    seen: dict[str, Rule] = {}
    for rule in rules:
        if rule.resource in seen:
            raise ConfigError(
                f"resource {rule.resource!r} is defined twice: {seen[rule.resource].where} "
                f"and {rule.where}",
                source=rule.source,
            )
        seen[rule.resource] = rule


def parse_rules(text: str, source: str, names: str = "vendor") -> list[Rule]:
    """Parse one rules document; ``source`` names it in error messages. With
    ``names="generic"`` its ``generic`` list (if any) replaces ``resources``."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {exc}", source=source) from exc
    if not isinstance(doc, dict):
        raise ConfigError("must be a mapping with a 'resources' list", source=source)
    _no_unknown(doc, {"version", "resources", "generic"}, source, "")
    if doc.get("version", 1) != 1:
        raise ConfigError(
            f"unsupported version {doc['version']!r} (1)", field="version", source=source
        )
    if "generic" in doc and (not isinstance(doc["generic"], list) or not doc["generic"]):
        raise ConfigError("must be a non-empty list", field="generic", source=source)
    entries = doc.get("resources")
    if not isinstance(entries, list) or not entries:
        raise ConfigError("must be a non-empty list", field="resources", source=source)
    # Both lists are checked, whichever is used, so a mistake never waits for the switch.
    rules = [_parse_entry(entry, source, i) for i, entry in enumerate(entries)]
    if "generic" in doc:
        generic = [_parse_entry(e, source, i, "generic") for i, e in enumerate(doc["generic"])]
        _check_unique(generic)
        if names == "generic":
            return generic
    _check_unique(rules)
    return rules


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


def _no_unknown(obj: Mapping[str, Any], allowed: set[str], source: str, fld: str) -> None:
    unknown = _unknown(obj, allowed)
    if unknown:
        key = f"{fld}.{unknown[0]}" if fld else unknown[0]
        raise ConfigError(unknown[1], field=key, source=source)


def _parse_entry(raw: object, source: str, position: int, section: str = "resources") -> Rule:
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


def template_fields(text: str) -> list[str]:
    fields = []
    for _, name, spec, conv in string.Formatter().parse(text):
        if name is None:
            continue
        if name == "attribute" and spec and not conv:
            fields.append(f"attribute:{spec}")
            continue
        if spec or conv or name not in TEMPLATE_KEYS:
            raise ValueError(
                f"unknown placeholder {{{name}{'!' + conv if conv else ''}"
                f"{':' + spec if spec else ''}}}; known: "
                + ", ".join("{" + k + "}" for k in TEMPLATE_KEYS)
                + ", {attribute:<name>}"
            )
        fields.append(name)
    return fields


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


class _Placeholders(dict[str, object]):
    def get(self, key: object, default: object = None) -> object:
        return f"<{str(key).rpartition(':')[2].rpartition('/')[2]}>"


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


def render(template: str, values: Mapping[str, object]) -> str:
    """Fill a template checked at load time; missing values render empty.
    ``{attribute:<name>}`` reads ``values["attribute:<name>"]``."""
    out: list[str] = []
    for literal, name, spec, _ in string.Formatter().parse(template):
        out.append(literal)
        if name is None:
            continue
        key = f"attribute:{spec}" if name == "attribute" else name
        out.append(str(values.get(key, "")))
    return "".join(out)
