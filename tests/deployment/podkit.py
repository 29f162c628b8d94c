"""Start a rendered pod spec as the kubelet would, one ``podman run`` per container.

``podman kube play`` (4.3) cannot resolve ``fieldRef: spec.nodeName``, so this does
the kubelet's part itself, for the fields our manifests use:

- init containers run first, one after the other, each to completion (exit 0);
  then the containers start (kubelet: pkg/kubelet/kuberuntime, computeInitContainerActions);
- ``command`` replaces the image's ENTRYPOINT and ``args`` its CMD (the Kubernetes
  "Define a command and arguments" page); ``$(VAR)`` in env values, command and args
  expands from the container's env defined before it (``$$`` escapes);
- env ``valueFrom.fieldRef`` (the downward API): ``metadata.name``, ``metadata.namespace``,
  ``metadata.uid``, ``spec.nodeName``, ``status.hostIP``, ``status.podIP``;
- volumes: ``hostPath`` (each host path is stood in by a directory the test gives,
  else a fresh temp dir for ``DirectoryOrCreate``; a ``Directory`` that is not given is
  an error, as on a node without it), ``configMap`` (keys as files), ``emptyDir`` (one
  dir shared by the pod's containers), ``projected`` (service account token, CA,
  namespace); ``readOnly`` mounts are read-only;
- ``terminationMessagePath`` (default /dev/termination-log) is a file the runtime
  mounts into the container, as the kubelet does: a read-only /dev over it breaks
  container creation (the kubelet's runtime reports the same);
- securityContext: ``privileged``, ``capabilities`` (drop/add), ``readOnlyRootFilesystem``
  (no tmpfs added), ``allowPrivilegeEscalation: false`` (no-new-privileges),
  ``runAsUser``/``runAsGroup``;
- stop: SIGTERM, then SIGKILL after ``terminationGracePeriodSeconds`` (default 30), as
  ``podman stop -t``.

Every container runs in the host's network namespace (the tests reach probes on
127.0.0.1): ports are not remapped, so a test gives each pod its own metrics port.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' $(VAR) expansion: known names are replaced, unknown stay, $$ -> $."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR.sub(sub, text)


@dataclass
class Node:
    """What the kubelet of the node knows: its name and IP, and the host paths that
    stand in for the node's (host path -> local dir)."""

    name: str = "gpu-node-1"
    ip: str = "127.0.0.1"
    host_paths: dict[str, Path] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # the node's /proc is this host's (the DaemonSets mount it read-only at /host/proc,
        # for attribution); a test may still give another
        self.host_paths.setdefault("/proc", Path("/proc"))

    # files the node's container runtime adds to every container (host file -> path in
    # the container), as the NVIDIA container runtime injects the driver's libraries
    runtime_mounts: dict[Path, str] = field(default_factory=dict)
    runtime_env: dict[str, str] = field(default_factory=dict)


@dataclass
class Started:
    name: str  # the podman container name
    container: str  # the name in the pod spec
    started: float


class Pod:
    """One pod of a rendered DaemonSet, run by ``engine`` (a scripts/build_images Engine)."""

    def __init__(
        self,
        engine: Any,
        template: Mapping[str, Any],
        node: Node,
        workdir: Path,
        *,
        configmaps: Mapping[str, Mapping[str, str]] | None = None,
        images: Mapping[str, str] | None = None,
        namespace: str = "kube-system",
        name: str = "",
        extra_env: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self.engine = engine
        self.template = template
        self.spec = template["spec"]
        self.node = node
        self.workdir = workdir
        self.configmaps = configmaps or {}
        self.images = images or {}
        self.namespace = namespace
        self.uid = str(uuid.uuid4())
        self.name = name or f"pod-{self.uid[:8]}"
        self.extra_env = extra_env or {}
        self.started: list[Started] = []
        self.volumes: dict[str, tuple[Path, bool]] = {}  # name -> (dir, read-only source)
        self.grace = int(self.spec.get("terminationGracePeriodSeconds", 30))

    # --- what the kubelet prepares ---------------------------------------------------

    def _volume(self, vol: Mapping[str, Any]) -> Path:
        name = vol["name"]
        if name in self.volumes:
            return self.volumes[name][0]
        if "hostPath" in vol:
            path, kind = vol["hostPath"]["path"], vol["hostPath"].get("type", "")
            local = self.node.host_paths.get(path)
            if local is None:
                if kind == "Directory":
                    raise FileNotFoundError(
                        f"volume {name}: hostPath {path} (type Directory) is not on this node"
                    )
                local = Path(tempfile.mkdtemp(prefix="hostpath-", dir=self.workdir))
                self.node.host_paths[path] = local
            local.mkdir(parents=True, exist_ok=True)
        elif "configMap" in vol:
            data = self.configmaps.get(vol["configMap"]["name"])
            if data is None:
                raise KeyError(f"volume {name}: configMap {vol['configMap']['name']} not found")
            local = Path(tempfile.mkdtemp(prefix=f"cm-{name}-", dir=self.workdir))
            for key, text in data.items():
                (local / key).write_text(text)
        elif "emptyDir" in vol:
            local = Path(tempfile.mkdtemp(prefix=f"empty-{name}-", dir=self.workdir))
        elif "projected" in vol:
            local = Path(tempfile.mkdtemp(prefix=f"proj-{name}-", dir=self.workdir))
            for source in vol["projected"]["sources"]:
                if "serviceAccountToken" in source:
                    (local / source["serviceAccountToken"]["path"]).write_text("test-token")
                for item in (source.get("configMap") or {}).get("items", []):
                    (local / item["path"]).write_text("")  # no TLS: the fake API is http
                for item in (source.get("downwardAPI") or {}).get("items", []):
                    (local / item["path"]).write_text(self._field(item["fieldRef"]["fieldPath"]))
        else:
            raise NotImplementedError(f"volume {name}: {sorted(vol)}")
        os.chmod(local, 0o755)
        self.volumes[name] = (local, False)
        return local

    def _field(self, path: str) -> str:
        return {
            "metadata.name": self.name,
            "metadata.namespace": self.namespace,
            "metadata.uid": self.uid,
            "spec.nodeName": self.node.name,
            "spec.serviceAccountName": self.spec.get("serviceAccountName", "default"),
            "status.hostIP": self.node.ip,
            "status.podIP": self.node.ip,  # in the host network
        }[path]

    def env_of(self, c: Mapping[str, Any]) -> dict[str, str]:
        env: dict[str, str] = {}
        for item in c.get("env", []):
            if "value" in item:
                env[item["name"]] = expand(str(item["value"]), env)
            elif "fieldRef" in item.get("valueFrom", {}):
                env[item["name"]] = self._field(item["valueFrom"]["fieldRef"]["fieldPath"])
            else:
                raise NotImplementedError(f"env {item['name']}: {item.get('valueFrom')}")
        env.update(self.extra_env.get(c["name"], {}))
        return env

    def run_args(self, c: Mapping[str, Any], *, detach: bool) -> list[str]:
        """The ``podman run`` command line for container ``c``."""
        cname = f"{self.name}-{c['name']}"
        env = self.env_of(c)
        args = [*self.engine.cmd("run"), *self.engine.run_flags, "--name", cname]
        args += ["--network", "host", "--pull", "never", "--stop-timeout", str(self.grace)]
        if detach:
            args.append("--detach")
        for key, value in {**self.node.runtime_env, **env}.items():
            args += ["--env", f"{key}={value}"]
        vols = {v["name"]: v for v in self.spec.get("volumes", [])}
        for m in c.get("volumeMounts", []):
            local = self._volume(vols[m["name"]])
            mode = "ro" if m.get("readOnly") else "rw"
            args += ["--volume", f"{local}:{m['mountPath']}:{mode}"]
        for host, inside in self.node.runtime_mounts.items():
            args += ["--volume", f"{host}:{inside}:ro"]
        log = self.workdir / f"termination-{cname}"
        log.touch()
        args += ["--volume", f"{log}:{c.get('terminationMessagePath', '/dev/termination-log')}"]
        sc = c.get("securityContext", {})
        if sc.get("privileged"):
            args.append("--privileged")
        for cap in sc.get("capabilities", {}).get("drop", []):
            args += ["--cap-drop", cap]
        for cap in sc.get("capabilities", {}).get("add", []):
            args += ["--cap-add", cap]
        if sc.get("readOnlyRootFilesystem"):
            args += ["--read-only", "--read-only-tmpfs=false"]
        if sc.get("allowPrivilegeEscalation") is False:
            args += ["--security-opt", "no-new-privileges"]
        if "runAsUser" in sc:
            args += ["--user", f"{sc['runAsUser']}:{sc.get('runAsGroup', sc['runAsUser'])}"]
        image = self.images.get(c["image"], c["image"])
        command = [expand(x, env) for x in c.get("command", [])]
        if command:
            args += ["--entrypoint", json.dumps(command)]
        args.append(image)
        args += [expand(x, env) for x in c.get("args", [])]
        return args

    # --- lifecycle --------------------------------------------------------------------

    def start(self, *, timeout: float = 120.0) -> None:
        """Init containers to completion, in order; then every container, detached."""
        for c in self.spec.get("initContainers", []):
            out = subprocess.run(
                self.run_args(c, detach=False), capture_output=True, text=True, timeout=timeout
            )
            self.started.append(Started(f"{self.name}-{c['name']}", c["name"], time.monotonic()))
            if out.returncode != 0:
                raise RuntimeError(
                    f"init container {c['name']} exited {out.returncode}:\n{out.stdout}{out.stderr}"
                )
        for c in self.spec["containers"]:
            subprocess.run(
                self.run_args(c, detach=True),
                check=True,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            self.started.append(Started(f"{self.name}-{c['name']}", c["name"], time.monotonic()))

    def container_name(self, container: str) -> str:
        return f"{self.name}-{container}"

    def logs(self, container: str) -> str:
        out = subprocess.run(
            self.engine.cmd("logs", self.container_name(container)),
            capture_output=True,
            text=True,
            timeout=60,
        )
        return out.stdout + out.stderr

    def state(self, container: str) -> dict[str, Any]:
        out = subprocess.run(
            self.engine.cmd(
                "inspect", "--format", "{{json .State}}", self.container_name(container)
            ),
            capture_output=True,
            text=True,
            timeout=60,
        )
        return json.loads(out.stdout) if out.returncode == 0 else {}

    def stop(self, container: str) -> tuple[float, int]:
        """SIGTERM, SIGKILL after the grace period: (seconds it took, exit code)."""
        started = time.monotonic()
        subprocess.run(
            self.engine.cmd("stop", "-t", str(self.grace), self.container_name(container)),
            capture_output=True,
            timeout=self.grace + 60,
        )
        took = time.monotonic() - started
        return took, int(self.state(container).get("ExitCode", -1))

    def remove(self) -> None:
        names = [s.name for s in self.started]
        if names:
            subprocess.run(
                self.engine.cmd("rm", "--force", "--time", "0", *names),
                capture_output=True,
                timeout=120,
            )
        self.started.clear()


def workdir(prefix: str = "pod-") -> Path:
    """A short dir (unix socket paths stay under 108 bytes)."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def cleanup(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
