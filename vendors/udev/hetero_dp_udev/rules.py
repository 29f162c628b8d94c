"""Rules files: which udev devices become which Kubernetes resources.

A rules file is YAML with one entry per resource (see docs/udev.md for the full
reference). Loading is strict: unknown keys, bad regexes, bad templates and
invalid resource names are ``ConfigError``s naming the file and the entry. This
module finds and loads files and shipped rule sets; :mod:`.entries` checks one
entry, :mod:`.ruletypes` holds the records it makes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path

from hetero_dp import ConfigError, load_yaml, read_foreign

from .entries import attribute_name_problem, no_unknown, parse_entry
from .ruletypes import NAMES, Companion, Match, Rule, render, template_fields

__all__ = [
    "Companion",
    "Match",
    "Rule",
    "attribute_name_problem",
    "load_rules",
    "load_shipped",
    "parse_rules",
    "render",
    "shipped_rule_sets",
    "template_fields",
]

SHIPPED_PACKAGE = "hetero_dp_udev.rulesets"
MAX_RULES_BYTES = 1024 * 1024  # the shipped rule sets are a few KiB each


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
            try:  # a ConfigMap's file: a FIFO or a huge file in its place is refused
                text = read_foreign(path, max_bytes=MAX_RULES_BYTES, follow=True).decode()
            except ValueError as exc:  # ForeignFileError, UnicodeDecodeError
                raise ConfigError(f"cannot read rules file: {exc}", source=item) from None
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
    try:  # bounded: aliases, depth, a key given twice (hetero_dp.load_yaml)
        doc, _surprises = load_yaml(text)
    except ValueError as exc:
        raise ConfigError(f"not valid YAML: {exc}", source=source) from None
    if not isinstance(doc, dict):
        raise ConfigError("must be a mapping with a 'resources' list", source=source)
    no_unknown(doc, {"version", "resources", "generic"}, source, "")
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
    rules = [parse_entry(entry, source, i) for i, entry in enumerate(entries)]
    if "generic" in doc:
        generic = [parse_entry(e, source, i, "generic") for i, e in enumerate(doc["generic"])]
        _check_unique(generic)
        if names == "generic":
            return generic
    _check_unique(rules)
    return rules
