"""pytest fixtures for plugin authors (registered through the ``pytest11`` entry point).

``fake_kubelet``: a started :class:`FakeKubelet` in a short temp dir, with a
``plugins_registry`` dir beside it for watcher mode.
``plugin_runner``: a :class:`PluginRunner` bound to that kubelet's dir;
``await plugin_runner.start("acme.py")`` serves a plugin, stopped at teardown (a
relative path is found from the working directory or else the test file's dir).

Needs pytest-asyncio (``pip install hetero-dp[testing]``). An ``async def`` test runs
as written, with no pytest config: where pytest-asyncio is in strict mode (its default,
when a project sets no ``asyncio_mode``), this plugin marks each coroutine test that has
no ``asyncio``, ``anyio`` or ``trio`` marker with ``@pytest.mark.asyncio`` itself.
"""

from __future__ import annotations

import inspect
import shutil
from collections.abc import AsyncIterator, Generator
from typing import TYPE_CHECKING

import pytest

try:
    import pytest_asyncio
except ImportError:  # fixtures need pytest-asyncio; without it, offer none
    pytest_asyncio = None  # type: ignore[assignment]


#: Markers that say which async runner takes a test: a test with one is left alone.
ASYNC_MARKERS = ("asyncio", "anyio", "trio")


def _strict(config: pytest.Config) -> bool:
    """pytest-asyncio in strict mode: coroutine tests run only when marked."""
    mode = config.getoption("asyncio_mode", None) or config.getini("asyncio_mode")
    return str(mode) == "strict"


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Without a pytest config, pytest-asyncio (0.24 and later) warns on every run that
    ``asyncio_default_fixture_loop_scope`` is unset. An author who set nothing gets
    ``function``, the default its warning announces, and no warning; a project that
    sets the option (in its ini file or with ``-o``) keeps its own value."""
    if pytest_asyncio is None:
        return
    try:
        unset = not config.getini("asyncio_default_fixture_loop_scope")
    except ValueError:  # a pytest-asyncio without the option
        return
    cache = getattr(config, "_inicache", None)
    if unset and isinstance(cache, dict):
        cache["asyncio_default_fixture_loop_scope"] = "function"


# Inner to pytest-asyncio's own wrapper of this hook (trylast), which turns a test it
# finds marked into a coroutine-running item: the mark must be there before it looks.
@pytest.hookimpl(hookwrapper=True, trylast=True)
def pytest_pycollect_makeitem(
    collector: pytest.Collector, name: str, obj: object
) -> Generator[None, object, None]:
    outcome = yield
    if pytest_asyncio is None or not inspect.iscoroutinefunction(obj):
        return
    if not _strict(collector.config):
        return
    result = outcome.get_result()  # type: ignore[attr-defined]
    items = result if isinstance(result, list) else [result] if result is not None else []
    for item in items:
        if isinstance(item, pytest.Function) and not any(
            item.get_closest_marker(m) for m in ASYNC_MARKERS
        ):
            item.add_marker(pytest.mark.asyncio)


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
