"""``hetero-dp run FILE --fake-kubelet``: try a plugin on a laptop.

The daemon serves the plugin, as on a node, to an in-process
:class:`~hetero_dp.testing.FakeKubelet` in a short temp dir; every change the
kubelet sees is printed as one line (registrations, the device list, health),
until SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

from hetero_dp.engine.daemon import Daemon
from hetero_dp.testing.fake_kubelet import FakeKubelet
from hetero_dp.testing.runner import short_tempdir

View = dict[str, tuple[int, dict[str, str]]]  # resource -> (registrations, id -> health)


def fake_kubelet_dirs() -> tuple[Path, Path, Path]:
    """A fresh short temp root, its device-plugin dir and its plugins_registry dir."""
    root = short_tempdir("hdp-try-")
    return root, root / "dp", root / "reg"


def _view(kubelet: FakeKubelet) -> View:
    return {
        name: (
            kubelet.registration_count(name),
            {d.id: d.health for d in res.devices.values()},
        )
        for name, res in kubelet.resources.items()
    }


def changes(before: View, after: View) -> list[str]:
    """Lines that say what changed between two views of the kubelet."""
    lines = []
    for name, (count, devices) in sorted(after.items()):
        old_count, old = before.get(name, (0, {}))
        if count > old_count:
            lines.append(f"{name}: registered" + (f" (again, {count} times)" if count > 1 else ""))
        added = sorted(set(devices) - set(old))
        removed = sorted(set(old) - set(devices))
        if added or removed or count > old_count:
            healthy = sum(1 for h in devices.values() if h == "Healthy")
            listed = ", ".join(sorted(devices)) or "none"
            lines.append(f"{name}: {len(devices)} devices ({healthy} healthy): {listed}")
        for device_id in sorted(set(devices) & set(old)):
            if devices[device_id] != old[device_id]:
                lines.append(f"{name}: {device_id} is {devices[device_id]}")
        for device_id in added:
            if devices[device_id] != "Healthy":
                lines.append(f"{name}: {device_id} is {devices[device_id]}")
    return lines


async def serve_to_fake_kubelet(
    daemon: Daemon, plugin_dir: Path, registry_dir: Path, echo: Callable[[str], None]
) -> None:
    """Start a fake kubelet in ``plugin_dir`` (and ``registry_dir``), run ``daemon``
    (configured for those dirs) until it is asked to stop (SIGTERM/SIGINT), and
    print what the kubelet sees as it changes."""
    async with FakeKubelet(plugin_dir, registry_dir) as kubelet:
        echo(f"fake kubelet at {kubelet.plugin_dir}")
        seen: list[View] = [{}]  # the last view printed

        async def report() -> None:
            while True:
                with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                    await kubelet.wait_for(lambda: _view(kubelet) != seen[0], timeout=3600)
                now = _view(kubelet)
                for line in changes(seen[0], now):
                    echo(line)
                seen[0] = now

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, daemon.request_stop)
        reporter = asyncio.ensure_future(report())
        try:
            await daemon.start()
            await daemon.wait_stopped()
        finally:
            # what the kubelet sees once the plugin stops (every device unhealthy as
            # the streams end) says nothing about the plugin: not printed
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
            echo("stopping")
            await daemon.stop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)


def remove_dirs(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
