"""The NVIDIA backend's hooks (entry point ``hetero_dp: nvidia``).

The entry point names one instance, :data:`plugin`, whose methods carry the
hookimpl markers (the pattern every bundled backend and the project template
follow). Tests (and anyone running two configurations in one process) register
their own ``NvidiaBackend()`` instances the same way.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Mapping
from typing import Any

from hetero_dp import (
    AllocationError,
    Check,
    ConfigError,
    ContainerResponse,
    Device,
    EventSink,
    Link,
    Mount,
    ProcessUsage,
    Sample,
    advertise,
    hookimpl,
)

from . import nvml
from .discovery import NodeInfo, build_devices, check_layout, read_node
from .driver_files import spec_edits
from .dynamic_mig import Partitioner
from .health import HealthMonitor, probe_gpu
from .labels import node_labels
from .memory_guard import MemoryGuard, guard_checks
from .metrics import node_samples
from .mps import mps_response, plan_mps
from .mps_control import MpsControl
from .mps_daemon import MpsManager, mps_checks
from .nvml import NvmlUnavailable
from .options import COMMAND_LINE, NvidiaFlags, parse_command_line, parse_options
from .runtime_advice import advice
from .topology import compute_links
from .usage import UsageReader

CDI_KIND = "k8s.device-plugin.nvidia.com/gpu"
# config file key -> where it lands in our options ("": the section's keys are options)
CONFIG_SECTIONS = {
    "flags": "",
    "resources.gpus": "resources.gpus",
    "resources.mig": "resources.mig",
    "imex": "imex",
    "sharing": "sharing",
}


class NvidiaBackend:
    """One configured NVIDIA backend: options, NVML state, topology cache, health."""

    hetero_dp_name = "nvidia"  # the name config sections and NVIDIA's ``flags`` use

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = environ
        self.options = parse_options({}, environ if environ is not None else {})
        self._configured = False
        self.session = nvml.Session()  # NVML, initialised once
        self.node = NodeInfo()
        self._lock = threading.RLock()
        self._links: tuple[frozenset[str], list[Link]] | None = None
        self.monitor = HealthMonitor(self.options.health, probe_gpu)
        self.init_retry_s = 5.0  # how often watch looks for a driver that came up late
        self.mps_control = MpsControl(self._gpu_handles)  # sharing.mps
        self.guard = MemoryGuard()
        self.usage_reader = UsageReader()  # per-process usage; each GPU's last sample time
        self._devices: list[Device] = []  # the last discovery, for a reload's MPS plan
        self.mig = Partitioner()  # dynamicMig (DRA): placements and the instances made

    # -- lifecycle -------------------------------------------------------------

    @hookimpl
    def configure(self, options: NvidiaFlags) -> None:
        # A reload calls this again while watch runs: check everything first, so that
        # a refusal leaves the old options in force, and keep the running monitor
        # (it holds the GPUs its events made Unhealthy), giving it the new settings.
        opts = parse_options(options, self._environ)
        if self.session.start(opts.fail_on_init_error):
            # A layout that cannot fit the MIG strategy stops start-up, named.
            check_layout(read_node(opts), opts.mig_strategy)
        plan = None
        if opts.uses_mps and self._devices:  # a reload: too many replicas refuse it here
            plan = plan_mps(advertise(self._devices, opts.sharing), opts.mps)
        self.options = opts
        self.monitor.settings = opts.health
        self._configured = True
        self.mps_control.configure(opts, plan)

    @property
    def mps(self) -> MpsManager | None:
        """The MPS control daemons' manager now (None without ``sharing.mps``)."""
        return self.mps_control.manager

    def _gpu_handles(self) -> dict[str, object]:
        with self._lock:
            return {g.uuid: g.handle for g in self.node.gpus}

    @hookimpl
    def shutdown(self) -> None:
        self.mps_control.stop()
        self.session.stop()

    # -- devices ---------------------------------------------------------------

    @hookimpl
    def discover(self) -> list[Device]:
        if not self._configured:
            self.configure({})
        if not self.session.start(self.options.fail_on_init_error):
            return []
        node = read_node(self.options)
        devices = build_devices(node, self.options)
        if self.options.dynamic_mig:
            devices = self.mig.whole(node, devices)
        advertised = advertise(devices, self.options.sharing)
        self.guard.update(advertised)
        mps = self.mps
        if mps is not None:
            # The daemons follow what the replicas are: one per shared resource name;
            # until a GPU's daemon answers, its replicas are not served (NVIDIA's plugin
            # waits for the daemon before it serves at all).
            mps.want(plan_mps(advertised, self.options.mps))
            devices = [_mps_health(d, mps.reason(d.physical_id)) for d in devices]
        with self._lock:
            before = {g.uuid for g in self.node.gpus if g.uuid}
            self.node = node
            self._devices = devices
        if {g.uuid for g in node.gpus if g.uuid} != before:
            self.monitor.gpus_changed.set()  # hot-plug: the watch loop registers new GPUs
        return devices

    @hookimpl
    def check_health(self, device: Device) -> bool | str | None:
        if self.options.health.disabled:
            return True  # DP_DISABLE_HEALTHCHECKS=all: no checks of any kind
        uuid = device.physical_id
        held = self.monitor.reason(uuid)
        if held:
            return held  # an event holds it Unhealthy until the recovery rule frees it
        if not self.session.up:
            return str(self.session.error or "NVML is not initialised")
        failure = probe_gpu(uuid)
        if failure is None and device.parent:
            failure = probe_gpu(device.id)
        if failure is None and self.mps is not None:
            failure = self.mps.reason(uuid) or None  # the replicas need their daemon
        if failure is None:
            with self._lock:
                gpu = self.node.gpu(uuid)
            if gpu is not None:
                self.guard.check(gpu, self.options.sharing)  # logs a GPU near full
        return failure if failure else True

    @hookimpl
    def watch(self, events: EventSink) -> None:
        # Without a driver (failOnInitError=false) wait for a later discover to bring
        # NVML up; this slow check runs only in that degraded state.
        while not self.session.up:
            if events.wait(self.init_retry_s):
                return
        stop_mps = threading.Event()
        runner = threading.Thread(
            target=self.mps_control.run,
            args=(events, stop_mps, self.monitor.reason),
            name="nvidia-mps",
            daemon=True,
        )
        runner.start()
        try:
            self.monitor.run(events, self._physical_handles)
        finally:
            stop_mps.set()
            self.mps_control.stop()
            runner.join(timeout=30)

    def _physical_handles(self) -> list[tuple[str, object]]:
        with self._lock:
            node = self.node
        if not node.gpus:
            node = read_node(self.options)
            with self._lock:
                self.node = node
        return [(g.uuid, g.handle) for g in node.gpus if g.uuid and g.handle is not None]

    # -- DRA: dynamic MIG ------------------------------------------------------

    @hookimpl
    def partitions(self, devices: list[Device]) -> list[Device]:
        if not self.options.dynamic_mig or not self.session.up:
            return []
        with self._lock:
            node = self.node
        return self.mig.partitions(node, devices)

    @hookimpl
    def prepare(
        self, claim: Mapping[str, str], devices: list[Device], config: list[Mapping[str, Any]]
    ) -> list[Device] | None:
        if not self.options.dynamic_mig:
            return None
        with self._lock:
            node = self.node
        return self.mig.prepare(node, devices, self.options)

    @hookimpl
    def unprepare(self, claim: Mapping[str, str], device_ids: list[str]) -> None:
        if not self.options.dynamic_mig:
            return
        with self._lock:
            node = self.node
        self.mig.unprepare(node, device_ids)

    # -- topology, labels, metrics ---------------------------------------------

    @hookimpl
    def links(self, devices: list[Device]) -> list[Link]:
        wanted = frozenset(d.physical_id for d in devices)
        with self._lock:
            if self._links and self._links[0] == wanted:
                return list(self._links[1])
            gpus = [g for g in self.node.gpus if g.uuid in wanted]
        result = compute_links(gpus) if self.session.up else []
        with self._lock:
            self._links = (wanted, result)
        return list(result)

    @hookimpl
    def labels(self, devices: list[Device]) -> dict[str, str]:
        with self._lock:
            node = self.node
        return node_labels(devices, node, self.options)

    @hookimpl
    def metrics(self, devices: list[Device]) -> list[Sample]:
        if not self.session.up:
            return []
        with self._lock:
            node = self.node
        samples = list(node_samples(node, socket.gethostname()))
        samples += self.guard.samples(node, self.options.sharing)
        return samples

    @hookimpl
    def usage(self, devices: list[Device]) -> list[ProcessUsage]:
        """Per-process memory and SM share of the GPUs and MIG devices (usage.py)."""
        if not self.session.up:
            return []
        with self._lock:
            node = self.node
        return self.usage_reader.read(node, (d.id for d in devices))

    # -- delivery defaults -----------------------------------------------------

    @hookimpl
    def resource_defaults(self, resource: str) -> dict[str, Any] | None:
        if not resource.startswith("nvidia.com/"):  # ours, renamed ones included
            return None
        strategies = self.options.device_list_strategy
        deliver = []
        if self.options.uses_env or self.options.pass_device_specs:
            # env, mounts and DeviceSpecs all come from the device records themselves
            deliver.append("device-specs")
        deliver += [s for s in strategies if s.startswith("cdi-")]
        return {
            "deliver": deliver,
            "cdiKind": CDI_KIND,
            "cdiAnnotationPrefix": self.options.cdi_annotation_prefix,
            "replicaPolicy": self.options.allocation_policy,
        }

    @hookimpl
    async def allocate(self, devices: list[Device], response: ContainerResponse) -> None:
        """DeviceSpecs only with passDeviceSpecs: the records carry nodes for the CDI spec
        (envvar plus a CDI strategy), which NVIDIA's plugin does not send as DeviceSpecs.
        With CDI strategies alone the core has left them out already, unless the
        runtime has CDI off (cdi.runtimeConfig): then they are the fallback, and stay.

        ``async def``: it runs on the event loop with no thread hop (the kubelet waits on
        it), so it makes no blocking call: it reads the options and the MPS plan, which
        the other threads replace whole rather than change in place."""
        if not self.options.pass_device_specs and self.options.uses_env:
            response.devices = []
        mps = self.mps
        if mps is None:
            return
        shared = {r.name: r for d in devices if (r := mps.resource_of(d.physical_id))}
        if len(shared) > 1:  # one CUDA_MPS_PIPE_DIRECTORY per container
            raise AllocationError(
                f"devices of several MPS resources ({', '.join(sorted(shared))}) in one "
                "request: a container talks to one MPS control daemon"
            )
        for resource in shared.values():
            env, mounts = mps_response(resource, self.options.mps)
            response.envs.update(env)
            for host, container in mounts:
                response.add_mount(Mount(host, container, read_only=False))

    @hookimpl
    def allocate_key(self) -> object:
        """What :meth:`allocate` answers from besides the devices: the options and the
        MPS plan, each replaced whole (by configure and the MPS supervisor), never
        changed in place. The same objects mean the same answers, so the framework
        answers a repeated request from the message it built before."""
        mps = self.mps
        return (self.options, None if mps is None else mps.plan)

    @hookimpl
    def cdi_spec_edits(self, kind: str, devices: list[Device]) -> dict[str, Any] | None:
        """The driver (libraries, utilities, firmware, hooks, env) for the CDI spec."""
        with self._lock:
            version = self.node.driver_version
        if not version:
            return None  # no driver: the spec holds the device records only
        return spec_edits(self.options, version)

    @hookimpl
    def config_sections(self) -> dict[str, str]:
        """NVIDIA's config file (schema v1) beside ``backends.nvidia``: its ``flags`` are
        our options, ``resources.gpus``/``resources.mig`` rename by pattern (a resource
        name always holds a '/', so these keys cannot clash with the core's), ``imex``,
        and ``sharing`` (read by the core too, which advertises the replicas; MPS, the
        memory guard and doctor here need it)."""
        return CONFIG_SECTIONS

    @hookimpl
    def parse_args(self, args: list[str]) -> dict[str, Any]:
        """NVIDIA's command-line flags (``--mig-strategy mixed`` ...) as options."""
        return {COMMAND_LINE: parse_command_line(args)}

    # -- doctor ----------------------------------------------------------------

    @hookimpl
    async def runtime_advice(self, runtime: Any, needs_cdi: bool, root: str) -> Check | None:
        """doctor's runtime step: the nvidia runtime or CDI (see runtime_advice.py)."""
        return advice(runtime, needs_cdi, root)

    @hookimpl
    def doctor(self, options: Mapping[str, Any]) -> list[Check]:
        return run_doctor(options, self._environ)


def _mps_health(device: Device, reason: str) -> Device:
    return device.with_health(False, reason) if reason and device.healthy else device


def run_doctor(options: Mapping[str, Any], environ: Mapping[str, str] | None) -> list[Check]:
    checks: list[Check] = []
    try:
        opts = parse_options(options, environ)
    except ConfigError as err:
        return [Check("nvidia options", "fail", str(err), "fix the named field")]
    try:
        nvml.init()
    except NvmlUnavailable as err:
        what = str(err).split("; fix:")[0]
        name = "nvidia driver/library version" if err.code == nvml.VERSION_MISMATCH else "nvml"
        return [Check(name, "fail", what, err.fix)]
    try:
        checks.append(Check("nvml", "pass", "libnvidia-ml.so.1 loads and initialises"))
        node = read_node(opts)
        cuda = node.cuda_major_minor
        checks.append(
            Check(
                "nvidia driver", "pass", f"driver {node.driver_version}, CUDA {cuda[0]}.{cuda[1]}"
            )
        )
        gpus = [g for g in node.gpus if g.uuid]
        if not gpus:
            checks.append(
                Check("nvidia gpus", "warn", "NVML sees no GPUs", "check nvidia-smi -L on the node")
            )
        else:
            names = ", ".join(sorted({g.name for g in gpus}))
            checks.append(Check("nvidia gpus", "pass", f"{len(gpus)} GPU(s): {names}"))
        for g in node.gpus:
            failure = g.error or (probe_gpu(g.uuid) if g.uuid else "no UUID")
            if failure:
                checks.append(
                    Check(f"gpu {g.index}", "fail", failure, failure.partition("fix: ")[2])
                )
        ctl = os.path.join(opts.visible_dev_root, "dev", "nvidiactl")
        if os.path.exists(ctl):
            checks.append(Check("nvidia device nodes", "pass", f"{ctl} present"))
        else:
            checks.append(
                Check(
                    "nvidia device nodes",
                    "warn",
                    f"{ctl} not found",
                    "mount the host's /dev (or the driver root) and set nvidiaDriverRoot",
                )
            )
        if opts.sharing.enabled:
            try:
                advertised = advertise(build_devices(node, opts), opts.sharing)
            except ConfigError:
                advertised = []  # a layout the MIG strategy cannot serve: checked below
            checks += guard_checks(node, advertised, opts.sharing)
        if opts.uses_mps:
            checks += mps_checks(opts.mps, opts.visible_driver_root)
        try:
            check_layout(node, opts.mig_strategy)
            checks.append(Check("mig layout", "pass", f"fits migStrategy {opts.mig_strategy}"))
        except ConfigError as err:
            checks.append(
                Check(
                    "mig layout",
                    "fail",
                    err.reason.split("; fix:")[0],
                    err.reason.partition("fix: ")[2],
                )
            )
    finally:
        nvml.shutdown()
    return checks


# ---- the entry point ----------------------------------------------------------------

# ``nvidia = "hetero_dp_nvidia.backend:plugin"``: the instance the daemon runs. Its
# environment is the process's (``environ=None``: os.environ, read at configure).
plugin = NvidiaBackend()
