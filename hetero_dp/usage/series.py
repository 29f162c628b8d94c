"""The attribution series (names in :mod:`.names`) from one :class:`View`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from hetero_dp.usage import names
from hetero_dp.usage.view import ClaimHolder, View


def families(view: View) -> Iterator[Metric]:
    labels = list(names.CONTAINER_LABELS)
    held = GaugeMetricFamily(
        names.DEVICE_ALLOCATION,
        "1 per device the kubelet reports held by a container (device: the ID as advertised).",
        labels=labels,
    )
    seen = set()
    for h in view.holders:
        key = (h.resource, h.device, h.owner)
        if key not in seen:
            seen.add(key)
            o = h.owner
            held.add_metric([h.resource, h.device, o.pod, o.namespace, o.container], 1)
    yield held
    memory = GaugeMetricFamily(
        names.CONTAINER_MEMORY,
        "Device memory a container's processes hold on the device, in bytes.",
        labels=labels,
    )
    util = GaugeMetricFamily(
        names.CONTAINER_UTILIZATION,
        "A container's processes' share of the device's compute, 0 to 1.",
        labels=labels,
    )
    fair = GaugeMetricFamily(
        names.CONTAINER_FAIR_SHARE,
        "A container's fair share of a shared device's memory (memory x replicas held / "
        "replicas), in bytes.",
        labels=labels,
    )
    for use in view.uses:
        o = use.owner
        values = [use.resource, use.device, o.pod, o.namespace, o.container]
        if use.memory_bytes is not None:
            memory.add_metric(values, use.memory_bytes)
        if use.utilization is not None:
            util.add_metric(values, use.utilization)
        if use.fair_share_bytes is not None:
            fair.add_metric(values, use.fair_share_bytes)
    yield from (memory, util, fair)


def claim_family(holders: Iterable[ClaimHolder]) -> Metric:
    fam = GaugeMetricFamily(
        names.CLAIM_ALLOCATION,
        "DRA: 1 per device of a prepared claim and per pod in its reservedFor.",
        labels=list(names.CLAIM_LABELS),
    )
    for h in sorted(set(holders), key=lambda h: (h.driver, h.device, h.claim, h.pod)):
        fam.add_metric([h.driver, h.pool, h.device, h.namespace, h.claim, h.pod], 1)
    return fam
