"""Rolling updates: two instances of one driver on a node (a DaemonSet with surge).

Each instance names its sockets after its pod UID as the kubelet's own helper does
(``<driver>-<uid>-reg.sock``, ``dra-<uid>.sock``); the kubelet (1.33+) uses the most
recent registration; only the instance that leaves last removes the pool; the pool
generation never goes backwards; a claim prepared by one is unprepared by the other.
"""

from __future__ import annotations

import shutil

import pytest

from hetero_dp.dra import device_name
from hetero_dp.model.errors import ConfigError
from hetero_dp.testing.dra import ClaimRef, make_claim

from .backend import DRIVER, RES, Npus, npu


def generations_written(api) -> list[int]:
    """Every pool generation the server stored, in order."""
    return [
        o["spec"]["pool"]["generation"]
        for _, kind, o in api.events
        if kind != "DELETED" and o["spec"]["driver"] == DRIVER
    ]


async def test_two_instances_coexist_and_only_the_last_removes_the_pool(dra, api_server, kubelet):
    old_backend = Npus(2)
    old = await dra.start(old_backend, instance="pod-old")
    first = await kubelet.wait_registered(DRIVER)
    assert first.endpoint == str(dra.plugins_dir / DRIVER / "dra-pod-old.sock")
    assert first.registry_socket == str(dra.registry_dir / f"{DRIVER}-pod-old-reg.sock")

    new_backend = Npus(3)  # the new version sees one more device
    new = await dra.start(new_backend, instance="pod-new")
    current = await kubelet.wait_registered(DRIVER, after=1)
    assert current.endpoint == str(dra.plugins_dir / DRIVER / "dra-pod-new.sock")
    assert len(kubelet.instances[DRIVER]) == 2
    assert len(api_server.devices_of(DRIVER)) == 3  # the newer instance publishes
    await api_server.wait_for(lambda: not old.front_end.drivers[RES].publisher.active)
    ok, lines = old.readiness()
    assert ok and "standing by: a newer instance publishes" in lines[0]

    # the old instance stands by: its changes are not written over the new pool
    old_backend.devices.pop()
    await old.rediscover()
    assert len(api_server.devices_of(DRIVER)) == 3

    await dra.stop(old)  # the old pod goes: pool, new socket and registration stay
    assert len(api_server.devices_of(DRIVER)) == 3
    assert (dra.plugins_dir / DRIVER / "dra-pod-new.sock").is_socket()
    await kubelet.wait_for(lambda: len(kubelet.instances.get(DRIVER, [])) == 1)
    assert kubelet.plugins[DRIVER].endpoint.endswith("dra-pod-new.sock")

    new_backend.devices.append(npu(3))
    await new.rediscover()
    assert len(api_server.devices_of(DRIVER)) == 4
    gens = generations_written(api_server)
    assert gens == sorted(gens), f"the generation went backwards: {gens}"

    await dra.stop(new)  # the last one removes the pool
    assert api_server.slices_of(DRIVER) == []


async def test_a_claim_prepared_by_one_instance_is_unprepared_by_the_other(
    dra, api_server, kubelet
):
    old = await dra.start(Npus(1), instance="pod-old")
    await kubelet.wait_registered(DRIVER)
    claim = api_server.add_claim(
        make_claim("c1", [("npu", device_name("NPU-0000"))], driver=DRIVER, pool="node-a")
    )
    uid = claim["metadata"]["uid"]
    [entry] = (await kubelet.prepare_pod("pod-a", DRIVER, [ClaimRef.of(claim)])).values()
    assert entry.error == ""
    await dra.start(Npus(1), instance="pod-new")
    await kubelet.wait_registered(DRIVER, after=1)
    await dra.stop(old)
    assert await kubelet.unprepare_pod("pod-a") == [uid]  # through the new instance
    assert not list(dra.cdi_dir.glob(f"*{uid}*"))


async def test_the_old_instance_takes_over_when_the_new_one_goes_first(dra, api_server, kubelet):
    old = await dra.start(Npus(2), instance="pod-old")
    new = await dra.start(Npus(3), instance="pod-new")
    await api_server.wait_for(lambda: not old.front_end.drivers[RES].publisher.active)
    await dra.stop(new)  # a rollback: the newer pod goes first
    await api_server.wait_for(lambda: old.front_end.drivers[RES].publisher.active)
    await api_server.wait_for(lambda: len(api_server.devices_of(DRIVER)) == 2)
    gens = generations_written(api_server)
    assert gens == sorted(gens), gens


async def test_an_instance_id_must_fit_a_file_name(dra):
    with pytest.raises(ConfigError, match=r"instance ID '\.\./x'"):
        await dra.start(Npus(1), instance="../x")


async def test_without_pod_uid_a_second_instance_is_refused_and_the_first_keeps_serving(
    dra, api_server, kubelet
):
    first = await dra.start(Npus(2))  # no POD_UID: the shared names dra.sock, <driver>-reg.sock
    await kubelet.wait_registered(DRIVER)
    sock = dra.plugins_dir / DRIVER / "dra.sock"
    reg = dra.registry_dir / f"{DRIVER}-reg.sock"
    before = (sock.stat().st_ino, reg.stat().st_ino)
    with pytest.raises(ConfigError, match=r"another running instance.*set POD_UID"):
        await dra.start(Npus(2))
    assert (sock.stat().st_ino, reg.stat().st_ino) == before  # untouched
    assert len(api_server.devices_of(DRIVER)) == 2
    claim = api_server.add_claim(
        make_claim("c1", [("npu", device_name("NPU-0000"))], driver=DRIVER, pool="node-a")
    )
    [entry] = (await kubelet.prepare_pod("pod-a", DRIVER, [ClaimRef.of(claim)])).values()
    assert entry.error == ""  # the first one still prepares
    await dra.stop(first)
    assert not sock.exists() and not reg.exists()


async def test_an_instance_leaving_removes_only_the_sockets_it_bound(dra, kubelet):
    first = await dra.start(Npus(1))
    await kubelet.wait_registered(DRIVER)
    sock = dra.plugins_dir / DRIVER / "dra.sock"
    # the file at its path is someone else's now (removed and bound again by another
    # process): the first instance's exit must leave it alone
    import socket

    sock.unlink()
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(str(sock))
    other.listen()
    try:
        ino = sock.stat().st_ino
        await dra.stop(first)
        assert sock.stat().st_ino == ino
    finally:
        other.close()


async def test_a_start_that_fails_after_serving_leaves_no_socket_behind(dra):
    """The service socket is bound before the registration socket: when the latter
    cannot be offered (here the registry path is a file, as a hostPath of the wrong
    type would leave it), the failed start stops the server already started and removes
    the file it bound, instead of leaving a listening socket for the kubelet to find."""
    shutil.rmtree(dra.registry_dir, ignore_errors=True)
    dra.registry_dir.write_text("not a directory")
    with pytest.raises(OSError):
        await dra.start(Npus(1))
    sock = dra.plugins_dir / DRIVER / "dra.sock"
    assert not sock.exists()
