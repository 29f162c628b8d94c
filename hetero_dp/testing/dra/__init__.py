"""Test kit for DRA mode: a DRA kubelet and a stand-in for the API server.

- :mod:`.apiserver`: :class:`FakeAPIServer`, :func:`make_claim`, :func:`slice_problems`
- :mod:`.kubelet`: :class:`FakeDRAKubelet` (and the records it keeps)
- :mod:`.runner`: :class:`DRARunner`, DRA daemons in-process

Everything is importable from ``hetero_dp.testing.dra`` as before the split.
"""

from __future__ import annotations

from hetero_dp.testing.dra.apiserver import (
    FEATURES,
    GROUP,
    SCHEMA_VERSION,
    FakeAPIServer,
    Request,
    make_claim,
    slice_problems,
)
from hetero_dp.testing.dra.kubelet import (
    WIRE,
    ClaimRef,
    DeviceHealthStatus,
    DRAPlugin,
    FakeDRAKubelet,
)
from hetero_dp.testing.dra.runner import DRARunner

__all__ = [
    "FEATURES",
    "GROUP",
    "SCHEMA_VERSION",
    "WIRE",
    "ClaimRef",
    "DRAPlugin",
    "DRARunner",
    "DeviceHealthStatus",
    "FakeAPIServer",
    "FakeDRAKubelet",
    "Request",
    "make_claim",
    "slice_problems",
]
