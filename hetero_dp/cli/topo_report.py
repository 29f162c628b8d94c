"""Text for ``hetero-dp topo``: what the allocation engine sees (the layout follows a
vendor's topology matrix tool: docs/topology.md).

The report has three parts: a legend of devices (short label, ID, NUMA node,
health with an unhealthy one's reason), the device-by-device matrix whose cells
read ``KIND/score`` (``X`` on the diagonal, ``-`` for a pair without a link, which
scores 0), and, when a size is given, the set the engine would choose with its
score and the pairs that make it up. A backend's devices are judged by its
``check_health`` first, as the daemon would.

A topology can also come from a file (:func:`load_topology`, YAML or JSON in the
shape :func:`topology_document` writes), so an operator can look at a node's
topology, or a made-up one, without the hardware::

    devices:
    - {id: GPU-0, numa: 0, index: 0}
    - {id: GPU-1, numa: 0, index: 1}
    links:
    - {a: GPU-0, b: GPU-1, score: 200, kind: NV2}
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hetero_dp.allocation.preferred import explain_preferred, link_scores, scoring_id
from hetero_dp.allocation.sharing import DEFAULT_REPLICA_POLICY, advertise
from hetero_dp.engine.backend import Backend
from hetero_dp.engine.config import Config
from hetero_dp.engine.publishing import check_names
from hetero_dp.kits.foreign import ForeignFileError, parse_foreign, read_foreign
from hetero_dp.model.device import Device, Link
from hetero_dp.model.errors import ConfigError

TOPOLOGY_FILE_SUFFIXES = (".yaml", ".yml", ".json")

LinksInput = Iterable[Link] | Mapping[tuple[str, str], float]


def _fmt(score: float) -> str:
    return str(int(score)) if float(score).is_integer() else f"{score:g}"


def _numa(device: Device) -> str:
    return ",".join(str(n) for n in device.numa_nodes) or "N/A"


def render_topology(
    devices: Sequence[Device],
    links: LinksInput = (),
    size: int | None = None,
    must_include: Sequence[str] = (),
    policy: str = DEFAULT_REPLICA_POLICY,
) -> str:
    """The report for ``devices`` and their ``links`` (Link records or a pair map).

    With ``size``, also the set the engine chooses among the healthy devices (the
    kubelet offers no others); ``must_include`` entries may be device IDs or the
    short labels of the legend (``D0`` ...). Raises
    AllocationError for a size or must-include the engine would refuse.
    """
    kinds: dict[tuple[str, str], str] = {}
    if isinstance(links, Mapping):
        scores = {k: float(v) for k, v in links.items()}
        scores.update({(b, a): v for (a, b), v in list(scores.items()) if (b, a) not in scores})
    else:
        records = list(links)
        scores = link_scores(records)
        for link in records:
            if link.kind and scores.get((link.a, link.b)) == link.score:
                kinds[(link.a, link.b)] = kinds[(link.b, link.a)] = link.kind

    # One row per physical device: replicas and slices collapse onto it.
    rows: dict[str, list[Device]] = {}
    for d in devices:
        rows.setdefault(scoring_id(d), []).append(d)
    phys = list(rows)
    label = {p: f"D{i}" for i, p in enumerate(phys)}

    out: list[str] = [f"Devices ({len(devices)} advertised, {len(phys)} physical):"]
    id_width = max([len(p) for p in phys] + [2])
    out.append(f"  {'':<4} {'ID':<{id_width}}  {'NUMA':<6} {'HEALTH':<12} UNITS")
    for p in phys:
        group = rows[p]
        healthy = sum(1 for d in group if d.healthy)
        health = "Healthy" if healthy == len(group) else f"{len(group) - healthy} unhealthy"
        reasons = sorted({d.reason for d in group if not d.healthy and d.reason})
        why = f"  ({'; '.join(reasons)})" if reasons else ""
        out.append(
            f"  {label[p]:<4} {p:<{id_width}}  {_numa(group[0]):<6} {health:<12} {len(group)}{why}"
        )

    cells = {
        (a, b): "X"
        if a == b
        else (f"{kinds.get((a, b), 'LINK')}/{_fmt(scores[(a, b)])}" if (a, b) in scores else "-")
        for a in phys
        for b in phys
    }
    width = max([len(c) for c in cells.values()] + [len(v) for v in label.values()]) + 2
    out.append("")
    out.append("Links (KIND/score, higher is better; - = no link, scores 0):")
    out.append("      " + "".join(f"{label[b]:<{width}}" for b in phys) + "NUMA")
    for a in phys:
        row = "".join(f"{cells[(a, b)]:<{width}}" for b in phys)
        out.append(f"  {label[a]:<4}{row}{_numa(rows[a][0])}")

    if size is not None:
        out.append("")
        out.extend(_choice(devices, scores, size, must_include, policy, label))
    return "\n".join(out) + "\n"


def _choice(
    devices: Sequence[Device],
    scores: Mapping[tuple[str, str], float],
    size: int,
    must_include: Sequence[str],
    policy: str,
    label: Mapping[str, str],
) -> list[str]:
    by_id = {d.id: d for d in devices}
    by_label = {v: k for k, v in label.items()}
    must: list[Device] = []
    for ref in must_include:
        ref_id = ref if ref in by_id else by_label.get(ref, ref)
        # A label names a physical device; take its first advertised unit.
        match = by_id.get(ref_id) or next((d for d in devices if scoring_id(d) == ref_id), None)
        must.append(match if match is not None else Device(ref_id, "unknown/unknown"))
    # The kubelet offers only healthy devices; so does the report.
    available = [d for d in devices if d.healthy]
    choice = explain_preferred(available, must, size, scores, policy)
    chosen = [by_id[i] for i in choice.ids]
    names = " ".join(label[scoring_id(d)] for d in chosen)
    how = "optimal (exact search)" if choice.exact else "heuristic (not proven optimal)"
    if choice.mode != "topology":
        how = f"replica policy {choice.mode}"
    lines = [
        f"Chosen for size {size}"
        + (f" (must include {', '.join(must_include)})" if must_include else "")
        + f": {names}",
        f"  IDs: {', '.join(d.id for d in chosen)}",
        f"  score {_fmt(choice.score)}, {how}; NUMA nodes "
        + (",".join(str(n) for n in sorted({n for d in chosen for n in d.numa_nodes})) or "N/A"),
    ]
    seen = list(dict.fromkeys(scoring_id(d) for d in chosen))
    pairs = [
        f"{label[a]}-{label[b]} {_fmt(scores.get((a, b), 0))}"
        for i, a in enumerate(seen)
        for b in seen[i + 1 :]
    ]
    if pairs:
        lines.append("  pairs: " + ", ".join(pairs))
    return lines


DEFAULT_RESOURCE = "example.com/device"


def topology_document(devices: Sequence[Device], links: Iterable[Link]) -> dict[str, Any]:
    """A plain document of devices and links that :func:`load_topology` reads back."""
    docs: list[dict[str, Any]] = []
    for d in devices:
        doc: dict[str, Any] = {"id": d.id, "resource": d.resource, "numa": list(d.numa_nodes)}
        if d.index is not None:
            doc["index"] = d.index
        if d.parent:
            doc["parent"] = d.parent
        if not d.healthy:
            doc["healthy"] = False
        docs.append(doc)
    return {
        "devices": docs,
        "links": [{"a": x.a, "b": x.b, "score": x.score, "kind": x.kind} for x in links],
    }


def load_topology(path: str | Path) -> tuple[list[Device], list[Link]]:
    """Devices and links from a YAML or JSON file; ConfigError names the file and field."""
    source = str(path)
    try:  # bounded: a FIFO, a huge file or an alias bomb is refused (kits/foreign.py)
        raw = parse_foreign(read_foreign(path, follow=True), as_json=False)
    except ForeignFileError as e:
        raise ConfigError(f"cannot read a topology: {e}", source=source) from None
    return parse_topology(raw, source)


def parse_topology(raw: Any, source: str = "") -> tuple[list[Device], list[Link]]:
    """Devices and links from a document (see :func:`topology_document`)."""

    def fail(reason: str, where: str) -> ConfigError:
        return ConfigError(reason, field=where, source=source)

    if not isinstance(raw, Mapping):
        raise fail("must be a mapping with devices and links", "")
    unknown = sorted(set(raw) - {"devices", "links"})
    if unknown:
        raise fail("unknown key; expected devices, links", unknown[0])
    items = raw.get("devices")
    if not isinstance(items, list) or not items:
        raise fail("must be a non-empty list of devices", "devices")
    devices: list[Device] = []
    for i, item in enumerate(items):
        devices.append(_parse_device(item, f"devices[{i}]", fail))
    ids = [d.id for d in devices]
    for i, d in enumerate(devices):
        if d.id in ids[:i]:
            raise fail(f"device ID {d.id!r} repeats", f"devices[{i}].id")
    known = set(ids) | {d.parent for d in devices if d.parent}
    links: list[Link] = []
    entries = raw.get("links") or []
    if not isinstance(entries, list):
        raise fail("must be a list of links", "links")
    for i, item in enumerate(entries):
        where = f"links[{i}]"
        if not isinstance(item, Mapping):
            raise fail("must be a mapping with a, b, score and kind", where)
        extra = sorted(set(item) - {"a", "b", "score", "kind"})
        if extra:
            raise fail("unknown key; expected a, b, score, kind", f"{where}.{extra[0]}")
        for end in ("a", "b"):
            if item.get(end) not in known:
                raise fail(f"{item.get(end)!r} is not a device in this file", f"{where}.{end}")
        score = item.get("score")
        if isinstance(score, bool) or not isinstance(score, int):
            raise fail(f"must be a whole number, got {score!r}", f"{where}.score")
        links.append(Link(item["a"], item["b"], score, str(item.get("kind") or "")))
    return devices, links


def _parse_device(item: Any, where: str, fail: Any) -> Device:
    if not isinstance(item, Mapping):
        raise fail("must be a mapping with at least an id", where)
    allowed = {"id", "resource", "numa", "index", "parent", "healthy"}
    extra = sorted(set(item) - allowed)
    if extra:
        raise fail(f"unknown key; expected {', '.join(sorted(allowed))}", f"{where}.{extra[0]}")
    dev_id = item.get("id")
    if not isinstance(dev_id, str) or not dev_id:
        raise fail(f"must be a non-empty string, got {dev_id!r}", f"{where}.id")
    numa = item.get("numa", [])
    numa_list = [numa] if isinstance(numa, int) and not isinstance(numa, bool) else numa
    if not isinstance(numa_list, list) or not all(
        isinstance(n, int) and not isinstance(n, bool) for n in numa_list
    ):
        raise fail(f"must be a NUMA node number or a list of them, got {numa!r}", f"{where}.numa")
    index = item.get("index")
    if index is not None and (isinstance(index, bool) or not isinstance(index, int)):
        raise fail(f"must be a whole number, got {index!r}", f"{where}.index")
    healthy = item.get("healthy", True)
    if not isinstance(healthy, bool):
        raise fail(f"must be true or false, got {healthy!r}", f"{where}.healthy")
    return Device(
        dev_id,
        str(item.get("resource") or DEFAULT_RESOURCE),
        healthy=healthy,
        numa_nodes=tuple(numa_list),
        index=index,
        parent=item.get("parent") or None,
    )


async def backend_topology(spec: str | Backend, cfg: Config) -> tuple[list[Device], list[Link]]:
    """Configure one backend, discover once, check the devices as ``run`` and ``list``
    do (refused resource names left out, health checked) and ask for its links (no
    kubelet needed). A failing hook raises BackendError."""
    from hetero_dp.cli.inspect import configured_backend, judged

    async with configured_backend(spec, cfg) as backend:
        found = await backend.call("discover")
        refused = check_names({backend.name: found}, cfg.sharing)
        devices = await judged(backend, [d for d in found if d.id not in refused])
        links = await backend.call("links", devices=devices) if backend.implements("links") else []
    return devices, links


def report(
    source: str | Backend,
    cfg: Config,
    *,
    size: int | None = None,
    must_include: Sequence[str] = (),
    resource: str | None = None,
) -> str:
    """The whole ``hetero-dp topo BACKEND_OR_FILE`` output.

    ``source`` is a topology file (``.yaml``, ``.yml``, ``.json``) or a backend
    spec. The config's sharing applies, so a shared resource shows its replicas
    and the choice follows its ``replicaPolicy``. With several resources,
    ``resource`` picks one (required with ``size``). Raises ConfigError or
    AllocationError with a message for the operator.
    """
    if isinstance(source, Backend):
        physical, links = asyncio.run(backend_topology(source, cfg))
        source = source.name
    elif Path(source).suffix in TOPOLOGY_FILE_SUFFIXES:
        physical, links = load_topology(Path(source))
    else:
        physical, links = asyncio.run(backend_topology(source, cfg))
    advertised = advertise(physical, cfg.sharing)
    names = list(dict.fromkeys(d.resource for d in advertised))
    if resource is not None:
        if resource not in names:
            raise ConfigError(
                f"no devices of {resource}; found: {', '.join(names) or 'none'}",
                field="resource",
                source=source,
            )
        names = [resource]
    elif size is not None and len(names) > 1:
        raise ConfigError(
            f"several resources ({', '.join(names)}): choose one with --resource",
            field="resource",
            source=source,
        )
    devices = [d for d in advertised if d.resource in names]
    if not devices:
        return "no devices found\n"
    policy = DEFAULT_REPLICA_POLICY
    if len(names) == 1:
        policy = cfg.resource_settings(names[0]).policy
    header = f"Resource: {', '.join(names)}\n"
    return header + render_topology(devices, links, size, must_include, policy)
