"""Extended resource names, checked the way the kubelet checks them at Register.

Temporary: the core will expose ``hetero_dp.names.validate_resource_name``; this
module uses it when present and falls back to its own copy of the kubelet's rules.
"""

from __future__ import annotations

import importlib
import re

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_NAME_PART = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")


def resource_name_problem(name: object) -> str | None:
    """Why ``name`` is not a valid extended resource name, or None when it is."""
    if not isinstance(name, str) or not name:
        return "must be a non-empty string like vendor.com/device"
    try:  # one place for each fact: prefer the core's check once it exists
        core = importlib.import_module("hetero_dp.names")
    except ImportError:
        pass
    else:
        try:
            core.validate_resource_name(name)
        except ValueError as exc:
            return str(exc)
        return None
    if name.count("/") != 1:
        return f"{name!r} must be <prefix>/<name> with exactly one '/'"
    prefix, part = name.split("/")
    if "kubernetes.io/" in name:
        return f"{name!r}: the kubernetes.io/ prefix is reserved"
    if name.startswith("requests."):
        return f"{name!r} must not start with 'requests.'"
    if (
        not prefix
        or len(prefix) > 253
        or not all(_DNS_LABEL.fullmatch(label) for label in prefix.split("."))
    ):
        return f"{name!r}: prefix {prefix!r} is not a lowercase DNS subdomain"
    if not part or len(part) > 63 or not _NAME_PART.fullmatch(part):
        return (
            f"{name!r}: name part {part!r} must be at most 63 characters of [A-Za-z0-9._-], "
            "starting and ending with a letter or digit"
        )
    return None
