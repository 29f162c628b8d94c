"""The MPS control daemons: running ``nvidia-cuda-mps-control``, checking and restarting.

What the daemon is told and when (NVIDIA's facts) is in :mod:`hetero_dp_nvidia.mps`;
this module runs the program. ``managed``: one daemon per shared resource, started by us
with its limits, checked every ``checkInterval`` and started again when it stops
answering (at once, then with exponential backoff while starting fails).
``external``: another container runs it; we only check that it answers.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from hetero_dp import Check

from .mps import CONTROL_BIN, MpsResource, MpsSettings

log = logging.getLogger("hetero_dp_nvidia.mps")


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
            # Bytes, decoded with errors replaced: the control program's output is
            # whatever the driver's tools print (text=True let one non-UTF-8 byte raise
            # UnicodeDecodeError and end the monitor, issue #29).
            ran = subprocess.run(
                [self.control, *args],
                input=stdin.encode() if stdin is not None else None,
                env=self.env(),
                capture_output=True,
                timeout=self.settings.command_timeout_s,
                check=False,
            )
            done = subprocess.CompletedProcess(
                ran.args,
                ran.returncode,
                ran.stdout.decode(errors="replace"),
                ran.stderr.decode(errors="replace"),
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
        # GPU uuid -> its MPS resource: replaced whole (never changed in place) when the
        # plan changes, so Allocate reads it on the event loop without taking _cond
        self._by_uuid: dict[str, MpsResource] = {}
        self._states: dict[str, _State] = {}
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stopped = False
        self._retired: list[MpsDaemon] = []  # managed daemons of replaced settings
        # Sets the GPUs' compute mode (uuids, exclusive) -> '' or the error: NVIDIA's MPS
        # daemon puts them in EXCLUSIVE_PROCESS so that only the MPS server runs there.
        self.compute_mode: Callable[[list[str], bool], str] | None = None
        self.mode_errors: dict[str, str] = {}  # resource -> why the mode could not be set

    def _set_mode(self, daemon: MpsDaemon, exclusive: bool) -> None:
        if self.compute_mode is None:
            return
        name = daemon.resource.name
        error = self.compute_mode([g.uuid for g in daemon.resource.gpus], exclusive)
        if error and exclusive and self.mode_errors.get(name) != error:
            log.warning(
                "MPS %s: cannot set the compute mode EXCLUSIVE_PROCESS (%s); the daemon runs "
                "anyway, but processes that bypass MPS can still use the GPUs",
                name,
                error,
            )
        if exclusive:
            self.mode_errors[name] = error

    def _retire(self, daemon: MpsDaemon) -> None:
        """A managed daemon we no longer want: quit it and give the GPUs their mode back."""
        daemon.stop_quietly()
        self._set_mode(daemon, False)

    def reconfigure(self, settings: MpsSettings, control: str | None) -> None:
        """New settings (a reload): every daemon is started again under them."""
        with self._cond:
            if self.settings.control == "managed":
                self._retired += [st.daemon for st in self._states.values()]
            self.settings, self.control = settings, control
            self._states, self._plan = {}, []
            self._by_uuid = {}
            self._cond.notify_all()
        self._wake.set()

    # -- inputs ------------------------------------------------------------------------

    def want(self, plan: list[MpsResource]) -> None:
        with self._cond:
            if plan == self._plan:
                return
            self._plan = list(plan)
            by_uuid: dict[str, MpsResource] = {}
            for r in plan:
                for g in r.gpus:
                    by_uuid.setdefault(g.uuid, r)
            self._by_uuid = by_uuid
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
        """The MPS resource a GPU serves (None: none); takes no lock, so it never
        waits on the supervisor thread (Allocate calls it on the event loop)."""
        return self._by_uuid.get(uuid)

    @property
    def plan(self) -> object:
        """What :meth:`resource_of` answers from: replaced whole when the plan
        changes, never changed in place, so the same object means the same answers."""
        return self._by_uuid

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
                try:
                    self.reconcile(on_change)
                except Exception as err:
                    self._failed(err, on_change)
                # wake on a new plan, on stop, or when a check or a retry is due
                self._wake.wait(self._next_delay())
                self._wake.clear()
        finally:
            if self.settings.control == "managed":
                with self._cond:
                    states = list(self._states.values())
                for st in states:
                    self._retire(st.daemon)

    def _failed(self, err: Exception, on_change: Callable[[Iterable[str], str], None]) -> None:
        """A reconcile that raised: every GPU it watches is Unhealthy with the reason
        (a dead daemon would otherwise go unnoticed), and it is tried again later."""
        log.exception("MPS monitor: reconcile failed; its GPUs are Unhealthy until it passes")
        reason = f"MPS monitor failed: {err!r}"
        now = self.clock()
        with self._cond:
            states = list(self._states.values())
            for st in states:
                st.reason = reason
                st.next_try = now + self.settings.check_interval_s
        for st in states:
            try:
                on_change([g.uuid for g in st.daemon.resource.gpus], reason)
            except Exception:
                log.exception("MPS monitor: reporting %s failed", st.daemon.resource.name)

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
            self._retire(daemon)
        with self._cond:
            wanted = {r.name for r in self._plan}
            gone = [st for n, st in self._states.items() if n not in wanted]
            for st in gone:
                del self._states[st.daemon.resource.name]
            states = list(self._states.values())
        for st in gone:
            if self.settings.control == "managed":
                self._retire(st.daemon)
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
        self._set_mode(daemon, True)
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
