"""How an Allocate response delivers devices: device specs, CDI annotations, CDI names.

A resource's config section picks the strategies (combinable)::

    deliver: [device-specs]          # default: DeviceSpecs, mounts, env
    deliver: [cdi-cri]               # CDIDevice names (Kubernetes >= 1.28)
    deliver: [cdi-annotations]       # annotation <prefix>hetero-dp_<hash> = names
    cdiKind: vendor.com/class        # default: the resource name
    cdiAnnotationPrefix: cdi.k8s.io/ # default

With CDI strategies only, the response carries no DeviceSpecs and no mounts
(the spec has them); env is kept: see ``docs/cdi.md`` for why.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hetero_dp.allocation.cdi import (
    CDINameError,
    check_device_names,
    kind_problem,
)
from hetero_dp.model.device import Device
from hetero_dp.model.errors import AllocationError, ConfigError
from hetero_dp.model.names import is_dns_subdomain
from hetero_dp.model.response import ContainerResponse

log = logging.getLogger(__name__)

DEVICE_SPECS = "device-specs"
CDI_ANNOTATIONS = "cdi-annotations"
CDI_CRI = "cdi-cri"
STRATEGIES = (DEVICE_SPECS, CDI_ANNOTATIONS, CDI_CRI)
DEFAULT_STRATEGIES = (DEVICE_SPECS,)
DEFAULT_ANNOTATION_PREFIX = "cdi.k8s.io/"
ANNOTATION_NAME_PREFIX = "hetero-dp_"
_HASH_LEN = 16

_NAME_START = re.compile(r"^(?:[A-Za-z0-9][-A-Za-z0-9_.]*)?$")


@dataclass(frozen=True)
class Delivery:
    """A resource's parsed delivery settings."""

    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    kind: str | None = None
    annotation_prefix: str = DEFAULT_ANNOTATION_PREFIX

    @property
    def uses_cdi(self) -> bool:
        """True if a CDI strategy is on: the resource then needs a CDI spec."""
        return CDI_ANNOTATIONS in self.strategies or CDI_CRI in self.strategies

    @property
    def device_specs(self) -> bool:
        """True if the plain DeviceSpecs / mounts stay in the response."""
        return DEVICE_SPECS in self.strategies

    def kind_for(self, resource: str) -> str:
        """The CDI kind: ``cdiKind`` if set, else the resource name."""
        return self.kind or resource


def without_cdi(delivery: Delivery) -> Delivery:
    """The fallback where the container runtime cannot consume CDI: device specs, plus
    any strategy that needs no CDI."""
    kept = tuple(s for s in delivery.strategies if s not in (CDI_ANNOTATIONS, CDI_CRI))
    return Delivery(kept or (DEVICE_SPECS,), delivery.kind, delivery.annotation_prefix)


def _sub(field: str, name: str) -> str:
    return f"{field}.{name}" if field else name


def annotation_prefix_problem(prefix: object) -> str | None:
    """Why ``prefix`` cannot start an annotation key of ours, or None.

    The key is ``prefix + "hetero-dp_" + <16 hex>`` and must be a valid
    Kubernetes annotation key: a lowercase DNS subdomain, ``/``, and a name of at
    most 63 characters.
    """
    if not isinstance(prefix, str):
        return f"must be a string like 'cdi.k8s.io/', got {prefix!r}"
    domain, slash, start = prefix.partition("/")
    if not slash or "/" in start:
        return f"{prefix!r} must be a DNS name followed by one '/', like 'cdi.k8s.io/'"
    if not is_dns_subdomain(domain):
        return f"{domain!r} in {prefix!r} is not a lowercase DNS subdomain"
    room = 63 - len(ANNOTATION_NAME_PREFIX) - _HASH_LEN
    if len(start) > room or not _NAME_START.match(start):
        return (
            f"the part after '/' in {prefix!r} must be at most {room} letters, digits, '-', '_' "
            "or '.', starting with a letter or digit"
        )
    return None


def parse_delivery(
    settings: Mapping[str, Any] | None, field: str = "", *, resource: str | None = None
) -> Delivery:
    """Parse and check ``deliver``, ``cdiKind`` and ``cdiAnnotationPrefix``.

    ``field`` is where the section sits in the config (``resources.acme.com/fpga``);
    errors name ``<field>.<key>``. ``resource`` lets a CDI strategy check the
    default kind (the resource name) at start-up. Other keys are ignored.
    """
    settings = settings or {}
    raw = settings.get("deliver", list(DEFAULT_STRATEGIES))
    if isinstance(raw, str):
        raw = [s.strip() for s in raw.split(",")]
    if not isinstance(raw, (list, tuple)) or not raw:
        raise ConfigError(
            f"must be a non-empty list of {', '.join(STRATEGIES)}, got {raw!r}",
            field=_sub(field, "deliver"),
        )
    unknown = [s for s in raw if s not in STRATEGIES]
    if unknown:
        raise ConfigError(
            f"unknown delivery strategies {unknown!r}; choose from {', '.join(STRATEGIES)}",
            field=_sub(field, "deliver"),
        )
    strategies = tuple(dict.fromkeys(raw))
    kind = settings.get("cdiKind")
    if kind is not None:
        problem = kind_problem(kind)
        if problem:
            raise ConfigError(problem, field=_sub(field, "cdiKind"))
    prefix = settings.get("cdiAnnotationPrefix", DEFAULT_ANNOTATION_PREFIX)
    problem = annotation_prefix_problem(prefix)
    if problem:
        raise ConfigError(problem, field=_sub(field, "cdiAnnotationPrefix"))
    delivery = Delivery(strategies, kind, prefix)
    if resource is not None:
        check_default_kind(delivery, resource, field)
    return delivery


def check_default_kind(delivery: Delivery, resource: str, field: str = "") -> None:
    """With a CDI strategy and no ``cdiKind`` the kind is the resource name: a
    ConfigError (``<field>.cdiKind``) where that name is no CDI kind."""
    if delivery.uses_cdi and delivery.kind is None:
        problem = kind_problem(resource)
        if problem:
            raise ConfigError(
                f"the CDI kind defaults to the resource name, which does not fit: {problem}; "
                "set cdiKind",
                field=_sub(field, "cdiKind"),
            )


def annotation_key(prefix: str, kind: str, ids: Sequence[str]) -> str:
    """``<prefix>hetero-dp_<hash>``: one key per (kind, device IDs).

    Deterministic, so a repeated Allocate answers the same; the kind is hashed
    in so that two resources of one container never share a key (the kubelet
    drops conflicting annotations).
    """
    import hashlib  # here: it loads OpenSSL (~1.5 MiB), needed only for CDI annotations

    digest = hashlib.sha256("\0".join([kind, *ids]).encode()).hexdigest()[:_HASH_LEN]
    return f"{prefix}{ANNOTATION_NAME_PREFIX}{digest}"


def qualified_names(kind: str, devices: Sequence[Device]) -> list[str]:
    """``kind=<id>`` per device, in request order; AllocationError for unfit IDs."""
    ids = list(dict.fromkeys(d.id for d in devices))
    try:
        check_device_names(ids, kind)
    except CDINameError as e:
        raise AllocationError(str(e), code="FAILED_PRECONDITION") from e
    return [f"{kind}={i}" for i in ids]


def apply_delivery(
    default: ContainerResponse, devices: Sequence[Device], delivery: Delivery
) -> ContainerResponse:
    """Turn the default response into what the resource's strategies ask for.

    ``default`` is built from the device records; ``devices`` are the physical
    devices of the request; ``delivery`` is the resource's, parsed once where its
    settings were read (engine/settings.py ``ResourceSettings``). Returns a new
    response; ``default`` is not changed. Annotations and CDI names already in
    ``default`` stay. Raises AllocationError (``FAILED_PRECONDITION``) for IDs that
    are not CDI names.
    """
    out = ContainerResponse(
        envs=dict(default.envs),
        mounts=list(default.mounts),
        devices=list(default.devices),
        annotations=dict(default.annotations),
        cdi_devices=list(default.cdi_devices),
    )
    if not delivery.uses_cdi or not devices:
        return out
    kind = delivery.kind_for(devices[0].resource)
    names = qualified_names(kind, devices)
    if not delivery.device_specs:
        # The spec carries nodes and mounts. Env stays: list keys such as
        # ACME_VISIBLE_DEVICES=0,1 must be joined per request, which CDI cannot do.
        out.devices = []
        out.mounts = []
    if CDI_CRI in delivery.strategies:
        out.cdi_devices.extend(n for n in names if n not in out.cdi_devices)
    if CDI_ANNOTATIONS in delivery.strategies:
        key = annotation_key(delivery.annotation_prefix, kind, [d.id for d in devices])
        out.annotations[key] = ",".join(names)
    return out
