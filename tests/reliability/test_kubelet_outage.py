"""The kubelet goes away for a while (its sockets deleted, kubelet.sock gone) and
comes back, several times in a row: each time the plugin, which has been failing to
register meanwhile, registers again at once when kubelet.sock reappears."""

from __future__ import annotations

import asyncio
import contextlib
import stat

from hetero_dp.kits import observe

from .conftest import SIM, simulated


async def test_repeated_outages_reregister_promptly(fake_kubelet, plugin_runner):
    # a long stream timeout: recovery must come from kubelet.sock, not the watchdog
    await plugin_runner.start(
        simulated(), config={"streamTimeout": 60}, options={"simulated": {"count": 2}}
    )
    await fake_kubelet.wait_registered(SIM)
    failures = asyncio.Queue()
    unsubscribe = observe.subscribe(
        lambda event, fields: (
            failures.put_nowait(fields) if event == "registration_failed" else None
        )
    )
    try:
        for _ in range(4):
            await fake_kubelet.stop()
            for entry in fake_kubelet.plugin_dir.iterdir():  # as the kubelet does on start
                if stat.S_ISSOCK(entry.lstat().st_mode):
                    entry.unlink()
            while not failures.empty():
                failures.get_nowait()
            for _ in range(2):  # the plugin notices and keeps trying while the kubelet is away
                reason = await asyncio.wait_for(failures.get(), 10)
                assert "kubelet.sock does not exist" in reason["reason"]
            before = fake_kubelet.registration_count(SIM)
            await fake_kubelet.start()
            await fake_kubelet.wait_registered(SIM, after=before, timeout=5)
            await fake_kubelet.wait_for(
                lambda: (
                    fake_kubelet.resources[SIM].stream_open
                    and fake_kubelet.resources[SIM].allocatable == 2
                ),
                timeout=5,
            )
            # once: the retrying registration goes through; nothing restarts on top of it
            # (a second registration would end the first stream: Unhealthy for a moment)
            assert fake_kubelet.registration_count(SIM) == before + 1
    finally:
        unsubscribe()


async def test_socket_deleted_at_any_point_of_a_restart(fake_kubelet, plugin_runner):
    """The kubelet deletes the plugin's socket while the plugin is restarting its
    server, at every point of that restart in turn: the plugin always ends up serving
    on a socket that exists, registered and streaming."""
    daemon = await plugin_runner.start(simulated(), config={"streamTimeout": 60})
    await fake_kubelet.wait_registered(SIM)
    endpoint = daemon.front_end.endpoints[SIM]
    for step in range(45):
        before = fake_kubelet.registration_count(SIM)
        endpoint.request_restart("test")
        for _ in range(step % 15):  # let the restart run this many loop steps
            await asyncio.sleep(0)
        with contextlib.suppress(FileNotFoundError):
            endpoint.socket_path.unlink()  # as a restarting kubelet does
        await fake_kubelet.wait_registered(SIM, after=before, timeout=5)
        await fake_kubelet.wait_for(
            lambda: fake_kubelet.resources[SIM].stream_open and endpoint.socket_path.exists(),
            timeout=5,
        )
