"""Text for ``hetero-dp topo``: what the allocation engine sees, like ``nvidia-smi topo -m``.

The report has three parts: a legend of devices (short label, ID, NUMA node,
health), the device-by-device matrix whose cells read ``KIND/score`` (``X`` on
the diagonal, ``-`` for a pair without a link, which scores 0), and, when a
size is given, the set the engine would choose with its score and the pairs
that make it up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from .device import Device, Link
from .preferred import explain_preferred, link_scores, scoring_id
from .sharing import DEFAULT_REPLICA_POLICY

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

    With ``size``, also the set the engine chooses; ``must_include`` entries may
    be device IDs or the short labels of the legend (``D0`` ...). Raises
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
    out.append(f"  {'':<4} {'ID':<{id_width}}  {'NUMA':<6} HEALTH     UNITS")
    for p in phys:
        group = rows[p]
        healthy = sum(1 for d in group if d.healthy)
        health = "Healthy" if healthy == len(group) else f"{len(group) - healthy} unhealthy"
        out.append(
            f"  {label[p]:<4} {p:<{id_width}}  {_numa(group[0]):<6} {health:<10} {len(group)}"
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
    choice = explain_preferred(devices, must, size, scores, policy)
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
