"""The attribution series' names and labels: the one place they are spelt.

The chart's PrometheusRule and dashboard, ``hetero-dp top`` and the docs
(docs/operations.md, "Attribution") use these names.

Device-plugin mode, every backend, labels ``resource, device, pod, namespace, container``:

``hetero_dp_device_allocation_info`` (1)
    One per device the kubelet reports held by a container: ``device`` is the ID as
    advertised, a replica's ID (``<id>::<n>``) on a shared device.
``hetero_dp_container_memory_used_bytes``
    Device memory the container's processes hold on that device (summed over them),
    where the backend reports it (the ``usage`` hook). ``device`` is the ID the
    container holds (the first, sorted, where it holds several replicas of one device).
``hetero_dp_container_utilization_ratio``
    The container's processes' share of the device's compute, 0 to 1, summed.
``hetero_dp_container_memory_fair_share_bytes``
    Shared devices only: the device's memory x the replicas the container holds /
    the device's replicas; the "container over its fair share" alert compares the
    used bytes with it.

DRA mode, labels ``driver, pool, device, namespace, claim, pod``:

``hetero_dp_claim_allocation_info`` (1)
    One per device of a claim this node prepared and per pod in the claim's
    ``status.reservedFor`` (``pod=""`` when none is listed). A claim's consumers live
    in the claim's namespace (the API server refuses others), so one ``namespace``
    label serves the claim and the pod alike, the same name as the device-plugin
    series use, which lets one dashboard filter both.

Labels added to backend samples (:class:`hetero_dp.Sample` ``device_id``/``pid``),
as dcgm-exporter names them: ``pod``, ``namespace``, ``container``.
"""

from __future__ import annotations

DEVICE_ALLOCATION = "hetero_dp_device_allocation_info"
CONTAINER_MEMORY = "hetero_dp_container_memory_used_bytes"
CONTAINER_UTILIZATION = "hetero_dp_container_utilization_ratio"
CONTAINER_FAIR_SHARE = "hetero_dp_container_memory_fair_share_bytes"
CLAIM_ALLOCATION = "hetero_dp_claim_allocation_info"

#: Labels of the device-plugin mode series, in order.
CONTAINER_LABELS = ("resource", "device", "pod", "namespace", "container")
#: Labels of the DRA holder series, in order.
CLAIM_LABELS = ("driver", "pool", "device", "namespace", "claim", "pod")
#: Labels the framework adds to a backend's samples (dcgm-exporter's names).
HOLDER_LABELS = ("pod", "namespace", "container")
