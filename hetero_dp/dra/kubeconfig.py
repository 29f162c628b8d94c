"""Where the API server is and how to authenticate to it, as client-go finds out.

In a pod the service account (``KUBERNETES_SERVICE_HOST``/``_PORT``, the token
and ``ca.crt`` under ``/var/run/secrets/kubernetes.io/serviceaccount``,
``rest.InClusterConfig``), elsewhere a kubeconfig (``$KUBECONFIG`` or
``~/.kube/config``; the current context's cluster ``server``,
``certificate-authority(-data)``, ``insecure-skip-tls-verify`` and user
``token``, ``tokenFile``, ``client-certificate(-data)``/``client-key(-data)``).
Exec and auth-provider plugins are refused with a message saying so.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass
class ClusterConfig:
    """Where the API server is and how to authenticate to it."""

    server: str
    token: str = ""
    token_file: str = ""
    ca_file: str = ""
    ca_data: str = ""  # PEM
    cert_file: str = ""
    key_file: str = ""
    cert_data: bytes = b""  # PEM
    key_data: bytes = b""  # PEM
    insecure: bool = False

    @classmethod
    def in_cluster(
        cls, env: Mapping[str, str] | None = None, account: Path = SERVICE_ACCOUNT
    ) -> ClusterConfig:
        """The pod's service account, as client-go's ``rest.InClusterConfig``."""
        env = os.environ if env is None else env
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise ValueError(
                "not in a cluster: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be set"
            )
        token_file = account / "token"
        if not token_file.is_file():
            raise ValueError(f"no service account token at {token_file}")
        if ":" in host:  # an IPv6 address
            host = f"[{host}]"
        ca = account / "ca.crt"
        return cls(
            server=f"https://{host}:{port}",
            token_file=str(token_file),
            ca_file=str(ca) if ca.is_file() else "",
        )

    @classmethod
    def from_kubeconfig(
        cls, path: str | None = None, env: Mapping[str, str] | None = None
    ) -> ClusterConfig:
        """The current context of a kubeconfig (``path``, else ``$KUBECONFIG``'s first
        file, else ``~/.kube/config``)."""
        env = os.environ if env is None else env
        if not path:
            listed = [p for p in env.get("KUBECONFIG", "").split(os.pathsep) if p]
            path = listed[0] if listed else str(Path.home() / ".kube" / "config")
        from hetero_dp.kits.foreign import ForeignFileError, parse_foreign, read_foreign

        try:  # bounded (a FIFO, an alias bomb); YAML only here: a pod reads none
            doc = parse_foreign(read_foreign(path, follow=True), as_json=False) or {}
        except ForeignFileError as e:
            raise ValueError(f"cannot read kubeconfig {path}: {e}") from None
        if not isinstance(doc, dict):
            raise ValueError(f"kubeconfig {path}: not a mapping")

        def named(kind: str, name: str) -> dict[str, Any]:
            for item in doc.get(kind) or []:
                if isinstance(item, dict) and item.get("name") == name:
                    found = item.get(kind[:-1]) or {}
                    return found if isinstance(found, dict) else {}
            raise ValueError(f"kubeconfig {path}: no {kind[:-1]} named {name!r}")

        current = doc.get("current-context")
        if not current:
            raise ValueError(f"kubeconfig {path}: no current-context")
        context = named("contexts", current)
        cluster = named("clusters", str(context.get("cluster", "")))
        user = named("users", str(context.get("user", ""))) if context.get("user") else {}
        if not cluster.get("server"):
            raise ValueError(f"kubeconfig {path}: cluster of context {current!r} has no server")
        if "exec" in user or "auth-provider" in user:
            raise ValueError(
                f"kubeconfig {path}: user of context {current!r} authenticates through an "
                "exec or auth-provider plugin, which DRA mode does not run; use a token or a "
                "client certificate (or run in the cluster)"
            )
        base = Path(path).parent

        def file(key: str, source: dict[str, Any]) -> str:
            value = source.get(key)
            return str(base / value) if value else ""

        def data(key: str, source: dict[str, Any]) -> bytes:
            value = source.get(key)
            return base64.b64decode(value) if value else b""

        return cls(
            server=str(cluster["server"]).rstrip("/"),
            token=str(user.get("token") or ""),
            token_file=file("tokenFile", user),
            ca_file=file("certificate-authority", cluster),
            ca_data=data("certificate-authority-data", cluster).decode(),
            cert_file=file("client-certificate", user),
            key_file=file("client-key", user),
            cert_data=data("client-certificate-data", user),
            key_data=data("client-key-data", user),
            insecure=bool(cluster.get("insecure-skip-tls-verify")),
        )


def load_config(
    api_server: str | None = None,
    kubeconfig: str | None = None,
    env: Mapping[str, str] | None = None,
) -> ClusterConfig:
    """``api_server`` (a URL, no authentication) if given, else in-cluster when
    ``KUBERNETES_SERVICE_HOST`` is set and no kubeconfig is named, else a kubeconfig."""
    env = os.environ if env is None else env
    if api_server:
        return ClusterConfig(server=api_server.rstrip("/"))
    if not kubeconfig and env.get("KUBERNETES_SERVICE_HOST"):
        return ClusterConfig.in_cluster(env)
    return ClusterConfig.from_kubeconfig(kubeconfig, env)


def ssl_context(cfg: ClusterConfig) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    if cfg.insecure:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif cfg.ca_file or cfg.ca_data:
        ctx = ssl.create_default_context(cafile=cfg.ca_file or None, cadata=cfg.ca_data or None)
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file or None)
    elif cfg.cert_data:
        # load_cert_chain takes files only: a private file for the moment of loading
        with tempfile.TemporaryDirectory(prefix="hetero-dp-") as tmp:
            cert, key = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
            cert.write_bytes(cfg.cert_data)
            key.touch(mode=0o600)
            key.write_bytes(cfg.key_data)
            ctx.load_cert_chain(str(cert), str(key) if cfg.key_data else None)
    return ctx
