"""Prometheus metrics for one daemon.

Event counters and the Allocate latency histogram follow :mod:`hetero_dp.kits.observe`
events; gauges (devices total/healthy, open streams, registration) are read from
the daemon's state at scrape time, so they can never drift from it. Backends add
their own samples through the ``metrics`` hook, gathered before each scrape.

Every daemon gets its own registry (several daemons may share a test process).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from hetero_dp.kits import observe
from hetero_dp.model.device import Sample
from hetero_dp.model.errors import BackendError
from hetero_dp.model.usage import ProcessUsage
from hetero_dp.ops.attributing import Attributing
from hetero_dp.usage import names as usage_names
from hetero_dp.usage import series, source
from hetero_dp.usage.attribution import Attribution

if TYPE_CHECKING:
    from hetero_dp.engine.daemon import Daemon

log = logging.getLogger(__name__)

PREFIX = "hetero_dp_"
#: Names under our prefix that backends fill, because only they can measure them
#: (docs/metrics.md): the memory guard of shared devices (docs/sharing.md).
BACKEND_NAMES = frozenset(
    {
        "hetero_dp_shared_memory_used_bytes",
        "hetero_dp_shared_memory_total_bytes",
        "hetero_dp_shared_memory_fair_share_bytes",
        "hetero_dp_shared_memory_process_used_bytes",
    }
)
BACKEND_SCRAPE_TIMEOUT = 5.0
MAX_REASON = 120  # a label value; long reasons are cut, not dropped
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class _StateCollector(Collector):
    """Gauges read from the daemon at scrape time, plus the backends' last samples."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        daemon = self.metrics.daemon
        total = GaugeMetricFamily(
            PREFIX + "devices", "Devices advertised to the kubelet.", labels=["resource"]
        )
        healthy = GaugeMetricFamily(
            PREFIX + "devices_healthy", "Healthy devices advertised.", labels=["resource"]
        )
        streams = GaugeMetricFamily(
            PREFIX + "list_and_watch_streams", "Open ListAndWatch streams.", labels=["resource"]
        )
        registered = GaugeMetricFamily(
            PREFIX + "resource_registered",
            "1 while the resource is registered with the kubelet.",
            labels=["resource"],
        )
        ready = GaugeMetricFamily(
            PREFIX + "resource_ready",
            "1 while the resource is registered and its ListAndWatch stream is open; 0 for "
            "one a backend requires while it has no device.",
            labels=["resource"],
        )
        device_healthy = GaugeMetricFamily(
            PREFIX + "device_healthy",
            "1 while an advertised device is healthy, 0 while not (reason: why).",
            labels=["resource", "device", "reason"],
        )
        missing = daemon.requirements.missing()  # required, no device: not ready
        for name in sorted(set(missing) - set(daemon.resources)):
            total.add_metric([name], 0)
            healthy.add_metric([name], 0)
            ready.add_metric([name], 0)
        for name, res in sorted(daemon.resources.items()):
            for d in res.state.devices:
                reason = "" if d.healthy else str(d.reason or "")[:MAX_REASON]
                device_healthy.add_metric([name, d.id, reason], 1 if d.healthy else 0)
            total.add_metric([name], len(res.state.devices))
            healthy.add_metric([name], res.state.healthy_count)
            session = daemon.front_end.session(name)  # the front end's, not the engine's
            streams.add_metric([name], session.open_streams if session else 0)
            registered.add_metric([name], 1 if session and session.registered else 0)
            ready.add_metric([name], 1 if session and session.ready and name not in missing else 0)
        yield from (total, healthy, device_healthy, streams, registered, ready)
        view = self.metrics.attribution.view if self.metrics.attribution else None
        if view is not None:
            yield from series.families(view)
        # a front end that prepares claims (DRA) says who holds them
        claim_holders = getattr(getattr(daemon, "front_end", None), "claim_holders", None)
        if callable(claim_holders):
            yield series.claim_family(claim_holders())
        yield from self.metrics.backend_families()


class Metrics:
    """The daemon's registry: counters fed by observe events, gauges from state."""

    def __init__(self, daemon: Daemon, attributing: Attributing | None = None) -> None:
        self.daemon = daemon
        #: the daemon's one Attribution, shared with its loop (ops/attributing.py)
        self.attributing = attributing or Attributing(daemon)
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.health_transitions = Counter(
            PREFIX + "health_transitions",
            "Device health transitions, by the health reached and its reason.",
            ["resource", "health", "reason"],
            registry=r,
        )
        self.allocations = Counter(
            PREFIX + "allocations",
            "Allocate calls, by gRPC status code.",
            ["resource", "code"],
            registry=r,
        )
        self.allocation_errors = Counter(
            PREFIX + "allocation_errors",
            "Allocate calls answered with an error.",
            ["resource", "code"],
            registry=r,
        )
        self.allocate_seconds = Histogram(
            PREFIX + "allocate_seconds",
            "Time to answer Allocate.",
            ["resource"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.preferred = Counter(
            PREFIX + "preferred_allocations",
            "GetPreferredAllocation calls, by gRPC status code.",
            ["resource", "code"],
            registry=r,
        )
        self.registrations = Counter(
            PREFIX + "registrations",
            "Successful registrations with the kubelet.",
            ["resource", "mode"],
            registry=r,
        )
        self.registration_failures = Counter(
            PREFIX + "registration_failures",
            "Failed registration attempts.",
            ["resource"],
            registry=r,
        )
        self.kubelet_restarts = Counter(
            PREFIX + "kubelet_restarts",
            "Kubelet restarts seen (a new kubelet.sock).",
            registry=r,
        )
        self.socket_deletions = Counter(
            PREFIX + "socket_deletions",
            "Own plugin sockets deleted by someone else (a kubelet restart, or a cleanup).",
            registry=r,
        )
        self.stream_opens = Counter(
            PREFIX + "list_and_watch_opened",
            "ListAndWatch streams opened by the kubelet.",
            ["resource"],
            registry=r,
        )
        self.hook_errors = Counter(
            PREFIX + "hook_errors",
            "Backend hooks that raised, timed out or returned garbage.",
            ["backend", "hook"],
            registry=r,
        )
        self.reloads = Counter(
            PREFIX + "config_reloads",
            "Configuration reloads, by result (applied, unchanged, rejected).",
            ["result"],
            registry=r,
        )
        r.register(_StateCollector(self))
        self._samples: dict[str, list[Sample]] = {}  # backend name -> last samples
        self._unsubscribe = observe.subscribe(self._on_event)

    @property
    def attribution(self) -> Attribution | None:
        """Made at the first refresh (a scrape's or the loop's)."""
        return self.attributing.attribution

    def close(self) -> None:
        self._unsubscribe()

    # --- events ----------------------------------------------------------

    def _ours(self, fields: dict[str, Any]) -> bool:
        """Events of another daemon in the same process are not ours."""
        resource = fields.get("resource")
        if resource is not None:
            d = self.daemon
            return resource in d.resources or any(
                resource in rt.resources for rt in d.runtimes.values()
            )
        backend = fields.get("backend")
        if backend is not None:
            return backend in self.daemon.runtimes
        return True

    def _on_event(self, event: str, fields: dict[str, Any]) -> None:
        if not self._ours(fields):
            return
        resource = str(fields.get("resource", ""))
        if event == "health_transition":
            reason = str(fields.get("reason") or "")[:MAX_REASON]
            health = "healthy" if fields.get("healthy") else "unhealthy"
            self.health_transitions.labels(resource, health, reason).inc()
        elif event == "allocate":
            code = str(fields.get("code", "OK"))
            self.allocations.labels(resource, code).inc()
            if code != "OK":
                self.allocation_errors.labels(resource, code).inc()
            seconds = fields.get("seconds")
            if isinstance(seconds, int | float):
                self.allocate_seconds.labels(resource).observe(seconds)
        elif event == "preferred_allocation":
            self.preferred.labels(resource, str(fields.get("code", "OK"))).inc()
        elif event == "registered":
            self.registrations.labels(resource, str(fields.get("mode", ""))).inc()
        elif event == "registration_failed":
            self.registration_failures.labels(resource).inc()
        elif event == "kubelet_restart":
            # one restart is one new kubelet.sock plus a deletion per plugin socket
            if fields.get("reason") == "kubelet.sock created":
                self.kubelet_restarts.inc()
            else:
                self.socket_deletions.inc()
        elif event == "stream_opened":
            self.stream_opens.labels(resource).inc()
        elif event == "hook_error":
            self.hook_errors.labels(str(fields.get("backend")), str(fields.get("hook"))).inc()
        elif event == "config_reload":
            self.reloads.labels(str(fields.get("result", ""))).inc()

    # --- backend samples -------------------------------------------------

    async def refresh_attribution(self, usage: list[ProcessUsage]) -> None:
        """Who holds and uses what, with the PIDs the samples name."""
        pids = {s.pid for ss in self._samples.values() for s in ss if s.pid is not None}
        await self.attributing.refresh(usage, pids)

    async def refresh_backends(self) -> None:
        """Ask every backend with a ``metrics`` hook for samples and every one with a
        ``usage`` hook for its processes (concurrently), then attribute them."""
        runtimes = [rt for rt in self.daemon.runtimes.values() if rt.backend.implements("metrics")]
        results, usage = await asyncio.gather(
            asyncio.gather(*(self._backend_samples(rt) for rt in runtimes)),
            source.usages(self.daemon, BACKEND_SCRAPE_TIMEOUT),
        )
        for rt, samples in zip(runtimes, results):
            self._samples[rt.backend.name] = samples
        await self.refresh_attribution(usage)

    async def _backend_samples(self, rt: Any) -> list[Sample]:
        b = rt.backend
        try:
            # a list of Sample: the hook's row in hookspecs.POLICY checks it
            samples: list[Sample] = await b.call(
                "metrics",
                devices=list(rt.published.values()),
                timeout=min(b.timeout, BACKEND_SCRAPE_TIMEOUT),
            )
        except BackendError as e:
            log.error("%s", e, extra={"backend": b.name, "hook": "metrics"})
            observe.emit("hook_error", backend=b.name, hook="metrics", error=str(e))
            return []
        return samples

    def backend_families(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        for backend, samples in sorted(self._samples.items()):
            for s in samples:
                problem = _sample_problem(s)
                if problem:
                    log.warning("dropping metric sample: %s", problem, extra={"backend": backend})
                    continue
                labels = self._with_holder(s)
                key = (s.name, tuple(sorted(labels.items())))
                if key in seen:
                    continue
                seen.add(key)
                fam = families.get(s.name)
                if fam is None:
                    fam = families[s.name] = Metric(s.name, s.help or s.name, "gauge")
                fam.add_sample(s.name, labels, float(s.value))
        yield from families.values()

    def _with_holder(self, s: Sample) -> dict[str, str]:
        """The sample's labels, with its holder's pod, namespace and container where
        attribution knows them (labels the backend set itself are kept)."""
        labels = dict(s.labels)
        owner = self.attribution.owner_of(s) if self.attribution else None
        if owner is not None:
            for key, value in zip(
                usage_names.HOLDER_LABELS, (owner.pod, owner.namespace, owner.container)
            ):
                labels.setdefault(key, value)
        return labels

    async def render(self) -> bytes:
        """The text exposition, backend samples freshly gathered."""
        await self.refresh_backends()
        return generate_latest(self.registry)


def _sample_problem(s: Sample) -> str | None:
    if not _METRIC_NAME.match(s.name):
        return f"invalid metric name {s.name!r}"
    if s.name.startswith(PREFIX) and s.name not in BACKEND_NAMES:
        return f"metric name {s.name!r} uses hetero-dp's own prefix {PREFIX!r}"
    bad = [k for k in s.labels if not _LABEL_NAME.match(k) or k.startswith("__")]
    if bad:
        return f"metric {s.name!r}: invalid label name {bad[0]!r}"
    if not isinstance(s.value, int | float) or isinstance(s.value, bool):
        return f"metric {s.name!r}: value {s.value!r} is not a number"
    return None
