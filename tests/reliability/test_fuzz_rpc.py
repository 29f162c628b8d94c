"""Fuzzing every DevicePlugin RPC of a running daemon with hypothesis: random and
unicode IDs, sizes, huge lists, raw garbage bytes. Only clean gRPC errors come
back, every call answers before its deadline, and the daemon keeps serving."""

from __future__ import annotations

import asyncio
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetero_dp.api import deviceplugin_v1beta1_pb2 as pb
from hetero_dp.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from hetero_dp.testing import FakeKubelet, PluginRunner

from .conftest import SIM, simulated

COUNT = 6
IDS = [f"sim{i}" for i in range(COUNT)]
DEADLINE = 5.0
CLEAN = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION}
FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class LiveDaemon:
    """A daemon and a fake kubelet on their own loop in a thread; tests call in with
    plain (blocking) gRPC clients, as an outside kubelet would."""

    def __init__(self, root: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.root = root

    def run(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start(self) -> None:
        self.kubelet = FakeKubelet(self.root / "dp")
        await self.kubelet.start()
        self.runner = PluginRunner(self.kubelet.plugin_dir)
        self.backend = simulated()
        self.daemon = await self.runner.start(self.backend, options={"simulated": {"count": COUNT}})
        await self.kubelet.wait_registered(SIM)
        self.daemon.set_health("simulated", "sim5", False, "broken on purpose")
        await self.kubelet.wait_devices(SIM, lambda d: not d["sim5"].healthy)

    async def _stop(self) -> None:
        await self.runner.stop_all()
        await self.kubelet.stop()

    def __enter__(self) -> LiveDaemon:
        self.thread.start()
        self.run(self._start())
        self.socket = str(self.daemon.front_end.endpoints[SIM].socket_path)
        self.channel = grpc.insecure_channel(f"unix://{self.socket}")
        self.stub = pb_grpc.DevicePluginStub(self.channel)
        return self

    def __exit__(self, *exc: object) -> None:
        self.channel.close()
        self.run(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
        shutil.rmtree(self.root, ignore_errors=True)

    async def _streams_settle(self, want: int) -> None:
        session = self.daemon.front_end.endpoints[SIM].session
        while session.open_streams != want:
            session.streams_changed.clear()
            if session.open_streams == want:
                return
            await session.streams_changed.wait()

    def wait_open_streams(self, want: int) -> None:
        self.run(asyncio.wait_for(self._streams_settle(want), 10))


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveDaemon]:
    # under pytest's basetemp, not a short_tempdir: the daemon outlives each test of
    # the module, and the temp guard removes what a test leaves in the temp dir
    with LiveDaemon(tmp_path_factory.mktemp("live")) as live:
        yield live
        # after all the fuzzing: still registered, still streaming, still allocating
        assert live.kubelet.resources[SIM].stream_open
        assert live.kubelet.registration_count(SIM) == 1
        resp = live.stub.Allocate(
            pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=IDS[:2])]
            ),
            timeout=DEADLINE,
        )
        assert resp.container_responses[0].envs["SIM_VISIBLE_DEVICES"] == "0,1"
        live.wait_open_streams(1)  # every fuzzed stream was cleaned up


def _clean(e: grpc.RpcError, allowed: set[grpc.StatusCode] = CLEAN) -> None:
    code, details = e.code(), e.details() or ""
    assert code != grpc.StatusCode.DEADLINE_EXCEEDED, "the call hung"
    assert code in allowed, (code, details)
    assert details and "Traceback" not in details


def _undecodable_or_clean(e: grpc.RpcError) -> None:
    """A request body protobuf cannot parse is refused with INVALID_ARGUMENT by our
    request decoder (grpc's own would answer UNKNOWN after logging a traceback)."""
    details = e.details() or ""
    if "not a valid protobuf message" in details:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.code(), details)
        return
    _clean(e)


# IDs: real ones, near misses, unicode (no lone surrogates: protobuf strings are UTF-8)
text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=80)
an_id = st.one_of(st.sampled_from(IDS), text, st.sampled_from(["", " ", "sim", "SIM0", "sim0::1"]))
id_lists = st.one_of(
    st.lists(an_id, max_size=12),
    st.lists(st.sampled_from(IDS), max_size=COUNT * 3),
    st.integers(0, 5_000).map(lambda n: [f"x{i}" for i in range(n)]),
)
sizes = st.one_of(st.integers(-5, COUNT + 3), st.integers(-(2**31), 2**31 - 1))


@FUZZ
@given(requests=st.lists(id_lists, max_size=4))
def test_fuzz_allocate(live, requests):
    msg = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=ids) for ids in requests]
    )
    try:
        resp = live.stub.Allocate(msg, timeout=DEADLINE)
    except grpc.RpcError as e:
        _clean(e)
        return
    # success only for known, healthy, distinct IDs, one answer per container
    assert len(resp.container_responses) == len(requests) > 0
    for ids, answer in zip(requests, resp.container_responses):
        assert ids and len(set(ids)) == len(ids) and set(ids) <= set(IDS) - {"sim5"}
        assert answer.envs["SIM_VISIBLE_DEVICES"] == ",".join(i[3:] for i in ids)


@FUZZ
@given(
    requests=st.lists(st.tuples(id_lists, id_lists, sizes), max_size=3),
)
def test_fuzz_preferred_allocation(live, requests):
    msg = pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=a, must_include_deviceIDs=m, allocation_size=n
            )
            for a, m, n in requests
        ]
    )
    try:
        resp = live.stub.GetPreferredAllocation(msg, timeout=DEADLINE)
    except grpc.RpcError as e:
        _clean(e)
        return
    assert len(resp.container_responses) == len(requests)
    for (available, must, size), answer in zip(requests, resp.container_responses):
        chosen = list(answer.deviceIDs)
        assert len(chosen) == size and len(set(chosen)) == size
        assert set(must) <= set(chosen) <= set(available)


@FUZZ
@given(ids=id_lists)
def test_fuzz_pre_start(live, ids):
    try:
        live.stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=ids), timeout=DEADLINE)
    except grpc.RpcError as e:
        _clean(e)
        return
    assert ids and set(ids) <= set(IDS)


METHODS = ["Allocate", "GetPreferredAllocation", "PreStartContainer", "GetDevicePluginOptions"]


@FUZZ
@given(method=st.sampled_from(METHODS), body=st.binary(max_size=4096))
def test_fuzz_raw_bytes(live, method, body):
    """Bytes that may not even parse: grpc's own clean error, never a dead server."""
    call = live.channel.unary_unary(f"/v1beta1.DevicePlugin/{method}")
    try:
        call(body, timeout=DEADLINE)
    except grpc.RpcError as e:
        _undecodable_or_clean(e)


@settings(max_examples=25, deadline=None)
@given(body=st.binary(max_size=512))
def test_fuzz_list_and_watch(live, body):
    """A ListAndWatch with any request body answers the device set (or refuses
    cleanly), and a stream the caller abandons is cleaned up."""
    call = live.channel.unary_stream("/v1beta1.DevicePlugin/ListAndWatch")(body, timeout=DEADLINE)
    try:
        first = pb.ListAndWatchResponse.FromString(next(call))
        assert sorted(d.ID for d in first.devices) == IDS
    except grpc.RpcError as e:
        _undecodable_or_clean(e)
    finally:
        call.cancel()
    live.wait_open_streams(1)


def test_huge_requests(live):
    """Very long IDs and lists beyond the message limit: refused, named, quickly."""
    cases = [
        ["sim0", "y" * 1_000_000],
        [f"id-{i}" for i in range(200_000)],  # ~2.4 MB
        ["\u2603" * 50_000] * 3,
        [f"sim{i % COUNT}" for i in range(100_000)],  # duplicates galore
    ]
    for ids in cases:
        msg = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
        with pytest.raises(grpc.RpcError) as err:
            live.stub.Allocate(msg, timeout=DEADLINE)
        _clean(err.value)
        assert len(err.value.details()) < 2000, "the message names a few IDs, not all"
    too_big = [f"z{i:08d}" for i in range(500_000)]  # ~5 MB: over grpc's 4 MB limit
    msg = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=too_big)])
    with pytest.raises(grpc.RpcError) as err:
        live.stub.Allocate(msg, timeout=DEADLINE)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
