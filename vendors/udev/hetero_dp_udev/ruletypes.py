"""What a rules file says, as records: a :class:`Rule` per resource with its
:class:`Match`, :class:`Companion` nodes and :class:`HealthRule`, and the templates
its fields may hold (:func:`template_fields`, :func:`render`). Reading and checking
a file is :mod:`.rules` (loading) and :mod:`.entries` (one entry)."""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hetero_dp import Mount

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


class _Placeholders(dict[str, object]):
    def get(self, key: object, default: object = None) -> object:
        return f"<{str(key).rpartition(':')[2].rpartition('/')[2]}>"
