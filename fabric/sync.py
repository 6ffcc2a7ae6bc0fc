"""connect(): the fabric's API for any caller, with or without an event loop (Jupyter too).

The async core (coordinator.Fabric) runs on an event loop of its own, on a daemon thread.
Every public call has a sync form, which blocks the calling thread (also one whose event
loop is running, like a notebook's: the core never needs that loop), and an async form
(`*_async`, `async with`, `async for`), which awaits the core from the caller's loop. Ctrl-C
during a sync call cancels it on the core's loop and waits for its clean-up (a block's
release, a map's teardown) before KeyboardInterrupt goes on. The connection closes at
interpreter exit if it was not closed before.

    fabric = vramfabric.connect()
    with fabric.gpu(vram="2GiB") as gpu:
        print(gpu.run(sum, [1, 2, 3]))
"""

from __future__ import annotations

import asyncio
import atexit
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import attrs

from vramfabric.broker.settings import BrokerSettings
from vramfabric.coordinator.aggregate import Aggregator
from vramfabric.coordinator.api.fabric import Fabric
from vramfabric.coordinator.calls.calling import to_own_streams
from vramfabric.coordinator.calls.interactive import GpuSession
from vramfabric.coordinator.jobs.job import Job
from vramfabric.coordinator.jobs.work import JobWork
from vramfabric.coordinator.run.jobresult import JobResult
from vramfabric.coordinator.settings import CoordinatorSettings

from .in_place import InPlaceFabric, InPlaceSettings
from .loop_thread import LoopThread, Relay
from .syncjob import SyncJob

T = TypeVar("T")

__all__ = ["LoopThread", "SyncFabric", "connect", "connect_fabric"]


@attrs.define
class SyncGpu:
    """A leased slice in a `with fabric.gpu()` block; `run` calls a function on it."""

    _loop: LoopThread
    session: GpuSession

    @property
    def node(self) -> str:
        """The node holding the slice."""
        return self.session.node

    def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` run on the slice; raises what it raised there (see GpuSession).

        What `fn` prints there is printed here as it prints it, by this thread (in a notebook:
        into the running cell).
        """
        timeout_s = kwargs.pop("timeout_s", None)
        relay = Relay()
        call = self.session.call(fn, args, kwargs, timeout_s=timeout_s, on_output=relay.post)
        return self._loop.call(call, relay)  # type: ignore[no-any-return]

    def run_work(self, work: JobWork, payload: Any, timeout_s: float | None = None) -> Any:
        """Uploaded work of its own run on `payload` on the slice (see GpuSession.run_work)."""
        relay = Relay()
        call = self.session.run_work(work, payload, timeout_s=timeout_s, on_output=relay.post)
        return self._loop.call(call, relay)

    async def run_async(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """The async form of `run` (what `fn` prints is printed on the caller's loop)."""
        timeout_s = kwargs.pop("timeout_s", None)
        caller = asyncio.get_running_loop()

        def on_output(stream: str, text: str) -> None:
            caller.call_soon_threadsafe(to_own_streams, stream, text)

        call = self.session.call(fn, args, kwargs, timeout_s=timeout_s, on_output=on_output)
        return await self._loop.call_async(call)


@attrs.define
class GpuBlock:
    """`with` or `async with`: one slice leased for the block, released however it ends."""

    _loop: LoopThread
    _block: AbstractAsyncContextManager[GpuSession]

    def __enter__(self) -> SyncGpu:
        return SyncGpu(self._loop, self._loop.call(self._block.__aenter__()))

    def __exit__(self, *exc: object) -> None:
        # The block's exception stays in this thread: the release needs none of it, and a
        # KeyboardInterrupt thrown into the core's loop would stop that loop.
        self._loop.call(self._block.__aexit__(None, None, None))

    async def __aenter__(self) -> SyncGpu:
        return SyncGpu(self._loop, await self._loop.call_async(self._block.__aenter__()))

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.shield(self._loop.call_async(self._block.__aexit__(None, None, None)))


@attrs.define
class MapResults:
    """The results of `fabric.map`: iterate with `for` or `async for`; `close` stops the rest.

    Leaving a loop over it early (`break`, `return`, an exception) stops the map and releases
    every lease before the next statement runs, with no call to `close` and no wait for the
    garbage collector: each loop gets a fresh iterator that only the loop holds, so CPython
    frees it, and closes it, the moment the loop lets go of it.
    """

    _loop: LoopThread
    _results: AsyncIterator[Any]

    def __iter__(self) -> Iterator[Any]:
        # Not kept here: a reference from this object (which the generator's frame holds)
        # would make a cycle that only the garbage collector breaks, and the leases would be
        # held until it ran.
        return self._pull()

    def _pull(self) -> Iterator[Any]:
        try:
            while True:
                try:
                    yield self._loop.call(_next(self._results))
                except StopAsyncIteration:
                    return
        finally:
            # Also when the loop that held this generator let go of it (close() at once).
            self._loop.call_or_start(_close(self._results))

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._pull_async()

    async def _pull_async(self) -> AsyncIterator[Any]:
        try:
            while True:
                try:
                    yield await self._loop.call_async(_next(self._results))
                except StopAsyncIteration:
                    return
        finally:
            await self.close_async()

    def close(self) -> None:
        """Stop the map: cancel what is left, release every lease."""
        self._loop.call(_close(self._results))

    async def close_async(self) -> None:
        """The async form of `close`."""
        await self._loop.call_async(_close(self._results))


async def _next(results: AsyncIterator[Any]) -> Any:
    return await results.__anext__()


async def _close(results: AsyncIterator[Any]) -> None:
    await results.aclose()  # type: ignore[attr-defined]


@attrs.define
class SyncFabric:
    """A connected fabric usable from any thread; the async core is `core` (on its own loop)."""

    _loop: LoopThread
    core: Fabric
    _closed: bool = attrs.field(default=False, init=False)

    def gpu(self, vram: int | str | None = None, *, wait_s: float | None = None) -> GpuBlock:
        """One slice of `vram` ("2GiB", bytes; default the slice size) for a `with` block."""
        return GpuBlock(self._loop, self.core.gpu(vram, wait_s=wait_s))

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any], **kw: Any) -> MapResults:
        """`fn(item)` for every item, yielded as results arrive (see Fabric.map)."""
        return MapResults(self._loop, self.core.map(fn, items, **kw))

    def run(self, job: Job, aggregator: Aggregator, **kw: Any) -> JobResult:
        """Run a batch job to completion (see Fabric.run)."""
        return self._loop.call(self.core.run(job, aggregator, **kw))

    async def run_async(self, job: Job, aggregator: Aggregator, **kw: Any) -> JobResult:
        """The async form of `run`."""
        return await self._loop.call_async(self.core.run(job, aggregator, **kw))

    def job(self, job_id: str) -> SyncJob:
        """A stored job by id: `status()`, `cancel()`, `result()` (see Fabric.job)."""
        return SyncJob(self._loop, self.core.job(job_id))

    def leased_bytes(self) -> dict[str, int]:
        """Bytes leased per tenant over the live fleet, as the nodes last advertised."""
        return self._loop.call(self._leased())

    async def _leased(self) -> dict[str, int]:
        usage: dict[str, int] = {}
        for advert in self.core.fleet.adverts.values():
            for tenant, n_bytes in advert.tenants.items():
                usage[tenant] = usage.get(tenant, 0) + n_bytes
        return usage

    def close(self) -> None:
        """Close the connection and stop the loop thread (again: nothing)."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        try:
            self._loop.call(self.core.close())
        finally:
            self._loop.stop()

    async def close_async(self) -> None:
        """The async form of `close`."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        try:
            await self._loop.call_async(self.core.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> SyncFabric:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(
    broker: BrokerSettings | None = None,
    settings: CoordinatorSettings | None = None,
    **overrides: Any,
) -> SyncFabric | InPlaceFabric:
    """Connect to the fabric, for sync and async callers alike.

    Settings come from the environment unless given (`VRAMFABRIC_NATS_URL`, or what
    `vramfabric up` printed to export); `overrides` are CoordinatorSettings fields, e.g.
    `tenant="alice"`. In a notebook run by `vramfabric notebook run`, which already runs on
    a slice, an InPlaceFabric: its blocks and maps run on that slice (fabric/in_place.py).
    """
    in_place = InPlaceSettings.from_env()
    if in_place.active:
        return InPlaceFabric(in_place)
    return connect_fabric(broker, settings, **overrides)


def connect_fabric(
    broker: BrokerSettings | None = None,
    settings: CoordinatorSettings | None = None,
    **overrides: Any,
) -> SyncFabric:
    """`connect` to the fabric itself, wherever this runs."""
    settings = attrs.evolve(settings or CoordinatorSettings.from_env(), **overrides)
    loop = LoopThread()
    try:
        core = loop.call(Fabric.connect(broker, settings))
    except BaseException:  # re-raised: the loop thread is stopped, not left behind
        loop.stop()
        raise
    fabric = SyncFabric(loop, core)
    atexit.register(fabric.close)
    return fabric
