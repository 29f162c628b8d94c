"""Hot reload: changed resources restart, the others keep their streams; bad configs
are rejected and the old one stays in force."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from dataclasses import dataclass

import pytest
import yaml
from hetero_dp_simulated.backend import SimulatedBackend

from hetero_dp import hookimpl, option
from hetero_dp.engine.config import ResourceSettings, load_config
from hetero_dp.model.errors import ConfigError
from hetero_dp.ops import operations
from hetero_dp.ops.reload import ConfigReloader
from tests.core.scripted import Scripted, make_devices

from .helpers import wait_ready

A = "example.com/a"
B = "example.com/b"
SIM = "hetero-dp.io/sim"


def base_doc(kubelet, **extra):
    doc = {
        "kubeletDir": str(kubelet.plugin_dir),
        "pluginsRegistryDir": str(kubelet.registry_dir),
        "healthInterval": 0,
        "rediscoverInterval": 0,
        "resources": {A: {"preferredAllocation": True}, B: {"preferredAllocation": True}},
    }
    doc.update(extra)
    return doc


async def start_two(fake_kubelet, plugin_runner, doc):
    backend = Scripted(make_devices(A, 2) + make_devices(B, 2, prefix="b"))
    daemon = await plugin_runner.start(backend, config=doc)
    await fake_kubelet.wait_registered(A)
    await fake_kubelet.wait_registered(B)
    await wait_ready(daemon)
    return backend, daemon


async def test_reload_restarts_only_the_changed_resource(fake_kubelet, plugin_runner):
    doc = base_doc(fake_kubelet)
    _, daemon = await start_two(fake_kubelet, plugin_runner, doc)
    res_b = fake_kubelet.resources[B]
    updates_b = res_b.updates
    assert fake_kubelet.resources[A].options.get_preferred_allocation_available is True

    doc["resources"][A] = {"preferredAllocation": False}
    summary = await daemon.apply_config(load_config(raw=doc, env={}))
    assert summary == {"restarted": [A], "reconfigured": []}

    res_a = await fake_kubelet.wait_registered(A, after=1)
    assert res_a.options.get_preferred_allocation_available is False  # new options reached it
    await wait_ready(daemon)
    # B never noticed: same registration, same stream, no new device list
    assert fake_kubelet.registration_count(B) == 1
    assert fake_kubelet.resources[B] is res_b
    assert res_b.stream_open and not res_b.stream_ended
    assert res_b.updates == updates_b
    assert daemon.resources[A].settings == ResourceSettings(preferred_allocation=False)


async def test_reload_with_changed_backend_options_rediscovers_without_restart(
    fake_kubelet, plugin_runner
):
    doc = base_doc(fake_kubelet, backends={"simulated": {"count": 2}})
    del doc["resources"]
    daemon = await plugin_runner.start(SimulatedBackend(), config=doc)
    res = await fake_kubelet.wait_registered(SIM)
    await fake_kubelet.wait_devices(SIM, lambda d: len(d) == 2)

    doc["backends"]["simulated"]["count"] = 5
    summary = await daemon.apply_config(load_config(raw=doc, env={}))
    assert summary == {"restarted": [], "reconfigured": ["simulated"]}
    await fake_kubelet.wait_devices(SIM, lambda d: len(d) == 5)
    assert fake_kubelet.registration_count(SIM) == 1 and fake_kubelet.resources[SIM] is res

    # a backend refusing its new options: rejected, old options and devices kept
    doc["backends"]["simulated"]["count"] = -1
    old = daemon.config
    with pytest.raises(ConfigError, match=r"backends.simulated.count"):
        await daemon.apply_config(load_config(raw=doc, env={}))
    assert daemon.config is old
    await daemon.rediscover()
    assert len(fake_kubelet.resources[SIM].devices) == 5


async def test_reload_of_the_simulated_resource_and_numa_nodes_takes_effect(
    fake_kubelet, plugin_runner
):
    """Issue 31 point 6 in device-plugin mode: ``numaNodes`` and ``resource`` set by a
    reload are served without a restart (the old resource is left with no devices)."""
    doc = base_doc(fake_kubelet, backends={"simulated": {"count": 4}})
    del doc["resources"]
    daemon = await plugin_runner.start(SimulatedBackend(), config=doc)
    await fake_kubelet.wait_devices(SIM, lambda d: d["sim2"].numa_nodes == (1,))

    doc["backends"]["simulated"]["numaNodes"] = 0
    await daemon.apply_config(load_config(raw=doc, env={}))
    await fake_kubelet.wait_devices(SIM, lambda d: all(x.numa_nodes == () for x in d.values()))

    doc["backends"]["simulated"]["resource"] = A
    summary = await daemon.apply_config(load_config(raw=doc, env={}))
    assert summary == {"restarted": [], "reconfigured": ["simulated"]}
    await fake_kubelet.wait_devices(A, lambda d: len(d) == 4)
    await fake_kubelet.wait_devices(SIM, lambda d: len(d) == 0)


async def test_socket_settings_cannot_change_while_running(fake_kubelet, plugin_runner):
    doc = base_doc(fake_kubelet)
    _, daemon = await start_two(fake_kubelet, plugin_runner, doc)
    old = daemon.config
    doc["socketPrefix"] = "other"
    with pytest.raises(ConfigError, match=r"socketPrefix.*restart the daemon"):
        await daemon.apply_config(load_config(raw=doc, env={}))
    assert daemon.config is old


async def test_file_change_and_sighup_reload_and_invalid_files_are_rejected(
    fake_kubelet, plugin_runner, tmp_path
):
    path = tmp_path / "config.yaml"
    doc = base_doc(fake_kubelet)
    path.write_text(yaml.safe_dump(doc))
    _, daemon = await start_two(fake_kubelet, plugin_runner, load_config(path, env={}).raw)
    reloader = ConfigReloader(daemon, path, lambda: load_config(path, env={}))
    reloader.start()
    try:
        original = daemon.config
        res_a, res_b = fake_kubelet.resources[A], fake_kubelet.resources[B]

        path.write_text("resources: [unclosed\n")  # broken YAML
        results = await reloader.wait_results(1)
        assert results[0].startswith("rejected: ") and "invalid YAML" in results[0]
        assert str(path) in results[0]
        doc_bad = dict(doc, healthInterval="often")  # a bad field
        path.write_text(yaml.safe_dump(doc_bad))
        results = await reloader.wait_results(2)
        assert "healthInterval" in results[1] and "expected a number" in results[1]
        assert daemon.config is original  # the old config stays in force
        assert fake_kubelet.resources[A] is res_a and res_a.stream_open
        assert fake_kubelet.resources[B] is res_b and res_b.stream_open

        doc["resources"][B] = {"preferredAllocation": False}
        tmp = tmp_path / "config.yaml.new"  # the way editors and ConfigMaps replace files
        tmp.write_text(yaml.safe_dump(doc))
        os.replace(tmp, path)
        results = await reloader.wait_results(3)
        assert results[2].startswith("applied") and B in results[2]
        await fake_kubelet.wait_registered(B, after=1)
        assert fake_kubelet.registration_count(A) == 1 and res_a.stream_open
        assert daemon.config.resources[B] == ResourceSettings(preferred_allocation=False)

        assert reloader._sighup, "SIGHUP handler must be installed in the main thread"
        os.kill(os.getpid(), signal.SIGHUP)  # same bytes: SIGHUP still reloads
        results = await reloader.wait_results(4)
        assert results[3].startswith("applied")
        assert "'restarted': []" in results[3]  # nothing changed, nothing restarted
        assert fake_kubelet.registration_count(B) == 2
    finally:
        await reloader.stop()


async def test_health_interval_reload_starts_polling(fake_kubelet, plugin_runner):
    doc = base_doc(fake_kubelet)
    backend, daemon = await start_two(fake_kubelet, plugin_runner, doc)
    assert "health poll" not in daemon.tasks.names()
    doc["healthInterval"] = 0.05
    await daemon.apply_config(load_config(raw=doc, env={}))
    backend.unhealthy["dev1"] = "polled after reload"
    await fake_kubelet.wait_devices(A, lambda d: not d["dev1"].healthy)
    assert fake_kubelet.registration_count(A) == 1

    doc["healthInterval"] = 0
    await daemon.apply_config(load_config(raw=doc, env={}))
    assert "health poll" not in daemon.tasks.names()


async def test_reload_turns_metrics_and_labels_on_without_touching_streams(
    fake_kubelet, plugin_runner, tmp_path
):
    from .helpers import http_get, port_of

    doc = base_doc(fake_kubelet)
    _, daemon = await start_two(fake_kubelet, plugin_runner, doc)
    assert operations.of(daemon).server is None and operations.of(daemon).labels is None
    doc["metrics"] = {"address": "127.0.0.1:0"}
    doc["labels"] = {"enabled": True, "dir": str(tmp_path / "features.d")}
    summary = await daemon.apply_config(load_config(raw=doc, env={}))
    assert summary == {"restarted": [], "reconfigured": []}
    status, body = await http_get(port_of(daemon), "/readyz")
    assert status == 200 and f"{A}: ready" in body
    text = (tmp_path / "features.d" / "hetero-dp-scripted").read_text()
    assert f"{A}.count=2\n{B}.count=2\n" == text
    assert fake_kubelet.registration_count(A) == fake_kubelet.registration_count(B) == 1

    doc["labels"] = {"enabled": False}
    await daemon.apply_config(load_config(raw=doc, env={}))
    assert not (tmp_path / "features.d" / "hetero-dp-scripted").exists()


async def test_sharing_reload_restarts_only_the_shared_resource(fake_kubelet, plugin_runner):
    doc = base_doc(fake_kubelet)
    doc["sharing"] = {"timeSlicing": {"resources": [{"name": A, "replicas": 2}]}}
    _, daemon = await start_two(fake_kubelet, plugin_runner, doc)
    await fake_kubelet.wait_devices(A, lambda d: len(d) == 4)
    res_b, updates_b = fake_kubelet.resources[B], fake_kubelet.resources[B].updates

    doc["sharing"]["timeSlicing"]["resources"][0]["replicas"] = 3
    summary = await daemon.apply_config(load_config(raw=doc, env={}))
    assert summary["restarted"] == [A]
    await fake_kubelet.wait_registered(A, after=1)
    devices = await fake_kubelet.wait_devices(A, lambda d: len(d) == 6)
    assert sorted(devices)[:3] == ["dev0::0", "dev0::1", "dev0::2"]

    shared = "example.com/a-shared"
    doc["sharing"]["timeSlicing"]["resources"][0]["rename"] = shared
    summary = await daemon.apply_config(load_config(raw=doc, env={}))
    assert summary["restarted"] == [A]  # the renamed resource is new: it simply starts
    await fake_kubelet.wait_devices(shared, lambda d: len(d) == 6)
    await fake_kubelet.wait_devices(A, lambda d: len(d) == 0)

    # a sharing block that does not fit the devices is rejected
    doc["sharing"]["timeSlicing"]["resources"][0]["devices"] = ["nope"]
    old = daemon.config
    bad = load_config(raw=doc, env={})  # parses; only the devices show it does not fit
    with pytest.raises(ConfigError, match=r"sharing.*nope"):
        await daemon.apply_config(bad)
    assert daemon.config is old

    assert fake_kubelet.registration_count(B) == 1 and fake_kubelet.resources[B] is res_b
    assert res_b.stream_open and res_b.updates == updates_b  # B never noticed


async def test_reload_turns_cdi_delivery_on_and_off(fake_kubelet, plugin_runner):
    from hetero_dp.testing import short_tempdir

    cdi_dir = short_tempdir("hdp-cdi-")
    doc = base_doc(fake_kubelet, backends={"simulated": {"count": 2}})
    del doc["resources"]
    daemon = await plugin_runner.start(SimulatedBackend(), config=doc)
    await fake_kubelet.wait_registered(SIM)
    assert list(cdi_dir.iterdir()) == []

    doc["cdi"] = {"enabled": True, "dir": str(cdi_dir)}
    doc["resources"] = {SIM: {"deliver": ["cdi-cri"]}}
    summary = await daemon.apply_config(load_config(raw=doc, env={}))
    assert summary["restarted"] == [SIM]
    specs = list(cdi_dir.iterdir())
    assert len(specs) == 1 and "sim0" in specs[0].read_text()
    await fake_kubelet.wait_registered(SIM, after=1)
    resp = await fake_kubelet.allocate(SIM, ["sim1"])
    assert [c.name for c in resp.cdi_devices] == [f"{SIM}=sim1"]

    doc["cdi"] = {"enabled": False}
    doc["resources"] = {}
    await daemon.apply_config(load_config(raw=doc, env={}))
    assert list(cdi_dir.iterdir()) == []  # nobody keeps that spec up to date any more
    cdi_dir.rmdir()


async def test_reload_to_a_busy_port_is_rejected_and_the_old_server_stays(
    fake_kubelet, plugin_runner
):
    import socket

    from .helpers import http_get, port_of

    doc = base_doc(fake_kubelet, metrics={"address": "127.0.0.1:0"})
    _, daemon = await start_two(fake_kubelet, plugin_runner, doc)
    port = port_of(daemon)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        doc["metrics"] = {"address": f"127.0.0.1:{busy.getsockname()[1]}"}
        doc["resources"][A] = {"preferredAllocation": False}  # would restart A, if accepted
        old = daemon.config
        with pytest.raises(ConfigError, match="cannot listen on"):
            await daemon.apply_config(load_config(raw=doc, env={}))
    assert daemon.config is old
    assert (await http_get(port, "/healthz"))[0] == 200
    assert fake_kubelet.registration_count(A) == 1

    with socket.socket() as probe:  # a free port, different from the current one
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    doc["metrics"] = {"address": f"127.0.0.1:{free}"}
    del doc["resources"][A]
    await daemon.apply_config(load_config(raw=doc, env={}))
    assert port_of(daemon) == free != port  # moved: the counters came along
    with pytest.raises(OSError):
        await http_get(port, "/healthz")
    _, body = await http_get(free, "/metrics")
    assert 'hetero_dp_registrations_total{mode="classic",resource="example.com/b"} 1.0' in body


class HoldsDiscover(Scripted):
    """Scripted, whose discover can be held (in its worker thread) until released."""

    def __init__(self, devices):
        super().__init__(devices)
        self.hold = threading.Event()
        self.entered = threading.Event()
        self.go_on = threading.Event()

    @hookimpl
    def discover(self):
        if self.hold.is_set():
            self.entered.set()
            self.go_on.wait(10)
        return super().discover()


async def test_rediscover_interval_reload_keeps_a_rediscover_it_interrupts(
    fake_kubelet, plugin_runner
):
    """A reload that changes rediscoverInterval replaces the rediscover loop; a watch
    hook's rediscover request the old loop was serving must not be lost with it."""
    doc = base_doc(fake_kubelet)
    backend = HoldsDiscover(make_devices(A, 2))
    daemon = await plugin_runner.start(backend, config=doc)
    await fake_kubelet.wait_devices(A, lambda d: len(d) == 2)
    await asyncio.to_thread(backend.watch_started.wait, 5)

    backend.devices = make_devices(A, 3)  # a device appeared; the watch hook says so
    backend.hold.set()
    backend.sinks[0].rediscover()
    assert await asyncio.to_thread(backend.entered.wait, 5)  # the loop is inside discover

    doc["rediscoverInterval"] = 3600  # the new loop would not look again for an hour
    await daemon.apply_config(load_config(raw=doc, env={}))
    backend.hold.clear()
    backend.go_on.set()
    await fake_kubelet.wait_devices(A, lambda d: len(d) == 3, timeout=5)


# --- reload as documented (issue #29) -------------------------------------------------


async def test_a_storm_of_changes_is_applied_within_the_bounded_delay(
    fake_kubelet, plugin_runner, tmp_path
):
    """A 20 Hz storm of writes: the quiet period used to restart on every event, so
    nothing was applied while it lasted. Now the latest file is applied at most
    MAX_DELAY after the first event, while the storm still goes on."""
    from hetero_dp.ops.reload import MAX_DELAY

    path = tmp_path / "config.yaml"
    doc = base_doc(fake_kubelet)
    path.write_text(yaml.safe_dump(doc))
    _, daemon = await start_two(fake_kubelet, plugin_runner, load_config(path, env={}).raw)
    reloader = ConfigReloader(daemon, path, lambda: load_config(path, env={}))
    reloader.start()
    try:
        loop = asyncio.get_running_loop()
        end = loop.time() + 2 * MAX_DELAY + 1
        i = 0
        while loop.time() < end:  # the stimulus: a write every 50 ms
            i += 1
            doc["hookTimeout"] = 10 + i
            path.write_text(yaml.safe_dump(doc))
            await asyncio.sleep(0.05)
        applied_during_storm = reloader.finished
        assert applied_during_storm >= 1, reloader.results
        results = await reloader.wait_results(applied_during_storm + 1)
        # after the storm the last write is what is in force
        assert daemon.config.hook_timeout == 10 + i, results
    finally:
        await reloader.stop()


async def test_a_file_that_changes_while_it_is_read_is_read_again(
    fake_kubelet, plugin_runner, tmp_path
):
    path = tmp_path / "config.yaml"
    doc = base_doc(fake_kubelet)
    path.write_text(yaml.safe_dump(doc))
    _, daemon = await start_two(fake_kubelet, plugin_runner, load_config(path, env={}).raw)
    final = dict(doc, resources={A: {"preferredAllocation": False}, B: doc["resources"][B]})
    reads = []

    def loader():
        cfg = load_config(path, env={})
        reads.append(cfg)
        if len(reads) == 1:  # a writer replaces the file while the first read runs
            path.write_text(yaml.safe_dump(final))
        return cfg

    doc["hookTimeout"] = 12
    path.write_text(yaml.safe_dump(doc))
    reloader = ConfigReloader(daemon, path, loader, handle_sighup=False)
    assert await reloader.reload(force=True) == "applied"
    assert len(reads) == 2
    assert daemon.config.resources[A] == ResourceSettings(preferred_allocation=False)


async def test_counters_survive_a_reload_that_removes_and_readds_metrics(
    fake_kubelet, plugin_runner
):
    from .helpers import scrape, value

    doc = base_doc(fake_kubelet, metrics={"address": "127.0.0.1:0"})
    _, daemon = await start_two(fake_kubelet, plugin_runner, doc)
    await fake_kubelet.allocate(A, ["dev0"])
    before = value(await scrape(daemon), "hetero_dp_allocations_total", resource=A, code="OK")
    assert before == 1
    del doc["metrics"]
    await daemon.apply_config(load_config(raw=doc, env={}))
    assert operations.of(daemon).server is None
    await fake_kubelet.allocate(A, ["dev1"])  # counted while unserved
    doc["metrics"] = {"address": "127.0.0.1:0"}
    await daemon.apply_config(load_config(raw=doc, env={}))
    after = value(await scrape(daemon), "hetero_dp_allocations_total", resource=A, code="OK")
    assert after == 2


async def test_reload_of_the_ready_file_moves_it_and_keeps_the_server(
    fake_kubelet, plugin_runner, tmp_path
):
    from .helpers import http_get, port_of, wait_until

    first, second = tmp_path / "a" / "ready", tmp_path / "b" / "ready"
    doc = base_doc(fake_kubelet, metrics={"address": "127.0.0.1:0", "readyFile": str(first)})
    _, daemon = await start_two(fake_kubelet, plugin_runner, doc)
    port = port_of(daemon)
    server = operations.of(daemon).server
    await wait_until(daemon, first.exists)
    doc["metrics"] = {"address": "127.0.0.1:0", "readyFile": str(second)}
    # before: any change under metrics bound the address again (a taken port 0 is
    # another free port, a fixed one would be refused as busy by the running server)
    await daemon.apply_config(load_config(raw=doc, env={}))
    assert operations.of(daemon).server is server and port_of(daemon) == port
    assert not first.exists()
    await wait_until(daemon, second.exists)
    assert (await http_get(port, "/readyz"))[0] == 200


# --- reload as a transaction (issue #35) ----------------------------------------------


@dataclass(frozen=True)
class CountedOptions:
    k: int = option(1, min=0, help="a value configure records")


class Configured(Scripted):
    """Scripted, recording each configure call (a backend with side effects there, as
    NVIDIA's starts and stops MPS daemons)."""

    def __init__(self, devices):
        super().__init__(devices)
        self.configured: list[int] = []

    @hookimpl
    def configure(self, options: CountedOptions) -> None:
        self.configured.append(options.k)
        if options.k == 3:  # a check only the backend can make
            raise ConfigError("3 is not a value this backend takes", field="k")


async def test_a_refused_reload_calls_no_hook_of_the_live_backend(
    fake_kubelet, plugin_runner, tmp_path
):
    """A file that changes a backend option and carries a value the daemon refuses
    (a metrics address with no port) is rejected before the backend hears of it:
    configure was called with the new options and again with the old ones before
    (calls seen 1, 2, 1); prepare now only reads the options, apply configures."""
    path = tmp_path / "config.yaml"
    doc = base_doc(fake_kubelet, backends={"scripted": {"k": 1}})
    path.write_text(yaml.safe_dump(doc))
    backend = Configured(make_devices(A, 2))
    daemon = await plugin_runner.start(backend, config=load_config(path, env={}).raw)
    await fake_kubelet.wait_registered(A)
    await wait_ready(daemon)
    assert backend.configured == [1]
    reloader = ConfigReloader(daemon, path, lambda: load_config(path, env={}))
    reloader.start()
    try:
        doc["backends"]["scripted"]["k"] = 2
        path.write_text(yaml.safe_dump(dict(doc, metrics={"address": "no-port-here"})))
        results = await reloader.wait_results(1)
        assert results[0].startswith("rejected: ") and "metrics.address" in results[0]
        assert backend.configured == [1]  # the live backend was not touched

        doc["backends"]["scripted"]["k"] = -1  # refused by the options reader itself
        path.write_text(yaml.safe_dump(doc))
        results = await reloader.wait_results(2)
        assert results[1].startswith("rejected: ") and "backends.scripted.k" in results[1]
        assert backend.configured == [1]

        doc["backends"]["scripted"]["k"] = 2
        path.write_text(yaml.safe_dump(doc))
        results = await reloader.wait_results(3)
        assert results[2].startswith("applied: ") and "scripted" in results[2]
        assert backend.configured == [1, 2]
    finally:
        await reloader.stop()


async def test_each_setting_a_reload_cannot_apply_is_refused_or_said_by_key(
    fake_kubelet, plugin_runner, tmp_path, caplog
):
    """Every core setting declares what a reload does with it (engine/settings.py). Each
    one that decides where sockets live refuses a reload that changes it, naming it; one
    read only at start-up (metrics.waitForPort) is applied with the rest and said, by
    key, to wait for the next start. Before, waitForPort changed by a reload said
    "applied" and nothing else."""
    from hetero_dp.engine.settings import NEXT_START, REFUSED

    assert set(REFUSED) == {"kubeletDir", "pluginsRegistryDir", "registration", "socketPrefix"}
    dra = ("nodeName", "driverNames", "pluginsDir", "apiServer", "kubeconfig")
    assert set(NEXT_START) == {"metrics.waitForPort", *(f"dra.{k}" for k in dra)}
    path = tmp_path / "config.yaml"
    doc = base_doc(fake_kubelet)
    path.write_text(yaml.safe_dump(doc))
    _, daemon = await start_two(fake_kubelet, plugin_runner, load_config(path, env={}).raw)
    original = daemon.config
    reloader = ConfigReloader(daemon, path, lambda: load_config(path, env={}))
    reloader.start()
    try:
        changes = {
            "kubeletDir": str(tmp_path / "elsewhere"),
            "pluginsRegistryDir": str(tmp_path / "registry"),
            "registration": "watcher",
            "socketPrefix": "other",
        }
        for i, (key, value) in enumerate(changes.items(), 1):
            path.write_text(yaml.safe_dump(dict(doc, **{key: value})))
            results = await reloader.wait_results(i)
            assert results[-1].startswith("rejected: "), results
            assert f"field '{key}'" in results[-1] and "restart the daemon" in results[-1]
            assert daemon.config is original

        doc["metrics"] = {"waitForPort": True}
        doc["resources"][A] = {"preferredAllocation": False}
        path.write_text(yaml.safe_dump(doc))
        results = await reloader.wait_results(len(changes) + 1)
        assert results[-1].startswith("applied: "), results
        assert "'next start': ['metrics.waitForPort']" in results[-1]
        assert A in results[-1]  # the rest was applied
        assert daemon.config.metrics.wait_for_port is True
        assert any(
            "'metrics.waitForPort'" in r.getMessage() and "restarts" in r.getMessage()
            for r in caplog.records
        )
    finally:
        await reloader.stop()


async def test_a_backend_refusing_at_commit_rejects_the_reload_and_everything_discards(
    fake_kubelet, plugin_runner, tmp_path
):
    """The configure hook runs once every other component has prepared; a backend that
    refuses there (a check only it can make) rejects the reload: the probe server bound
    for the new address is closed again and the old config stays in force."""
    from .helpers import http_get, port_of

    path = tmp_path / "config.yaml"
    doc = base_doc(
        fake_kubelet, backends={"scripted": {"k": 1}}, metrics={"address": "127.0.0.1:0"}
    )
    path.write_text(yaml.safe_dump(doc))
    backend = Configured(make_devices(A, 2))
    daemon = await plugin_runner.start(backend, config=load_config(path, env={}).raw)
    await fake_kubelet.wait_registered(A)
    port, old = port_of(daemon), daemon.config
    import socket

    with socket.socket() as probe:  # a free port for the new address
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    reloader = ConfigReloader(daemon, path, lambda: load_config(path, env={}))
    reloader.start()
    try:
        doc["backends"]["scripted"]["k"] = 3
        doc["metrics"] = {"address": f"127.0.0.1:{free}"}
        path.write_text(yaml.safe_dump(doc))
        results = await reloader.wait_results(1)
        assert results[0].startswith("rejected: ") and "backends.scripted.k" in results[0]
        assert backend.configured == [1, 3] and daemon.config is old
        assert port_of(daemon) == port and (await http_get(port, "/healthz"))[0] == 200
        with pytest.raises(OSError):  # the server prepared for the new address is gone
            await http_get(free, "/healthz")
    finally:
        await reloader.stop()
