"""Per-node configs chosen by the node label nvidia.com/device-plugin.config (NVIDIA's
config-manager rules), written for the plugin's hot reload; the node is read through
the real kubernetes client from a fake API server (tests/nvidia/fake_nodes.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import yaml
from hetero_dp_nvidia.backend import NvidiaBackend
from hetero_dp_nvidia.config_manager import (
    EMPTY_CONFIG,
    NODE_LABEL,
    ConfigManager,
    choose,
    main,
    make_api,
    parse_fallbacks,
    run,
)

from hetero_dp import ConfigError

from .fake_nodes import FakeNodes

pytest.importorskip("kubernetes")
NODE = "gpu-node-1"


def test_choice_rules_are_nvidias():
    assert choose("a100", ["a100", "h100"], "") == "a100"  # named by the label
    assert choose(None, ["a100", "h100"], "h100") == "h100"  # no label: the default
    assert choose(None, ["only"], "") == "only"  # no default: the single config
    assert choose(None, ["a", "b"], "") is None  # neither: the empty config
    # NVIDIA's FALLBACK_STRATEGIES (cmd/config-manager/main.go): named = a config
    # named "default", single = the only one, empty = none; tried in the order given
    assert choose(None, ["default", "b"], "", ("named", "single")) == "default"
    assert choose(None, ["only"], "", ("named", "single")) == "only"
    assert choose(None, ["a", "b"], "", ("empty",)) is None
    with pytest.raises(ConfigError, match="no fallback strategy \\(named,single\\) applies"):
        choose(None, ["a", "b"], "", ("named", "single"))
    assert parse_fallbacks("named, single") == ("named", "single")
    with pytest.raises(ConfigError, match="unknown fallback strategy 'nearest'"):
        parse_fallbacks("named,nearest")
    with pytest.raises(ConfigError, match="names no config \\(there are: a, b\\)"):
        choose("c", ["a", "b"], "")
    with pytest.raises(ConfigError, match="DEFAULT_CONFIG 'z'"):
        choose(None, ["a"], "z")


@pytest.fixture
def api_server():
    fake = FakeNodes()
    url = fake.start()
    yield fake, url
    fake.stop()


def configs(tmp_path: Path, **files: str) -> Path:
    src = tmp_path / "available-configs"
    src.mkdir()
    for name, text in files.items():
        (src / name).write_text(text)
    return src


def test_label_changes_rewrite_the_config_file(api_server, tmp_path):
    fake, url = api_server
    fake.set_labels(NODE, {NODE_LABEL: "a"})
    src = configs(tmp_path, a="version: v1\n# a\n", b="version: v1\n# b\n")
    dst = tmp_path / "config" / "config.yaml"
    dst.parent.mkdir()
    manager = ConfigManager(src, dst)
    stop = threading.Event()
    thread = threading.Thread(
        target=run, args=(manager, make_api(url), NODE), kwargs={"stop": stop}
    )
    thread.start()
    try:
        assert manager.wait_seen(1, 10)
        assert dst.read_text().endswith("# a\n")
        fake.set_labels(NODE, {NODE_LABEL: "b"})
        assert manager.wait_seen(2, 10)
        assert dst.read_text().endswith("# b\n") and manager.current == "b"
        fake.set_labels(NODE, {NODE_LABEL: "nope"})  # names no config: b stays
        assert manager.wait_seen(3, 10)
        assert dst.read_text().endswith("# b\n") and manager.applied == 2
        fake.set_labels(NODE, {})  # label removed, two configs, no default: empty config
        assert manager.wait_seen(4, 10)
        assert dst.read_text() == EMPTY_CONFIG
    finally:
        stop.set()
        fake.set_labels(NODE, {"wake": "the watch"})
        thread.join(10)
    assert not thread.is_alive()


def test_oneshot_exits_with_the_choice_or_fails_for_an_unknown_label(api_server, tmp_path):
    fake, url = api_server
    src = configs(tmp_path, a="version: v1\n")
    dst = tmp_path / "config.yaml"
    env = {
        "NODE_NAME": NODE,
        "CONFIG_FILE_SRCDIR": str(src),
        "CONFIG_FILE_DST": str(dst),
        "ONESHOT": "true",
        "KUBERNETES_API_SERVER": url,
    }
    fake.set_labels(NODE, {})
    assert main([], env) == 0 and dst.read_text() == "version: v1\n"  # the only config
    fake.set_labels(NODE, {NODE_LABEL: "missing"})
    assert main([], env) == 1
    assert main([], {k: v for k, v in env.items() if k != "NODE_NAME"}) == 2


async def test_a_label_change_is_applied_by_hot_reload_restarting_only_what_changed(
    api_server, fake_kubelet, plugin_runner, fake_node, tmp_path
):
    from hetero_dp.engine.config import load_config
    from hetero_dp.ops.reload import ConfigReloader

    fake, url = api_server
    node = fake_node("a100-8x-nvlink.scn")
    base = {
        "kubeletDir": str(fake_kubelet.plugin_dir),
        "pluginsRegistryDir": str(fake_kubelet.registry_dir),
        "healthInterval": 0,
        "rediscoverInterval": 0,
        "version": "v1",
        "flags": {**node.options, "migStrategy": "mixed"},
    }
    shared = {
        **base,
        "sharing": {
            "timeSlicing": {"resources": [{"name": "nvidia.com/mig-1g.5gb", "replicas": 2}]}
        },
    }
    src = configs(tmp_path, plain=yaml.safe_dump(base), shared=yaml.safe_dump(shared))
    dst = tmp_path / "config" / "config.yaml"
    dst.parent.mkdir()
    manager = ConfigManager(src, dst)
    fake.set_labels(NODE, {NODE_LABEL: "plain"})
    api = make_api(url)
    assert run(manager, api, NODE, oneshot=True)  # the init container

    daemon = await plugin_runner.start(NvidiaBackend(environ={}), config=load_config(dst).raw)
    reloader = ConfigReloader(daemon, dst, lambda: load_config(dst, env={}))
    reloader.start()
    stop = threading.Event()
    thread = threading.Thread(target=run, args=(manager, api, NODE), kwargs={"stop": stop})
    thread.start()
    try:
        migs = node.mig_uuids(0)[:2]
        await fake_kubelet.wait_devices(
            "nvidia.com/mig-1g.5gb", lambda d: sorted(d) == sorted(migs)
        )
        # the resources register one by one: the MIG one being ready says nothing of this one
        gpu_stream = await fake_kubelet.wait_registered("nvidia.com/gpu")
        fake.set_labels(NODE, {NODE_LABEL: "shared"})
        results = await reloader.wait_results(1)
        assert results[0].startswith("applied"), results
        devices = await fake_kubelet.wait_devices("nvidia.com/mig-1g.5gb", lambda d: len(d) == 4)
        assert sorted(devices) == sorted(f"{m}::{n}" for m in migs for n in range(2))
        # the unchanged resource kept its stream and registered once
        assert fake_kubelet.resources["nvidia.com/gpu"] is gpu_stream and gpu_stream.stream_open
        assert fake_kubelet.registration_count("nvidia.com/gpu") == 1
    finally:
        stop.set()
        fake.set_labels(NODE, {NODE_LABEL: "shared", "wake": "the watch"})
        thread.join(10)
        await reloader.stop()


def test_a_config_that_is_no_regular_file_keeps_the_current_one(tmp_path, caplog):
    """The ConfigMap's dir read as any shared dir (issue #36): a FIFO named like a
    config is refused at once, not waited on, and the config in force stays."""
    import os

    src = configs(tmp_path, b="version: v1\n# b\n")
    os.mkfifo(src / "a")
    dst = tmp_path / "config.yaml"
    manager = ConfigManager(src, dst)
    assert manager.apply({NODE_LABEL: "b"}) and dst.read_text().endswith("# b\n")
    done = threading.Event()
    result: list[bool] = []
    worker = threading.Thread(
        target=lambda: (result.append(manager.apply({NODE_LABEL: "a"})), done.set()), daemon=True
    )
    worker.start()
    assert done.wait(20), "reading a FIFO config blocked"
    assert result == [False] and dst.read_text().endswith("# b\n") and manager.current == "b"
    assert "config a not read: a FIFO, not a regular file" in caplog.text
