"""Every bundled backend against the floor, in one run: start-up, idle cost, Allocate and
GetPreferredAllocation (issue 18).

Each backend runs as ``python -m hetero_dp run BACKEND`` in its own process, as
deployed, with the FakeKubelet (hetero_dp.testing) and the measuring client in this
process, over real unix sockets:

- ``simulated``: 8 simulated devices;
- ``nvidia``: real pynvml on the fake ``libnvidia-ml.so.1`` (tests/fakenvml, built
  here with gcc), scenario ``h100-8x.scn``: 8 H100, NVLink between every pair;
- ``udev``: real pyudev/libudev under umockdev, on the 8-GPU AMD tree that
  ``benchmarks/_udev_tree.py`` builds from the tree it names in tests/udev/data.

The floor is ``benchmarks/_floor.py``: a bare grpc.aio DevicePlugin that registers
through kubelet.sock like any plugin and answers Allocate and GetPreferredAllocation
with the very bytes the backend it is compared with answered. The udev backend's
floor runs under the same umockdev preload (its libc interposition slows every
path lookup, Python's own start included), so that ratio compares like with like.

Start-ups alternate (floor, simulated, nvidia, floor under umockdev, udev, in an
order that rotates each round). For the call figures every backend and its own floor
are up together; calls go one at a time in batches of 5, round-robin over all six
servers with a rotating start, so that all see the same machine noise. Idle RSS and
CPU are read from /proc for all six over one shared window, before any call.

``HDP_BENCH_QUICK=1`` (``python -m benchmarks --quick bench_backends``) runs a short
version (fewer starts and calls, a 5 s idle window) for development and CI; its
figures are not for docs/benchmarks.md. Raw samples go to ``HDP_BENCH_RAW`` (default
``benchmarks/raw/bench_backends.json``).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import ROOT, ensure_bytecode, median, percentile, row, subprocess_env
from benchmarks import _import_costs as import_costs
from benchmarks import _udev_tree as udev_tree
from hetero_dp.api import deviceplugin_v1beta1_pb2 as pb
from hetero_dp.api import deviceplugin_v1beta1_pb2_grpc as pb_grpc
from hetero_dp.testing import FakeKubelet, short_tempdir

QUICK = os.environ.get("HDP_BENCH_QUICK", "") not in ("", "0")
STARTS = 3 if QUICK else 15
CALLS = 500 if QUICK else 2000
WARMUP = 50 if QUICK else 200
BATCH = 5
IDLE_SECONDS = 5.0 if QUICK else 30.0
RAW = Path(os.environ.get("HDP_BENCH_RAW") or ROOT / "benchmarks" / "raw" / "bench_backends.json")
FLOOR = str(ROOT / "benchmarks" / "_floor.py")
NVIDIA_SCENARIO = "h100-8x.scn"
PREFERRED_SIZE = 2
MS = 1000.0
GOAL_START = {"simulated": 1.2, "nvidia": 1.3, "udev": 1.3}


@dataclass
class Subject:
    """One process to measure: a backend's daemon or a floor."""

    name: str
    resource: str
    argv: list[str]
    env: dict[str, str]
    proc: asyncio.subprocess.Process | None = None
    ids: list[str] = field(default_factory=list)


def _loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def proc_stats(pid: int) -> dict[str, float]:
    """RSS (MiB), threads and CPU seconds (user+system) of a process, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    after = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return {
        "rss_mib": int(fields["VmRSS"].split()[0]) / 1024,
        "threads": int(fields["Threads"]),
        "cpu_s": (int(after[11]) + int(after[12])) / os.sysconf("SC_CLK_TCK"),
    }


async def spawn(subject: Subject, log: Path) -> None:
    with open(log, "ab") as err:
        subject.proc = await asyncio.create_subprocess_exec(
            *subject.argv,
            env=subject.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=err,
        )


async def stop(subject: Subject) -> None:
    proc, subject.proc = subject.proc, None
    if proc is not None and proc.returncode is None:
        proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()


# --- the node: what each backend needs to find its 8 devices -------------------


@dataclass
class Node:
    root: Path
    kubelet: FakeKubelet
    base_env: dict[str, str]
    skipped: dict[str, str] = field(default_factory=dict)
    nvidia_env: dict[str, str] = field(default_factory=dict)
    nvidia_options: list[str] = field(default_factory=list)
    umockdev_env: dict[str, str] = field(default_factory=dict)
    testbed: asyncio.subprocess.Process | None = None


async def make_node(root: Path) -> Node:
    ensure_bytecode()  # every process starts from bytecode, as an installed one does
    kubelet = FakeKubelet(root / "dp")
    await kubelet.start()
    node = Node(root, kubelet, subprocess_env())
    # nvidia: the fake driver library, its scenario and the host trees it reads
    if shutil.which("gcc") is None:
        node.skipped["nvidia"] = "gcc is needed to build the fake libnvidia-ml.so.1"
    else:
        from tests.nvidia.support import build_fake
        from tests.nvidia.support import make_node as fake_node

        lib = build_fake(root / "lib")
        fake = fake_node(None, root / "nv", NVIDIA_SCENARIO)  # type: ignore[arg-type]
        node.nvidia_env = {
            **node.base_env,
            "LD_LIBRARY_PATH": str(lib.parent),
            "FAKE_NVML_SCENARIO": str(fake.scenario),
        }
        for key, value in fake.options.items():
            node.nvidia_options += ["-o", f"nvidia.{key}={value}"]
    # udev: an 8-GPU umockdev testbed, held by a helper process for the whole run
    sys.path.insert(0, str(ROOT / "vendors" / "udev"))
    from hetero_dp_udev import testing

    why = testing.missing()
    if why:
        node.skipped["udev"] = why
    else:
        tree = root / "node.umockdev"
        tree.write_text(udev_tree.tree_text())
        node.testbed = await asyncio.create_subprocess_exec(
            "umockdev-wrapper",
            sys.executable,
            "-m",
            "benchmarks._udev_tree",
            str(tree),
            cwd=ROOT,
            env=node.base_env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert node.testbed.stdout is not None
        line = await asyncio.wait_for(node.testbed.stdout.readline(), 30)
        testbed_dir = line.decode().strip()
        if not testbed_dir or not Path(testbed_dir).is_dir():
            raise RuntimeError(f"the umockdev testbed helper did not start: {line!r}")
        node.umockdev_env = {
            **node.base_env,
            "LD_PRELOAD": testing.PRELOAD,
            "UMOCKDEV_DIR": testbed_dir,
        }
    return node


async def close_node(node: Node) -> None:
    if node.testbed is not None:
        assert node.testbed.stdin is not None
        node.testbed.stdin.close()  # the helper tears the testbed down at EOF
        try:
            await asyncio.wait_for(node.testbed.wait(), 15)
        except asyncio.TimeoutError:
            node.testbed.kill()
            await node.testbed.wait()
    await node.kubelet.stop()


def daemon(node: Node, backend: str) -> Subject:
    argv = [sys.executable, "-m", "hetero_dp", "run", backend]
    argv += ["--kubelet-dir", str(node.kubelet.plugin_dir)]
    if backend == "simulated":
        argv += ["-o", "simulated.count=8"]
        return Subject(backend, "hetero-dp.io/sim", argv, node.base_env)
    if backend == "nvidia":
        return Subject(backend, "nvidia.com/gpu", argv + node.nvidia_options, node.nvidia_env)
    argv += ["-o", f"udev.rules=[{udev_tree.RULES}]"]
    return Subject(backend, udev_tree.RESOURCE, argv, node.umockdev_env)


def floor(node: Node, name: str, env: dict[str, str], files: tuple[Path, ...] = ()) -> Subject:
    socket = node.kubelet.plugin_dir / f"{name}.sock"
    resource = f"bench.floor/{name}"
    argv = [sys.executable, FLOOR, str(socket), *map(str, files)]
    argv += ["--register", str(node.kubelet.socket_path), resource]
    return Subject(name, resource, argv, env)


# --- the kubelet's calls ----------------------------------------------------------


def allocate_request(ids: list[str]) -> pb.AllocateRequest:
    return pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])


def preferred_request(ids: list[str]) -> pb.PreferredAllocationRequest:
    return pb.PreferredAllocationRequest(
        container_requests=[
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=ids, allocation_size=PREFERRED_SIZE
            )
        ]
    )


class Caller:
    """The kubelet's own channel to one subject (the channel it dialled back on)."""

    def __init__(self, kubelet: FakeKubelet, subject: Subject) -> None:
        res = kubelet.resources[subject.resource]
        assert res.channel is not None
        self.subject = subject
        self.stub = pb_grpc.DevicePluginStub(res.channel)
        ids = sorted(res.devices)
        self.allocate = allocate_request(ids[:2])
        self.preferred = preferred_request(ids)

    async def call(self, method: str, n: int, out: list[float]) -> None:
        fn = self.stub.Allocate if method == "allocate" else self.stub.GetPreferredAllocation
        request = self.allocate if method == "allocate" else self.preferred
        for _ in range(n):
            t = time.perf_counter()
            await fn(request, timeout=10)  # type: ignore[operator]
            out.append(time.perf_counter() - t)


async def register(node: Node, subject: Subject, log: Path) -> tuple[float, Caller]:
    """Spawn; seconds until registered with the first ListAndWatch message received."""
    n = node.kubelet.registration_count(subject.resource)
    t = time.perf_counter()
    await spawn(subject, log)
    await node.kubelet.wait_registered(subject.resource, after=n, timeout=60)
    return time.perf_counter() - t, Caller(node.kubelet, subject)


# --- phases ----------------------------------------------------------------------------


async def startups(node: Node, backends: list[str], raw: dict[str, Any]) -> None:
    """STARTS rounds; each starts every subject once, in an order that rotates."""
    subjects = [floor(node, "floor", node.base_env)]
    for b in backends:
        if b == "udev":
            subjects.append(floor(node, "floor-umockdev", node.umockdev_env))
        subjects.append(daemon(node, b))
    log = node.root / "startup.log"
    starts: dict[str, list[float]] = {s.name: [] for s in subjects}
    first_alloc: dict[str, list[float]] = {s.name: [] for s in subjects}
    first_pref: dict[str, list[float]] = {s.name: [] for s in subjects}
    for i in range(STARTS):
        k = i % len(subjects)
        for s in subjects[k:] + subjects[:k]:
            try:
                seconds, caller = await register(node, s, log)
                starts[s.name].append(seconds)
                # the first calls after registration: laziness must not land here
                out: list[float] = []
                await caller.call("allocate", 1, out)
                first_alloc[s.name] += out
                out = []
                await caller.call("preferred", 1, out)
                first_pref[s.name] += out
            finally:
                await stop(s)
    raw["startup_s"] = starts
    raw["first_allocate_s"] = first_alloc
    raw["first_preferred_s"] = first_pref
    raw["loadavg_after_startups"] = _loadavg()


async def serving(node: Node, backends: list[str], raw: dict[str, Any]) -> None:
    """Every backend and its own floor up together: idle window, then the calls."""
    log = node.root / "serving.log"
    callers: list[Caller] = []
    subjects: list[Subject] = []
    try:
        for b in backends:
            s = daemon(node, b)
            subjects.append(s)
            _, caller = await register(node, s, log)
            callers.append(caller)
            # the floor answers exactly what the backend answered
            a = await caller.stub.Allocate(caller.allocate, timeout=10)
            p = await caller.stub.GetPreferredAllocation(caller.preferred, timeout=10)
            files = (node.root / f"{b}.alloc", node.root / f"{b}.pref")
            files[0].write_bytes(a.SerializeToString())
            files[1].write_bytes(p.SerializeToString())
            env = node.umockdev_env if b == "udev" else node.base_env
            f = floor(node, f"floor-{b}", env, files)
            subjects.append(f)
            _, fcaller = await register(node, f, log)
            callers.append(fcaller)
            got = await fcaller.stub.Allocate(fcaller.allocate, timeout=10)
            assert got.SerializeToString() == a.SerializeToString(), "floor must answer alike"
        # idle: nothing but the kubelet's open ListAndWatch streams
        await asyncio.sleep(1.0)  # past the start-up's own settling (not a synchronisation)
        pids = {s.name: s.proc.pid for s in subjects if s.proc is not None}
        before = {n: proc_stats(p) for n, p in pids.items()}
        t = time.monotonic()
        await asyncio.sleep(IDLE_SECONDS)  # the measurement window itself
        wall = time.monotonic() - t
        after = {n: proc_stats(p) for n, p in pids.items()}
        raw["idle"] = {
            n: {
                "rss_mib": after[n]["rss_mib"],
                "threads": after[n]["threads"],
                "cpu_percent": (after[n]["cpu_s"] - before[n]["cpu_s"]) / wall * 100,
                "window_s": wall,
            }
            for n in pids
        }
        raw["loadavg_after_idle"] = _loadavg()
        for method in ("allocate", "preferred"):
            samples: dict[str, list[float]] = {c.subject.name: [] for c in callers}
            for c in callers:
                await c.call(method, WARMUP, [])
            for i in range(CALLS // BATCH):
                k = i % len(callers)
                for c in callers[k:] + callers[:k]:
                    await c.call(method, BATCH, samples[c.subject.name])
            raw[f"{method}_s"] = samples
            raw[f"loadavg_after_{method}"] = _loadavg()
        raw["rss_after_calls_mib"] = {n: proc_stats(p)["rss_mib"] for n, p in pids.items()}
    finally:
        for s in subjects:
            await stop(s)


# --- figures ------------------------------------------------------------------------------


def rows(raw: dict[str, Any], backends: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    st, fa = raw["startup_s"], raw["first_allocate_s"]
    for b in backends:
        base = "floor-umockdev" if b == "udev" else "floor"
        fl = f"floor-{b}"
        m, fm = median(st[b]) * MS, median(st[base]) * MS
        goal = GOAL_START[b]
        out.append(
            row(
                f"{b}: process start to registered and streaming, median",
                m,
                "ms",
                floor=fm,
                goal=f"<= {goal}x floor",
                ok=m <= goal * fm,
                note=f"{len(st[b])} starts; least {min(st[b]) * MS:.0f} vs "
                f"{min(st[base]) * MS:.0f} ms, {min(st[b]) / min(st[base]):.2f}x"
                + ("; both under umockdev" if b == "udev" else ""),
            )
        )
        a1, f1 = median(fa[b]) * MS, median(fa[base]) * MS
        out.append(
            row(
                f"{b}: first Allocate after registration, median",
                a1,
                "ms",
                floor=f1,
                note=f"{len(fa[b])} starts; first GetPreferredAllocation "
                f"{median(raw['first_preferred_s'][b]) * MS:.2f} ms",
            )
        )
        idle = raw["idle"]
        rss, frss = idle[b]["rss_mib"], idle[fl]["rss_mib"]
        out.append(
            row(
                f"{b}: idle RSS",
                rss,
                "MiB",
                floor=frss,
                goal="<= floor + 3 MiB",
                ok=rss <= frss + 3.0,
                note=f"+{rss - frss:.1f} MiB; threads {idle[b]['threads']} vs "
                f"{idle[fl]['threads']}",
            )
        )
        cpu, fcpu = idle[b]["cpu_percent"], idle[fl]["cpu_percent"]
        out.append(
            row(
                f"{b}: idle CPU over {idle[b]['window_s']:.0f} s",
                cpu,
                "% of a core",
                floor=fcpu or None,
                note=f"floor {fcpu:.3f}%",
            )
        )
        al, fal = raw["allocate_s"][b], raw["allocate_s"][fl]
        for label, q, limit in (("median", 50.0, 1.1), ("p99", 99.0, 1.2)):
            o, f = percentile(al, q) * MS, percentile(fal, q) * MS
            out.append(
                row(
                    f"{b}: Allocate, {label}",
                    o,
                    "ms",
                    floor=f,
                    goal=f"<= {limit}x floor",
                    ok=o <= limit * f,
                    note=f"{len(al)} calls",
                )
            )
        pr, fpr = raw["preferred_s"][b], raw["preferred_s"][fl]
        falloc = median(fal) * MS
        for label, q in (("median", 50.0), ("p99", 99.0)):
            o, f = percentile(pr, q) * MS, percentile(fpr, q) * MS
            out.append(
                row(
                    f"{b}: GetPreferredAllocation, 8 devices, size {PREFERRED_SIZE}, {label}",
                    o,
                    "ms",
                    floor=f,
                    goal=f"<= floor's Allocate + 0.2 ms ({falloc + 0.2:.2f} ms)"
                    if q == 50.0
                    else "",
                    ok=o <= falloc + 0.2 if q == 50.0 else None,
                    note=f"{len(pr)} calls",
                )
            )
    for step in raw.get("import_costs", []):
        out.append(
            row(
                f"start-up cost: {step['step']}",
                step["cpu_s"] * MS,
                "ms CPU",
                note=f"RSS +{step['rss_mib']:.2f} MiB",
            )
        )
    return out


WHY = [
    "Start-up cost rows: benchmarks/_import_costs.py imports, in a fresh interpreter, "
    "what `hetero-dp run BACKEND` loads before it serves, layer by layer in load order "
    "(each layer charged only what the layers before it did not load); the least CPU "
    "time of 7 interpreters and the median RSS growth. The sum of the rows after the "
    "floor's is what hetero-dp adds to a start before any work; the start-up and idle "
    "RSS goals fail on it.",
    "Why each missed goal stays (issue 18). Start to registered (1.2x, 1.3x): the "
    "budget above the floor is a fifth of its start, a few tens of ms; the start-up cost "
    "rows after the floor's (hetero_dp's public face, click, the entry-point scan, "
    "hetero_dp's layers, each backend and its binding) add up to more than that before "
    "any work. click and pluggy are dependencies the project is built on (the brief "
    "names them); hetero_dp's own layers are about 60 modules nearly all used at once by "
    "serving, so loading them lazily would move the cost into the first registration or "
    "Allocate (measured apart above; the few that serve only when configured, ops.labels, "
    "probes and reload, weigh about 1 ms); pynvml and pyudev are the bindings themselves; "
    "the udev backend also parses its YAML rule set and scans the tree before it serves, "
    "and runs under umockdev's preload here. Idle RSS (floor + 3 MiB): the same imports; "
    "click alone is about 1.1 MiB of it, the NVML and udev bindings most of the rest. "
    "Allocate median (1.1x) and p99 (1.2x): the floor answers fixed bytes. A backend "
    "without an allocate hook (simulated, udev) answers a request it answered before "
    "with the message built then, for as long as the device records, the resource's "
    "settings and sharing are unchanged: what is left is the servicer's own bookkeeping "
    "(calls in flight, the observation event). So does one whose allocate hook names "
    "what its answers depend on (the allocate_key hook: nvidia's options and MPS plan). "
    "Any other allocate hook is asked on every call, under hookTimeout: a plain "
    "function on a worker thread (hook "
    "isolation, issue 13: a hook that hangs fails only its request and never blocks the "
    "loop), an `async def` one on the loop with no thread hop, at once (issue 26: "
    "nvidia's allocate is `async def` and makes no blocking call); it edits a copy of "
    "the default response, built once per request and state generation, and the "
    "container gate judges only what it changed; the edited response is then converted "
    "to protobuf, the part above a backend without a hook. "
    "Typed options cost the nvidia backend about 4 ms of import (its options "
    "dataclass is built from NVIDIA's flag table at import).",
    "Per call: Allocate answers a request answered before from the message built then "
    "when the backend has no allocate hook, or one with an allocate_key that is unchanged "
    "(built again after any change of the device records, settings, sharing or key); "
    "otherwise it validates the IDs and builds the "
    "response from the devices' nodes, mounts and env (once per request and state "
    "generation), runs the backend's allocate hook on a copy under a timeout (nvidia's "
    "is `async def`: on the loop, no thread; a plain hook runs on a worker thread, whose "
    "pool starts at the first call, which is in the first-Allocate row) and judges what "
    "the hook changed; every call emits an observation event; "
    "GetPreferredAllocation also builds the 8x8 pair weights and scores every candidate "
    "set (allocation/topology.py), the part above the Allocate round trip.",
    "Cut because of these figures, Allocate (issue 26; quick runs on the loaded 2-core "
    "machine, median against the floor, before -> after): a request answered before is "
    "answered from the message built then while the device records, settings and sharing "
    "hold (no allocate hook); the IDs are checked and the default response built once per "
    "request and state generation; the container gate judges only what a hook changed; "
    "a hook that answers as last time gets the protobuf message converted then; the "
    "AllocateResponse is built in place; two coroutine frames per call instead of four, "
    "the debug line formatted only when enabled; HookRunner knows its `async def` hooks "
    "from construction and Resource calls it without Backend.call's forwarding. "
    "Simulated 1.09-1.19x -> 1.00-1.09x, udev 1.10-1.23x -> 1.02-1.08x, nvidia "
    "1.14-1.29x -> 1.09-1.14x (3 runs before, 11 after); the handler alone, in process "
    "(benchmarks/_handler.py): simulated 32.6 -> 2.4-4.8 us per call, nvidia 45-64 -> "
    "11.2-12.4 us. Then the allocate_key hook: nvidia names its options and MPS plan, so "
    "a repeated request is answered as without a hook (handler in process: nvidia 16.8 "
    "-> 2.6 us per call).",
    "Cut because of these figures (before -> after, import set of `run simulated`): "
    "bytecode for every child (PYTHONDONTWRITEBYTECODE in the dev environment made each "
    "start recompile ~60 modules: 56-117 ms); entry points read without "
    "importlib.metadata (RSS 38.34 -> 36.92 MiB, 347 -> 318 modules); libc opened "
    "without ctypes.util's `ldconfig -p` and temp files made without tempfile "
    "(37.02 -> 36.22 MiB, 318 -> 305 modules); GetPreferredAllocation scores every "
    "set when there are few (8 candidates) instead of the heuristic and branch and "
    "bound (choose_preferred, 8 devices, size 2: 0.47-0.98 -> 0.14-0.22 ms).",
]


def _rounded(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, float):
        return round(value, 7)
    return value


async def measure() -> dict[str, Any]:
    root = short_tempdir("hdp-bb-")
    raw: dict[str, Any] = {"quick": QUICK, "loadavg_at_start": _loadavg()}
    node = await make_node(root)
    try:
        backends = [b for b in ("simulated", "nvidia", "udev") if b not in node.skipped]
        raw["skipped"] = node.skipped
        await startups(node, backends, raw)
        await serving(node, backends, raw)
        raw["import_costs"] = import_costs.measure(3 if QUICK else 7, node.base_env)
    except BaseException:
        for log in root.glob("*.log"):  # the daemons' own words, for the failure report
            print(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
        raise
    finally:
        await close_node(node)
        shutil.rmtree(root, ignore_errors=True)
    raw["loadavg_at_end"] = _loadavg()
    RAW.parent.mkdir(parents=True, exist_ok=True)
    from hetero_dp.kits.atomic import write_atomic

    write_atomic(RAW, json.dumps(_rounded(raw), indent=0) + "\n")
    loads = [raw[k] for k in raw if k.startswith("loadavg")]
    notes = [
        "Load average (1, 5, 15 min) at start, after start-ups, after idle, after "
        "Allocate, after GetPreferredAllocation, at end: "
        + "; ".join(", ".join(f"{x:.2f}" for x in la) for la in loads)
        + ".",
        f"Raw samples: `{RAW.relative_to(ROOT) if RAW.is_relative_to(ROOT) else RAW}`; "
        "reproduce with `python3 -m benchmarks bench_backends` (or `make bench`).",
        "Start-up: from spawning the process to the fake kubelet's first ListAndWatch "
        "message (the floor registers through kubelet.sock as the daemon does); the "
        "interpreter's own start is in both. On a shared machine the least of the starts "
        "(in the note) is the steadier figure: noise only adds. The first Allocate and "
        "GetPreferredAllocation after each start are timed apart from the rest.",
        "Allocate: 2 of the 8 devices; GetPreferredAllocation: all 8 available, size "
        f"{PREFERRED_SIZE}; each backend's floor answers that backend's own response bytes; "
        "the kubelet's own channel; calls one at a time, alternating over all six servers "
        "in batches of 5.",
        "Idle: RSS at the end and CPU time over one window shared by all six processes, "
        "with the kubelet's ListAndWatch stream open, default health and rediscovery "
        "settings; CPU time moves in clock ticks "
        f"(1/{os.sysconf('SC_CLK_TCK')} s).",
    ]
    notes += WHY
    if node.skipped:
        notes.append("Skipped: " + "; ".join(f"{b} ({why})" for b, why in node.skipped.items()))
    if QUICK:
        notes.append("QUICK run: fewer starts and calls, short idle window; not for the docs.")
    return {
        "title": "Backends against the floor (issue 18)",
        "rows": rows(raw, backends),
        "notes": notes,
    }


def run() -> dict[str, Any]:
    return asyncio.run(measure())


if __name__ == "__main__":
    print(json.dumps(run(), indent=1))
