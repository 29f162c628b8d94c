"""Attribution: which container holds each device, and what each container uses.

Backends report per-process usage (the ``usage`` hook, :class:`ProcessUsage`); this
layer maps each process to its container and every exporter (``/metrics``),
``hetero-dp doctor`` and ``hetero-dp top`` read the same view. The chain, for a
process: its host PID -> the pod UID and container ID in ``/proc/<pid>/cgroup``
-> the container's name and device IDs in the kubelet's device checkpoint
(``kubelet_internal_checkpoint``) -> the pod's name and namespace from the
kubelet's pod-resources API (``List``), joined on the resource, the device IDs and
the container name (that API gives no pod UID). The metric names are in
:mod:`hetero_dp.usage.names`; docs/operations.md ("Attribution") explains them.
"""
