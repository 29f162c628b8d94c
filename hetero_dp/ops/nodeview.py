"""The node as the local daemon's ``/metrics`` shows it: each device, its health, who
holds it and what each holder uses. ``hetero-dp top`` draws it; ``hetero-dp doctor``
names the containers over their fair share from it. Neither needs kubelet access of
its own: the daemon already joined the kubelet's view with the driver's.

The endpoint is untrusted input: the read is bounded in size and in time, and
anything but Prometheus text with hetero-dp's series is one clear :class:`ViewError`.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from hetero_dp.model.device import replica_base
from hetero_dp.model.errors import ConfigError
from hetero_dp.ops.probes import parse_address

MAX_BYTES = 8 << 20  # a node with thousands of devices and processes stays far below
TIMEOUT = 3.0  # seconds for the whole read, not per packet

HEALTH = "hetero_dp_device_healthy"
# the attribution series (hetero_dp/usage/names.py spells them for the daemon)
ALLOCATION = "hetero_dp_device_allocation_info"
MEMORY = "hetero_dp_container_memory_used_bytes"
UTILIZATION = "hetero_dp_container_utilization_ratio"
FAIR_SHARE = "hetero_dp_container_memory_fair_share_bytes"
CLAIM_ALLOCATION = "hetero_dp_claim_allocation_info"  # DRA mode


class ViewError(Exception):
    """The daemon's metrics could not be read; the message is one line saying why."""


@dataclass
class Holder:
    """One container holding a device (``device``: the ID it holds, a replica's on a
    shared device), with what its processes use there (``None``: not reported)."""

    namespace: str
    pod: str
    container: str
    device: str
    memory: float | None = None
    utilization: float | None = None
    fair_share: float | None = None
    claim: str = ""  # DRA mode: the ResourceClaim (its consumers name no container)

    @property
    def name(self) -> str:
        if self.claim:
            return f"{self.namespace}/{self.pod or '-'} (claim {self.claim})"
        return f"{self.namespace}/{self.pod}/{self.container}"

    @property
    def over_fair_share(self) -> bool:
        return (
            self.memory is not None
            and self.fair_share is not None
            and (self.memory > self.fair_share)
        )


@dataclass
class DeviceRow:
    """A device as advertised (replicas folded into the device they stand for)."""

    resource: str
    device: str
    healthy: bool = True
    reason: str = ""
    replicas: int = 0  # 0: not shared
    holders: list[Holder] = field(default_factory=list)

    @property
    def health(self) -> str:
        if self.healthy:
            return "Healthy"
        return f"Unhealthy: {self.reason}" if self.reason else "Unhealthy"


def metrics_url(address: str) -> str:
    """``http://...`` as given; ``HOST:PORT`` or ``:PORT`` (``metrics.address``) as the
    local daemon's ``/metrics`` (a wildcard host is asked on the loopback)."""
    if address.startswith(("http://", "https://")):
        return address
    try:
        host, port = parse_address(address, field="--url")
    except ConfigError as e:
        raise ViewError(str(e)) from None
    if host in (None, "", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"


def fetch(url: str, timeout: float = TIMEOUT, max_bytes: int = MAX_BYTES) -> str:
    """The body of ``url``, at most ``max_bytes``, read within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            chunks: list[bytes] = []
            size = 0
            while True:
                if time.monotonic() > deadline:
                    raise ViewError(f"{url} did not answer within {timeout:g} s")
                chunk = resp.read1(65536)
                if not chunk:
                    break
                size += len(chunk)
                if size > max_bytes:
                    raise ViewError(
                        f"{url} answered more than {max_bytes} bytes: "
                        "not a hetero-dp daemon's /metrics"
                    )
                chunks.append(chunk)
    except urllib.error.HTTPError as e:
        raise ViewError(f"{url} answers HTTP {e.code}: not a hetero-dp daemon's /metrics") from None
    except (TimeoutError, urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", None) or e
        raise ViewError(f"no daemon answers at {url}: {reason}") from None
    try:
        return b"".join(chunks).decode()
    except UnicodeDecodeError:
        raise ViewError(f"{url} answered bytes that are not text: not /metrics?") from None


Series = dict[str, list[tuple[dict[str, str], float]]]


def parse(text: str, url: str = "/metrics") -> Series:
    """Prometheus text -> {sample name: [(labels, value)]}; hetero-dp's series or a
    :class:`ViewError`."""
    out: Series = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    except (ValueError, TypeError, IndexError, KeyError) as e:
        first = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
        raise ViewError(f"{url} did not answer Prometheus text ({first})") from None
    if not any(name.startswith("hetero_dp_") for name in out):
        raise ViewError(f"{url} answers no hetero_dp_ series: not a hetero-dp daemon")
    return out


def _container(labels: dict[str, str]) -> tuple[str, str, str, str, str]:
    return (
        labels.get("resource", ""),
        replica_base(labels.get("device", "")),
        labels.get("namespace", ""),
        labels.get("pod", ""),
        labels.get("container", ""),
    )


def rows(series: Series) -> list[DeviceRow]:
    """One row per device (replicas folded), holders and their usage attached."""
    table: dict[tuple[str, str], DeviceRow] = {}

    def row(resource: str, device: str) -> DeviceRow:
        key = (resource, replica_base(device))
        if key not in table:
            table[key] = DeviceRow(resource, key[1])
        return table[key]

    for labels, value in series.get(HEALTH, []):
        r = row(labels.get("resource", ""), labels.get("device", ""))
        if labels.get("device", "") != r.device:
            r.replicas += 1
        if not value:
            r.healthy = False
            r.reason = r.reason or labels.get("reason", "")
    holders: dict[tuple[str, str, str, str, str], Holder] = {}
    for labels, _ in series.get(ALLOCATION, []):
        key = _container(labels)
        if key not in holders:
            holders[key] = Holder(key[2], key[3], key[4], labels.get("device", ""))
            row(key[0], key[1]).holders.append(holders[key])
    for name, attr in (
        (MEMORY, "memory"),
        (UTILIZATION, "utilization"),
        (FAIR_SHARE, "fair_share"),
    ):
        for labels, value in series.get(name, []):
            h = holders.get(_container(labels))
            if h is not None:
                setattr(h, attr, value)
    for r in table.values():
        r.holders.sort(key=lambda h: h.name)
    return sorted(table.values(), key=lambda r: (r.resource, r.device))


def claim_holders(series: Series) -> list[tuple[str, str, Holder]]:
    """DRA mode: (driver, device name in the ResourceSlice, holder) per prepared claim
    and pod in its ``reservedFor``."""
    out = []
    for labels, _ in series.get(CLAIM_ALLOCATION, []):
        device = labels.get("device", "")
        holder = Holder(
            labels.get("namespace", ""), labels.get("pod", ""), "", device,
            claim=labels.get("claim", ""),
        )  # fmt: skip
        out.append((labels.get("driver", ""), device, holder))
    return sorted(out, key=lambda t: (t[0], t[1], t[2].name))


def read(url: str, timeout: float = TIMEOUT, max_bytes: int = MAX_BYTES) -> list[DeviceRow]:
    """Fetch, parse and fold: the rows, or a :class:`ViewError` saying why not."""
    return rows(parse(fetch(url, timeout, max_bytes), url))


def read_series(url: str, timeout: float = TIMEOUT, max_bytes: int = MAX_BYTES) -> Series:
    """Fetch and parse: the series by name, or a :class:`ViewError` saying why not."""
    return parse(fetch(url, timeout, max_bytes), url)


def over_fair_share(devices: Iterable[DeviceRow]) -> list[tuple[DeviceRow, Holder]]:
    """The holders whose memory passes their fair share of a shared device."""
    return [(r, h) for r in devices for h in r.holders if h.over_fair_share]
