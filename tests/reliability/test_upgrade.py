"""Rolling the DaemonSet in both orders (stop old then start new; new beside old,
then stop old) for the simulated and nvidia backends (udev: tests/udev/test_upgrade.py,
under umockdev): no pod fails admission, each instance keeps its own socket, and in
surge order the kubelet loses the devices at most once, for one immediate
re-registration (kubelet 1.32 disconnects the current client when the old one's
stream ends). Timings are in benchmarks/bench_upgrade.py."""

from __future__ import annotations

import asyncio
import threading

import pytest
from hetero_dp_nvidia.backend import NvidiaBackend

from hetero_dp import ContainerResponse, Device, hookimpl

from .conftest import SIM, devices, simulated
from .upgrade import ORDERS, HostNetwork, check, roll


@pytest.mark.parametrize("order", ORDERS)
async def test_upgrade_simulated(fake_kubelet, plugin_runner, tmp_path, order):
    labels = {"enabled": True, "dir": str(tmp_path / "features.d")}

    async def start():
        return await plugin_runner.start(
            simulated(), config={"labels": labels}, options={"simulated": {"count": 3}}
        )

    rollout = await roll(fake_kubelet, plugin_runner, start, SIM, 3, order)
    check(rollout, fake_kubelet, SIM, 3)
    # the node label file the new pod wrote outlives the old pod's exit
    assert [p.name for p in (tmp_path / "features.d").iterdir()] == ["hetero-dp-simulated"]


@pytest.mark.parametrize("order", ORDERS)
async def test_upgrade_in_the_host_network(fake_kubelet, plugin_runner, tmp_path, order):
    """Pods in the host network (the udev DaemonSet): the new pod starts although the
    old one holds the metrics port (before: 'cannot listen on', exit 2, so a surge
    rollout crash-looped), and the rollout waits for the new pod's own ready file."""
    net = HostNetwork(tmp_path)

    async def start():
        return await plugin_runner.start(
            simulated(), config=net.config(), options={"simulated": {"count": 2}}
        )

    rollout = await roll(fake_kubelet, plugin_runner, start, SIM, 2, order, ready=net.ready)
    check(rollout, fake_kubelet, SIM, 2)
    await net.check(rollout)


@pytest.mark.parametrize("order", ORDERS)
async def test_upgrade_nvidia(fake_kubelet, plugin_runner, fake_node, order):
    node = fake_node("h100-8x.scn")

    async def start():
        backend = NvidiaBackend(environ={})
        daemon = await plugin_runner.start(backend, options={"nvidia": dict(node.options)})
        backend.monitor.wait_ms = 200  # bounds only how fast its watch thread sees shutdown
        return daemon

    rollout = await roll(fake_kubelet, plugin_runner, start, "nvidia.com/gpu", 8, order)
    check(rollout, fake_kubelet, "nvidia.com/gpu", 8)


async def test_sockets_of_dead_instances_are_removed_live_ones_left_alone(
    fake_kubelet, plugin_runner
):
    import socket

    def bound(name: str, listening: bool) -> tuple[socket.socket, int]:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(str(fake_kubelet.plugin_dir / name))
        if listening:
            s.listen()
        return s, (fake_kubelet.plugin_dir / name).stat().st_ino

    # an instance SIGKILLed in another pod left its socket (bound, nobody listening);
    # another instance (a pod of another rollout step) is alive on its own
    dead, _ = bound("hetero-dp-hetero-dp.io_sim-deadbeef0000.sock", listening=False)
    live, live_ino = bound("hetero-dp-hetero-dp.io_sim-a11fe0000000.sock", listening=True)
    try:
        daemon = await plugin_runner.start(simulated(), options={"simulated": {"count": 1}})
        await fake_kubelet.wait_registered(SIM)
        names = {p.name for p in fake_kubelet.plugin_dir.iterdir()}
        assert "hetero-dp-hetero-dp.io_sim-deadbeef0000.sock" not in names
        assert daemon.front_end.endpoints[SIM].socket_path.name in names
        await plugin_runner.stop(daemon)
        live_path = fake_kubelet.plugin_dir / "hetero-dp-hetero-dp.io_sim-a11fe0000000.sock"
        assert live_path.stat().st_ino == live_ino  # never touched
        assert not daemon.front_end.endpoints[SIM].socket_path.exists()  # its own: removed
    finally:
        dead.close()
        live.close()


async def test_a_socket_file_put_at_our_path_by_someone_else_survives_our_exit(
    fake_kubelet, plugin_runner
):
    import socket

    daemon = await plugin_runner.start(simulated(), options={"simulated": {"count": 1}})
    await fake_kubelet.wait_registered(SIM)
    path = daemon.front_end.endpoints[SIM].socket_path
    path.unlink()  # gone (an operator, a kubelet wipe) and bound again by another process
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(str(path))
    other.listen()
    try:
        ino = path.stat().st_ino
        await plugin_runner.stop(daemon)
        assert path.stat().st_ino == ino  # not ours: left alone (gRPC's own unlink too)
    finally:
        other.close()


class SlowAllocate:
    """A backend whose Allocate takes as long as the test says (a slow driver call)."""

    hetero_dp_name = "slowalloc"

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    @hookimpl
    def discover(self) -> list[Device]:
        return devices("example.com/slow", 2)

    @hookimpl
    def allocate(self, devices: list[Device], response: ContainerResponse) -> None:
        self.entered.set()
        self.release.wait(10)


async def test_a_stop_lets_an_allocate_in_flight_finish_before_ending_the_stream(
    fake_kubelet, plugin_runner
):
    """SIGTERM during an Allocate: the call is answered, then the stream ends (kubelet
    1.32 closes its connection when the stream ends, which would cancel the call)."""
    backend = SlowAllocate()
    daemon = await plugin_runner.start(backend)
    await fake_kubelet.wait_registered("example.com/slow")
    call = asyncio.ensure_future(fake_kubelet.allocate("example.com/slow", ["dev0"]))
    assert await asyncio.to_thread(backend.entered.wait, 10)
    stopping = asyncio.ensure_future(plugin_runner.stop(daemon))
    await asyncio.sleep(0.5)  # the modelled driver call goes on for 0.5 s into the stop
    assert fake_kubelet.resources["example.com/slow"].stream_open  # not ended under it
    backend.release.set()
    response = await call  # answered, not cancelled
    assert response.envs["VISIBLE"] == "0"
    await asyncio.wait_for(stopping, 10)
    # the kubelet's side reads the stream's end after the plugin's stop returns
    res = fake_kubelet.resources["example.com/slow"]
    await fake_kubelet.wait_for(lambda: not res.stream_open, 10)


class Context:
    """A servicer context that ends its RPC when told (gRPC calls the done callbacks
    once the status is sent, also after an abort, an error or a cancel)."""

    def __init__(self) -> None:
        self.callbacks: list = []

    def add_done_callback(self, callback) -> None:
        self.callbacks.append(callback)

    def end(self) -> None:
        for callback in self.callbacks:
            callback(self)


async def test_a_call_is_in_flight_until_its_answer_is_sent(fake_kubelet, plugin_runner):
    """A stop ends the streams once no call is in flight; a call counted only until its
    handler returned left a window in which the streams ended before the answer was
    written, and kubelet 1.32, closing its connection at the stream's end, cancelled
    the call (seen under load in the test above)."""
    from hetero_dp.api import deviceplugin_v1beta1_pb2 as pb
    from hetero_dp.deviceplugin.servicer import DevicePluginServicer

    daemon = await plugin_runner.start(simulated(), options={"simulated": {"count": 1}})
    await fake_kubelet.wait_registered(SIM)
    endpoint = daemon.front_end.endpoints[SIM]
    servicer = DevicePluginServicer(endpoint.resource, endpoint.session)
    request = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=["sim0"])]
    )
    context = Context()
    answer = await servicer.Allocate(request, context)
    assert answer.container_responses
    # the handler has returned; the answer is not out yet
    assert servicer.calls_in_flight == 1 and not servicer.idle.is_set()
    context.end()
    assert servicer.calls_in_flight == 0 and servicer.idle.is_set()
    # a context that cannot say when its RPC ends (a direct call): done at return
    await servicer.Allocate(request, None)
    assert servicer.calls_in_flight == 0 and servicer.idle.is_set()
