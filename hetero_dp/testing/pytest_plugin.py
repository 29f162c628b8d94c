"""pytest fixtures for plugin authors (registered through the ``pytest11`` entry point).

``fake_kubelet``: a started :class:`FakeKubelet` in a short temp dir, with a
``plugins_registry`` dir beside it for watcher mode.
``plugin_runner``: a :class:`PluginRunner` bound to that kubelet's dir;
``await plugin_runner.start("acme.py")`` serves a plugin, stopped at teardown (a
relative path is found from the working directory or else the test file's dir).

Needs pytest-asyncio (``pip install hetero-dp[testing]``).
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import pytest

try:
    import pytest_asyncio
except ImportError:  # fixtures need pytest-asyncio; without it, offer none
    pytest_asyncio = None  # type: ignore[assignment]


if TYPE_CHECKING:  # imported lazily so coverage of a test run sees every import
    from hetero_dp.testing.fake_kubelet import FakeKubelet
    from hetero_dp.testing.runner import PluginRunner

if pytest_asyncio is not None:

    @pytest_asyncio.fixture
    async def fake_kubelet() -> AsyncIterator[FakeKubelet]:
        from hetero_dp.testing.fake_kubelet import FakeKubelet
        from hetero_dp.testing.runner import short_tempdir

        root = short_tempdir()
        kubelet = FakeKubelet(root / "dp", root / "reg")
        await kubelet.start()
        try:
            yield kubelet
        finally:
            await kubelet.stop()
            shutil.rmtree(root, ignore_errors=True)

    @pytest_asyncio.fixture
    async def plugin_runner(
        fake_kubelet: FakeKubelet, request: pytest.FixtureRequest
    ) -> AsyncIterator[PluginRunner]:
        from hetero_dp.testing.runner import PluginRunner

        runner = PluginRunner(
            fake_kubelet.plugin_dir, fake_kubelet.registry_dir, base_dir=request.path.parent
        )
        try:
            yield runner
        finally:
            await runner.stop_all()
