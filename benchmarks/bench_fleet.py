"""DRA mode at fleet scale (issue 31): requests per node by verb, repair after an API
server restart, and what one driver process costs.

N DRA daemons (one per node, 8 devices each) run against one stand-in API server
(``hetero_dp.testing.dra.FakeAPIServer``, over real HTTP), which records every
request by verb. Before each daemon starts, the per-process caches (served
version, feature probe) are dropped, so each node counts as its own process.

- **start**: requests per node from start to the pool on the server.
- **idle**: a periodic check (every 30 s in production) and a rediscovery (every
  60 s) per node every second, run by the benchmark: LISTs and writes per node. Goal:
  0 LISTs (the watch keeps the cache; its re-opens every 30-60 s, one WATCH
  each, are not in the window).
- **churn**: health changes on every node, each one write: LISTs per write.
  Goal: at most 0.25.
- **restart**: the server stops, the nodes' pools are lost (an etcd restore,
  ``FakeAPIServer.lose``), the server starts again, after a short outage and
  after one long enough for every back-off to reach its cap: time until every
  pool is back, from the server's start and from each node's first request it
  answered (goal 2 s), and connection attempts per try while it is down (goal
  1: no library retries under our own). The periodic check runs every 30 s, as
  in production, so the watch's back-off decides when a node looks again.
- **process**: ``hetero-dp run simulated --mode dra`` as a real process, start
  to the pool on the server, and its RSS, beside the device-plugin mode's start
  to registered (fake kubelet) and RSS. Goals: RSS within 10 MiB, start within 1.3x.

The 5,000-node figures are *extrapolations*: the per-node rate times 5,000, as
per-node rates do not grow with the fleet (issue 31 measured that on a real
kube-apiserver with 10, 30 and 60 nodes).

Run: ``python -m benchmarks bench_fleet`` (``--quick``: 3 nodes, short phases).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import median, row, subprocess_env  # noqa: E402
from benchmarks._npus import RES, Npus  # noqa: E402

QUICK = os.environ.get("HDP_BENCH_QUICK") == "1"
NODES = 3 if QUICK else 8
IDLE_S = 3.0 if QUICK else 10.0
CHURN_WRITES = 4 if QUICK else 10  # health changes per node
OUTAGE_S = 2.0 if QUICK else 5.0
# long enough for every back-off to reach its cap (RETRY_CAP, 1.6 s: a few tries)
LONG_OUTAGE_S = 10.0 if QUICK else 20.0
STARTS = 3 if QUICK else 5
FLEET = 5000
DRIVER = "npu.acme.example.com"
DEVICES = 8


def _first_request(requests: list[Any], node: str) -> float:
    """When the first of ``requests`` made for ``node`` (its slices, by the field
    selector or the slice name) was answered; inf when none was."""
    mine = re.compile(rf"{re.escape(node)}(?![0-9])")
    return next((r.at for r in requests if mine.search(r.path)), float("inf"))


async def _restart(
    api: Any, nodes: list[str], complete: Any, clients: list[Any], outage: float
) -> dict[str, Any]:
    """Stop the server, lose every node's pool (an etcd restore), wait ``outage``
    seconds, start it again: per node, when its pool was back and when the server
    answered its first request (seconds after the start), and the tries and
    connection attempts made while it was down."""
    c0 = sum(c.connects for c in clients)
    k0 = sum(c.calls for c in clients)
    api.stop()
    for node in nodes:
        api.lose(node)
    await asyncio.sleep(outage)  # the server is down this long
    connects = sum(c.connects for c in clients) - c0
    calls = sum(c.calls for c in clients) - k0
    mark = len(api.requests)
    api.start()
    t0 = time.monotonic()
    back: dict[str, float] = {}

    def all_back() -> bool:  # re-checked on every request and change
        now = time.monotonic()
        for n in nodes:
            if n not in back and complete(n):
                back[n] = now - t0
        return len(back) == len(nodes)

    await api.wait_for(all_back, timeout=60)
    # a request is recorded just after the store changed: wait for the last creates
    await api.wait_for(lambda: api.verbs(mark).get("CREATE", 0) >= len(nodes), timeout=10)
    # from its first answered request on, the repair is the driver's (relist on 410)
    first = [_first_request(api.requests[mark:], n) - t0 for n in nodes]
    return {
        "repair": [back[n] for n in nodes],
        "first": first,
        "after": api.verbs(mark),
        "connects": connects,
        "calls": calls,
    }


def _per_node(counts: dict[str, int], nodes: int) -> dict[str, float]:
    return {k: v / nodes for k, v in sorted(counts.items())}


async def fleet() -> tuple[list[dict[str, Any]], list[str]]:
    from hetero_dp.dra.api import forget_served
    from hetero_dp.dra.client import RETRY_CAP
    from hetero_dp.dra.features import forget_probes
    from hetero_dp.testing import short_tempdir
    from hetero_dp.testing.dra import DRARunner, FakeAPIServer

    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    roots = []
    runners: list[Any] = []
    daemons: list[Any] = []
    with FakeAPIServer() as api:
        nodes = [f"node-{i}" for i in range(NODES)]

        def complete(node: str) -> bool:
            return len(api.devices_of(DRIVER, node)) == DEVICES

        try:
            # --- start
            mark = len(api.requests)
            for node in nodes:
                forget_served(api.url)  # each node is a process of its own
                forget_probes(api.url)
                root = short_tempdir("hdp-fleet-")
                roots.append(root)
                runner = DRARunner(root, api, node=node)
                runners.append(runner)
                # the production interval: the idle phase runs the checks itself, every 1 s
                daemons.append(await runner.start(Npus(DEVICES), resync_interval=30.0))
            await api.wait_for(lambda: all(complete(n) for n in nodes), timeout=60)
            await api.wait_for(lambda: api.watches >= NODES, timeout=30)
            start = api.verbs(mark)
            per = sum(v for k, v in start.items() if k != "FAILED") / NODES
            rows.append(
                row(
                    "start: requests per node (separate processes)",
                    per,
                    "requests",
                    goal="< 7 (before: 7, 2 of them probes)",
                    ok=per < 7,
                    note=", ".join(f"{k} {v:g}" for k, v in _per_node(start, NODES).items()),
                )
            )

            # --- idle
            mark = len(api.requests)
            t0 = time.monotonic()
            rounds = 0
            while time.monotonic() - t0 < IDLE_S:
                await asyncio.gather(
                    *(d.rediscover() for d in daemons),
                    *(d.front_end.drivers[RES].resync() for d in daemons),  # periodic check
                )
                rounds += 1
                await asyncio.sleep(1.0)
            idle_s = time.monotonic() - t0
            idle = api.verbs(mark)
            checks = sum(
                d.front_end.drivers[RES].publisher.syncs for d in daemons
            )  # syncs so far, all causes
            lists = idle.get("LIST", 0) / NODES
            rows.append(
                row(
                    "idle: LISTs per node",
                    lists,
                    "LISTs",
                    goal="0 between watch re-opens",
                    ok=lists == 0,
                    note=(
                        f"{idle_s:.1f} s with a periodic check every 1 s and {rounds} "
                        f"rediscoveries per node; all requests: {idle or 'none'}; before: one "
                        "LIST per check and per rediscovery"
                    ),
                )
            )
            notes.append(f"syncs run by the {NODES} drivers up to the end of idle: {checks}")

            # --- churn
            mark = len(api.requests)

            async def churn(daemon: Any, node: str) -> None:
                for w in range(CHURN_WRITES):
                    healthy = w % 2 == 1
                    daemon.set_health("npus", "NPU-0", healthy, "" if healthy else "XID 79")
                    want = DEVICES if healthy else DEVICES - 1
                    await api.wait_for(
                        lambda n=node, k=want: len(api.devices_of(DRIVER, n)) == k, timeout=30
                    )

            t0 = time.monotonic()
            await asyncio.gather(*(churn(d, n) for d, n in zip(daemons, nodes)))
            churn_s = time.monotonic() - t0
            # a request is recorded just after the store changed: wait for the last ones
            await api.wait_for(
                lambda: api.verbs(mark).get("UPDATE", 0) >= NODES * CHURN_WRITES, timeout=10
            )
            moved = api.verbs(mark)
            writes = moved.get("UPDATE", 0) + moved.get("CREATE", 0) + moved.get("DELETE", 0)
            per_write = moved.get("LIST", 0) / max(1, writes)
            rows.append(
                row(
                    "churn: LISTs per write",
                    per_write,
                    "LISTs/write",
                    goal="<= 0.25 (before: ~2.3)",
                    ok=per_write <= 0.25,
                    note=(
                        f"{NODES * CHURN_WRITES} health changes in {churn_s:.1f} s: "
                        f"{moved}; conflicts (409) {moved.get('FAILED', 0)}"
                    ),
                )
            )

            # --- restart, after a short outage and after one long enough for every
            # back-off to reach its cap
            drivers = [d.front_end.drivers[RES] for d in daemons]
            clients = {id(dr.api.api_client): dr.api.api_client for dr in drivers}.values()
            for outage, label in ((OUTAGE_S, "short"), (LONG_OUTAGE_S, "long")):
                await api.wait_for(lambda: api.watches >= NODES, timeout=30)  # all live
                r = await _restart(api, nodes, complete, list(clients), outage)
                repair, first = r["repair"], r["first"]
                rows.append(
                    row(
                        f"restart after a {outage:.0f} s outage: every pool back after the "
                        "server started again, max",
                        max(repair) * 1000,
                        "ms",
                        goal="< 2000 ms (before: 20-26 s, up to 30 s)",
                        ok=max(repair) < 2.0,
                        note=(
                            "the periodic check every 30 s, as in production; median "
                            f"{median(repair) * 1000:.0f} ms; each "
                            "node's first request after the start came "
                            f"{median(first) * 1000:.0f} ms (median) to "
                            f"{max(first) * 1000:.0f} ms (max) after it: the watch's "
                            f"back-off (0.5 s doubling, capped at {RETRY_CAP:g} s, jittered "
                            "down by up to half) decides when a node looks again; requests "
                            "after the "
                            f"restart: {r['after']}"
                        ),
                    )
                )
                since_first = max(b - f for b, f in zip(repair, first))
                rows.append(
                    row(
                        f"restart after a {outage:.0f} s outage: pool back after the node's "
                        "first answered request, max",
                        since_first * 1000,
                        "ms",
                        goal="< 2000 ms (relist on 410 at once)",
                        ok=since_first < 2.0,
                        note="the part the driver decides once the server answers it",
                    )
                )
                rate = r["connects"] / NODES / outage
                if label == "long":
                    long_rate = rate
                    continue
                short_rate = rate
                most = max(c.most_connects for c in clients)
                rows.append(
                    row(
                        "restart: connection attempts per try, most in one call",
                        most,
                        "attempts/try",
                        goal="1 (before: 4, urllib3's 3 retries under ours)",
                        ok=most == 1,
                        note=(
                            f"while down: {r['calls']} tries, {r['connects']} connection "
                            f"attempts in {outage:.0f} s (a call started before the stop may "
                            f"connect inside the window); {rate:.2f} attempts per node per "
                            "second"
                        ),
                    )
                )
            # a node while the server is down: the watch retries (back-off capped at
            # RETRY_CAP, drawn between half and all of it: mean 0.75 * RETRY_CAP) and the
            # 30 s periodic check lists once (the cache is stale while the watch is down);
            # one connection attempt each
            mean_try = 0.75 * RETRY_CAP
            steady = 1 / mean_try + 1 / 30
            notes.append(
                "Repair after a restart: once a node's request is answered, its pool is back "
                "within tens of ms (relist on 410, one CREATE: the 'first answered request' "
                "rows). Before that a node waits out its back-off: once the back-off has "
                f"reached its cap, tries come {RETRY_CAP / 2:g}-{RETRY_CAP:g} s apart "
                f"({RETRY_CAP:g} s cap, jittered down by up to half), so a node finds the "
                f"server back at most {RETRY_CAP:g} s after it starts answering, whatever "
                "the outage's length. The price of the 2 s goal, at 5,000 nodes: a dead "
                f"server gets about {5000 / mean_try:,.0f} connection attempts/s (one per "
                "try; before issue 31 ~2,900/s, four per try), and a returning one the "
                f"fleet's relists within {RETRY_CAP:g} s (about {5000 / RETRY_CAP:,.0f} "
                "LIST/s, each of one node's slices). client-go's reflector, for comparison, "
                "caps at 30 s with jitter 1: once capped it looks every 30-60 s."
            )
            notes.append(
                "Extrapolated to 5,000 nodes (per-node rate x 5,000; not measured at that "
                f"size): idle {lists / idle_s * FLEET:.0f} LIST/s (before: 250 LIST/s); churn "
                f"at one change per node every 20 s {per_write * FLEET / 20:.0f} LIST/s beside "
                f"{FLEET / 20:.0f} PUT/s (before: ~565 LIST/s beside 250 PUT/s); a dead API "
                f"server gets about {steady * FLEET:.0f} connection attempts/s once the "
                "back-offs reach their cap (watch retry every "
                f"{mean_try:g} s on average plus one "
                "periodic check per 30 s per node; before: ~2,900/s) (here "
                f"{short_rate:.2f} attempts per node per second over a {OUTAGE_S:.0f} s "
                f"outage and {long_rate:.2f} over a {LONG_OUTAGE_S:.0f} s one, the periodic "
                "check every 30 s)"
            )
        finally:
            for runner in runners:
                await runner.stop_all()
            for root in roots:
                shutil.rmtree(root, ignore_errors=True)
    return rows, notes


def _cpu_s(pid: int) -> float:
    """The CPU time (user + system) a process has used so far, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def processes() -> tuple[list[dict[str, Any]], list[str]]:
    from hetero_dp.dra.api import ResourceAPI
    from hetero_dp.dra.slices import render_slices
    from hetero_dp.testing import FakeKubelet, short_tempdir
    from hetero_dp.testing.dra import FakeAPIServer

    env = subprocess_env()
    dp_start, dp_rss, dra_start, dra_rss = [], [], [], []
    dp_cpu: list[float] = []
    dra_cpu: list[float] = []
    root = short_tempdir("hdp-fleetp-")
    (root / "cdi").mkdir()
    (root / "config.yaml").write_text(
        f"healthInterval: 0\nrediscoverInterval: 0\ncdi:\n  dir: {root / 'cdi'}\n"
    )
    base = [
        sys.executable,
        "-m",
        "hetero_dp",
        "run",
        "simulated",
        "-o",
        f"simulated.count={DEVICES}",
    ]
    kubelet = FakeKubelet(root / "dp")
    await kubelet.start()
    try:
        for i in range(STARTS):
            n = kubelet.registration_count("hetero-dp.io/sim")
            t = time.perf_counter()
            proc = await asyncio.create_subprocess_exec(
                *base,
                "-c",
                str(root / "config.yaml"),
                "--kubelet-dir",
                str(root / "dp"),
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL,
            )
            try:
                await kubelet.wait_registered("hetero-dp.io/sim", after=n, timeout=60)
                await kubelet.wait_devices("hetero-dp.io/sim", lambda d: len(d) == DEVICES)
                dp_start.append(time.perf_counter() - t)
                dp_cpu.append(_cpu_s(proc.pid))
                await asyncio.sleep(0.5)  # settled
                dp_rss.append(_rss_mib(proc.pid))
            finally:
                proc.terminate()
                await proc.wait()
            with FakeAPIServer() as api:
                node = f"p{i}"
                api.add_node(node)
                # the stand-in validates every write with the 1.34 JSON schema; its first
                # use loads the schema, in this process: done before the clock starts
                ResourceAPI(api.client()).create_slice(
                    render_slices(
                        driver="sim.hetero-dp.io", node=node, devices=[{"name": "warm"}],
                        generation=1, version="v1",
                    )[0],
                    dry_run=True,
                )  # fmt: skip
                t = time.perf_counter()
                proc = await asyncio.create_subprocess_exec(
                    *base, "-c", str(root / "config.yaml"), "--mode", "dra",
                    "--node-name", node, "--api-server", api.url,
                    "--kubelet-dir", str(root / "dp"),
                    "--plugins-registry-dir", str(root / "reg"),
                    "--dra-plugins-dir", str(root / "plugins"),
                    env=env, stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
                )  # fmt: skip
                try:
                    await api.wait_for(
                        lambda a=api, nd=node: len(a.devices_of("sim.hetero-dp.io", nd)) == DEVICES,
                        timeout=60,
                    )
                    dra_start.append(time.perf_counter() - t)
                    dra_cpu.append(_cpu_s(proc.pid))
                    await asyncio.sleep(0.5)
                    dra_rss.append(_rss_mib(proc.pid))
                finally:
                    proc.terminate()
                    await proc.wait()
    finally:
        await kubelet.stop()
        shutil.rmtree(root, ignore_errors=True)
    ds, rs = median(dra_start) * 1000, median(dp_start) * 1000
    dm, pm = median(dra_rss), median(dp_rss)
    rows = [
        row(
            "process: DRA driver start to the pool on the server, median",
            ds,
            "ms",
            floor=rs,
            goal="<= 1.3x the device-plugin mode's start to registered",
            ok=ds <= 1.3 * rs,
            note=(
                f"{STARTS} starts each, 8 simulated devices; floor: device-plugin mode; "
                f"DRA {', '.join(f'{x * 1000:.0f}' for x in dra_start)} ms, device plugin "
                f"{', '.join(f'{x * 1000:.0f}' for x in dp_start)} ms"
            ),
        ),
        row(
            "process: DRA driver CPU time to the pool on the server, median",
            median(dra_cpu) * 1000,
            "ms",
            floor=median(dp_cpu) * 1000,
            goal="<= 1.3x the device-plugin mode's CPU time to registered",
            ok=median(dra_cpu) <= 1.3 * median(dp_cpu),
            note=(
                "user + system time of the driver process alone (the stand-in's work is "
                f"not in it); DRA {', '.join(f'{x * 1000:.0f}' for x in dra_cpu)} ms, "
                f"device plugin {', '.join(f'{x * 1000:.0f}' for x in dp_cpu)} ms; before: "
                "about 1.5 CPU-s (issue 31)"
            ),
        ),
        row(
            "process: DRA driver RSS, median",
            dm,
            "MiB",
            floor=pm,
            goal="within 10 MiB of the device-plugin mode's",
            ok=dm - pm <= 10.0,
            note=f"device-plugin mode {pm:.1f} MiB; before: ~102 vs ~47 MB (issue 31)",
        ),
    ]
    # what the kubernetes client cost (the DRA mode imported it before issue 31)
    code = (
        "import time,sys;sys.path.insert(0,{root!r});import hetero_dp.engine.daemon;"
        "r=lambda:int([l for l in open('/proc/self/status') if l.startswith('VmRSS')][0]"
        ".split()[1])/1024;a=r();t=time.process_time();import {mod};"
        "print(time.process_time()-t, r()-a)"
    )
    costs = {}
    for name, mod in (
        ("kubernetes client", "kubernetes.client, kubernetes.config"),
        ("our client (hetero_dp.dra.api)", "hetero_dp.dra.api"),
    ):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", code.format(root=str(ROOT), mod=mod),
            env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        out, _ = await proc.communicate()
        try:
            cpu, rss = (float(x) for x in out.split())
            costs[name] = (cpu, rss)
        except ValueError:
            costs[name] = (float("nan"), float("nan"))
    notes = [
        "What the DRA start costs and why (issue 31 point 4): it counts until the pool is "
        "on the stand-in, 6 requests in three round trips one after the other (discovery; "
        "the LIST, the dry-run probe and the Node read side by side; the create; then the "
        "watch), answered by a stand-in that runs in this benchmark's process and validates "
        "each write with the 1.34 JSON schema (8-22 ms per write on this machine, measured "
        "2026-12-02 after a warm-up); the device-plugin start's two round trips (Register, "
        "ListAndWatch) go to a fake kubelet that validates nothing. The driver's own work is "
        "the CPU-time row: DRA mode imports about as much as the device-plugin mode (its "
        "own modules and http.client in place of the device-plugin ones, about 5 ms more "
        "import time in one -X importtime run) and needs 1.1-1.2x its CPU time to start. "
        "The wall-clock ratio on this shared 2-core machine moves with the load: 1.20x-1.59x "
        "over six runs on 2026-12-02 (load 1.4-3.7), 1.05x-1.68x in earlier runs, so the "
        "1.3x goal for the wall clock is met in some runs and not in others; what stays is "
        "the round trips a DRA driver needs (the version to use, the pool's generation and "
        "the server's optional fields before the first write; the discovery answer and the "
        "probe are kept per process).",
        "Import cost on top of the engine (CPU s, RSS MiB): "
        + "; ".join(f"{k}: {c:.2f} s, +{r:.1f} MiB" for k, (c, r) in costs.items()),
    ]
    return rows, notes


async def main() -> dict[str, Any]:
    rows, notes = await fleet()
    prows, pnotes = await processes()
    return {
        "title": f"DRA mode at fleet scale ({NODES} nodes, {DEVICES} devices each"
        + (", quick form)" if QUICK else ")"),
        "rows": rows + prows,
        "notes": [
            "One stand-in API server (FakeAPIServer) counting requests by verb; every node "
            "a DRA daemon with its own client; per-process caches dropped before each start.",
            *notes,
            *pnotes,
        ],
    }


def run() -> dict[str, Any]:
    return asyncio.run(main())


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2, default=str))
