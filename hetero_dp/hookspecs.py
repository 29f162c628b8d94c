# mypy: disable-error-code="empty-body"
"""Every hook a backend can implement: the whole plugin contract on one screen.

A backend is an object (or, for a single-file plugin, a module) with methods marked
``@hetero_dp.hookimpl`` whose names match the specifications below. Only
:func:`discover` is required. A packaged backend registers one way, the way every
bundled backend and ``hetero-dp new``'s project do: a class whose methods are the
hooks, one instance of it named ``plugin`` in its module, and an entry point in the
group ``hetero_dp`` that names that instance (``acme = "acme_npu:plugin"``); a test
registers an instance of its own the same way.
Hooks may be plain functions (run in a worker thread, so they may block) or
``async def`` coroutines (run on the event loop with no thread hop, so they must
not block). Both run under the same ``hookTimeout``; a coroutine that returns
without waiting on anything answers in the same turn of the loop, which is why the
bundled backends' ``allocate`` hooks are ``async def``: the kubelet's hot path pays
for no thread. The plain hooks the kubelet waits on (``allocate``,
``pre_start_container``, ``preferred_allocation``) get worker threads of their
own, so a hanging health check cannot hold up an Allocate.
A hook may take any subset of its arguments, by name.

The framework calls each backend's hooks on their own, so a backend that
raises or hangs only harms the devices it covers: they turn Unhealthy with
the error as the reason, and the daemon keeps serving everything else.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import pluggy

from hetero_dp.model.errors import AllocationError, ConfigError

if TYPE_CHECKING:
    from hetero_dp.kits.runtimeconf import RuntimeView
    from hetero_dp.model.device import Check, Device, Link, Sample
    from hetero_dp.model.events import EventSink
    from hetero_dp.model.response import ContainerResponse
    from hetero_dp.model.usage import ProcessUsage

hookspec = pluggy.HookspecMarker("hetero_dp")


@hookspec
def configure(options: Mapping[str, Any]) -> None:
    """Receive this backend's options before anything else runs.

    ``options`` is the ``backends.<name>`` section of the config file merged
    with the ``-o`` flags. Annotate it with a dataclass whose fields are made with
    :func:`hetero_dp.option` (``def configure(options: AcmeOptions)``) and the
    framework checks every value against the declared types and limits (reading
    each option's environment variable too), refuses unknown keys with the closest
    known one, and passes an instance; ``hetero-dp list --options`` prints them.
    Without such an annotation the hook gets the mapping as it is. Raise
    ``hetero_dp.ConfigError`` (or ``ValueError``) to stop start-up; the message
    names the field.

    A config reload whose options for this backend changed calls it again while
    the daemon runs (and while ``watch`` may be running), once the new options have
    been read and every other part of the reload has accepted the new config: a
    reload refused for any other reason never calls it. Raising then rejects the
    reload and the old options stay in force.
    """


@hookspec
def required_resources() -> Mapping[str, str] | Iterable[str] | None:
    """Name the resources this node must have a device of before the daemon is ready.

    Called right after each :func:`configure` (at start-up and on a reload that
    changed the options); return a constant or what the options say. Return
    resource names as the devices' ``resource`` field spells them (no globs), or a
    mapping of each name to why it is required (``"udev.expect names it"``), shown
    in the reason; ``None`` or nothing: none. While one of them has no device at
    all (Unhealthy ones count: their reasons are logged), ``/readyz`` answers 503
    naming it and the readiness file (``metrics.readyFile``) is absent, and one log
    line says so; it turns ready once a device of it is found (a rediscovery or a
    ``watch`` event). So a rolled-out config that finds nothing, a rules typo, stalls
    a DaemonSet's surge roll with the old pod still serving, rather than replacing
    it. Name only what every node running the backend has: a node without one is
    never ready.
    """


@hookspec
def discover() -> Iterable[Device]:
    """Return (or yield) every device this backend sees now. Required.

    Called at start, on every rediscovery interval and whenever the backend
    asks for it through :meth:`EventSink.rediscover`. Each call returns the
    whole set: devices left out are removed from the kubelet's view.
    """


@hookspec
def check_health(device: Device) -> bool | str | None:
    """Probe one device; polled every ``healthInterval`` seconds.

    Return ``True`` or ``None`` for healthy, ``False`` or a string (the reason)
    for unhealthy; a :class:`hetero_dp.Lost` reason says the device is gone until
    repaired (DRA mode taints it ``NoExecute``). A device that passes again turns
    Healthy again. A call that
    passes ``hookTimeout`` marks only this device; while it is stuck the device is
    not checked again, and when it returns the device is judged again.
    """


@hookspec
def watch(events: EventSink) -> None:
    """Run for the life of the daemon, pushing events as they happen.

    Report health with ``events.set_health(device_id, healthy, reason)`` and
    device-set changes with ``events.rediscover()``. A plain function runs in
    its own thread and should return once ``events.stopping`` is set (wait on
    it, or poll it between blocking calls with a short timeout); an ``async``
    one runs on the loop and is cancelled at shutdown.
    """


@hookspec
def allocate(devices: list[Device], response: ContainerResponse) -> None:
    """Adjust the Allocate response built from the devices' records.

    ``devices`` are the physical devices of one container request (replicas
    already mapped back and de-duplicated). ``response`` is mutable: add or
    change envs, mounts, device specs, annotations or CDI names. Raise
    ``hetero_dp.AllocationError`` to refuse the request with a clear message: the
    kubelet gets that message as written, with its ``code`` (default
    ``INVALID_ARGUMENT``). Any other exception, or a call past ``hookTimeout``,
    fails only this request, with ``INTERNAL`` and a message naming the hook.
    """


@hookspec(firstresult=True)
def allocate_key() -> object:
    """Name what ``allocate``'s answers depend on, so a repeated request skips it.

    Optional, beside ``allocate``: a value that stays equal for as long as
    ``allocate`` answers each request the same way, because its answer depends
    only on the devices and on what the value holds (the backend's options, a plan
    it replaces whole rather than changes in place). While the value holds, a
    request answered before is answered with the message built then, and
    ``allocate`` is not called; a new value, or a change of the devices' records,
    the resource's settings or its sharing config, starts afresh. Refusals are
    never reused. Called on the event loop on every Allocate: return at once.
    ``None``, or raising, or no implementation: ``allocate`` runs on every request.
    """


@hookspec
def pre_start_container(devices: list[Device]) -> None:
    """Prepare devices before a container starts (reset, firmware load ...).

    Implementing this hook makes the framework register with
    ``pre_start_required``; the kubelet then calls it before each container
    that holds devices of the backend, with a 30 s budget.
    """


@hookspec(firstresult=True)
def preferred_allocation(
    available: list[Device], must_include: list[Device], size: int
) -> list[str] | None:
    """Choose ``size`` device IDs out of ``available``, containing ``must_include``.

    Return ``None`` to leave the choice to the framework's engine, which
    maximises the pair scores from :func:`links` and keeps NUMA locality.
    """


@hookspec
def prepare(
    claim: Mapping[str, str], devices: list[Device], config: list[Mapping[str, Any]]
) -> Iterable[Device] | None:
    """DRA mode: apply a ResourceClaim's opaque configuration to its devices.

    Called once per claim when the kubelet prepares it (a retry of a prepared
    claim does not call it again), with ``claim`` (``namespace``, ``name``,
    ``uid``), the claim's devices of this backend, and ``config``: the opaque
    configuration for this driver from the DeviceClass and the claim, in that
    order (later entries win), each ``{"source": "FromClass" | "FromClaim",
    "requests": [...], "parameters": {...}}``; ``requests`` empty means all.
    Return the device records to use for this claim (same IDs; for instance
    with extra ``env``: they shape the claim's CDI spec), or None to keep them.
    Raise to fail the claim with the message; the kubelet retries. A call that
    passes ``hookTimeout`` fails the claim too, and the kubelet's retries of that
    claim are refused while the call is still stuck; once it returns, the next retry
    calls the hook again, so make it idempotent (take over what the late call made).
    """


@hookspec
def partitions(devices: list[Device]) -> Iterable[Device] | None:
    """DRA mode: devices that can be carved out of ``devices`` on demand.

    Return one record per possible partition (a MIG placement), each with
    ``parent`` naming one of ``devices`` and ``consumes`` saying which of the
    parent's counters it draws (the parent's own ``consumes`` is the counter
    set). They are published beside their parents as partitionable devices
    (KEP-4815), so the scheduler never hands out two that overlap, nor one with
    its whole parent; a partition's health follows its parent's. Nothing exists
    until a claim gets one: create it in :func:`prepare` (returning the record
    with the created device's nodes and env) and remove it in
    :func:`unprepare`. Called when the devices' IDs change, not on health
    events; ignored in device-plugin mode and where the API server does not
    serve partitionable devices (a log line says so).
    """


@hookspec
def unprepare(claim: Mapping[str, str], device_ids: list[str]) -> None:
    """DRA mode: undo what :func:`prepare` made for a claim (destroy a MIG instance).

    Called when the kubelet unprepares a claim, with the same ``claim`` and the
    IDs of the claim's devices as the checkpoint holds them, so it also runs
    for claims a previous process prepared. Only IDs this backend publishes
    (devices or partitions) are passed, or every ID when no backend publishes it
    now. Ignore IDs you made nothing for; a missing device is already undone.
    Raise to fail the unprepare with the message: the claim stays in the
    checkpoint and the kubelet retries. Also called, best effort, when a
    prepare fails after the hook ran.
    """


@hookspec
def links(devices: list[Device]) -> Iterable[Link]:
    """Describe how pairs of physical devices connect (NVLink, PCIe, XGMI ...).

    Scores are higher-is-better; pairs left out score 0. The framework caches
    the answer until the device set changes.
    """


@hookspec
def labels(devices: list[Device]) -> Mapping[str, str]:
    """Node labels (``key -> value``) for the devices this backend serves.

    Written to a Node Feature Discovery feature file and refreshed when
    devices change. Keys should carry the vendor's prefix (``acme.example.com/``).
    """


@hookspec
def metrics(devices: list[Device]) -> Iterable[Sample]:
    """Extra metric samples for the devices (memory, utilisation, temperature ...).

    Called on every scrape of ``/metrics``, in a worker thread; keep it cheap.
    """


@hookspec
def usage(devices: list[Device]) -> Iterable[ProcessUsage]:
    """Per-process usage of the devices: which host PIDs use which device, how much.

    Optional: a backend without it reports no usage, and the framework still says
    which container holds each device. Return one :class:`ProcessUsage` per
    process and device (``device``: a ``Device.id`` of ``devices``, the physical or
    carved-out device, never a replica's ID; any figure ``None`` when unknown).
    The framework maps each PID to its container and exports the sums per
    container (``hetero_dp_container_memory_used_bytes``,
    ``hetero_dp_container_utilization_ratio``), warns about a container over its
    fair share of a shared device, and ``hetero-dp top`` shows them. A PID whose
    container the kubelet does not know is attributed to no one.

    Called before each scrape of ``/metrics`` (beside :func:`metrics`, bounded the
    same way), in a worker thread; keep it cheap.
    """


@hookspec
def doctor(options: Mapping[str, Any]) -> Iterable[Check]:
    """Backend checks for ``hetero-dp doctor``: driver loads, devices answer ...

    ``options`` are the backend's options (paths may point into a fake root).
    Checks come first in the troubleshooting chain: hardware and driver
    before runtime and plugin.
    """


@hookspec
def runtime_advice(runtime: RuntimeView, needs_cdi: bool, root: str) -> Check | None:
    """What ``hetero-dp doctor`` says about the node's container runtime for this
    backend's devices, beyond what the core checks (CDI on where CDI delivers).

    ``runtime`` is what containerd's or dockerd's config says (its runtimes and their
    binaries, the default one, CDI on or off); ``needs_cdi`` whether some resource
    delivers through CDI; ``root`` the dir every host path is read under. Return a
    ``Check`` (``fail`` first in the runtime step; ``pass``/``warn`` when nothing
    failed) or None. For a GPU backend whose containers get the driver's libraries
    only through the vendor's runtime or CDI, the advice is about that runtime.
    """


@hookspec(firstresult=True)
def resource_defaults(resource: str) -> Mapping[str, Any] | None:
    """Defaults for a resource's section of the config (``resources.<name>``).

    Lets a backend map its own options onto framework settings, e.g. a backend
    whose option ``listStrategy: cdi-cri`` means CDI delivery returns
    ``{"deliver": ["cdi-cri"], "cdiKind": "acme.example.com/npu"}``.
    The config file's ``resources`` section wins over these defaults, key by key.
    The answer is read as the file's entries are: an unknown key or a value of the
    wrong type is logged naming the backend and the field
    (``resource_defaults(<resource>).<key>``), and none of it is used.
    """


@hookspec
def cdi_spec_edits(kind: str, devices: list[Device]) -> Mapping[str, Any] | None:
    """Spec-wide CDI ``containerEdits`` to add to the spec of ``kind``.

    Called whenever the framework rewrites the spec of a CDI kind that holds
    devices of this backend (``devices``: those devices), and in DRA mode for
    each claim's spec (``kind``: ``<driver>/claim``; ``devices``: the claim's
    devices of this backend). Return a mapping in
    the CDI spec's own shape, with any of ``deviceNodes``, ``mounts``, ``env``
    (``NAME=value`` strings) and ``hooks``: what every container of the kind
    needs beyond the device records (driver libraries, utilities, runtime
    hooks). Device nodes and mounts replace the records' shared ones at the
    same container path; env replaces the same variable. Return ``None`` for
    nothing. A raise keeps the previous spec and is logged (in DRA mode it
    fails that claim's prepare, naming the backend).
    """


@hookspec(firstresult=True)
def config_sections() -> Mapping[str, str] | None:
    """Sections of the config file, besides ``backends.<name>``, that hold this
    backend's options: the key as written in the file (dotted for a key inside a
    section) -> where it lands in the options (``""``: the section's keys become
    options themselves).

    For a backend that reads the config file of the plugin it replaces (the
    bundled GPU backend: ``{"flags": "", "resources.gpus": "resources.gpus", ...}``).
    Called before any other hook, on the class's instance: return a constant.
    An option refused there is named where it was written (``flags.migStrategy``);
    a claimed key the core also reads (``sharing``) is read by both. A section a
    backend claims is not refused as unknown, even when that backend is not run
    (the file may be shared with another program).
    """


@hookspec(firstresult=True)
def parse_args(args: list[str]) -> Mapping[str, Any] | None:
    """Parse the backend's own command-line flags into options.

    ``hetero-dp run BACKEND --some-flag value ...``: the arguments after the
    backend names that the ``run`` command does not know itself are passed here
    (only one loaded backend may implement this hook). Return options merged
    over the backend's config section; raise ``hetero_dp.ConfigError`` naming an
    unknown or bad flag. Lets a backend accept the flags of the plugin it
    replaces (the bundled GPU backend: ``--mig-strategy`` ...).
    """


@hookspec
def shutdown() -> None:
    """Release what :func:`configure` or :func:`watch` acquired. Called once at exit."""


# -- how the framework calls each hook: one row per specification above ----------------


@dataclass(frozen=True)
class HookPolicy:
    """How the framework calls one hook: the engine's hook runner
    (``hetero_dp/engine/hookrunner.py``) and the hook reference (``docs/hooks.md``)
    both read this, so adding a hook is its specification and its row in
    :data:`POLICY`.

    ``runs``: where a plain (not ``async def``) implementation runs. ``"worker"``:
    the backend's worker threads; ``"request"``: the threads of the hooks the
    kubelet waits on, apart from the others, so a hanging health check cannot hold
    up an Allocate; ``"thread"``: a thread of its own for the daemon's life;
    ``"loop"``: called on the event loop as it is (it must return at once);
    ``"start-up"``: called before the event loop starts. An ``async def``
    implementation always runs on the loop.

    ``timeout``: seconds, ``"hookTimeout"`` (the setting) or ``"none"``.
    ``passes``: what the hook may raise to refuse, given to the caller as raised;
    anything else (and a timeout) becomes a ``BackendError`` naming the backend,
    the hook and the line that raised. ``result``: the name of the check of what
    the hook returns (a function in ``hetero_dp/engine/results.py``), ``"caller"``
    where the caller judges it against the call's arguments, ``""`` where it is not
    read.
    """

    runs: Literal["worker", "request", "thread", "loop", "start-up"]
    timeout: float | Literal["hookTimeout", "none"] = "hookTimeout"
    passes: tuple[type[Exception], ...] = ()
    result: str = ""


#: One row per hook, in the order of the specifications.
POLICY: dict[str, HookPolicy] = {
    "configure": HookPolicy("worker", passes=(ConfigError, ValueError)),
    "required_resources": HookPolicy("worker", result="resource_names"),
    "discover": HookPolicy("worker", result="devices"),
    "check_health": HookPolicy("worker", result="health_verdict"),
    "watch": HookPolicy("thread", timeout="none"),
    "allocate": HookPolicy("request", passes=(AllocationError, ConfigError, ValueError)),
    "allocate_key": HookPolicy("loop", timeout="none", result="caller"),
    "pre_start_container": HookPolicy("request", timeout=30, passes=(AllocationError,)),
    "preferred_allocation": HookPolicy("request", passes=(AllocationError,), result="caller"),
    "prepare": HookPolicy("worker", result="caller"),
    "partitions": HookPolicy("worker", result="caller"),
    "unprepare": HookPolicy("worker"),
    "links": HookPolicy("worker", result="links"),
    "labels": HookPolicy("worker", result="labels"),
    "metrics": HookPolicy("worker", result="samples"),
    "usage": HookPolicy("worker", result="process_usages"),
    "doctor": HookPolicy("worker", result="checks"),
    "runtime_advice": HookPolicy("worker", result="check"),
    "resource_defaults": HookPolicy("worker", result="mapping"),
    "cdi_spec_edits": HookPolicy("worker", result="mapping"),
    "config_sections": HookPolicy("start-up", timeout="none", result="sections"),
    "parse_args": HookPolicy(
        "start-up", timeout="none", passes=(ConfigError,), result="parsed_args"
    ),
    "shutdown": HookPolicy("worker", timeout=5),
}
