"""Representative device sets, built as a backend would build its records."""

from __future__ import annotations

from hetero_dp import Device, DeviceNode, Mount

NVIDIA_KIND = "k8s.device-plugin.nvidia.com/gpu"
GPU_UUIDS = [
    "GPU-8c0f4b9e-21aa-4f3c-9a53-0c1d2e3f4a50",
    "GPU-1d2e3f4a-5b6c-4d7e-8f90-a1b2c3d4e5f6",
]
MIG_UUID = "MIG-5c2f8e0a-77b1-5b19-9f2e-3c4d5e6f7a8b"


def accel_glob(n: int = 4) -> list[Device]:
    """A plain ``/dev/accel/accel*`` glob: one node per device, nothing shared."""
    return [
        Device(
            id=f"accel{i}",
            resource="acme.com/accel",
            nodes=(DeviceNode(f"/dev/accel/accel{i}"),),
        )
        for i in range(n)
    ]


def amd_gpus() -> list[Device]:
    """AMD-like: card/renderD per GPU, shared /dev/kfd; IDs are PCI addresses."""
    out = []
    for i, bus in enumerate(["0000:03:00.0", "0000:43:00.0"]):
        out.append(
            Device(
                id=bus,
                resource="amd.com/gpu",
                numa_nodes=(i,),
                nodes=(
                    DeviceNode("/dev/kfd", shared=True),
                    DeviceNode(f"/dev/dri/card{i + 1}"),
                    DeviceNode(f"/dev/dri/renderD{128 + i}"),
                ),
            )
        )
    return out


def _control_nodes() -> tuple[DeviceNode, ...]:
    return tuple(
        DeviceNode(p, shared=True)
        for p in (
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidia-modeset",
        )
    )


def nvidia_gpus() -> list[Device]:
    """NVIDIA-like: shared control nodes, /dev/nvidia<minor> per GPU, a MIG slice with
    its caps, per-GPU env (a list key), a shared read-only mount of a tools dir."""
    tools = Mount("/usr/local/nvidia/bin", "/usr/local/nvidia/bin", shared=True)
    gpus = [
        Device(
            id=uuid,
            resource="nvidia.com/gpu",
            index=i,
            nodes=(*_control_nodes(), DeviceNode(f"/dev/nvidia{i}")),
            mounts=(tools,),
            env={"NVIDIA_VISIBLE_DEVICES": uuid, "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"},
        )
        for i, uuid in enumerate(GPU_UUIDS)
    ]
    mig = Device(
        id=MIG_UUID,
        resource="nvidia.com/gpu",
        parent=GPU_UUIDS[0],
        nodes=(
            *_control_nodes(),
            DeviceNode("/dev/nvidia0"),
            DeviceNode("/dev/nvidia-caps/nvidia-cap21", permissions="r"),
            DeviceNode("/dev/nvidia-caps/nvidia-cap22", permissions="r"),
        ),
        mounts=(tools,),
        env={"NVIDIA_VISIBLE_DEVICES": MIG_UUID, "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"},
    )
    return [*gpus, mig]


def nvidia_by_index() -> list[Device]:
    """The same GPUs under the ``index`` ID strategy (``0``, ``1``, MIG ``0:0``)."""
    import dataclasses

    a, b, mig = nvidia_gpus()
    return [
        dataclasses.replace(a, id="0"),
        dataclasses.replace(b, id="1"),
        dataclasses.replace(mig, id="0:0", parent="0"),
    ]
