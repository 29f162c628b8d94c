"""``hetero-dp top``: the node's devices, who holds them and what each holder uses,
read from the local daemon's ``/metrics`` and redrawn in place.

Plain ANSI (home, clear) on a terminal; on anything else (a pipe, ``TERM=dumb``)
each refresh prints the table again, so the output stays readable in a log.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

import click

if TYPE_CHECKING:  # the reader (urllib, the Prometheus parser) loads when top runs
    from hetero_dp.ops.nodeview import DeviceRow, Series

EXIT_NO_DAEMON = 2
HOME_CLEAR = "\x1b[H\x1b[2J"
HEADER = ("RESOURCE", "DEVICE", "HEALTH", "HOLDER", "MEMORY", "UTIL")
MAX_CELL = 60  # a long device ID or reason is cut, the table stays a table


def _bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value:.0f} B"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _cut(text: str) -> str:
    return text if len(text) <= MAX_CELL else text[: MAX_CELL - 1] + "…"


def table_lines(devices: Sequence[DeviceRow]) -> list[str]:
    """The table: one line per device and holder (a shared device has several)."""
    cells: list[tuple[str, ...]] = [HEADER]
    marked = False
    for r in devices:
        device = r.device if not r.replicas else f"{r.device} ({r.replicas} replicas)"
        first = (_cut(r.resource), _cut(device), _cut(r.health))
        if not r.holders:
            cells.append((*first, "-", "-  ", "-"))
        for i, h in enumerate(r.holders):
            lead = first if i == 0 else ("", "", "")
            memory = _bytes(h.memory) + (" !" if h.over_fair_share else "  ")
            marked = marked or h.over_fair_share
            cells.append((*lead, _cut(h.name), memory, _ratio(h.utilization)))
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    right = {4, 5}  # numbers line up on the right
    lines = [
        "  ".join(
            (c.rjust(w) if i in right else c.ljust(w)) for i, (c, w) in enumerate(zip(row, widths))
        ).rstrip()
        for row in cells
    ]
    if not devices:
        lines.append("(the daemon advertises no devices)")
    if marked:
        lines.append("! over its fair share of a shared device (memory x replicas held / replicas)")
    return lines


def node_rows(series: Series) -> list[DeviceRow]:
    """The device rows, with DRA mode's claim holders on the devices they name (a
    ResourceSlice names a device by :func:`hetero_dp.dra.device_name` of its ID)."""
    from hetero_dp.dra.names import device_name
    from hetero_dp.ops.nodeview import DeviceRow, claim_holders, rows

    table = rows(series)
    by_name: dict[str, list[DeviceRow]] = {}
    for r in table:
        by_name.setdefault(device_name(r.device), []).append(r)
    for driver, device, holder in claim_holders(series):
        found = by_name.get(device, [])
        if len(found) != 1:  # unknown here, or the name is ambiguous: a row of its own
            found = [DeviceRow(driver, device)]
            table.append(found[0])
            by_name[device] = found
        found[0].holders.append(holder)
    return table


def _url(url: str | None, config: str | None) -> str:
    from hetero_dp.engine.config import load_config
    from hetero_dp.model.errors import ConfigError
    from hetero_dp.ops.nodeview import ViewError, metrics_url

    if url:
        return metrics_url(url)

    try:
        cfg = load_config(config)
    except ConfigError as e:
        raise ViewError(f"cannot read the config: {e}") from None
    address = cfg.metrics.address
    if not address:
        raise ViewError(
            "no metrics.address configured, so there is no /metrics to read: "
            "pass --url HOST:PORT (the daemon's metrics.address)"
        )
    return metrics_url(address)


def _dumb(out: TextIO) -> bool:
    return not out.isatty() or os.environ.get("TERM", "dumb") in ("", "dumb")


def run_top(
    url: str,
    once: bool,
    interval: float,
    out: TextIO,
    stop: threading.Event | None = None,
    timeout: float | None = None,
) -> int:
    """Draw until ``stop`` is set (or once); the exit code. Only a daemon that never
    answered ends it with :data:`EXIT_NO_DAEMON`: one that goes away later is shown as
    gone, and top waits for it to come back."""
    from hetero_dp.ops.nodeview import MAX_BYTES, TIMEOUT, ViewError, read_series

    timeout = TIMEOUT if timeout is None else timeout
    stop = stop or threading.Event()
    drawn = False
    dumb = _dumb(out)
    while True:
        stamp = time.strftime("%H:%M:%S")
        try:
            lines = table_lines(node_rows(read_series(url, timeout, MAX_BYTES)))
        except ViewError as e:
            if not drawn:
                click.echo(f"hetero-dp top: {e}", err=True)
                return EXIT_NO_DAEMON
            lines = [f"{e} (retrying every {interval:g} s)"]
        drawn = True
        if once:
            out.write("\n".join(lines) + "\n")
            out.flush()
            return 0
        head = f"hetero-dp top  {url}  {stamp}  (every {interval:g} s, Ctrl-C quits)"
        text = "\n".join([head, "", *lines]) + "\n"
        out.write(text + "\n" if dumb else HOME_CLEAR + text)
        out.flush()
        if stop.wait(interval):
            return 0


@click.command()
@click.option(
    "--config",
    "-c",
    "--config-file",
    type=click.Path(dir_okay=False),
    envvar=["HETERO_DP_CONFIG", "CONFIG_FILE"],
    help="YAML config file whose metrics.address names the daemon (env HETERO_DP_CONFIG).",
)
@click.option(
    "--url",
    envvar="HETERO_DP_METRICS_ADDRESS",
    help="The daemon's /metrics: a URL, or HOST:PORT / :PORT (env HETERO_DP_METRICS_ADDRESS; "
    "default: the config's metrics.address).",
)
@click.option("--once", is_flag=True, help="Print one table and exit.")
@click.option(
    "--interval",
    type=click.FloatRange(min=0.2),
    default=2.0,
    show_default=True,
    help="Seconds between refreshes.",
)
def top(config: str | None, url: str | None, once: bool, interval: float) -> None:
    """A live view of the node's devices: health, holder (namespace/pod/container),
    memory and utilization, from the local daemon's /metrics. Exits 2 when no
    daemon answers."""
    from hetero_dp.ops.nodeview import ViewError

    try:
        target = _url(url, config)
    except ViewError as e:
        click.echo(f"hetero-dp top: {e}", err=True)
        sys.exit(EXIT_NO_DAEMON)
    try:
        code = run_top(target, once, interval, sys.stdout)
    except KeyboardInterrupt:
        code = 0
    sys.exit(code)
