"""Running DRA daemons in-process, against the stand-in API server."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hetero_dp.testing.dra.apiserver import FakeAPIServer
from hetero_dp.testing.runner import PluginRunner, keep_off_the_host, test_config


class DRARunner(PluginRunner):
    """Start daemons with the DRA front end (:class:`~hetero_dp.dra.frontend.DRAFrontEnd`)
    under ``root`` against ``api``, built as ``hetero-dp run --mode dra`` builds them.

    Layout: ``root/reg`` (plugins_registry, where a :class:`FakeDRAKubelet`
    looks), ``root/plugins`` (driver sockets and checkpoints), ``root/cdi``
    (CDI specs). Health polling, rediscovery and slice resync are off unless
    ``config`` sets them: tests drive them (``daemon.poll_health()``,
    ``daemon.rediscover()``, ``driver.resync()``).
    """

    def __init__(self, root: Path, api: FakeAPIServer, node: str = "node-a") -> None:
        super().__init__(Path(root) / "dp", Path(root) / "reg")
        self.root = Path(root)
        self.api = api
        self.node = node
        self.create_node = True  # give the API server a Node object for the node

    @property
    def cdi_dir(self) -> Path:
        return self.root / "cdi"

    @property
    def plugins_dir(self) -> Path:
        return self.root / "plugins"

    async def start(  # type: ignore[override]  # DRA daemons take DRA options too
        self,
        *backends: Any,
        config: dict[str, Any] | None = None,
        options: dict[str, dict[str, Any]] | None = None,
        driver_names: dict[str, str] | None = None,
        node: str | None = None,
        api_versions: Sequence[str] | None = None,
        resync_interval: float = 0,
        instance: str = "",
    ) -> Any:
        node_name = self.node if node is None else node
        if self.create_node and node_name and node_name not in self.api.nodes:
            self.api.add_node(node_name)  # the node exists, as in any cluster

        raw = test_config(config, options)
        raw["kubeletDir"] = str(self.plugin_dir)
        raw["pluginsRegistryDir"] = str(self.registry_dir)
        raw.setdefault("cdi", {})["dir"] = str(self.cdi_dir)
        keep_off_the_host(raw, self.root)
        front_end = {
            "node_name": node_name,
            "driver_names": dict(driver_names or {}),
            "plugins_dir": str(self.plugins_dir),
            "resync_interval": resync_interval,
            "instance": instance,
            "api_versions": tuple(api_versions or ()),
            "api_client": self.api.client(),
            "env": {},  # the test's own node and instance, never the host's env
        }
        return await self.assemble(backends, raw, "dra", front_end)
