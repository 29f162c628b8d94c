"""CDI end to end: a daemon serving a backend to the fake kubelet over real sockets,
with specs written by CDIPublisher into a CDI dir, Allocate per strategy, and the
names in each response resolved against the specs on disk as a runtime would."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hetero_dp import Device, DeviceNode, Mount, hookimpl
from hetero_dp.engine.daemon import Daemon
from tests.cdi.schema_check import assert_valid_cdi_spec

RES = "acme.com/accel"


def make_devices(n: int) -> list[Device]:
    return [
        Device(
            id=f"accel{i}",
            resource=RES,
            nodes=(DeviceNode(f"/dev/accel/accel{i}"), DeviceNode("/dev/accel-ctl", shared=True)),
            mounts=(Mount("/opt/acme/lib", shared=True),),
            env={"ACME_VISIBLE_DEVICES": str(i), "ACME_DRIVER": "2.1"},
            annotations={f"acme.com/slot-{i}": "x"},
        )
        for i in range(n)
    ]


class Acme:
    hetero_dp_name = "acme"

    def __init__(self, n: int) -> None:
        self.devices = make_devices(n)

    @hookimpl
    def discover(self) -> list[Device]:
        return list(self.devices)


async def start(
    plugin_runner: Any,
    backend: object,
    cdi_dir: Path,
    settings: dict,
    *,
    resources: dict | None = None,
    options: dict | None = None,
) -> Daemon:
    """Start a daemon with ``cdi.enabled``: the core wires the CDI publisher."""
    raw = {
        "cdi": {"enabled": True, "dir": str(cdi_dir)},
        "resources": resources or {RES: settings},
        "backends": options or {},
    }
    return await plugin_runner.start(backend, config=raw)


def resolve(cdi_dir: Path, qualified: str) -> dict:
    """Find a qualified CDI name in the specs on disk, as a runtime's CDI cache does."""
    kind, _, name = qualified.partition("=")
    for path in cdi_dir.glob("*.json"):
        spec = json.loads(path.read_text())
        if spec["kind"] == kind:
            assert_valid_cdi_spec(spec)
            for d in spec["devices"]:
                if d["name"] == name:
                    return d
    raise AssertionError(f"{qualified} is not in any spec in {cdi_dir}")


def spec_names(cdi_dir: Path) -> list[str]:
    spec = assert_valid_cdi_spec(cdi_dir / "hetero-dp_acme.com_accel.json")
    return [d["name"] for d in spec["devices"]]


@pytest.fixture
def cdi_dir(tmp_path: Path) -> Path:
    return tmp_path / "run" / "cdi"  # missing: the start-up check creates it


async def test_cdi_cri(fake_kubelet, plugin_runner, cdi_dir):
    await start(plugin_runner, Acme(3), cdi_dir, {"deliver": ["cdi-cri"]})
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 3)
    assert spec_names(cdi_dir) == ["accel0", "accel1", "accel2"]
    r = await fake_kubelet.allocate(RES, ["accel2", "accel0"])
    assert [c.name for c in r.cdi_devices] == ["acme.com/accel=accel2", "acme.com/accel=accel0"]
    assert list(r.devices) == [] and list(r.mounts) == []
    assert not [k for k in r.annotations if k.startswith("cdi.k8s.io/")]
    assert dict(r.envs) == {"ACME_VISIBLE_DEVICES": "2,0", "ACME_DRIVER": "2.1"}
    assert r.annotations["acme.com/slot-2"] == "x"  # the records' own annotations stay
    for c in r.cdi_devices:
        dev = resolve(cdi_dir, c.name)
        assert dev["containerEdits"]["env"] == ["ACME_DRIVER=2.1"]


async def test_cdi_annotations(fake_kubelet, plugin_runner, cdi_dir):
    await start(plugin_runner, Acme(2), cdi_dir, {"deliver": ["cdi-annotations"]})
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 2)
    r = await fake_kubelet.allocate(RES, ["accel1"])
    (key,) = [k for k in r.annotations if k.startswith("cdi.k8s.io/")]
    assert key.startswith("cdi.k8s.io/hetero-dp_")
    assert r.annotations[key] == "acme.com/accel=accel1"
    assert list(r.cdi_devices) == [] and list(r.devices) == []
    resolve(cdi_dir, r.annotations[key])


async def test_device_specs_with_cdi_cri_and_custom_kind(fake_kubelet, plugin_runner, cdi_dir):
    settings = {"deliver": ["device-specs", "cdi-cri"], "cdiKind": "acme.com/npu"}
    await start(plugin_runner, Acme(2), cdi_dir, settings)
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 2)
    assert [p.name for p in cdi_dir.iterdir()] == ["hetero-dp_acme.com_npu.json"]
    r = await fake_kubelet.allocate(RES, ["accel0"])
    assert [c.name for c in r.cdi_devices] == ["acme.com/npu=accel0"]
    assert [d.host_path for d in r.devices] == ["/dev/accel/accel0", "/dev/accel-ctl"]
    assert [m.container_path for m in r.mounts] == ["/opt/acme/lib"]
    resolve(cdi_dir, "acme.com/npu=accel0")


async def test_device_specs_only_writes_no_spec(fake_kubelet, plugin_runner, cdi_dir):
    await start(plugin_runner, Acme(2), cdi_dir, {})
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 2)
    r = await fake_kubelet.allocate(RES, ["accel0", "accel1"])
    assert list(r.cdi_devices) == []
    assert len(r.devices) == 3
    assert list(cdi_dir.iterdir()) == []


async def test_device_removal_rewrites_spec_and_spec_survives_stop(
    fake_kubelet, plugin_runner, cdi_dir
):
    backend = Acme(3)
    daemon = await start(plugin_runner, backend, cdi_dir, {"deliver": ["cdi-cri"]})
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 3)
    backend.devices = [d for d in backend.devices if d.id != "accel1"]
    await daemon.rediscover()
    assert spec_names(cdi_dir) == ["accel0", "accel2"]
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 2)
    with pytest.raises(AssertionError, match="not in any spec"):
        resolve(cdi_dir, "acme.com/accel=accel1")
    backend.devices = make_devices(4)
    await daemon.rediscover()
    assert spec_names(cdi_dir) == ["accel0", "accel1", "accel2", "accel3"]
    # A clean stop leaves the spec: running containers restart through it.
    await plugin_runner.stop(daemon)
    assert spec_names(cdi_dir) == ["accel0", "accel1", "accel2", "accel3"]


async def test_health_change_does_not_rewrite_spec(fake_kubelet, plugin_runner, cdi_dir):
    backend = Acme(2)
    daemon = await start(plugin_runner, backend, cdi_dir, {"deliver": ["cdi-cri"]})
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 2)
    path = cdi_dir / "hetero-dp_acme.com_accel.json"
    before = path.stat()
    backend.devices = [backend.devices[0].with_health(False, "hot"), backend.devices[1]]
    await daemon.rediscover()
    await fake_kubelet.wait_devices(RES, lambda d: not d["accel0"].healthy)
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


async def test_ids_unfit_for_cdi_fail_allocate_clearly(fake_kubelet, plugin_runner, cdi_dir):
    import grpc

    backend = Acme(1)
    backend.devices = [Device(id="acc_0-", resource=RES, nodes=(DeviceNode("/dev/null"),))]
    await start(plugin_runner, backend, cdi_dir, {"deliver": ["cdi-cri"]})
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 1)
    assert list(cdi_dir.iterdir()) == []  # logged, not written
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await fake_kubelet.allocate(RES, ["acc_0-"])
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "'acc_0-'" in (e.value.details() or "")


async def test_unwritable_cdi_dir_is_a_start_up_error(plugin_runner, tmp_path):
    from hetero_dp import ConfigError

    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match="f' is a file") as e:
        await start(plugin_runner, Acme(1), tmp_path / "f" / "cdi", {"deliver": ["cdi-cri"]})
    assert e.value.field == "cdi.dir"


async def test_simulated_backend_two_resources(fake_kubelet, plugin_runner, cdi_dir):
    sim = pytest.importorskip("hetero_dp_simulated.backend")
    backend = sim.SimulatedBackend()
    a, b = "hetero-dp.io/sim", "hetero-dp.io/sim-b"
    daemon = await start(
        plugin_runner,
        backend,
        cdi_dir,
        {},
        resources={a: {"deliver": ["cdi-cri"]}, b: {"deliver": ["cdi-annotations"]}},
        options={"simulated": {"resources": [a, b], "count": 3}},
    )
    await fake_kubelet.wait_devices(a, lambda d: len(d) == 3)
    await fake_kubelet.wait_devices(b, lambda d: len(d) == 3)
    assert sorted(p.name for p in cdi_dir.iterdir()) == [
        "hetero-dp_hetero-dp.io_sim-b.json",
        "hetero-dp_hetero-dp.io_sim.json",
    ]
    r = await fake_kubelet.allocate(a, ["sim0", "sim2"])
    assert [c.name for c in r.cdi_devices] == ["hetero-dp.io/sim=sim0", "hetero-dp.io/sim=sim2"]
    assert dict(r.envs) == {"SIM_VISIBLE_DEVICES": "0,2"}
    dev = resolve(cdi_dir, "hetero-dp.io/sim=sim2")
    assert dev["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/sim2", "hostPath": "/dev/null", "permissions": "rw"}
    ]
    r = await fake_kubelet.allocate(b, ["sim1-1"])
    (value,) = [v for k, v in r.annotations.items() if k.startswith("cdi.k8s.io/")]
    assert value == "hetero-dp.io/sim-b=sim1-1"
    resolve(cdi_dir, value)
    backend.count = 1
    await daemon.rediscover()
    for kind, name in ((a, "sim0"), (b, "sim1-0")):
        spec = assert_valid_cdi_spec(cdi_dir / f"hetero-dp_{kind.replace('/', '_')}.json")
        assert [d["name"] for d in spec["devices"]] == [name]
        assert spec["cdiVersion"] == "0.5.0"  # hostPath /dev/null differs from /dev/simN


async def test_one_device_unfit_for_cdi_leaves_the_spec_to_the_others(
    fake_kubelet, plugin_runner, cdi_dir
):
    """Issue #29: one bad device blocked the spec of every device of the resource, all
    stayed Healthy and Allocate handed out names no spec defined."""
    import grpc

    backend = Acme(2)
    backend.devices.append(Device(id="acc_0-", resource=RES, nodes=(DeviceNode("/dev/null"),)))
    daemon = await start(plugin_runner, backend, cdi_dir, {"deliver": ["cdi-cri"]})
    devices = await fake_kubelet.wait_devices(RES, lambda d: len(d) == 3)
    assert devices["accel0"].healthy and not devices["acc_0-"].healthy
    assert "not a valid CDI device name" in daemon.resources[RES].state.get("acc_0-").reason
    assert spec_names(cdi_dir) == ["accel0", "accel1"]
    r = await fake_kubelet.allocate(RES, ["accel1"])
    for c in r.cdi_devices:
        resolve(cdi_dir, c.name)  # every name handed out is in a spec
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await fake_kubelet.allocate(RES, ["acc_0-"])
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_devices_a_failed_spec_write_leaves_without_a_name_are_unhealthy_until_it_works(
    fake_kubelet, plugin_runner, cdi_dir, monkeypatch
):
    """Issue #29, 'no Allocate ever returns a CDI name that no spec defines': a spec
    write that failed after start-up (a full disk, a dir made read-only) kept the
    previous file while a new device served Healthy under a CDI name that file does
    not define. Now that device is Unhealthy with the reason, the others (in the
    file) serve, and the write is tried again at each publish."""
    import grpc

    from hetero_dp.engine.cdi_publisher import CDIPublisher

    backend = Acme(2)
    daemon = await start(plugin_runner, backend, cdi_dir, {"deliver": ["cdi-cri"]})
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 2)
    (cdi,) = [p for p in daemon.publishers if isinstance(p, CDIPublisher)]

    def full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cdi.writer, "write_spec", full)
    backend.devices = make_devices(3)
    await daemon.rediscover()
    # (advertised first, then made Unhealthy once the write failed)
    devices = await fake_kubelet.wait_devices(
        RES, lambda d: "accel2" in d and not d["accel2"].healthy
    )
    assert devices["accel0"].healthy and devices["accel1"].healthy
    reason = daemon.resources[RES].state.get("accel2").reason
    assert "CDI spec of acme.com/accel not written" in reason and "No space" in reason
    assert spec_names(cdi_dir) == ["accel0", "accel1"]
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await fake_kubelet.allocate(RES, ["accel2"])
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    resolve(cdi_dir, (await fake_kubelet.allocate(RES, ["accel1"])).cdi_devices[0].name)
    monkeypatch.undo()
    await daemon.rediscover()  # any publish tries the write again
    devices = await fake_kubelet.wait_devices(RES, lambda d: d["accel2"].healthy)
    assert spec_names(cdi_dir) == ["accel0", "accel1", "accel2"]
    resolve(cdi_dir, (await fake_kubelet.allocate(RES, ["accel2"])).cdi_devices[0].name)


async def test_cdi_names_an_allocate_hook_adds_of_our_kinds_must_be_in_our_spec(
    fake_kubelet, plugin_runner, cdi_dir
):
    """What an allocate hook adds to cdiDevices under a kind this daemon writes must
    be a device of that spec; names of other kinds (another tool's spec, such as a
    vendor's own `vendor.com/gpu=all`) are not the daemon's to judge."""
    import grpc

    class Adding(Acme):
        @hookimpl
        def allocate(self, devices: list[Device], response: Any) -> None:
            if devices[0].id == "accel0":
                response.cdi_devices.append(f"{RES}=ghost")
            else:
                response.cdi_devices.append("other.example.com/x=all")

    await start(plugin_runner, Adding(2), cdi_dir, {"deliver": ["cdi-cri"]})
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 2)
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await fake_kubelet.allocate(RES, ["accel0"])
    assert e.value.code() == grpc.StatusCode.INTERNAL
    assert "'acme.com/accel=ghost' is defined by no CDI spec written" in (e.value.details() or "")
    r = await fake_kubelet.allocate(RES, ["accel1"])
    assert [c.name for c in r.cdi_devices] == [f"{RES}=accel1", "other.example.com/x=all"]


@pytest.mark.parametrize("where", ["file", "proc"])
async def test_an_unusable_cdi_dir_is_a_start_up_error_when_specs_are_needed(
    plugin_runner, tmp_path, where
):
    """cdi.enabled unset: the dir is checked when the first spec is needed, which at
    start-up is still a configuration error naming cdi.dir (issue #29: it was logged
    and the daemon served CDI names without specs)."""
    from hetero_dp import ConfigError

    (tmp_path / "f").write_text("")
    cdi = tmp_path / "f" / "cdi" if where == "file" else Path("/proc/hetero-dp-cdi")
    raw = {"cdi": {"dir": str(cdi)}, "resources": {RES: {"deliver": ["cdi-cri"]}}}
    with pytest.raises(ConfigError) as e:
        await plugin_runner.start(Acme(1), config=raw)
    assert e.value.field == "cdi.dir"


async def test_spec_wide_edits_that_may_not_go_into_a_container_are_refused(
    fake_kubelet, plugin_runner, cdi_dir, caplog
):
    """What a backend's cdi_spec_edits adds to every device passes the container gate:
    a mount of / and LD_PRELOAD are refused and the spec is not written with them."""

    class Hostile(Acme):
        @hookimpl
        def cdi_spec_edits(self, kind: str, devices: list[Device]) -> dict:
            return {
                "mounts": [{"hostPath": "/", "containerPath": "/host", "options": ["rbind"]}],
                "env": ["LD_PRELOAD=/host/evil.so"],
            }

    await start(plugin_runner, Hostile(2), cdi_dir, {"deliver": ["cdi-cri"]})
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 2)
    assert not list(cdi_dir.glob("*.json"))
    assert any("may not go into a container" in r.getMessage() for r in caplog.records)


async def test_what_the_specs_define_is_the_engines_data_not_a_call_into_the_writer(
    fake_kubelet, plugin_runner, cdi_dir
):
    """The spec writer fills the daemon's CDINames as it writes; each resource reads
    that record (the same one) to judge what an allocate hook adds."""
    daemon = await start(plugin_runner, Acme(2), cdi_dir, {"deliver": ["cdi-cri"]})
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 2)
    names = daemon.cdi_names
    assert names.kinds == {RES} and names.written[RES] == frozenset({"accel0", "accel1"})
    assert daemon.resources[RES].cdi_names is names
    assert names.undefined([f"{RES}=accel1", f"{RES}=ghost", "other.example.com/x=all"]) == [
        f"{RES}=ghost"
    ]
