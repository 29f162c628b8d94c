"""Fixtures for the fake libnvidia-ml.so.1, shared by every test directory.

Loaded once from tests/conftest.py, so ``fake_nvml_lib`` is a single session fixture
for the whole run: one process can hold only one fake NVML that pynvml talks to, and
any test file (tests/nvidia, tests/ops, ...) can use it, alone or in any order.

The fake library (tests/fakenvml/fake_nvml.c) is built once per session with gcc
and loaded with RTLD_GLOBAL, so pynvml's ``CDLL("libnvidia-ml.so.1")`` resolves
to it (the dynamic loader matches the already-loaded soname). Each test picks a
scenario through FAKE_NVML_SCENARIO; the fake re-reads it on the next nvmlInit.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.nvidia.support import FakeNode, Watching

# NVIDIA's environment variables: a developer's shell must not change what a test sees
NVIDIA_ENV = (
    "MIG_STRATEGY",
    "DEVICE_LIST_STRATEGY",
    "DEVICE_ID_STRATEGY",
    "PASS_DEVICE_SPECS",
    "FAIL_ON_INIT_ERROR",
    "NVIDIA_DRIVER_ROOT",
    "DP_DISABLE_HEALTHCHECKS",
    "DP_ENABLE_HEALTHCHECKS",
    "CONTAINER_DRIVER_ROOT",
    "NVIDIA_DEV_ROOT",
    "DRIVER_ROOT_CTR_PATH",
    "NVIDIA_CDI_HOOK_PATH",
    "NVIDIA_CTK_PATH",
    "CDI_DISABLE_HOOKS",
    "CONFIG_FILE",
    "MPS_ROOT",
    "MPS_CONTROL_DAEMON",
)


@pytest.fixture(scope="session")
def fake_nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    pynvml = pytest.importorskip("pynvml")
    from tests.nvidia.support import build_fake

    if pynvml.nvmlLib is not None and not hasattr(pynvml.nvmlLib, "fake_nvml_reset"):
        pytest.skip("a real libnvidia-ml is already loaded in this process")
    path = build_fake(tmp_path_factory.mktemp("fakenvml"))
    lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    lib.fake_nvml_inject_event.argtypes = [
        ctypes.c_uint,
        ctypes.c_ulonglong,
        ctypes.c_ulonglong,
        ctypes.c_uint,
        ctypes.c_uint,
    ]
    lib.fake_nvml_inject_xid.argtypes = [ctypes.c_uint, ctypes.c_ulonglong]
    lib.fake_nvml_set_lost.argtypes = [ctypes.c_uint, ctypes.c_int]
    lib.fake_nvml_wait_waiters.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.fake_nvml_wait_hanging.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.fake_nvml_set_value.argtypes = [ctypes.c_uint, ctypes.c_char_p, ctypes.c_long]
    lib.fake_nvml_set_proc_util.argtypes = [ctypes.c_uint] * 4
    lib.fake_nvml_call_count.argtypes = [ctypes.c_uint]
    lib.fake_nvml_call_count.restype = ctypes.c_long
    lib.fake_nvml_sizeof.argtypes = [ctypes.c_char_p]
    lib.fake_nvml_sizeof.restype = ctypes.c_uint
    lib.path = str(path)  # type: ignore[attr-defined]
    return lib


def _forget_entry_point_instance() -> None:
    """A reset of the fake library is a new node (NVML's init count back to 0). The nvidia
    entry point names one instance per process, as production loads it; a test that
    left it initialised against the last node would have it skip ``nvmlInit`` on the
    new one and meet NVML_ERROR_UNINITIALIZED, so it is shut down first."""
    from hetero_dp_nvidia.backend import plugin

    plugin.shutdown()


@pytest.fixture
def fake_node(
    fake_nvml_lib: ctypes.CDLL, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., FakeNode]]:
    """``fake_node("a100-8x-nvlink.scn", extra_lines...)`` -> FakeNode, NVML env set."""
    from tests.nvidia.support import make_node

    for var in NVIDIA_ENV:
        monkeypatch.delenv(var, raising=False)
    counter = iter(range(1000))

    def make(base: str, *extra: str, **kw: object) -> FakeNode:
        node = make_node(fake_nvml_lib, tmp_path / f"node{next(counter)}", base, extra, **kw)
        _forget_entry_point_instance()
        fake_nvml_lib.fake_nvml_reset()
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(node.scenario))
        return node

    yield make
    _forget_entry_point_instance()
    fake_nvml_lib.fake_nvml_reset()
    os.environ.pop("FAKE_NVML_SCENARIO", None)


@pytest.fixture
def watching() -> type[Watching]:
    from tests.nvidia.support import Watching

    return Watching
