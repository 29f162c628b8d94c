"""The deployment suite: the images we ship, built for real, started as the rendered
chart and manifests say, under a real container runtime (podman, or docker).

Where no container engine answers, every test here skips and says why; under CI=true
it fails instead (CI must never pass without it). The images are built through
scripts/build_images.py (the same code as ``make images``): once per session, and on a
machine that built them before, the engine's layer cache and the reused stand-in base
make that a matter of seconds.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from hetero_dp.testing.fake_kubelet import FakeKubelet
from tests.nvidia.support import build_fake, make_node

from .podkit import Node, Pod

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import build_images  # noqa: E402

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
T = TypeVar("T")


def missing(what: str) -> None:
    if IN_CI:
        pytest.fail(f"{what} (CI=true: the deployment suite must run)", pytrace=False)
    pytest.skip(what)


@pytest.fixture(scope="session")
def engine() -> build_images.Engine:
    if os.geteuid() != 0:
        missing("the deployment suite runs containers as root (rootless podman is not set up)")
    found, why = build_images.find_engine()
    if found is None:
        missing(f"no container engine runs here: {why}; install podman (make image-deps)")
    assert found is not None
    return found


_built: dict[str, str] = {}
_lock = threading.Lock()


@pytest.fixture(scope="session")
def image(engine: build_images.Engine):
    """``image("nvidia")`` -> its tag, built once per session (cached layers reused)."""

    def get(name: str) -> str:
        with _lock:
            if name not in _built:
                started = time.monotonic()
                # buildah leaves its buildah-cache-* dirs in TMPDIR: give the build a
                # temp dir of its own, not the one the host guard holds each test to
                scratch = tempfile.mkdtemp(prefix="hdp-image-build-", dir="/var/tmp")
                saved = os.environ.get("TMPDIR")
                os.environ["TMPDIR"] = scratch
                try:
                    _built.update(build_images.build_all(engine, [name]))
                finally:
                    if saved is None:
                        os.environ.pop("TMPDIR", None)
                    else:
                        os.environ["TMPDIR"] = saved
                    shutil.rmtree(scratch, ignore_errors=True)
                print(f"\ndeployment: image {name} ready in {time.monotonic() - started:.0f}s")
            return _built[name]

    return get


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A short dir under /tmp (unix socket paths stay under 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="dep-", dir="/tmp"))
    yield path
    subprocess.run(["rm", "-rf", str(path)], check=False)


class KubeletThread:
    """The project's FakeKubelet on its own event loop thread, for sync tests."""

    def __init__(self, plugin_dir: Path) -> None:
        self.plugin_dir = plugin_dir
        plugin_dir.mkdir(parents=True, exist_ok=True)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.kubelet = FakeKubelet(plugin_dir)
        self.call(self.kubelet.start())

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 90.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        try:
            self.call(self.kubelet.stop(), 30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)

    def plugin_sockets(self) -> list[str]:
        return sorted(
            p.name
            for p in self.plugin_dir.iterdir()
            if p.is_socket() and p.name != self.kubelet.socket_path.name
        )


@pytest.fixture
def kubelet(workdir: Path) -> Iterator[KubeletThread]:
    k = KubeletThread(workdir / "device-plugins")
    yield k
    k.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_status(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def wait_http(url: str, status: int = 200, timeout: float = 60.0) -> str:
    """Poll a probe URL as the kubelet's prober does (every second) until ``status``."""
    deadline = time.monotonic() + timeout
    last: tuple[int, str] | str = "no answer"
    while time.monotonic() < deadline:
        try:
            last = http_status(url)
            if last[0] == status:
                return last[1]
        except OSError as e:
            last = str(e)
        time.sleep(1.0)  # the probe period, not a synchronisation
    raise AssertionError(f"{url} never answered {status}: {last}")


def helm_render(args: list[str]) -> list[dict[str, Any]]:
    from tests.deploy.conftest import find_helm

    out = subprocess.run(
        [find_helm(), "template", *args], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


# --- the NVIDIA node: fake NVML, driver root, runtime config --------------------------------

LIB_PATH = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
CONTAINERD_17_CDI = 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  enable_cdi = true\n'


@pytest.fixture(scope="session")
def fake_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_fake(tmp_path_factory.mktemp("fakenvml-image"))


@pytest.fixture
def nvidia_node(workdir: Path, fake_lib: Path, kubelet: KubeletThread):
    """``nvidia_node(scenario)`` -> (Node, fake node): host paths stood in by temp dirs."""

    def make(scenario: str = "a100-8x-nvlink.scn", runtime_config: str = CONTAINERD_17_CDI):
        fake = make_node(None, workdir / "node", scenario)  # type: ignore[arg-type]
        etc = workdir / "etc-containerd"
        etc.mkdir(exist_ok=True)
        (etc / "config.toml").write_text(runtime_config)
        node = Node(
            host_paths={
                "/var/lib/kubelet/device-plugins": kubelet.plugin_dir,
                "/": fake.root / "driver",
                "/dev": fake.root / "driver" / "dev",
                "/var/run/cdi": workdir / "cdi",
                "/etc/containerd": etc,
            },
            runtime_mounts={fake_lib: LIB_PATH, fake.scenario.parent: "/run/fake-nvml"},
            runtime_env={"FAKE_NVML_SCENARIO": "/run/fake-nvml/scenario.scn"},
        )
        return node, fake

    return make


@pytest.fixture
def pods(engine: Any, workdir: Path) -> Iterator[list[Pod]]:
    started: list[Pod] = []
    yield started
    for pod in started:
        pod.remove()
