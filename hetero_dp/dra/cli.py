"""The DRA front end from ``hetero-dp run --mode dra`` flags."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from hetero_dp.model.errors import ConfigError

if TYPE_CHECKING:
    from hetero_dp.dra.frontend import DRAFrontEnd


def make_dra_front_end(
    node_name: str | None,
    driver_names: Sequence[str],
    plugins_dir: str | None,
    api_server: str | None,
    kubeconfig: str | None,
) -> DRAFrontEnd:
    from hetero_dp.dra.api import make_api_client
    from hetero_dp.dra.frontend import DRAFrontEnd, DRAOptions

    options = DRAOptions.from_flags(
        node_name=node_name, driver_names=driver_names, plugins_dir=plugins_dir
    )
    if not options.node_name:
        raise ConfigError(
            "DRA mode needs the node's name: --node-name, or NODE_NAME from the downward API",
            field="nodeName",
            source="flag --node-name",
        )
    try:
        client = make_api_client(api_server, kubeconfig)
    except (ValueError, OSError) as e:  # no cluster, an unreadable kubeconfig, a bad CA
        raise ConfigError(
            f"cannot configure the API server client: {e}", field="kubeconfig"
        ) from None
    return DRAFrontEnd(options, client)
