"""DRA mode's API client (issue 31): one connection attempt per call, one back-off
policy, and the configuration client-go reads (in-cluster service account, kubeconfig)."""

from __future__ import annotations

import base64
import socket
import threading

import pytest
import yaml

from hetero_dp.dra.api import ResourceAPI, make_api_client
from hetero_dp.dra.client import APIError, Backoff, ClusterConfig, KubeClient
from hetero_dp.testing.dra import FakeAPIServer


class Refuser:
    """A listening socket that accepts each connection and closes it at once,
    counting them (an API server that is up but answers nothing)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


def test_a_call_that_gets_no_answer_is_one_connection_attempt():
    refuser = Refuser()
    try:
        client = KubeClient(ClusterConfig(server=f"http://127.0.0.1:{refuser.port}"))
        for _ in range(3):
            with pytest.raises(APIError) as e:
                client.request("GET", "/apis/resource.k8s.io")
            assert e.value.status == 0 and e.value.retriable
        # the kubernetes client made 4 per call (urllib3's 3 retries under ours)
        assert client.connects == 3 and client.most_connects == 1
    finally:
        refuser.close()
    assert refuser.accepted == 3


def test_a_dead_endpoint_is_one_attempt_per_call():
    with FakeAPIServer() as server:
        url = server.url
    client = KubeClient(ClusterConfig(server=url))
    with pytest.raises(APIError, match="cannot reach the API server"):
        client.request("GET", "/api/v1/nodes/x")
    assert client.connects == 1


def test_kept_alive_connections_are_reused_and_a_restart_costs_one_new_one():
    with FakeAPIServer() as server:
        server.add_node("n")
        client = server.client()
        for _ in range(5):
            client.request("GET", "/api/v1/nodes/n")
        assert server.connections == 1 and client.connects == 1
        server.stop()  # cuts the kept-alive connection
        server.start()
        client.request("GET", "/api/v1/nodes/n")  # the stale one is replaced once
        assert client.connects == 2


def test_backoff_grows_with_jitter_up_to_a_cap():
    b = Backoff(base=0.5, cap=4.0, jitter=0.5, rand=lambda: 1.0)  # the lowest draw
    assert [b.next() for _ in range(6)] == [0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    b.reset()
    hi = Backoff(base=0.5, cap=4.0, jitter=0.5, rand=lambda: 0.0)
    assert [hi.next() for _ in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert b.next() == 0.25


def test_the_one_policy_looks_again_within_the_repair_goal():
    """Issue #31: a pool lost while the server was down must be back within 2 s of
    the server answering again, however long the outage. A node in back-off looks
    again at most the cap after its last try, so the cap leaves room under 2 s for
    the relist and the write (the watch and the publisher both use the default)."""
    from hetero_dp.dra.client import RETRY_CAP

    worst = Backoff(rand=lambda: 0.0)  # the highest draw every time
    delays = [worst.next() for _ in range(40)]  # a long outage
    assert max(delays) == RETRY_CAP <= 1.6


def test_in_cluster_config_reads_the_service_account(tmp_path):
    (tmp_path / "token").write_text("tok-1\n")
    (tmp_path / "ca.crt").write_text("not checked here")
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    cfg = ClusterConfig.in_cluster(env, account=tmp_path)
    assert cfg.server == "https://10.96.0.1:443"
    assert cfg.token_file == str(tmp_path / "token") and cfg.ca_file == str(tmp_path / "ca.crt")
    v6 = ClusterConfig.in_cluster({**env, "KUBERNETES_SERVICE_HOST": "fd00::1"}, account=tmp_path)
    assert v6.server == "https://[fd00::1]:443"
    with pytest.raises(ValueError, match="KUBERNETES_SERVICE_HOST"):
        ClusterConfig.in_cluster({}, account=tmp_path)
    with pytest.raises(ValueError, match="no service account token"):
        ClusterConfig.in_cluster(env, account=tmp_path / "missing")


def test_the_token_file_is_sent_and_read_again_after_rotation(tmp_path, monkeypatch):
    token = tmp_path / "token"
    token.write_text("tok-1\n")
    with FakeAPIServer() as server:
        server.add_node("n")
        client = KubeClient(ClusterConfig(server=server.url, token_file=str(token)))
        client.request("GET", "/api/v1/nodes/n")
        token.write_text("tok-2\n")  # the kubelet rotated the projected token
        client.request("GET", "/api/v1/nodes/n")  # within a minute: the cached one
        monkeypatch.setattr("hetero_dp.dra.client.TOKEN_REREAD", 0.0)
        client.request("GET", "/api/v1/nodes/n")
        assert [r.auth for r in server.requests] == [
            "Bearer tok-1",
            "Bearer tok-1",
            "Bearer tok-2",
        ]


def _kubeconfig(path, user, cluster_extra=None):
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "dev",
        "contexts": [{"name": "dev", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [
            {"name": "c", "cluster": {"server": "https://k.example:6443/"} | (cluster_extra or {})}
        ],
        "users": [{"name": "u", "user": user}],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_kubeconfig_current_context_with_token_and_ca(tmp_path):
    ca = base64.b64encode(b"-----BEGIN CERTIFICATE-----\n").decode()
    path = _kubeconfig(tmp_path / "config", {"token": "abc"}, {"certificate-authority-data": ca})
    cfg = ClusterConfig.from_kubeconfig(str(path))
    assert cfg.server == "https://k.example:6443" and cfg.token == "abc"
    assert cfg.ca_data.startswith("-----BEGIN CERTIFICATE-----")
    # relative file paths are relative to the kubeconfig, as kubectl reads them
    path = _kubeconfig(
        tmp_path / "config", {"tokenFile": "tok"}, {"certificate-authority": "ca.pem"}
    )
    cfg = ClusterConfig.from_kubeconfig(None, env={"KUBECONFIG": str(path)})
    assert cfg.token_file == str(tmp_path / "tok") and cfg.ca_file == str(tmp_path / "ca.pem")


def test_kubeconfig_with_an_exec_plugin_is_refused_saying_why(tmp_path):
    path = _kubeconfig(tmp_path / "config", {"exec": {"command": "aws"}})
    with pytest.raises(ValueError, match="exec or auth-provider plugin"):
        ClusterConfig.from_kubeconfig(str(path))


def test_the_cli_builds_a_client_from_a_url_or_a_kubeconfig(tmp_path):
    with FakeAPIServer() as server:
        api = ResourceAPI(make_api_client(server.url))
        assert api.detect() == "v1"
    path = _kubeconfig(tmp_path / "config", {"token": "abc"}, {"insecure-skip-tls-verify": True})
    client = make_api_client(None, str(path))
    assert client.scheme == "https" and client.host == "k.example" and client.port == 6443


def test_the_version_is_read_from_discovery_once_per_process():
    with FakeAPIServer(versions=("v1beta1",)) as server:
        a, b = ResourceAPI(server.client()), ResourceAPI(server.client())
        assert a.detect() == "v1beta1" and b.detect() == "v1beta1"
        assert server.verbs() == {"DISCOVERY": 1}
