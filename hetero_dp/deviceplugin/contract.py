"""What the kubelet side needs of a resource it serves, and nothing more; and the
session state it keeps of its own.

The protocol side (servicer, endpoint) is written against this contract, so it
knows nothing of backends, sharing or allocation; the engine's
:class:`hetero_dp.engine.resource.Resource` fulfils it. Whether the kubelet has
registered the resource and how many ListAndWatch streams it holds open is this
front end's :class:`Session`, one per endpoint: the engine knows nothing of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from hetero_dp.model.response import ContainerResponse
from hetero_dp.model.state import ResourceState

T = TypeVar("T")


class ServedResource(Protocol):
    name: str
    state: ResourceState  # the advertised device set that ListAndWatch streams

    @property
    def pre_start_required(self) -> bool: ...

    @property
    def preferred_allocation_available(self) -> bool: ...

    def kept(self, request: Hashable) -> Any:
        """What :meth:`answer` made for ``request`` if it would give it again now, else
        None (a plain call: the hot path)."""
        ...

    async def answer(
        self,
        request: Hashable,
        containers: Callable[[], Sequence[Sequence[str]]],
        convert: Callable[[list[ContainerResponse]], T],
    ) -> T:
        """The answer to one Allocate request (``containers()``: each container's device
        IDs), as ``convert`` makes it of the containers' responses; kept (and given
        again) while nothing it depends on changes. AllocationError to refuse."""
        ...

    async def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]: ...

    async def pre_start(self, ids: Sequence[str]) -> None: ...


@dataclass
class Session:
    """One resource's session with the kubelet: registered or not, its ListAndWatch
    streams. Kept by its endpoint (:class:`.endpoint.PluginEndpoint`), read by the
    registrar, the stream watchdog, the servicer and ``/readyz``."""

    registered: bool = False
    open_streams: int = 0
    streams_opened: int = 0  # ListAndWatch streams opened so far (never decreases)
    streams_changed: asyncio.Event = field(default_factory=asyncio.Event)  # every open/close

    @property
    def ready(self) -> bool:
        """Registered, and the kubelet holds a ListAndWatch stream open."""
        return self.registered and self.open_streams > 0
