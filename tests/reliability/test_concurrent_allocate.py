"""50 concurrent Allocates while health flips: every answer agrees with the device
set at the moment it was given."""

from __future__ import annotations

import asyncio
import random
import threading

import grpc

from hetero_dp.kits import observe

from .conftest import SIM, simulated

STABLE = ["sim0", "sim1", "sim2"]  # always healthy
FLIPPING = ["sim3", "sim4", "sim5", "sim6"]
BROKEN = "sim7"  # always unhealthy
CALLS = 50


async def test_concurrent_allocates_while_health_flips(fake_kubelet, plugin_runner):
    backend = simulated()
    daemon = await plugin_runner.start(backend, options={"simulated": {"count": 8}})
    await fake_kubelet.wait_registered(SIM)
    state = daemon.resources[SIM].state
    daemon.set_health("simulated", BROKEN, False, "fan failure")
    await fake_kubelet.wait_devices(SIM, lambda d: not d[BROKEN].healthy)

    # Every state the kubelet could have been answered from, in order: the daemon
    # publishes synchronously on its loop and says so with "devices_changed".
    history: list[set[str]] = [{d.id for d in state.devices if d.healthy}]
    # OK answers are made without giving up the loop between the check and the
    # "allocate" event, so for them the state at the event is the state decided on.
    ok_seen: list[tuple[list[str], set[str]]] = []

    flipping = asyncio.Event()  # the flips have reached the kubelet side's state

    def on_event(event, fields):
        if event == "devices_changed" and fields["resource"] == SIM:
            history.append({d.id for d in state.devices if d.healthy})
            if len(history) > 2:
                flipping.set()
        elif event == "allocate" and fields["code"] == "OK":
            ok_seen.append((list(fields["devices"]), {d.id for d in state.devices if d.healthy}))

    unsubscribe = observe.subscribe(on_event)
    rng = random.Random(1234)
    requests = []
    for i in range(CALLS):
        ids = rng.sample(STABLE + FLIPPING, rng.randint(1, 3))
        if i % 10 == 5:  # some that must fail whatever the flips
            ids.insert(rng.randint(0, len(ids)), BROKEN)
        requests.append(ids)
    requests[0] = STABLE[:2]  # at least one that must succeed whatever the flips

    async def call(ids):
        first = len(history) - 1  # the state in force when the request left
        try:
            result = await fake_kubelet.allocate(SIM, ids)
        except grpc.aio.AioRpcError as e:
            result = e
        return result, history[first : len(history)]

    loop = asyncio.get_running_loop()
    done = threading.Event()
    flips = 0

    def flipper():  # a blocking health watcher in its own thread, as NVML's would be
        nonlocal flips
        r = random.Random(99)
        while not done.is_set():
            dev = r.choice(FLIPPING)
            healthy = r.random() < 0.5
            loop.call_soon_threadsafe(daemon.set_health, "simulated", dev, healthy, "flip")
            flips += 1
            done.wait(0.0005)  # the flip rate, not a synchronisation

    thread = threading.Thread(target=flipper)
    thread.start()
    try:
        # the calls start once flips are landing (the thread's first flips can come
        # after a fast batch of answers), and the flips go on while they run
        await asyncio.wait_for(flipping.wait(), 10)
        answers = await asyncio.gather(*(call(ids) for ids in requests))
    finally:
        done.set()
        thread.join(5)
        unsubscribe()

    assert flips > 0 and len(history) > 2
    for ids, healthy in ok_seen:
        assert set(ids) <= healthy, (ids, healthy)
    results = []
    for ids, (result, window) in zip(requests, answers):
        results.append(result)
        if isinstance(result, grpc.aio.AioRpcError):
            assert result.code() == grpc.StatusCode.FAILED_PRECONDITION, result
            # some state during the call had one of the devices unhealthy
            assert any(not set(ids) <= h for h in window), (ids, window)
            named = [i for i in ids if repr(i) in result.details()]
            assert named, result.details()  # the refusal names the unhealthy device
            assert any(not set(named) & h for h in window), (named, window)
            continue
        assert any(set(ids) <= h for h in window), (ids, window)
        # the answer is exactly the requested devices, in order
        assert result.envs["SIM_VISIBLE_DEVICES"] == ",".join(i[3:] for i in ids)
        assert [d.container_path for d in result.devices] == [f"/dev/{i}" for i in ids]
    assert len(ok_seen) == sum(not isinstance(r, grpc.aio.AioRpcError) for r in results)
    stable_only = [r for ids, r in zip(requests, results) if set(ids) <= set(STABLE)]
    assert stable_only and all(not isinstance(r, BaseException) for r in stable_only)
    broken = [r for ids, r in zip(requests, results) if BROKEN in ids]
    assert broken and all(isinstance(r, grpc.aio.AioRpcError) for r in broken)

    # after the storm the kubelet's view matches the daemon's
    want = {d.id: d.healthy for d in state.devices}
    await fake_kubelet.wait_devices(SIM, lambda d: {k: v.healthy for k, v in d.items()} == want)
