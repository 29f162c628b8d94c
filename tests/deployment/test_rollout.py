"""A surge rollout of the scaffold's DaemonSet under a real container runtime: the new
pod starts beside the old one, the old one is stopped once the new one is ready, and
the kubelet keeps its devices throughout but for the hand-over.

The kubelet is the project's FakeKubelet with the 1.32 device manager's semantics
(hetero_dp/testing/fake_kubelet/clients.py, after kubelet 1.32
``pkg/kubelet/cm/devicemanager/plugin/v1beta1/handler.go`` runClient and
``manager.go`` PluginDisconnected): when the old pod's stream ends, the kubelet
disconnects the resource's *current* client, the new pod, and marks every device
unhealthy; the new pod re-registers at once. Each pod names its socket after its UID
(``POD_UID`` from the downward API), so the two never share one.

Every pod here runs in the host's network (podkit); a real pod has a network of its
own, so the new pod's probe port is moved (HETERO_DP_METRICS_ADDRESS) where the old one
still holds the manifest's.
"""

from __future__ import annotations

import time
from pathlib import Path

from hetero_dp.testing.fake_kubelet.devices import HealthPoint

from .conftest import KubeletThread, free_port, wait_http
from .test_nvidia_pods import start_pod, wait_registered
from .test_other_pods import SCAFFOLD, scaffold_node

RES = f"{SCAFFOLD['vendor_domain']}/{SCAFFOLD['resource']}"
HANDOVER_BOUND = 0.5  # seconds with no healthy device a hand-over may take (goal: 50 ms)


def zero_windows(points: list[HealthPoint], since: float) -> list[float]:
    """How long each stretch with no healthy device lasted after ``since`` (an open
    stretch counts until now)."""
    windows, began = [], None
    for p in points:
        if p.at < since:
            continue
        if p.healthy == 0 and began is None:
            began = p.at
        elif p.healthy > 0 and began is not None:
            windows.append(p.at - began)
            began = None
    if began is not None:
        windows.append(time.monotonic() - began)
    return windows


def serving(kubelet: KubeletThread, socket_name: str | None = None) -> bool:
    res = kubelet.kubelet.resources.get(RES)
    return (
        res is not None
        and res.current
        and res.stream_open
        and res.allocatable == 2
        and (socket_name is None or Path(res.endpoint).name == socket_name)
    )


def wait_until(check, timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # polling another process's state, not a synchronisation


def test_scaffold_pods_roll_with_surge_and_the_kubelet_keeps_its_devices(
    image, kubelet: KubeletThread, engine, workdir: Path, pods
):
    tag = image("scaffold")
    template, node, rendered = scaffold_node(kubelet, workdir)
    assert template["spec"]["containers"][0]["readinessProbe"]  # what the surge waits on
    container = template["spec"]["containers"][0]["name"]

    old = start_pod(engine, template, node, workdir, pods, images={rendered: tag})
    try:
        wait_registered(old, kubelet, RES)
        wait_until(lambda: serving(kubelet), what="the old pod's devices")
        wait_http("http://127.0.0.1:9435/readyz")
    except BaseException:
        print(old.logs(container))
        raise
    [old_socket] = kubelet.plugin_sockets()
    assert old.uid.replace("-", "")[:12] in old_socket, "the socket is named after the pod"

    port = free_port()
    new = start_pod(
        engine,
        template,
        node,
        workdir,
        pods,
        images={rendered: tag},
        extra_env={container: {"HETERO_DP_METRICS_ADDRESS": f"127.0.0.1:{port}"}},
    )
    try:
        # the new pod registers beside the old one and becomes ready (the surge's gate)
        wait_until(
            lambda: len(kubelet.plugin_sockets()) == 2 and serving(kubelet),
            what="the new pod's registration",
        )
        [new_socket] = [s for s in kubelet.plugin_sockets() if s != old_socket]
        assert new.uid.replace("-", "")[:12] in new_socket
        wait_until(lambda: serving(kubelet, new_socket), what="the new pod as the current client")
        wait_http(f"http://127.0.0.1:{port}/readyz")
        registrations = kubelet.kubelet.registration_count(RES)

        # the DaemonSet controller deletes the old pod
        since = time.monotonic()
        took, code = old.stop(container)
        assert code == 0 and took < old.grace, (took, code, old.logs(container))

        # kubelet 1.32 dropped the new pod when the old stream ended; it came back at once
        wait_until(
            lambda: (
                kubelet.kubelet.registration_count(RES) > registrations
                and serving(kubelet, new_socket)
            ),
            what="the new pod's re-registration after the old one's stream ended",
        )
        timeline = [p for p in kubelet.kubelet.device_manager.timeline if p.resource == RES]
        dips = zero_windows(timeline, since)
        assert any(p.why == "disconnect" and p.at >= since for p in timeline), timeline
        assert dips and max(dips) < HANDOVER_BOUND, dips
        print(f"\nsurge rollout under the runtime: dip {max(dips) * 1000:.0f} ms")
        assert kubelet.plugin_sockets() == [new_socket], "the old pod took only its own socket"
        first = sorted(kubelet.kubelet.resources[RES].devices)[0]
        response = kubelet.call(kubelet.kubelet.allocate(RES, [first]))
        assert [d.host_path for d in response.devices] == ["/dev/acme0"]
    except BaseException:
        print(new.logs(container))
        raise
    took, code = new.stop(container)
    assert code == 0 and took < new.grace, (took, code, new.logs(container))
    assert kubelet.plugin_sockets() == []
