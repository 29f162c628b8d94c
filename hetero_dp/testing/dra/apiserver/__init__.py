"""The stand-in for the API server DRA mode talks to, and the objects it holds.

- :mod:`.server`: :class:`FakeAPIServer`, which composes the pieces below, with its
  lifecycle (restart, a control-plane upgrade with a draining old process) and the
  test-side changes (wipe a node, lose slices in an etcd restore, hold watches);
- :mod:`.transport`: the endpoints served, the REST dispatch and the HTTP handler;
- :mod:`.store`: the objects, resourceVersions and the watch cache (410 Gone);
- :mod:`.schema`: what the server accepts of a slice (:func:`slice_problems`) and
  how it stores it (canonical quantities, disabled gates' fields dropped, versions);
- :mod:`.watch`: the watch streams (events, bookmarks, expiry, drained processes);
- :mod:`.objects`: ``Status`` bodies, :func:`make_claim`, the request log's
  :class:`Request` and its verbs.
"""

from __future__ import annotations

from hetero_dp.testing.dra.apiserver.objects import Request, make_claim
from hetero_dp.testing.dra.apiserver.schema import (
    FEATURES,
    GROUP,
    SCHEMA_VERSION,
    slice_problems,
)
from hetero_dp.testing.dra.apiserver.server import FakeAPIServer
from hetero_dp.testing.dra.apiserver.watch import WATCH_POLL

__all__ = [
    "FEATURES",
    "GROUP",
    "SCHEMA_VERSION",
    "WATCH_POLL",
    "FakeAPIServer",
    "Request",
    "make_claim",
    "slice_problems",
]
