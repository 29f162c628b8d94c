"""Fixtures: a stand-in API server, a DRA kubelet and a runner for DRA daemons."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from hetero_dp.testing import short_tempdir
from hetero_dp.testing.dra import DRARunner, FakeAPIServer, FakeDRAKubelet


@pytest.fixture
def api_server() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as server:
        yield server


@pytest_asyncio.fixture
async def dra(api_server: FakeAPIServer) -> AsyncIterator[DRARunner]:
    root = short_tempdir("hdra-")
    runner = DRARunner(root, api_server)
    try:
        yield runner
    finally:
        await runner.stop_all()
        shutil.rmtree(root, ignore_errors=True)


@pytest_asyncio.fixture
async def kubelet(dra: DRARunner) -> AsyncIterator[FakeDRAKubelet]:
    k = FakeDRAKubelet(dra.registry_dir)
    await k.start()
    try:
        yield k
    finally:
        await k.stop()
