"""One socket found in ``plugins_registry``, as the kubelet's plugin watcher handles it
(docs/sources.md#device-plugin-api): the fake kubelet (device plugins in watcher mode)
and the fake DRA kubelet both dial it here.

The watcher checks that the file is a socket, calls ``GetInfo``, hands the answer to
the handler of its plugin type, and tells the plugin the verdict with
``NotifyRegistrationStatus``. A plugin type no handler of this kubelet takes is left
alone (the real watcher routes by type to the device-plugin or DRA handler).
"""

from __future__ import annotations

import contextlib
import stat
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc

from hetero_dp.api import pluginregistration_v1_pb2 as reg_pb
from hetero_dp.api import pluginregistration_v1_pb2_grpc as reg_grpc

#: What a handler answers for a plugin type it does not handle: no verdict is sent.
NOT_MINE = object()

#: ``judge(info)``: None when the plugin is registered, else why not, or NOT_MINE.
Judge = Callable[[reg_pb.PluginInfo], Awaitable[Any]]


async def dial_registration(
    path: Path,
    judge: Judge,
    reject: Callable[[str], Awaitable[Any]],
    *,
    timeout: float,
    options: Sequence[tuple[str, Any]] = (),
) -> Any:
    """Register the plugin behind the socket ``path``: ``GetInfo``, ``judge`` its answer,
    ``NotifyRegistrationStatus``; returns the verdict (None, why not, or NOT_MINE).
    A ``GetInfo`` that fails is passed to ``reject`` (returns why); a path that is gone
    or no socket is skipped as NOT_MINE (a file renamed into place after its creation
    event, or another program's file)."""
    try:
        if not stat.S_ISSOCK(path.lstat().st_mode):
            return NOT_MINE
    except FileNotFoundError:
        return NOT_MINE
    async with grpc.aio.insecure_channel(f"unix://{path}", options=list(options)) as channel:
        stub = reg_grpc.RegistrationStub(channel)
        try:
            info = await stub.GetInfo(reg_pb.InfoRequest(), timeout=timeout, wait_for_ready=True)
        except grpc.aio.AioRpcError as e:
            why = f"GetInfo on {path} failed: {e.code().name}"
            await reject(why)
            return why
        problem = await judge(info)
        if problem is NOT_MINE:
            return problem
        with contextlib.suppress(grpc.aio.AioRpcError):
            await stub.NotifyRegistrationStatus(
                reg_pb.RegistrationStatus(plugin_registered=problem is None, error=problem or ""),
                timeout=timeout,
            )
    return problem
