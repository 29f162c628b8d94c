"""hetero-dp's generic udev/sysfs backend: accelerators from a rules file, no vendor code."""

from __future__ import annotations

from .backend import UdevBackend
from .rules import Rule, load_rules, shipped_rule_sets

__all__ = ["Rule", "UdevBackend", "load_rules", "shipped_rule_sets"]
