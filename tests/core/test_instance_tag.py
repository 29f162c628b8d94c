"""What names an instance's sockets (issue 28 point 1): its pod, from the downward API,
so that the old and the new pod of a surge rollout never share a socket."""

from __future__ import annotations

from hetero_dp.model.names import INSTANCE_TAG_LENGTH, instance_tag, socket_name

UID = "0A1B2C3D-4e5f-6789-abcd-ef0123456789"


def test_the_pod_uid_names_the_instance_before_the_pod_name():
    assert instance_tag({"POD_UID": UID, "POD_NAME": "dp-x"}) == "0a1b2c3d4e5f"
    assert instance_tag({"HETERO_DP_POD_UID": "ffff", "POD_UID": UID}) == "ffff"


def test_the_pod_name_when_no_uid_hashed_when_long():
    assert instance_tag({"POD_NAME": "hetero-dp-7xk2p"}) == "hetero-dp-7xk2p"
    long = instance_tag({"POD_NAME": "a" * 40})
    assert len(long) == INSTANCE_TAG_LENGTH and long != instance_tag({"POD_NAME": "b" * 40})


def test_without_either_each_start_gets_its_own_tag():
    tags = {instance_tag({}) for _ in range(50)}
    assert len(tags) == 50
    assert all(t.startswith("u") and len(t) == INSTANCE_TAG_LENGTH for t in tags)


def test_two_pods_of_one_resource_get_two_sockets():
    old = socket_name("hetero-dp", "nvidia.com/gpu", instance_tag({"POD_UID": UID}))
    new = socket_name("hetero-dp", "nvidia.com/gpu", instance_tag({"POD_UID": "9" * 32}))
    assert old == "hetero-dp-nvidia.com_gpu-0a1b2c3d4e5f.sock" and new != old
