"""Merging nested mappings: one deep merge for config documents of every kind."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def deep_merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``top`` laid over it: where both hold a mapping under a key the two
    are merged the same way, otherwise ``top``'s value wins. Neither input is changed."""
    out = dict(base)
    for k, v in top.items():
        old = out.get(k)
        out[k] = deep_merge(old, v) if isinstance(v, Mapping) and isinstance(old, Mapping) else v
    return out
