"""Names DRA needs: driver names, device names (DNS labels) and attribute names.

Device IDs are free-form (``GPU-8a1f...``, ``0:1``); a device in a ResourceSlice
must be named by a DNS label. The mapping is a pure function of the ID, so the
same device keeps its name across restarts and device-set changes.
"""

from __future__ import annotations

import hashlib
import re

from hetero_dp.dra.validation import MAX_DRIVER_NAME, qualified_name_problem
from hetero_dp.model.errors import ConfigError

# Kubernetes' name rules live in hetero_dp.model.names; re-exported for DRA callers.
from hetero_dp.model.names import MAX_DNS_LABEL as MAX_LABEL
from hetero_dp.model.names import is_dns_label as is_dns_label
from hetero_dp.model.names import is_dns_subdomain as is_dns_subdomain
from hetero_dp.model.names import resource_name_problem


def driver_name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a DRA driver name, or None.

    The API server validates a driver name as a CSI driver name: a DNS subdomain
    of at most 63 bytes; we also want it lowercase, as it names directories.
    """
    if not isinstance(name, str) or not name:
        return "a DRA driver name must be a non-empty string"
    if not is_dns_subdomain(name) or len(name) > MAX_DRIVER_NAME:
        return (
            f"DRA driver name {name!r} must be a lowercase DNS subdomain "
            f"(letters, digits, '-' and '.', at most {MAX_DRIVER_NAME} characters), "
            "e.g. gpu.example.com"
        )
    return None


def driver_name_for(resource: str) -> str:
    """The default driver name of a resource: ``acme.example.com/npu`` -> ``npu.acme.example.com``.

    The resource's name part is lowercased and ``_`` becomes ``-`` so the result
    is a DNS subdomain; ConfigError if it still is not one.
    """
    problem = resource_name_problem(resource)
    if problem:
        raise ConfigError(problem, field="resource")
    prefix, _, short = resource.partition("/")
    name = f"{short.lower().replace('_', '-')}.{prefix}"
    problem = driver_name_problem(name)
    if problem:
        raise ConfigError(
            f"cannot derive a DRA driver name from {resource!r}: {problem}; set one with "
            "--driver-name",
            field="driverName",
        )
    return name


def device_name(device_id: str) -> str:
    """The DNS label naming ``device_id`` in a ResourceSlice.

    An ID that already is a DNS label is kept. Any other is lowercased, runs of
    other characters become ``-``, and an 8-hex-digit hash of the original ID is
    appended, so two IDs that differ only in case or punctuation stay distinct.
    """
    if is_dns_label(device_id):
        return device_id
    digest = hashlib.sha256(device_id.encode()).hexdigest()[:8]
    base = re.sub(r"[^a-z0-9]+", "-", device_id.lower()).strip("-")
    base = base[: MAX_LABEL - len(digest) - 1].rstrip("-")
    return f"{base}-{digest}" if base else f"d-{digest}"


def is_attribute_name(key: str) -> bool:
    """A valid DRA attribute/capacity name: a C identifier of at most 32 characters,
    optionally after a domain (a driver name: DNS subdomain of at most 63) and ``/``."""
    return qualified_name_problem(key) is None


def attribute_name(key: str) -> str | None:
    """A valid DRA attribute/capacity name for ``key``, or None if none can be made.

    ``-`` and ``.`` in the identifier become ``_``; one starting with a digit gets a
    leading ``_``.
    """
    domain, slash, ident = key.rpartition("/")
    ident = re.sub(r"[^A-Za-z0-9_]", "_", ident)
    if ident[:1].isdigit():
        ident = "_" + ident
    name = f"{domain}/{ident}" if slash else ident
    return name if is_attribute_name(name) else None
