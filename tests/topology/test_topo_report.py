"""The `hetero-dp topo` report and topology files."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import yaml

from hetero_dp import AllocationError, ConfigError, Device, Link
from hetero_dp.allocation.sharing import advertise, parse_sharing
from hetero_dp.cli.topo_report import (
    load_topology,
    parse_topology,
    render_topology,
    report,
    topology_document,
)
from hetero_dp.engine.config import load_config

RES = "nvidia.com/gpu"


def node() -> tuple[list[Device], list[Link]]:
    # Four GPUs: 0-1 and 2-3 are NVLink pairs (NV2), the pairs meet across CPUs (SYS).
    devices = [Device(f"GPU-{i}", RES, index=i, numa_nodes=(i // 2,)) for i in range(4)]
    links = []
    for a, b in itertools.combinations(range(4), 2):
        if a // 2 == b // 2:
            links.append(Link(f"GPU-{a}", f"GPU-{b}", 200, "NV2"))
        else:
            links.append(Link(f"GPU-{a}", f"GPU-{b}", 10, "SYS"))
    return devices, links


def matrix_rows(text: str) -> dict[str, list[str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Links")) + 2
    rows = {}
    for line in lines[start:]:
        if not line.strip():
            break
        label, *cells = line.split()
        rows[label] = cells
    return rows


def test_matrix_shows_kinds_scores_and_numa() -> None:
    devices, links = node()
    text = render_topology(devices, links)
    rows = matrix_rows(text)
    assert rows["D0"] == ["X", "NV2/200", "SYS/10", "SYS/10", "0"]
    assert rows["D3"] == ["SYS/10", "SYS/10", "NV2/200", "X", "1"]
    assert "D2   GPU-2" in text
    assert "Chosen" not in text


def test_chosen_set_with_score_and_must_include() -> None:
    devices, links = node()
    text = render_topology(devices, links, size=2, must_include=["GPU-2"])
    assert "Chosen for size 2 (must include GPU-2): D2 D3" in text
    assert "IDs: GPU-2, GPU-3" in text
    assert "score 200, optimal (exact search); NUMA nodes 1" in text
    assert "pairs: D2-D3 200" in text
    # A legend label works as well as an ID.
    assert "D0 D1" in render_topology(devices, links, size=2, must_include=["D1"])


def test_missing_links_and_pair_maps() -> None:
    devices, _ = node()
    text = render_topology(devices, {("GPU-0", "GPU-3"): 60})
    rows = matrix_rows(text)
    assert rows["D0"][3] == "LINK/60" and rows["D3"][0] == "LINK/60"
    assert rows["D1"][2] == "-"
    assert "D0 D3" in render_topology(devices, {("GPU-0", "GPU-3"): 60}, size=2)


def test_unhealthy_and_replicas_collapse_onto_physical_rows() -> None:
    devices, links = node()
    devices[1] = devices[1].with_health(False, "XID 79")
    config = parse_sharing({"timeSlicing": {"resources": [{"name": RES, "replicas": 3}]}})
    text = render_topology(advertise(devices, config), links, size=2, must_include=["GPU-0::0"])
    assert "12 advertised, 4 physical" in text
    assert "3 unhealthy" in text and "UNITS" in text
    assert len(matrix_rows(text)) == 4
    assert "replica policy distributed" in text
    # Unhealthy GPU-1 is not offered: the NV2 partner of GPU-0 is skipped.
    assert "IDs: GPU-0::0, GPU-2::0" in text


@pytest.mark.parametrize(
    ("size", "must", "needle"),
    [(5, [], "allocation_size 5 exceeds"), (2, ["GPU-9"], "not in available: GPU-9"), (0, [], "0")],
)
def test_bad_requests_raise_allocation_error(size: int, must: list[str], needle: str) -> None:
    devices, links = node()
    with pytest.raises(AllocationError, match=needle):
        render_topology(devices, links, size=size, must_include=must)


def test_topology_file_round_trip(tmp_path: Path) -> None:
    devices, links = node()
    devices[3] = devices[3].with_health(False)
    path = tmp_path / "topo.json"
    path.write_text(json.dumps(topology_document(devices, links)))
    loaded, loaded_links = load_topology(path)
    assert [(d.id, d.resource, d.numa_nodes, d.index, d.healthy) for d in loaded] == [
        (d.id, d.resource, d.numa_nodes, d.index, d.healthy) for d in devices
    ]
    assert loaded_links == links
    assert render_topology(loaded, loaded_links, 2) == render_topology(devices, links, 2)


def test_yaml_topology_file(tmp_path: Path) -> None:
    path = tmp_path / "topo.yaml"
    path.write_text(
        "devices:\n- {id: a, numa: 0}\n- {id: b, numa: [1]}\n- {id: c}\n"
        "links:\n- {a: a, b: c, score: 100, kind: NV1}\n"
    )
    devices, links = load_topology(path)
    assert [d.numa_nodes for d in devices] == [(0,), (1,), ()]
    assert "IDs: a, c" in render_topology(devices, links, 2)


@pytest.mark.parametrize(
    ("raw", "field", "reason"),
    [
        ([], "", "must be a mapping"),
        ({"devices": []}, "devices", "non-empty list"),
        ({"devices": [{"id": "a"}], "edges": []}, "edges", "unknown key"),
        ({"devices": [{"name": "a"}]}, "devices[0].name", "unknown key"),
        ({"devices": [{"id": ""}]}, "devices[0].id", "non-empty string"),
        ({"devices": [{"id": "a"}, {"id": "a"}]}, "devices[1].id", "repeats"),
        ({"devices": [{"id": "a", "numa": "0"}]}, "devices[0].numa", "NUMA node"),
        ({"devices": [{"id": "a", "index": 1.5}]}, "devices[0].index", "whole number"),
        ({"devices": [{"id": "a"}], "links": [{"a": "a", "b": "z", "score": 1}]}, "links[0].b",
         "'z' is not a device"),
        ({"devices": [{"id": "a"}, {"id": "b"}], "links": [{"a": "a", "b": "b", "score": "x"}]},
         "links[0].score", "whole number"),
        ({"devices": [{"id": "a"}], "links": ["a-b"]}, "links[0]", "must be a mapping"),
    ],
)  # fmt: skip
def test_bad_topology_documents_name_the_field(raw: object, field: str, reason: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_topology(raw, "node.yaml")
    assert err.value.field == field and err.value.source == "node.yaml"
    assert reason in str(err.value)


def test_unreadable_topology_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read a topology"):
        load_topology(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("devices: [unclosed")
    with pytest.raises(ConfigError, match=str(bad)):
        load_topology(bad)


BACKEND = """
import itertools
from hetero_dp import Device, Link, hookimpl

@hookimpl
def discover():
    gpus = [Device(f"GPU-{i}", "acme.com/gpu", index=i, numa_nodes=(i // 2,)) for i in range(4)]
    return gpus + [Device("nic-0", "acme.com/nic")]

@hookimpl
def links(devices):
    gpus = [d.id for d in devices if d.resource == "acme.com/gpu"]
    out = []
    for a, b in itertools.combinations(gpus, 2):
        nvlink = {a, b} == {"GPU-1", "GPU-3"}
        out.append(Link(a, b, 300 if nvlink else 20, "NV3" if nvlink else "NODE"))
    return out
"""


def test_report_for_a_backend_uses_its_links(tmp_path: Path) -> None:
    spec = tmp_path / "acme.py"
    spec.write_text(BACKEND)
    cfg = load_config(raw={}, env={})
    text = report(str(spec), cfg, size=2, must_include=["GPU-3"], resource="acme.com/gpu")
    assert text.startswith("Resource: acme.com/gpu\n")
    assert "IDs: GPU-1, GPU-3" in text and "score 300" in text
    # Without --size every resource is shown; with it, one must be chosen.
    assert "nic-0" in report(str(spec), cfg)
    with pytest.raises(ConfigError, match="choose one with --resource"):
        report(str(spec), cfg, size=1)
    with pytest.raises(ConfigError, match=r"no devices of acme\.com/fpga"):
        report(str(spec), cfg, resource="acme.com/fpga")


def test_report_applies_sharing_and_the_replica_policy(tmp_path: Path) -> None:
    spec = tmp_path / "acme.py"
    spec.write_text(BACKEND)
    cfg = load_config(
        raw={
            "sharing": {
                "timeSlicing": {
                    "renameByDefault": True,
                    "resources": [{"name": "acme.com/gpu", "replicas": 2}],
                }
            },
            "resources": {"acme.com/gpu.shared": {"replicaPolicy": "packed"}},
        },
        env={},
    )
    text = report(str(spec), cfg, size=2, resource="acme.com/gpu.shared")
    assert "8 advertised, 4 physical" in text
    assert "replica policy packed" in text and "IDs: GPU-0::0, GPU-0::1" in text


def test_report_for_a_topology_file(tmp_path: Path) -> None:
    devices, links = node()
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(topology_document(devices, links)))
    text = report(str(path), load_config(raw={}, env={}), size=3, must_include=["D3"])
    # GPU-0 and GPU-1 tie (SYS/10 to both others, neither on NUMA node 1): order decides.
    assert "IDs: GPU-0, GPU-2, GPU-3" in text
    assert "score 220" in text
