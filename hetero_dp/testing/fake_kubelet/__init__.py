"""A fake kubelet that speaks the real device-plugin API over real unix sockets.

It behaves as the kubelet's device manager does (docs/sources.md#device-plugin-api);
each piece says which part of the kubelet it models and from which source:

- :mod:`.registration`: ``Registration`` on ``kubelet.sock`` and the plugin watcher
  on ``plugins_registry``;
- :mod:`.clients`: the client per plugin endpoint (dial-back,
  ``GetDevicePluginOptions``, ListAndWatch) with the kubelet 1.32 semantics of a
  second registration and of a stream's end (``runClient``/``getClient``/
  ``disconnectClient``);
- :mod:`.devices`: the device-manager bookkeeping (device sets, allocatable,
  health timeline, admission);
- :mod:`.kubelet`: :class:`FakeKubelet`, which composes them, with the kubelet's
  lifecycle (a restart with downtime) and the calls it makes (Allocate, ...).
"""

from __future__ import annotations

from hetero_dp.testing.fake_kubelet.devices import (
    AdmissionError,
    DeviceManager,
    FakeDevice,
    FakeResource,
    HealthPoint,
)
from hetero_dp.testing.fake_kubelet.kubelet import FakeKubelet

__all__ = [
    "AdmissionError",
    "DeviceManager",
    "FakeDevice",
    "FakeKubelet",
    "FakeResource",
    "HealthPoint",
]
