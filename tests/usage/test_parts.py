"""The attribution's readers on their own: cgroup lines, the checkpoint, the join."""

from __future__ import annotations

import json
import os

import pytest

from hetero_dp import Device, ProcessUsage
from hetero_dp.usage import checkpoint
from hetero_dp.usage.cgroups import ContainerRef, Vanished, parse_cgroup, read_cgroup
from hetero_dp.usage.containerlogs import ContainerNames, parse
from hetero_dp.usage.podresources import ContainerDevices
from hetero_dp.usage.view import Inventory, Owner, build

UID = "787cf967-3c2b-4b8e-9a57-0d0d3c2e1f10"
CID = "a" * 64

# the forms of REFERENCE's list, as the kubelet and the runtimes name them
KNOWN = [
    f"0::/kubepods/burstable/pod{UID}/{CID}",  # cgroupfs v2
    f"0::/kubepods/pod{UID}/{CID}",  # guaranteed: no qos level
    f"12:memory:/kubepods/besteffort/pod{UID}/{CID}\n0::/",  # v1 line (v2 line empty)
    f"0::/kubepods/burstable/pod{UID}/crio-{CID}",  # CRI-O under cgroupfs
    "0::/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope",
    f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope",
    "1:name=systemd:/kubepods.slice/kubepods-besteffort.slice/"
    f"kubepods-besteffort-pod{UID.replace('-', '_')}.slice/docker-{CID}.scope",
    f"0::/kubelet.slice/kubelet-kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/"
    f"cri-containerd-{CID}.scope",  # kind's nested kubelet
]
UNKNOWN = [
    "0::/user.slice/user-1000.slice/session-2.scope",
    "0::/system.slice/containerd.service",
    f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-conmon-{CID}.scope",
    f"0::/kubepods/burstable/pod{UID}",  # the pod's own cgroup, no container
    f"0::/kubepods/burstable/pod{UID}/{CID[:12]}",  # a short ID: no runtime's form
    f"0::/other/pod{UID}/{CID}",  # no kubepods above it
    "garbage without colons",
    "",
]


@pytest.mark.parametrize("text", KNOWN)
def test_known_cgroup_forms_name_the_pod_and_container(text):
    assert parse_cgroup(text) == ContainerRef(UID, CID)


@pytest.mark.parametrize("text", UNKNOWN)
def test_unknown_cgroup_forms_belong_to_no_one(text):
    assert parse_cgroup(text) is None


def test_a_vanished_process_and_a_huge_cgroup_file(tmp_path):
    with pytest.raises(Vanished):
        read_cgroup(str(tmp_path), 4242)
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cgroup").write_text(KNOWN[0] + "\n" + "x" * 70_000)
    assert read_cgroup(str(tmp_path), 7) is None


def _doc(entries):
    return {"Data": {"PodDeviceEntries": entries, "RegisteredDevices": {}}, "Checksum": 1}


ENTRY = {
    "PodUID": UID,
    "ContainerName": "c",
    "ResourceName": "example.com/acme",
    "DeviceIDs": {"-1": ["acme1"], "0": ["acme2"]},
    "AllocResp": "",
}


def test_the_checkpoint_as_kubelet_1_36_writes_it_and_older_lists(tmp_path):
    old = dict(ENTRY, DeviceIDs=["acme3"])  # kubelets before 1.20
    odd = dict(ENTRY, DeviceIDs="acme4")
    entries, skipped = checkpoint.parse(_doc([ENTRY, old, odd, "x"]))
    assert [e.device_ids for e in entries] == [("acme1", "acme2"), ("acme3",)]
    assert skipped == 2
    assert checkpoint.parse({"Data": {"PodDeviceEntries": None}}) == ([], 0)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (None, "missing"),
        (json.dumps(_doc([ENTRY]))[:-20], "not JSON"),
        (json.dumps({"Data": {"PodDeviceEntries": {"a": 1}}}), "not of the shape"),
        (json.dumps([1, 2]), "not of the shape"),
        ("[" * 100_000, "nested deeper"),
        ("fifo", "not a regular file"),
        ("huge", "more than the"),
    ],
)
def test_a_checkpoint_that_cannot_be_used_says_why(tmp_path, content, why):
    path = tmp_path / "kubelet_internal_checkpoint"
    if content == "fifo":
        os.mkfifo(path)  # never blocks the reader
    elif content == "huge":
        with open(path, "wb") as f:
            f.truncate(checkpoint.MAX_CHECKPOINT + 1)
    elif content is not None:
        path.write_text(content)
    with pytest.raises(checkpoint.CheckpointError, match=why):
        checkpoint.read(str(path))


def _dev(i, memory=16384):
    return Device(f"g{i}", "r/x", attributes={"memoryMiB": memory})


def test_the_join_sums_each_containers_processes_and_leaves_out_the_unknown():
    g0, g1 = _dev(0), _dev(1)
    inv = Inventory({"r/x": {"g0::0": g0, "g0::1": g0, "g1": g1}})
    listed = [
        ContainerDevices("a", "ns", "c", "r/x", ("g0::0",)),
        ContainerDevices("b", "ns", "c", "r/x", ("g0::1",)),
        ContainerDevices("w", "ns", "c", "r/x", ("g1",)),
        ContainerDevices("o", "ns", "c", "other/y", ("y0",)),  # not ours
    ]
    uids = {"a": "u-a", "b": "u-b", "w": "u-w"}
    entries = [checkpoint.Entry(uids[c.pod], "c", c.resource, c.device_ids) for c in listed[:3]]
    usages = [
        ProcessUsage("g0", 1, 100, 0.1),
        ProcessUsage("g0", 2, 50, 0.2),  # a second process of pod a
        ProcessUsage("g0", 3, 300),
        ProcessUsage("g0", 4, 999),  # a process of no pod
        ProcessUsage("g1", 5, None, 0.5),
    ]
    refs = {
        1: ContainerRef("u-a", CID),
        2: ContainerRef("u-a", CID),
        3: ContainerRef("u-b", CID),
        4: None,
        5: ContainerRef("u-w", CID),
    }
    view = build(inv, listed, entries, usages, refs)
    assert {(h.device, h.owner.pod) for h in view.holders} == {
        ("g0::0", "a"),
        ("g0::1", "b"),
        ("g1", "w"),
    }
    got = {u.owner.pod: (u.device, u.memory_bytes, u.utilization) for u in view.uses}
    assert got["a"][0] == "g0::0" and got["a"][1] == 150
    assert got["a"][2] == pytest.approx(0.3)
    assert got["b"] == ("g0::1", 300, None)
    assert got["w"] == ("g1", None, 0.5)
    fair = {u.owner.pod: u.fair_share_bytes for u in view.uses}
    assert fair == {"a": 8192 * 1024 * 1024, "b": 8192 * 1024 * 1024, "w": None}
    assert view.unattributed == 1
    assert view.sole == {"g1": Owner("w", "ns", "c")}  # a shared device has no sole holder


def test_a_process_is_read_once_and_a_reused_pid_afresh(tmp_path):
    from hetero_dp.usage.cgroups import CgroupCache

    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cgroup").write_text(KNOWN[0])
    cache = CgroupCache(str(tmp_path))
    assert cache.lookup(7) == ContainerRef(UID, CID)
    assert cache.lookup(7) == ContainerRef(UID, CID)
    assert cache.reads == 1
    # the process ends and a new one gets PID 7, in another pod
    (tmp_path / "7" / "cgroup").unlink()
    (tmp_path / "7").rmdir()
    (tmp_path / "keep").mkdir()  # tmpfs may hand a freed inode number out again at once
    (tmp_path / "7").mkdir()
    other = "0::/kubepods/pod11111111-2222-3333-4444-555555555555/" + "b" * 64
    (tmp_path / "7" / "cgroup").write_text(other)
    assert cache.lookup(7) == ContainerRef("11111111-2222-3333-4444-555555555555", "b" * 64)
    assert cache.reads == 2
    (tmp_path / "7" / "cgroup").unlink()
    (tmp_path / "7").rmdir()
    with pytest.raises(Vanished):
        cache.lookup(7)


def test_a_container_holding_every_replica_holds_the_device_whole():
    g0 = _dev(0)
    inv = Inventory({"r/x": {"g0::0": g0, "g0::1": g0}})
    both = [ContainerDevices("a", "ns", "c", "r/x", ("g0::0", "g0::1"))]
    assert build(inv, both, [], [], {}).sole == {"g0": Owner("a", "ns", "c")}
    one = [ContainerDevices("a", "ns", "c", "r/x", ("g0::0",))]
    assert build(inv, one, [], [], {}).sole == {}


def test_container_log_link_names_parse_one_way_only():
    cid = "0123456789abcdef" * 4
    # legacyLogSymlink: <pod>_<namespace>_<container>-<container ID>.log
    assert parse(f"web-7d4b9-x2x_team-a_side-car-{cid}.log") == (
        cid,
        Owner("web-7d4b9-x2x", "team-a", "side-car"),
    )
    assert parse(f"p.v1_ns_c-{cid}.log") == (cid, Owner("p.v1", "ns", "c"))
    for other in (
        f"p_ns_c-{cid}",  # no .log
        f"p_ns_c_{cid}.log",  # four parts
        f"p_c-{cid}.log",  # two parts
        f"p_ns_{cid}.log",  # no container
        "p_ns_c-0123.log",  # an ID cut short (the kubelet cuts names past 255 bytes)
        f"p_ns_c-{cid[:-1]}!.log",
        f"_ns_c-{cid}.log",
    ):
        assert parse(other) is None, other


def test_container_log_links_are_read_again_only_when_the_dir_changes(tmp_path):
    cid = "ab" * 32
    names = ContainerNames(str(tmp_path / "none"))
    assert names.read() == {} and "No such file" in names.problem
    names = ContainerNames(str(tmp_path))
    assert names.read() == {} and names.problem == ""
    (tmp_path / f"p_ns_c-{cid}.log").symlink_to("/nowhere/0.log")  # dangling: fine
    os.utime(tmp_path, ns=(1, 10**18))  # a new mtime, as creating a link makes
    assert names.read()[cid].container == "c"
    assert ContainerNames("").read() == {}  # off
