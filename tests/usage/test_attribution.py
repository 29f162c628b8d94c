"""Attribution end to end: the simulated backend under a daemon, the fake kubelet's
pod-resources API on a real unix socket and its device checkpoint, a fake /proc."""

from __future__ import annotations

import asyncio
import logging

import pytest
from hetero_dp_simulated.backend import plugin as simulated

from hetero_dp import Device, ProcessUsage, Sample, hookimpl
from hetero_dp.ops.operations import of
from tests.ops.helpers import scrape, value

RES = "hetero-dp.io/sim"
MIB = 1024 * 1024
HELD = "hetero_dp_device_allocation_info"
USED = "hetero_dp_container_memory_used_bytes"
UTIL = "hetero_dp_container_utilization_ratio"
FAIR = "hetero_dp_container_memory_fair_share_bytes"


def put_process(proc, pid: int, uid: str, n: int = 1) -> None:
    """A process of the pod ``uid`` in a fake /proc, cgroup v2 under the systemd driver."""
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    slice_ = f"kubepods-burstable-pod{uid.replace('-', '_')}.slice"
    cid = f"{n:064x}"
    (proc / str(pid) / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-burstable.slice/{slice_}/cri-containerd-{cid}.scope\n"
    )


async def start(fake_kubelet, plugin_runner, proc, *, count=2, replicas=0):
    await fake_kubelet.serve_pod_resources()
    config = {
        "metrics": {"address": "127.0.0.1:0"},
        "attribution": {"procRoot": str(proc)},
        "backends": {"simulated": {"count": count, "numaNodes": 0}},
    }
    if replicas:
        config["sharing"] = {"timeSlicing": {"resources": [{"name": RES, "replicas": replicas}]}}
    daemon = await plugin_runner.start("simulated", config=config)
    await fake_kubelet.wait_registered(RES)
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == count * max(replicas, 1))
    return daemon


def series(m, name):
    return {
        dict(labels)["pod"]: (dict(labels)["device"], v)
        for (n, labels), v in m.items()
        if n == name
    }


@pytest.fixture
def proc(tmp_path):
    simulated.set_processes([])
    yield tmp_path / "proc"
    simulated.set_processes([])


async def test_holders_of_whole_devices_and_replicas_and_a_departed_pod(
    fake_kubelet, plugin_runner, proc
):
    daemon = await start(fake_kubelet, plugin_runner, proc, count=2)
    a = await fake_kubelet.admit_pod("a", {"main": {RES: 1}}, namespace="team")
    b = await fake_kubelet.admit_pod("b", {"main": {RES: 1}, "side": {}})
    m = await scrape(daemon)
    (ida,) = a.device_ids()
    (idb,) = b.device_ids()
    labels = {"resource": RES, "container": "main"}
    assert value(m, HELD, device=ida, pod="a", namespace="team", **labels) == 1
    assert value(m, HELD, device=idb, pod="b", namespace="default", **labels) == 1
    assert set(series(m, HELD)) == {"a", "b"}

    fake_kubelet.remove_pod("a", "team")
    m = await scrape(daemon)
    assert set(series(m, HELD)) == {"b"}  # gone at the next scrape


async def test_two_pods_on_one_shared_device_show_their_own_usage_and_the_noisy_one_is_named(
    fake_kubelet, plugin_runner, proc, caplog
):
    daemon = await start(fake_kubelet, plugin_runner, proc, count=1, replicas=2)
    a = await fake_kubelet.admit_pod("a", {"c": {RES: 1}})
    b = await fake_kubelet.admit_pod("b", {"c": {RES: 1}})
    put_process(proc, 101, a.uid)
    put_process(proc, 102, b.uid, 2)
    put_process(proc, 103, b.uid, 2)
    simulated.set_processes(
        [
            ProcessUsage("sim0", 101, 3000 * MIB, 0.25),
            ProcessUsage("sim0", 102, 6000 * MIB, 0.25),
            ProcessUsage("sim0", 103, 3000 * MIB, 0.25),
        ]
    )
    caplog.set_level(logging.INFO, logger="hetero_dp.usage")
    m = await scrape(daemon)
    ida, idb = a.device_ids()[0], b.device_ids()[0]
    assert sorted([ida, idb]) == ["sim0::0", "sim0::1"], (ida, idb)
    assert series(m, USED) == {"a": (ida, 3000 * MIB), "b": (idb, 9000 * MIB)}
    assert series(m, UTIL) == {"a": (ida, 0.25), "b": (idb, 0.5)}
    assert series(m, FAIR) == {"a": (ida, 8192 * MIB), "b": (idb, 8192 * MIB)}
    await scrape(daemon)  # still over: no second line
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "default/b, container c, device " + idb in warnings[0]
    assert "9000 MiB" in warnings[0] and "8192 MiB" in warnings[0]
    assert "default/a" not in "".join(warnings)

    simulated.set_processes([ProcessUsage("sim0", 102, 1000 * MIB)])
    caplog.clear()
    await scrape(daemon)
    back = [r.getMessage() for r in caplog.records if "back under" in r.getMessage()]
    assert len(back) == 1 and "default/b" in back[0]


class Gauged:
    """Two devices with memory and a ``metrics`` hook that says what each sample
    measures: a device (``device_id``) or a process (``pid``)."""

    hetero_dp_name = "gauged"

    @hookimpl
    def discover(self) -> list[Device]:
        return [Device(f"g{i}", "example.com/g", attributes={"memoryMiB": 1024}) for i in (0, 1)]

    @hookimpl
    def metrics(self) -> list[Sample]:
        return [
            Sample("DCGM_FI_DEV_FB_USED", 10, {"gpu": "0"}, device_id="g0"),
            Sample("DCGM_FI_DEV_FB_USED", 20, {"gpu": "1"}, device_id="g1"),
            Sample("hetero_dp_shared_memory_process_used_bytes", 5, {"pid": "201"}, pid=201),
            Sample("hetero_dp_shared_memory_process_used_bytes", 6, {"pid": "999"}, pid=999),
        ]


async def test_samples_carry_their_holder_where_it_is_true(fake_kubelet, plugin_runner, proc):
    await fake_kubelet.serve_pod_resources()
    config = {
        "metrics": {"address": "127.0.0.1:0"},
        "attribution": {"procRoot": str(proc)},
        "sharing": {
            "timeSlicing": {
                "resources": [{"name": "example.com/g", "replicas": 2, "devices": ["g1"]}]
            }
        },
    }
    daemon = await plugin_runner.start(Gauged(), config=config)
    await fake_kubelet.wait_devices("example.com/g", lambda d: len(d) == 3)
    a = await fake_kubelet.admit_pod("a", {"c": {"example.com/g": 1}})
    b = await fake_kubelet.admit_pod("b", {"c": {"example.com/g": 1}})
    assert (a.device_ids(), b.device_ids()) == (["g0"], ["g1::0"])
    put_process(proc, 201, b.uid)
    m = await scrape(daemon)
    holder = {"pod": "a", "namespace": "default", "container": "c"}
    assert value(m, "DCGM_FI_DEV_FB_USED", gpu="0", **holder) == 10  # held whole
    assert value(m, "DCGM_FI_DEV_FB_USED", gpu="1") == 20  # shared: device-wide, no pod
    process = "hetero_dp_shared_memory_process_used_bytes"
    assert value(m, process, pid="201", pod="b", namespace="default", container="c") == 5
    assert value(m, process, pid="999") == 6  # a process of no known pod


async def test_the_kubelet_going_away_and_back_is_survived(
    fake_kubelet, plugin_runner, proc, caplog
):
    caplog.set_level(logging.INFO, logger="hetero_dp.usage")
    daemon = await start(fake_kubelet, plugin_runner, proc, count=2)
    await fake_kubelet.admit_pod("a", {"main": {RES: 1}})
    assert set(series(await scrape(daemon), HELD)) == {"a"}
    await fake_kubelet.stop_pod_resources()
    for _ in range(2):
        m = await scrape(daemon)  # answers as before, without the holders
        assert series(m, HELD) == {} and value(m, "hetero_dp_devices", resource=RES) == 2
    assert sum("attribution off" in r.getMessage() for r in caplog.records) == 1
    await fake_kubelet.serve_pod_resources()
    assert set(series(await scrape(daemon), HELD)) == {"a"}
    assert sum("attribution on" in r.getMessage() for r in caplog.records) == 2  # start, back


async def test_a_kubelet_restart_is_survived(fake_kubelet, plugin_runner, proc):
    daemon = await start(fake_kubelet, plugin_runner, proc, count=2)
    await fake_kubelet.admit_pod("a", {"main": {RES: 1}})
    assert set(series(await scrape(daemon), HELD)) == {"a"}
    await fake_kubelet.restart()  # its pod-resources server stops and comes back with it
    await fake_kubelet.wait_registered(RES, after=1)
    assert set(series(await scrape(daemon), HELD)) == {"a"}


async def test_a_reload_that_moves_the_socket_is_followed(fake_kubelet, plugin_runner, proc):
    from hetero_dp.engine.config import load_config

    real = await fake_kubelet.serve_pod_resources()
    doc = {
        "kubeletDir": str(fake_kubelet.plugin_dir),
        "pluginsRegistryDir": str(fake_kubelet.registry_dir),
        "healthInterval": 0,
        "rediscoverInterval": 0,
        "metrics": {"address": "127.0.0.1:0"},
        "cdi": {"dir": str(proc.parent / "cdi")},
        "labels": {"dir": str(proc.parent / "labels")},
        "attribution": {"procRoot": str(proc), "podResourcesSocket": str(real) + ".moved"},
        "backends": {"simulated": {"count": 2, "numaNodes": 0}},
    }
    daemon = await plugin_runner.start("simulated", config=doc)
    await fake_kubelet.wait_registered(RES)
    await fake_kubelet.admit_pod("a", {"main": {RES: 1}})
    assert series(await scrape(daemon), HELD) == {}  # no socket there
    doc["attribution"]["podResourcesSocket"] = str(real)
    await daemon.apply_config(load_config(raw=doc, env={}))
    assert set(series(await scrape(daemon), HELD)) == {"a"}


class LogSeen(logging.Handler):
    """Sets an asyncio event when a record holding ``text`` is logged (the daemon logs
    in the loop's thread)."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.INFO)
        self.text = text
        self.seen = asyncio.Event()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.records.append(record)
            self.seen.set()


async def test_the_noisy_neighbour_is_named_with_no_one_scraping(fake_kubelet, plugin_runner, proc):
    """Metrics off: the attribution loop (attribution.interval) names the container
    over its fair share, and says when it is back under, without a scrape."""
    await fake_kubelet.serve_pod_resources()
    daemon = await plugin_runner.start(
        "simulated",
        config={
            "attribution": {"procRoot": str(proc), "interval": 0.2},
            "backends": {"simulated": {"count": 1, "numaNodes": 0}},
            "sharing": {"timeSlicing": {"resources": [{"name": RES, "replicas": 2}]}},
        },
    )
    await fake_kubelet.wait_registered(RES)
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 2)
    assert of(daemon).metrics is None  # nobody can scrape
    a = await fake_kubelet.admit_pod("a", {"c": {RES: 1}})
    b = await fake_kubelet.admit_pod("b", {"c": {RES: 1}})
    put_process(proc, 101, a.uid)
    put_process(proc, 102, b.uid, 2)
    over, back = LogSeen("over its fair share"), LogSeen("back under its fair share")
    logger = logging.getLogger("hetero_dp.usage")
    logger.addHandler(over)
    logger.addHandler(back)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        simulated.set_processes(
            [ProcessUsage("sim0", 101, 1000 * MIB), ProcessUsage("sim0", 102, 9000 * MIB)]
        )
        await asyncio.wait_for(over.seen.wait(), 10)
        (record,) = over.records
        assert record.levelno == logging.WARNING
        assert "default/b, container c, device " + b.device_ids()[0] in record.getMessage()
        assert "9000 MiB" in record.getMessage() and "8192 MiB" in record.getMessage()

        simulated.set_processes([ProcessUsage("sim0", 102, 1000 * MIB)])
        await asyncio.wait_for(back.seen.wait(), 10)
        assert len(over.records) == 1  # once per crossing
        assert "default/b" in back.records[0].getMessage()
    finally:
        logger.removeHandler(over)
        logger.removeHandler(back)
        logger.setLevel(level)


async def test_two_containers_of_one_pod_on_one_device_are_told_apart_by_the_log_links(
    fake_kubelet, plugin_runner, proc, tmp_path
):
    """A pod whose two containers each hold a replica of one shared device: the cgroup
    gives the process's container ID, and the kubelet's link
    /var/log/containers/<pod>_<namespace>_<container>-<ID>.log says which container
    that is. Without a link for an ID, that process stays attributed to no one."""
    links = tmp_path / "containers"
    links.mkdir()
    await fake_kubelet.serve_pod_resources()
    daemon = await plugin_runner.start(
        "simulated",
        config={
            "metrics": {"address": "127.0.0.1:0"},
            "attribution": {"procRoot": str(proc), "containerLogsDir": str(links)},
            "backends": {"simulated": {"count": 1, "numaNodes": 0}},
            "sharing": {"timeSlicing": {"resources": [{"name": RES, "replicas": 2}]}},
        },
    )
    await fake_kubelet.wait_registered(RES)
    await fake_kubelet.wait_devices(RES, lambda d: len(d) == 2)
    pod = await fake_kubelet.admit_pod("p", {"a": {RES: 1}, "b": {RES: 1}}, namespace="ml")
    put_process(proc, 101, pod.uid, 1)  # container a
    put_process(proc, 102, pod.uid, 2)  # container b
    put_process(proc, 103, pod.uid, 3)  # a container ID no link names
    # as the kubelet makes them (legacyLogSymlink): a link to the container's log
    target = f"/var/log/pods/ml_p_{pod.uid}"
    (links / f"p_ml_a-{1:064x}.log").symlink_to(f"{target}/a/0.log")
    (links / f"p_ml_b-{2:064x}.log").symlink_to(f"{target}/b/0.log")
    (links / "junk_without_an_id.log").write_text("")  # another form: skipped
    simulated.set_processes(
        [
            ProcessUsage("sim0", 101, 1000 * MIB, 0.1),
            ProcessUsage("sim0", 102, 3000 * MIB, 0.3),
            ProcessUsage("sim0", 103, 5000 * MIB, 0.5),
        ]
    )
    m = await scrape(daemon)
    used = {dict(labels)["container"]: v for (name, labels), v in m.items() if name == USED}
    assert used == {"a": 1000 * MIB, "b": 3000 * MIB}
