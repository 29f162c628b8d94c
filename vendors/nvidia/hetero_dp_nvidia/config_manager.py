"""Per-node configs: the node label ``nvidia.com/device-plugin.config`` picks one.

NVIDIA's chart runs a ``config-manager`` sidecar for this; this is ours, with the
same env vars and the same choice rules, and without a signal: it writes the
chosen config file atomically to ``CONFIG_FILE_DST``, which the plugin reads as
its ``CONFIG_FILE``, and the plugin's hot reload applies it (only resources whose
settings changed restart).

Choice (NVIDIA's config-manager, cmd/config-manager/main.go ``updateConfigName``):
the label's value names a file in ``CONFIG_FILE_SRCDIR`` (the mounted ConfigMap);
without the label, ``DEFAULT_CONFIG`` if set; else the ``FALLBACK_STRATEGIES`` in
order: ``named`` (a config named ``default``), ``single`` (the only config, if there
is one), ``empty`` (an empty config: the plugin's defaults). NVIDIA's chart passes
``named,single``; unset, all three apply. A label naming a config that does not
exist, or no strategy that applies, is logged, naming the label and the configs
there are, and the current config stays.

SIGTERM (the kubelet stopping the pod) ends it at once, also while it waits on a
watch: in a container it is PID 1, for which the kernel ignores a signal that has
no handler, so without one every pod stop would wait out its grace period.

Run as ``hetero-dp-nvidia-config-manager`` (``--oneshot`` as an init container,
so the plugin starts with the right file). Needs the ``kubernetes`` client
(``pip install 'hetero-dp-nvidia[config-manager]'``) and RBAC to get and watch
its node.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from hetero_dp import ConfigError, read_foreign, write_atomic

log = logging.getLogger("hetero_dp_nvidia.config_manager")

NODE_LABEL = "nvidia.com/device-plugin.config"  # NVIDIA's label name
EMPTY_CONFIG = "version: v1\n"
MAX_CONFIG = 256 * 1024  # what the daemon reads of a config file (engine/configfile.py)


def available(srcdir: Path) -> list[str]:
    """Config names in the mounted ConfigMap dir (its hidden ``..data`` entries left out)."""
    try:
        return sorted(p.name for p in srcdir.iterdir() if not p.name.startswith("."))
    except OSError:
        return []


FALLBACKS = ("named", "single", "empty")
NAMED_FALLBACK = "default"  # NVIDIA's NamedConfigFallback


def parse_fallbacks(text: str) -> tuple[str, ...]:
    """``named,single`` -> ("named", "single"); unknown names raise ConfigError."""
    names = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [n for n in names if n not in FALLBACKS]
    if unknown:
        raise ConfigError(
            f"unknown fallback strategy {unknown[0]!r} (known: {', '.join(FALLBACKS)})",
            field="FALLBACK_STRATEGIES",
        )
    return names


def choose(
    label: str | None,
    names: list[str],
    default: str,
    fallbacks: tuple[str, ...] = FALLBACKS,
) -> str | None:
    """The config to use for a node label value; None for the empty config.

    Raises ConfigError when the label (or the default) names a config that is
    not there, or when no fallback strategy applies.
    """
    if label:
        if label not in names:
            raise ConfigError(
                f"the node label {NODE_LABEL}={label} names no config "
                f"(there are: {', '.join(names) or 'none'})",
                field=NODE_LABEL,
            )
        return label
    if default:
        if default not in names:
            raise ConfigError(
                f"DEFAULT_CONFIG {default!r} is not among the configs "
                f"({', '.join(names) or 'none'})",
                field="DEFAULT_CONFIG",
            )
        return default
    for fallback in fallbacks:
        if fallback == "named" and NAMED_FALLBACK in names:
            return NAMED_FALLBACK
        if fallback == "single" and len(names) == 1:
            return names[0]
        if fallback == "empty":
            return None
    raise ConfigError(
        f"no node label {NODE_LABEL}, no DEFAULT_CONFIG, and no fallback strategy "
        f"({','.join(fallbacks) or 'none'}) applies (configs: {', '.join(names) or 'none'})",
        field="FALLBACK_STRATEGIES",
    )


class ConfigManager:
    """Keeps ``dst`` equal to the config the node's label chooses."""

    def __init__(
        self,
        srcdir: Path,
        dst: Path,
        default: str = "",
        label: str = NODE_LABEL,
        fallbacks: tuple[str, ...] = FALLBACKS,
    ):
        self.srcdir = srcdir
        self.dst = dst
        self.default = default
        self.label = label
        self.fallbacks = fallbacks
        self.current: str | None = None
        self.applied = 0  # how many times dst was written
        self.seen = 0  # how many label states were looked at
        self._seen_cond = threading.Condition()

    def wait_seen(self, count: int, timeout: float) -> bool:
        """Block until ``count`` label states were handled (for tests and tools)."""
        with self._seen_cond:
            return self._seen_cond.wait_for(lambda: self.seen >= count, timeout)

    def apply(self, labels: Mapping[str, str] | None) -> bool:
        """Write the config that ``labels`` choose; False (logged) when it cannot."""
        try:
            return self._apply(labels)
        finally:
            with self._seen_cond:
                self.seen += 1
                self._seen_cond.notify_all()

    def _apply(self, labels: Mapping[str, str] | None) -> bool:
        value = (labels or {}).get(self.label)
        try:
            name = choose(value, available(self.srcdir), self.default, self.fallbacks)
        except ConfigError as e:
            log.error("%s; the current config (%s) stays", e, self.current or "none")
            return False
        text = EMPTY_CONFIG
        try:  # the ConfigMap's dir: a FIFO or a huge file there must not block or bloat
            if name:
                text = read_foreign(self.srcdir / name, max_bytes=MAX_CONFIG, follow=True).decode()
        except ValueError as e:  # ForeignFileError, UnicodeDecodeError
            log.error("config %s not read: %s; the current config (%s) stays", name, e,
                      self.current or "none")  # fmt: skip
            return False
        try:
            same = read_foreign(self.dst, max_bytes=len(text.encode()) + 1) == text.encode()
        except ValueError:
            same = False
        if not same:
            write_atomic(self.dst, text)
            self.applied += 1
            log.info("config %s written to %s (label %s=%s)", name, self.dst, self.label, value)
        self.current = name
        return True


def node_labels(api: Any, node: str) -> tuple[dict[str, str], str]:
    """The node's labels and its resourceVersion."""
    obj = api.read_node(node)
    return dict(obj.metadata.labels or {}), obj.metadata.resource_version


def label_events(api: Any, node: str, version: str, timeout_s: int) -> Iterator[dict[str, str]]:
    """The node's labels at every change, through a watch (ends at ``timeout_s``)."""
    from kubernetes import watch

    stream = watch.Watch().stream(
        api.list_node,
        field_selector=f"metadata.name={node}",
        resource_version=version,
        timeout_seconds=timeout_s,
    )
    for event in stream:
        if event.get("type") in ("ADDED", "MODIFIED"):
            yield dict(event["object"].metadata.labels or {})


def run(
    manager: ConfigManager,
    api: Any,
    node: str,
    *,
    oneshot: bool = False,
    stop: threading.Event | None = None,
) -> bool:
    """Apply the node's choice, then (unless ``oneshot``) follow label changes until
    ``stop`` is set. Returns whether the last choice could be applied."""
    stop = stop or threading.Event()
    backoff = 1.0
    ok = False
    while not stop.is_set():
        try:
            labels, version = node_labels(api, node)
            ok = manager.apply(labels)
            if oneshot:
                return ok
            for labels in label_events(api, node, version, timeout_s=300):
                ok = manager.apply(labels)
                if stop.is_set():
                    break
            backoff = 1.0  # the watch ended normally: list and watch again
        except Exception as e:  # API errors, network: keep the current config, retry
            if oneshot:
                raise
            log.warning("reading node %s failed: %s; retrying in %gs", node, e, backoff)
            stop.wait(backoff)
            backoff = min(backoff * 2, 30.0)
    return ok


def make_api(api_server: str | None = None) -> Any:
    try:
        from kubernetes import client, config
    except ImportError:
        raise ConfigError(
            "the kubernetes client is missing; pip install 'hetero-dp-nvidia[config-manager]'",
            field="kubernetes",
        ) from None
    if api_server:
        cfg = client.Configuration()
        cfg.host = api_server
        return client.CoreV1Api(client.ApiClient(cfg))
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.CoreV1Api()


def main(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(
        prog="hetero-dp-nvidia-config-manager", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--node-name", default=env.get("NODE_NAME", ""))
    parser.add_argument("--node-label", default=env.get("NODE_LABEL", NODE_LABEL))
    parser.add_argument("--config-file-srcdir", default=env.get("CONFIG_FILE_SRCDIR", ""))
    parser.add_argument("--config-file-dst", default=env.get("CONFIG_FILE_DST", ""))
    parser.add_argument("--default-config", default=env.get("DEFAULT_CONFIG", ""))
    parser.add_argument(
        "--fallback-strategies",
        default=env.get("FALLBACK_STRATEGIES", ",".join(FALLBACKS)),
        help="without label and default: named, single, empty, tried in order",
    )
    parser.add_argument("--api-server", default=env.get("KUBERNETES_API_SERVER", ""))
    parser.add_argument(
        "--oneshot",
        action="store_true",
        default=env.get("ONESHOT", "").lower() in ("1", "true", "yes"),
        help="choose once and exit (the init container)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    missing = [
        n
        for n, v in (
            ("NODE_NAME", args.node_name),
            ("CONFIG_FILE_SRCDIR", args.config_file_srcdir),
            ("CONFIG_FILE_DST", args.config_file_dst),
        )
        if not v
    ]
    if missing:
        print(f"config-manager: set {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        manager = ConfigManager(
            Path(args.config_file_srcdir),
            Path(args.config_file_dst),
            args.default_config,
            args.node_label,
            parse_fallbacks(args.fallback_strategies),
        )
        api = make_api(args.api_server or None)
    except ConfigError as e:
        print(f"config-manager: {e}", file=sys.stderr)
        return 2
    stop = threading.Event()
    handle_termination(stop)
    try:
        ok = run(manager, api, args.node_name, oneshot=args.oneshot, stop=stop)
    except Terminated:
        log.info("stopped by signal; the current config (%s) stays", manager.current or "none")
        return 0
    return 0 if ok else 1


class Terminated(BaseException):
    """Raised in the main thread by the SIGTERM/SIGINT handler (leaves any wait)."""


def handle_termination(stop: threading.Event) -> None:
    """SIGTERM and SIGINT set ``stop`` and raise :class:`Terminated` in the main
    thread, which leaves a blocking watch read (PEP 475 retries a read only when the
    handler returns)."""

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()
        raise Terminated(signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)


if __name__ == "__main__":
    sys.exit(main())
