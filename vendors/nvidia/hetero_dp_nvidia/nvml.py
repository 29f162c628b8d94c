"""Thin helpers over pynvml: start-up with clear errors, and one log line per problem.

Every NVML error a user can meet is turned into a sentence that says what is
wrong and what to do about it; :func:`explain` is the one place for that.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pynvml

log = logging.getLogger("hetero_dp.nvidia")

NVMLError: Any = pynvml.NVMLError  # pynvml ships no type hints
SUCCESS = pynvml.NVML_SUCCESS
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
NOT_FOUND = pynvml.NVML_ERROR_NOT_FOUND
INVALID_ARGUMENT = pynvml.NVML_ERROR_INVALID_ARGUMENT
TIMEOUT = pynvml.NVML_ERROR_TIMEOUT
FUNCTION_NOT_FOUND = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
LIBRARY_NOT_FOUND = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
DRIVER_NOT_LOADED = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
VERSION_MISMATCH = pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH
NO_PERMISSION = pynvml.NVML_ERROR_NO_PERMISSION
UNINITIALIZED = pynvml.NVML_ERROR_UNINITIALIZED

FIX_MISMATCH = "reload the nvidia kernel module or reboot the node"
FIX_LOST = "drain the node, then reset the GPU (nvidia-smi -r -i <index>) or reboot the node"
FIX_OLD_DRIVER = "upgrade the NVIDIA driver (MIG needs R470 or newer)"


class NvmlUnavailable(RuntimeError):
    """NVML could not start; the message says why and how to fix it."""

    def __init__(self, message: str, code: int, fix: str) -> None:
        super().__init__(message)
        self.code = code
        self.fix = fix


def text(value: Any) -> str:
    """pynvml returns str or bytes depending on the call and version."""
    return value.decode() if isinstance(value, bytes) else str(value)


def explain_init(err: Any) -> tuple[str, str]:
    """(what went wrong, fix) for an nvmlInit failure."""
    code = err.value
    if code == LIBRARY_NOT_FOUND:
        return (
            "NVML library libnvidia-ml.so.1 not found: no NVIDIA driver is installed, "
            "or it is not visible inside this container",
            "install the NVIDIA driver on the node and run the plugin with the NVIDIA "
            "container runtime, or mount the driver root and set nvidiaDriverRoot",
        )
    if code == DRIVER_NOT_LOADED:
        return (
            "the NVIDIA kernel driver is not loaded",
            "load it (modprobe nvidia) or reinstall the driver, then restart the plugin",
        )
    if code == VERSION_MISMATCH:
        return (
            "NVIDIA driver/library version mismatch: libnvidia-ml.so.1 and the loaded "
            "kernel module come from different driver versions (a driver upgrade "
            "without a reboot)",
            FIX_MISMATCH,
        )
    if code == NO_PERMISSION:
        return (
            "no permission to open the NVIDIA device nodes",
            "run the plugin as root with /dev mounted, or use the NVIDIA container runtime",
        )
    return (f"NVML failed to initialise: {err}", "check the driver with nvidia-smi on the node")


def explain(err: Any, what: str, device: str = "") -> str:
    """One sentence with the fix, for an error from an NVML call on a device."""
    on = f" on {device}" if device else ""
    code = err.value
    if code == GPU_IS_LOST:
        return f"GPU{(' ' + device) if device else ''} is lost (fell off the bus); fix: {FIX_LOST}"
    if code == FUNCTION_NOT_FOUND:
        return (
            f"NVML function for {what} is missing: the driver is older than this "
            f"feature; fix: {FIX_OLD_DRIVER}"
        )
    if code == NOT_SUPPORTED and device.startswith("MIG-"):
        return (
            f"{what} is not supported{on} (NVML answers NOT_SUPPORTED on MIG handles); "
            "fix: none needed, the value is taken from the parent GPU where possible"
        )
    if code == NOT_SUPPORTED:
        return f"{what} is not supported{on}; fix: none needed, it is skipped"
    if code == VERSION_MISMATCH:
        return f"{what}{on} failed: driver/library version mismatch; fix: {FIX_MISMATCH}"
    return f"{what}{on} failed: {err}"


_logged: set[str] = set()
_logged_lock = threading.Lock()


def log_once(key: str, message: str, level: int = logging.WARNING) -> None:
    """Log a problem once per process (discovery repeats; the log should not)."""
    with _logged_lock:
        if key in _logged:
            return
        _logged.add(key)
    log.log(level, message)


def forget_logged() -> None:
    """Let every problem be logged again (after a successful re-init)."""
    with _logged_lock:
        _logged.clear()


def init() -> None:
    """nvmlInit, turning failures into :class:`NvmlUnavailable` with a fix."""
    try:
        pynvml.nvmlInit()
    except NVMLError as err:
        what, fix = explain_init(err)
        raise NvmlUnavailable(f"{what}; fix: {fix}", err.value, fix) from None


def shutdown() -> None:
    try:
        pynvml.nvmlShutdown()
    except NVMLError as err:
        log.debug("nvmlShutdown: %s", err)


class Session:
    """NVML for one backend: initialised once (``up``), the error of a failed try
    kept (``error``, what a health verdict says), shut down at exit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.up = False
        self.error: NvmlUnavailable | None = None

    def start(self, fail_on_init_error: bool) -> bool:
        """Initialise NVML once; False (logged) when unavailable and allowed to be."""
        with self._lock:
            if self.up:
                return True
            try:
                init()
            except NvmlUnavailable as err:
                self.error = err
                if fail_on_init_error:
                    raise  # said once, by whoever reports the failed hook
                log_once(
                    f"init:{err.code}",
                    f"{err}; failOnInitError=false: serving 0 GPUs until the driver works",
                )
                return False
            self.up = True
            self.error = None
            return True

    def stop(self) -> None:
        with self._lock:
            if self.up:
                shutdown()
                self.up = False


def normalise_bus_id(bus_id: str) -> str:
    """NVML's ``00000000:07:00.0`` -> sysfs's ``0000:07:00.0`` (lower case)."""
    bus_id = text(bus_id).strip().lower()
    domain, _, rest = bus_id.partition(":")
    if not rest:
        return bus_id
    return f"{domain[-4:].rjust(4, '0')}:{rest}"
