"""MPS sharing: the control daemon per shared resource, its limits, its health.

Facts from NVIDIA's k8s-device-plugin (cmd/mps-control-daemon/mps/daemon.go,
root.go, internal/plugin/mps.go), read, not copied:

- One control daemon per shared *resource name*, with its pipe and log
  directories under the MPS root: ``<root>/<resource>/pipe``, ``<root>/<resource>/log``;
  a ``<root>/<resource>/.started`` file once its limits are set; the shared memory
  the daemon and its clients use is ``<root>/shm`` (mounted at ``/dev/shm``).
- It is started with ``nvidia-cuda-mps-control -d`` and env
  ``CUDA_MPS_PIPE_DIRECTORY``/``CUDA_MPS_LOG_DIRECTORY``; commands go to it by
  running ``nvidia-cuda-mps-control`` with the command on stdin.
- Limits: ``set_default_device_pinned_mem_limit <index> <MiB>M`` per GPU (the GPU's
  memory / replicas) and ``set_default_active_thread_percentage <100/replicas>``.
- Health: ``get_default_active_thread_percentage`` answers; stop: ``quit``.
- A container gets ``CUDA_MPS_PIPE_DIRECTORY=/mps/<resource>/pipe`` and mounts
  of the host's pipe dir there and of ``<root>/shm`` at ``/dev/shm``.
- At most 48 clients per GPU from Volta on, 16 before (device.go): more replicas
  are refused.

Ours on top: the plugin runs and supervises the daemons itself (``managed``),
restarting a dead one with exponential backoff; every GPU of a resource whose
daemon is down or does not answer is Unhealthy with the reason, so all its
replicas leave allocatable at once. ``external`` leaves the daemon to another
container (NVIDIA's mps-control-daemon DaemonSet) and only checks that it answers.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hetero_dp import Check, ConfigError, Device, is_replica, replica_base

log = logging.getLogger("hetero_dp_nvidia.mps")

CONTROL_BIN = "nvidia-cuda-mps-control"
CONTAINER_ROOT = "/mps"  # where a client container sees the MPS root (NVIDIA's ContainerRoot)
DEFAULT_ROOT = "/run/nvidia/mps"  # NVIDIA's chart value mps.root
MIB = 1024 * 1024
MODES = ("managed", "external")
_SIZE = re.compile(r"^(\d+)\s*([KMGT]?)(i?B?)?$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1024, "M": MIB, "G": 1024 * MIB, "T": 1024 * 1024 * MIB}


@dataclass(frozen=True)
class Limits:
    """Per-resource overrides: pinned device memory per client and active threads."""

    pinned_memory_mib: int | None = None
    active_thread_percentage: int | None = None


@dataclass(frozen=True)
class MpsSettings:
    """``backends.nvidia.mps`` (ours) plus NVIDIA's ``flags.mpsRoot``."""

    root: str = DEFAULT_ROOT  # on the host: what client containers mount
    visible_root: str = ""  # where this process sees the root (see local_root)
    control: str = "managed"
    control_path: str = ""  # "" = <driver root>/usr/bin, then PATH
    check_interval_s: float = 10.0
    command_timeout_s: float = 10.0
    backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    limits: Mapping[str, Limits] = field(default_factory=dict)

    @property
    def local_root(self) -> str:
        """Where this process sees the root: ``visibleRoot``, else NVIDIA's container
        path ``/mps`` when it exists (the chart mounts the root there), else the root."""
        if self.visible_root:
            return self.visible_root
        return CONTAINER_ROOT if os.path.isdir(CONTAINER_ROOT) else self.root


def _size_mib(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value  # a bare number is MiB, as the control daemon's "M" unit
    match = _SIZE.match(str(value).strip())
    if not match or isinstance(value, bool):
        raise ConfigError(
            f"expected a size such as 4096M, 8G or 8Gi, got {value!r}", field=where, source="config"
        )
    mib = int(match.group(1)) * _UNITS[match.group(2).upper()] // MIB
    if mib <= 0:
        raise ConfigError(f"must be at least 1M, got {value!r}", field=where, source="config")
    return mib


def parse_mps_settings(value: Any, root: str) -> MpsSettings:
    """Parse ``backends.nvidia.mps``; ConfigError names the field."""
    where = "mps"
    raw = value or {}
    if not isinstance(raw, Mapping):
        raise ConfigError("expected a mapping", field=where, source="config")
    known = {
        "visibleRoot": str,
        "controlDaemon": str,
        "controlPath": str,
        "checkInterval": float,
        "commandTimeout": float,
        "backoff": float,
        "maxBackoff": float,
        "resources": dict,
    }
    unknown = sorted(set(raw) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown key (known: {', '.join(sorted(known))})",
            field=f"{where}.{unknown[0]}",
            source="config",
        )
    control = str(raw.get("controlDaemon", "managed"))
    if control not in MODES:
        raise ConfigError(
            f"must be one of {', '.join(MODES)}, got {control!r}",
            field=f"{where}.controlDaemon",
            source="config",
        )
    numbers: dict[str, float] = {}
    for key, default in (
        ("checkInterval", 10.0),
        ("commandTimeout", 10.0),
        ("backoff", 1.0),
        ("maxBackoff", 60.0),
    ):
        v = raw.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int | float) or v <= 0:
            raise ConfigError(
                f"expected a positive number of seconds, got {v!r}",
                field=f"{where}.{key}",
                source="config",
            )
        numbers[key] = float(v)
    limits: dict[str, Limits] = {}
    resources = raw.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise ConfigError("expected a mapping", field=f"{where}.resources", source="config")
    for name, item in resources.items():
        at = f"{where}.resources.{name}"
        if not isinstance(item, Mapping):
            raise ConfigError("expected a mapping", field=at, source="config")
        extra = sorted(set(item) - {"pinnedDeviceMemoryLimit", "activeThreadPercentage"})
        if extra:
            raise ConfigError(
                "unknown key (known: activeThreadPercentage, pinnedDeviceMemoryLimit)",
                field=f"{at}.{extra[0]}",
                source="config",
            )
        mem = item.get("pinnedDeviceMemoryLimit")
        pct = item.get("activeThreadPercentage")
        if pct is not None and (
            isinstance(pct, bool) or not isinstance(pct, int) or not 1 <= pct <= 100
        ):
            raise ConfigError(
                f"expected a whole percentage from 1 to 100, got {pct!r}",
                field=f"{at}.activeThreadPercentage",
                source="config",
            )
        limits[str(name)] = Limits(
            _size_mib(mem, f"{at}.pinnedDeviceMemoryLimit") if mem is not None else None, pct
        )
    return MpsSettings(
        root=root or DEFAULT_ROOT,
        visible_root=str(raw.get("visibleRoot") or ""),
        control=control,
        control_path=str(raw.get("controlPath") or ""),
        check_interval_s=numbers["checkInterval"],
        command_timeout_s=numbers["commandTimeout"],
        backoff_s=numbers["backoff"],
        max_backoff_s=numbers["maxBackoff"],
        limits=limits,
    )


# --- the plan: which resources run a daemon, with which limits ---------------------------


@dataclass(frozen=True)
class MpsGpu:
    uuid: str
    index: int
    memory_mib: int
    compute_major: int = 0


@dataclass(frozen=True)
class MpsResource:
    """One shared resource name and the GPUs behind its replicas."""

    name: str
    replicas: int
    gpus: tuple[MpsGpu, ...]
    limits: Limits = field(default_factory=Limits)

    def pinned_limits_mib(self) -> dict[int, int]:
        """GPU index -> pinned memory limit per client, in MiB (memory / replicas)."""
        out = {}
        for g in self.gpus:
            limit = self.limits.pinned_memory_mib or g.memory_mib // self.replicas
            if limit > 0:  # NVIDIA skips GPUs whose memory is unknown
                out[g.index] = limit
        return out

    def active_thread_percentage(self) -> int:
        return self.limits.active_thread_percentage or max(1, 100 // self.replicas)

    def commands(self) -> list[str]:
        """What the daemon is told after it starts, in order."""
        cmds = [
            f"set_default_device_pinned_mem_limit {index} {mib}M"
            for index, mib in sorted(self.pinned_limits_mib().items())
        ]
        cmds.append(f"set_default_active_thread_percentage {self.active_thread_percentage()}")
        return cmds


def max_clients(compute_major: int) -> int:
    """MPS clients per GPU: 48 from Volta (compute 7.x) on, 16 before (NVIDIA's device.go)."""
    return 48 if compute_major >= 7 else 16


def plan_mps(advertised: Sequence[Device], settings: MpsSettings) -> list[MpsResource]:
    """The daemons the advertised replicas need: one per resource that holds replicas."""
    groups: dict[str, dict[str, list[Device]]] = {}
    for d in advertised:
        if is_replica(d.id):
            groups.setdefault(d.resource, {}).setdefault(replica_base(d.id), []).append(d)
    out = []
    for name, by_gpu in groups.items():
        gpus = []
        for uuid, replicas in by_gpu.items():
            attrs = replicas[0].attributes
            cc = str(attrs.get("cudaComputeCapability", "0.0"))
            gpus.append(
                MpsGpu(
                    uuid=str(attrs.get("uuid", uuid)),
                    index=int(replicas[0].index if replicas[0].index is not None else -1),
                    memory_mib=int(attrs.get("memoryMiB", 0) or 0),
                    compute_major=int(cc.partition(".")[0] or 0),
                )
            )
        n = max(len(r) for r in by_gpu.values())
        for g in gpus:
            if n > max_clients(g.compute_major):
                raise ConfigError(
                    f"{n} MPS replicas of GPU {g.index} ({g.uuid}) exceed the "
                    f"{max_clients(g.compute_major)} clients MPS serves per GPU of compute "
                    f"capability {g.compute_major}.x",
                    field="sharing.mps.resources",
                    source="config",
                )
        limits = settings.limits.get(name) or settings.limits.get(name.partition("/")[2], Limits())
        out.append(MpsResource(name, n, tuple(sorted(gpus, key=lambda g: g.index)), limits))
    return sorted(out, key=lambda r: r.name)


# --- one daemon ------------------------------------------------------------------------


class MpsError(RuntimeError):
    """A control command failed; the message says which and why."""


def find_control(settings: MpsSettings, driver_root: str) -> str | None:
    """The control binary: the configured path, PATH's, or the driver root's.

    PATH first: in a container the NVIDIA runtime puts the driver's utilities (and the
    libraries they load) in place; a binary under a mounted driver root may not find
    its libraries. On a host the driver root's ``usr/bin`` is on PATH anyway.
    """
    if settings.control_path:
        return settings.control_path
    found = shutil.which(CONTROL_BIN)
    if found:
        return found
    candidate = os.path.join(driver_root, "usr", "bin", CONTROL_BIN)
    return candidate if os.access(candidate, os.X_OK) else None


class MpsDaemon:
    """The control daemon of one shared resource."""

    def __init__(self, resource: MpsResource, settings: MpsSettings, control: str | None) -> None:
        self.resource = resource
        self.settings = settings
        self.control = control

    def _dir(self, root: str, part: str) -> str:
        return os.path.join(root, self.resource.name, part)

    @property
    def pipe_dir(self) -> str:
        return self._dir(self.settings.local_root, "pipe")

    @property
    def log_dir(self) -> str:
        return self._dir(self.settings.local_root, "log")

    @property
    def started_file(self) -> str:
        return self._dir(self.settings.local_root, ".started")

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
        env["CUDA_MPS_PIPE_DIRECTORY"] = self.pipe_dir
        env["CUDA_MPS_LOG_DIRECTORY"] = self.log_dir
        return env

    def _run(self, args: list[str], stdin: str | None) -> str:
        if not self.control:
            raise MpsError(
                f"{CONTROL_BIN} not found under the driver root or on PATH; install the "
                "driver's utilities or set backends.nvidia.mps.controlPath"
            )
        try:
            done = subprocess.run(
                [self.control, *args],
                input=stdin,
                env=self.env(),
                capture_output=True,
                text=True,
                timeout=self.settings.command_timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise MpsError(
                f"{CONTROL_BIN} {' '.join(args) or repr(stdin)} did not answer within "
                f"{self.settings.command_timeout_s:g} s"
            ) from None
        except OSError as err:
            raise MpsError(f"cannot run {self.control}: {err.strerror}") from None
        if done.returncode != 0:
            what = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
            raise MpsError(f"{CONTROL_BIN} {' '.join(args) or repr(stdin)}: {what}")
        return done.stdout

    def send(self, command: str) -> str:
        """One control command (written to the control program's stdin)."""
        return self._run([], command)

    def start(self) -> None:
        shm = os.path.join(self.settings.local_root, "shm")
        for d in (self.pipe_dir, self.log_dir, shm):
            os.makedirs(d, mode=0o755, exist_ok=True)
        self.stop_quietly()  # a daemon left from an earlier run would refuse a second -d
        self._run(["-d"], None)
        for command in self.resource.commands():
            self.send(command)
        with open(self.started_file, "w") as f:
            f.write("\n".join(self.resource.commands()) + "\n")

    def assert_healthy(self) -> None:
        """NVIDIA's check: the daemon answers get_default_active_thread_percentage."""
        self.send("get_default_active_thread_percentage")

    def stop_quietly(self) -> None:
        try:
            self.send("quit")
        except MpsError:
            pass
        try:
            os.remove(self.started_file)
        except FileNotFoundError:
            pass


# --- the manager ----------------------------------------------------------------------


@dataclass
class _State:
    daemon: MpsDaemon
    reason: str = "MPS control daemon not started yet"
    failures: int = 0
    next_try: float = 0.0
    started: bool = False  # managed: started by us with this plan's limits
    restarts: int = 0  # managed: daemons found dead and started again


class MpsManager:
    """Runs (or, ``external``, only watches) one daemon per MPS-shared resource.

    :meth:`want` hands it the current plan; :meth:`run` (a thread of the
    backend's ``watch``) reconciles, checks every ``checkInterval`` and restarts a
    daemon that died, waiting ``backoff * 2**(failures-1)`` seconds (at most
    ``maxBackoff``) between tries. :meth:`reason` says why a GPU cannot serve.
    """

    def __init__(
        self,
        settings: MpsSettings,
        control: str | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.control = control
        self.clock = clock
        self._plan: list[MpsResource] = []
        self._states: dict[str, _State] = {}
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stopped = False
        self._retired: list[MpsDaemon] = []  # managed daemons of replaced settings

    def reconfigure(self, settings: MpsSettings, control: str | None) -> None:
        """New settings (a reload): every daemon is started again under them."""
        with self._cond:
            if self.settings.control == "managed":
                self._retired += [st.daemon for st in self._states.values()]
            self.settings, self.control = settings, control
            self._states, self._plan = {}, []
            self._cond.notify_all()
        self._wake.set()

    # -- inputs ------------------------------------------------------------------------

    def want(self, plan: list[MpsResource]) -> None:
        with self._cond:
            if plan == self._plan:
                return
            self._plan = list(plan)
            for r in plan:  # until the supervisor has run, the GPUs are not served
                st = self._states.get(r.name)
                if st is None or st.daemon.resource != r:
                    self._states[r.name] = _State(MpsDaemon(r, self.settings, self.control))
            self._cond.notify_all()
        self._wake.set()

    # -- outputs -----------------------------------------------------------------------

    def reason(self, uuid: str) -> str:
        """Why the GPU's MPS daemon cannot serve ('' when it can, or it is not MPS-shared)."""
        with self._cond:
            for st in self._states.values():
                if any(g.uuid == uuid for g in st.daemon.resource.gpus) and st.reason:
                    return f"MPS ({st.daemon.resource.name}): {st.reason}"
        return ""

    def resource_of(self, uuid: str) -> MpsResource | None:
        with self._cond:
            return next((r for r in self._plan if any(g.uuid == uuid for g in r.gpus)), None)

    def daemons(self) -> dict[str, MpsDaemon]:
        """Shared resource name -> its daemon (to send it commands: the smoke script)."""
        with self._cond:
            return {name: st.daemon for name, st in self._states.items()}

    def status(self) -> dict[str, str]:
        with self._cond:
            return {name: st.reason for name, st in self._states.items()}

    def wait_for(self, predicate: Callable[[dict[str, str]], bool], timeout: float) -> bool:
        """Wait until ``predicate(status())`` holds (tests, the smoke script)."""
        with self._cond:
            return self._cond.wait_for(
                lambda: predicate({n: s.reason for n, s in self._states.items()}), timeout
            )

    # -- the loop ----------------------------------------------------------------------

    def run(self, on_change: Callable[[Iterable[str], str], None]) -> None:
        """Reconcile until :meth:`stop`; ``on_change(uuids, reason)`` on every change.

        Managed daemons are told to quit on the way out.
        """
        try:
            while not self._stopped:
                self.reconcile(on_change)
                # wake on a new plan, on stop, or when a check or a retry is due
                self._wake.wait(self._next_delay())
                self._wake.clear()
        finally:
            if self.settings.control == "managed":
                with self._cond:
                    states = list(self._states.values())
                for st in states:
                    st.daemon.stop_quietly()

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def _next_delay(self) -> float:
        now = self.clock()
        with self._cond:
            due = [st.next_try - now for st in self._states.values()]
        return max(0.0, min([self.settings.check_interval_s, *due]))

    def reconcile(self, on_change: Callable[[Iterable[str], str], None]) -> None:
        with self._cond:
            retired, self._retired = self._retired, []
        for daemon in retired:  # before any new one starts in the same pipe dir
            daemon.stop_quietly()
        with self._cond:
            wanted = {r.name for r in self._plan}
            gone = [st for n, st in self._states.items() if n not in wanted]
            for st in gone:
                del self._states[st.daemon.resource.name]
            states = list(self._states.values())
        for st in gone:
            if self.settings.control == "managed":
                st.daemon.stop_quietly()
        for st in states:
            if self.clock() < st.next_try:
                continue
            self._check(st, on_change)

    def _check(self, st: _State, on_change: Callable[[Iterable[str], str], None]) -> None:
        daemon = st.daemon
        managed = self.settings.control == "managed"
        if not managed or st.started:
            try:
                daemon.assert_healthy()
                self._set(st, "", on_change)
                return
            except MpsError as err:
                # Unhealthy at once: its clients have lost their server anyway.
                self._set(
                    st, f"control daemon does not answer: {err}", on_change, failed=not managed
                )
                if not managed:
                    return
                st.started = False
                st.restarts += 1
        try:
            daemon.start()
        except MpsError as err:
            self._set(st, f"control daemon cannot start: {err}", on_change, failed=True)
            return
        st.started = True
        log.info(
            "MPS control daemon for %s started: %s",
            daemon.resource.name,
            "; ".join(daemon.resource.commands()),
        )
        self._set(st, "", on_change)

    def _set(
        self,
        st: _State,
        reason: str,
        on_change: Callable[[Iterable[str], str], None],
        failed: bool = False,
    ) -> None:
        now = self.clock()
        with self._cond:
            before = st.reason
            if failed:
                st.failures += 1
                backoff = self.settings.backoff_s * 2 ** (st.failures - 1)
                st.next_try = now + min(backoff, self.settings.max_backoff_s)
                reason = f"{reason} (try {st.failures}, next in {st.next_try - now:.3g} s)"
            elif not reason:
                st.failures = 0
                st.next_try = now + self.settings.check_interval_s
            st.reason = reason
            changed = before != reason
            self._cond.notify_all()
        if changed:
            if reason:
                log.warning("MPS %s: %s", st.daemon.resource.name, reason)
            on_change([g.uuid for g in st.daemon.resource.gpus], reason)


def mps_response(resource: MpsResource, settings: MpsSettings) -> tuple[dict[str, str], list]:
    """What a container of ``resource`` gets: env and (host, container) mounts."""
    pipe = os.path.join(CONTAINER_ROOT, resource.name, "pipe")
    mounts = [
        (os.path.join(settings.root, resource.name, "pipe"), pipe),
        (os.path.join(settings.root, "shm"), "/dev/shm"),
    ]
    return {"CUDA_MPS_PIPE_DIRECTORY": pipe}, mounts


def mps_checks(settings: MpsSettings, driver_root: str, shm: str = "/dev/shm") -> list[Check]:
    """``hetero-dp doctor`` under sharing.mps: the control program, and a shared /dev/shm.

    MPS clients and their server talk through /dev/shm: a container gets
    ``<root>/shm`` there, so the daemon's own /dev/shm must be that same directory
    (the chart mounts it so; NVIDIA's chart does the same for its daemon container).
    """
    checks = []
    control = find_control(settings, driver_root)
    if settings.control == "managed" and control is None:
        checks.append(
            Check(
                "mps control",
                "fail",
                f"{CONTROL_BIN} not found on PATH or under {driver_root}/usr/bin",
                "run the plugin with the NVIDIA runtime (utility capability) or set "
                "backends.nvidia.mps.controlPath",
            )
        )
    elif settings.control == "managed":
        checks.append(Check("mps control", "pass", f"{control}"))
    ours = os.path.join(settings.local_root, "shm")
    try:
        same = os.path.samefile(shm, ours)
    except OSError:
        same = False
    if settings.control == "managed" and not same:
        checks.append(
            Check(
                "mps shm",
                "warn",
                f"{shm} here is not {ours}, which containers get as /dev/shm: "
                "their MPS server would not see them",
                f"mount the host's {settings.root}/shm at /dev/shm in the plugin's container",
            )
        )
    elif settings.control == "managed":
        checks.append(Check("mps shm", "pass", f"{shm} is {ours}"))
    return checks
