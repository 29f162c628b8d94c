"""``hetero-dp top``: the table from a running daemon's /metrics over real HTTP, and one
clear line (exit 2) for an endpoint that is not one."""

from __future__ import annotations

import asyncio
import http.server
import io
import socket
import threading
from collections.abc import Callable, Iterator

import pytest
from click.testing import CliRunner

from hetero_dp.cli import main
from hetero_dp.cli.top import run_top, table_lines
from hetero_dp.ops.nodeview import DeviceRow, Holder, metrics_url
from tests.core.scripted import Scripted, make_devices

from .helpers import port_of, wait_ready

RES = "example.com/accel"
CONFIG = {"metrics": {"address": "127.0.0.1:0"}}


def top(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["top", *args])
    return result.exit_code, result.stdout, result.stderr


# --- an HTTP endpoint that answers what a test wants ------------------------------------------


Handler = Callable[[http.server.BaseHTTPRequestHandler], None]


@pytest.fixture
def endpoint() -> Iterator[Callable[[Handler], str]]:
    servers: list[http.server.ThreadingHTTPServer] = []

    def serve(answer: Handler) -> str:
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                answer(self)

            def log_message(self, *args: object) -> None:
                pass

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        srv.daemon_threads = True
        servers.append(srv)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{srv.server_address[1]}/metrics"

    yield serve
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def body(text: bytes, status: int = 200) -> Handler:
    def answer(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(status)
        h.send_header("Content-Length", str(len(text)))
        h.end_headers()
        h.wfile.write(text)

    return answer


# --- against a running daemon ----------------------------------------------------------------


async def test_once_prints_each_device_with_its_health(fake_kubelet, plugin_runner):
    backend = Scripted(make_devices(RES, 3))
    daemon = await plugin_runner.start(backend, config=CONFIG)
    await fake_kubelet.wait_registered(RES)
    await wait_ready(daemon)
    assert backend.watch_started.wait(5)
    backend.sinks[0].set_health("dev1", False, "XID 79")
    await fake_kubelet.wait_devices(RES, lambda d: not d["dev1"].healthy)
    code, out, err = await asyncio.to_thread(top, "--once", "--url", f":{port_of(daemon)}")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["RESOURCE", "DEVICE", "HEALTH", "HOLDER", "MEMORY", "UTIL"]
    rows = [line.split(None, 2) for line in lines[1:]]
    assert [r[:2] for r in rows] == [[RES, "dev0"], [RES, "dev1"], [RES, "dev2"]]
    assert rows[1][2].startswith("Unhealthy: XID 79")
    assert rows[0][2].split() == ["Healthy", "-", "-", "-"]  # held by no one yet


async def test_once_prints_who_holds_each_device(fake_kubelet, plugin_runner, tmp_path):
    await fake_kubelet.serve_pod_resources()
    config = {**CONFIG, "attribution": {"procRoot": str(tmp_path / "proc")}}
    daemon = await plugin_runner.start(Scripted(make_devices(RES, 3)), config=config)
    await fake_kubelet.wait_registered(RES)
    a = await fake_kubelet.admit_pod("a", {"main": {RES: 1}}, namespace="team")
    b = await fake_kubelet.admit_pod("b", {"side": {RES: 1}})
    code, out, _ = await asyncio.to_thread(top, "--once", "--url", f":{port_of(daemon)}")
    assert code == 0
    held = {line.split()[1]: line.split()[3] for line in out.splitlines()[1:]}
    (da,), (db,) = a.device_ids(), b.device_ids()
    assert held[da] == "team/a/main" and held[db] == "default/b/side"
    (free,) = set(held) - {da, db}
    assert held[free] == "-"


async def test_the_config_names_the_daemon(fake_kubelet, plugin_runner, tmp_path):
    daemon = await plugin_runner.start(Scripted(make_devices(RES, 1)), config=CONFIG)
    await wait_ready(daemon)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"metrics:\n  address: 127.0.0.1:{port_of(daemon)}\n")
    code, out, _ = await asyncio.to_thread(top, "--once", "--config", str(cfg))
    assert code == 0
    assert f"{RES}  dev0" in out


# --- endpoints that are not a daemon: one clear line, exit 2 ---------------------------------


def test_no_daemon_answers():
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, out, err = top("--once", "--url", f"127.0.0.1:{port}")
    assert (code, out) == (2, "")
    assert err.startswith(f"hetero-dp top: no daemon answers at http://127.0.0.1:{port}/metrics")
    assert err.count("\n") == 1


def test_no_address_configured_says_what_to_pass(tmp_path, monkeypatch):
    monkeypatch.delenv("HETERO_DP_METRICS_ADDRESS", raising=False)
    cfg = tmp_path / "config.yaml"
    cfg.write_text("kubeletDir: /tmp/x\n")
    code, _, err = top("--once", "--config", str(cfg))
    assert code == 2
    assert "no metrics.address configured" in err and "--url" in err


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (body(b"<html>hello</html>\n"), "did not answer Prometheus text"),
        (body(b"some_metric 1\n"), "answers no hetero_dp_ series"),
        (body(b"\xff\xfe\x00garbage"), "not text"),
        (body(b"not found", 404), "answers HTTP 404"),
    ],
)
def test_garbage_gets_one_line(endpoint, answer, says):
    url = endpoint(answer)
    code, out, err = top("--once", "--url", url)
    assert (code, out) == (2, "")
    assert says in err and url in err
    assert err.count("\n") == 1


def test_an_oversized_answer_is_cut_at_the_cap(endpoint):
    line = b'hetero_dp_devices{resource="x"} 1\n'
    big = line * ((8 << 20) // len(line) + 2)  # just past 8 MiB of valid text

    def answer(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.end_headers()
        try:
            h.wfile.write(big)
        except OSError:
            pass  # the reader stopped at the cap and closed

    code, _, err = top("--once", "--url", endpoint(answer))
    assert code == 2
    assert "answered more than 8388608 bytes" in err


def test_a_stalled_answer_times_out(endpoint):
    release = threading.Event()

    def answer(h: http.server.BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.end_headers()
        h.wfile.write(b"# HELP hetero_dp_devices x\n")
        h.wfile.flush()
        release.wait(30)  # the rest never comes while the test runs

    url = endpoint(answer)
    out = io.StringIO()
    try:
        assert run_top(url, once=True, interval=1, out=out, timeout=0.5) == 2
    finally:
        release.set()
    assert out.getvalue() == ""


# --- live mode ---------------------------------------------------------------------------------


class Frames(io.StringIO):
    """An output that counts what is written and tells a waiting test."""

    def __init__(self, want: int) -> None:
        super().__init__()
        self.frames: list[str] = []
        self.enough = threading.Event()
        self.want = want

    def write(self, s: str) -> int:
        self.frames.append(s)
        if len(self.frames) >= self.want:
            self.enough.set()
        return super().write(s)


def test_live_mode_redraws_and_survives_the_daemon_going_away(endpoint):
    text = b'hetero_dp_device_healthy{resource="r",device="d0",reason=""} 1\n'
    gone = threading.Event()

    def answer(h: http.server.BaseHTTPRequestHandler) -> None:
        if gone.is_set():
            body(b"bye", 503)(h)
        else:
            body(text)(h)

    url = endpoint(answer)
    out = Frames(want=2)
    stop = threading.Event()
    t = threading.Thread(target=run_top, args=(url, False, 0.2, out, stop))
    t.start()
    try:
        assert out.enough.wait(10)
        gone.set()
        out.want = len(out.frames) + 2  # one more frame, at least, after it went away
        out.enough.clear()
        assert out.enough.wait(10)
    finally:
        stop.set()
        t.join(10)
    assert not t.is_alive()
    # not a terminal: each refresh is the table again (no escape codes), then the outage
    assert all("\x1b" not in f for f in out.frames)
    assert ["r", "d0", "Healthy"] in [line.split()[:3] for line in out.frames[0].splitlines()]
    assert "answers HTTP 503" in out.frames[-1] and "retrying" in out.frames[-1]


# --- the table -----------------------------------------------------------------------------------


def test_a_shared_device_lists_each_holder_and_marks_the_one_over_its_share():
    gib = 1 << 30
    rows = [
        DeviceRow(
            "nvidia.com/gpu",
            "GPU-1",
            replicas=4,
            holders=[
                Holder("ml", "a", "c", "GPU-1::0", 9 * gib, 0.35, 4 * gib),
                Holder("ml", "b", "c", "GPU-1::1", 1 * gib, None, 4 * gib),
            ],
        ),
        DeviceRow("nvidia.com/gpu", "GPU-2", healthy=False, reason="XID 79"),
    ]
    lines = table_lines(rows)
    assert lines[1].split() == [
        "nvidia.com/gpu", "GPU-1", "(4", "replicas)", "Healthy", "ml/a/c", "9.0", "GiB", "!", "35%",
    ]  # fmt: skip
    assert lines[2].split() == ["ml/b/c", "1.0", "GiB", "-"]
    assert lines[3].split()[:4] == ["nvidia.com/gpu", "GPU-2", "Unhealthy:", "XID"]
    assert lines[-1].startswith("! over its fair share")


def test_metrics_url_forms():
    assert metrics_url(":9435") == "http://127.0.0.1:9435/metrics"
    assert metrics_url("0.0.0.0:9435") == "http://127.0.0.1:9435/metrics"
    assert metrics_url("[::1]:9435") == "http://[::1]:9435/metrics"
    assert metrics_url("http://node:1/metrics") == "http://node:1/metrics"


def test_the_docs_example_is_what_top_prints(repo_root):
    """docs/operations.md shows top's output: the table drawn from the rows it shows."""
    gib = 1 << 30
    gpu0, gpu1 = (
        "GPU-54d08ce6-28ad-49c6-b639-6ae3994b9717",
        "GPU-9874f882-2b2d-498d-bcb3-fd500e263730",
    )
    rows = [
        DeviceRow(
            "nvidia.com/gpu",
            gpu0,
            replicas=4,
            holders=[
                Holder("ml", "train-0", "main", f"{gpu0}::0", 9.2 * gib, 0.41, 20 * gib),
                Holder("ml", "notebook-7", "jupyter", f"{gpu0}::2", 31.5 * gib, 0.12, 20 * gib),
            ],
        ),
        DeviceRow(
            "nvidia.com/gpu",
            gpu1,
            holders=[Holder("infer", "api-5d9c", "server", gpu1, 18.4 * gib, 0.77)],
        ),
        DeviceRow(
            "nvidia.com/gpu",
            "GPU-cde9d231-c8a3-4e7b-9d7d-255f2b68beef",
            healthy=False,
            reason="XID 79: GPU has fallen off the bus",
        ),
        DeviceRow(
            "nvidia.com/mig-1g.10gb",
            "MIG-52496e1e-3fc2-4ec0-9529-89c17d9c649a",
            holders=[Holder("ci", "test-runner", "cuda", "MIG-52496e1e", 2.1 * gib)],
        ),
        DeviceRow("nvidia.com/mig-1g.10gb", "MIG-d5b8c255-1f4d-4cc5-891b-5ffbff651b90"),
    ]
    doc = (repo_root / "docs" / "operations.md").read_text()
    block = doc.split("$ hetero-dp top --once\n", 1)[1].split("\n```", 1)[0]
    assert block.splitlines() == table_lines(rows)
