"""LoopThread: an event loop on a daemon thread, and sync calls that wait for it.

The fabric's async core runs on this loop (fabric/sync.py). A sync call blocks its thread
until its coroutine ends there (Ctrl-C cancels it and waits for its clean-up); meanwhile the
waiting thread prints what the coroutine posts to its `Relay`, so a remote call's output
appears where its caller prints (in a notebook, in the running cell: a write from the loop's
own thread would go to the cell that started that thread).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from vramfabric.coordinator.calls.calling import to_own_streams

T = TypeVar("T")

log = logging.getLogger(__name__)

# After Ctrl-C, a sync call waits this long for its cancelled work to clean up.
CANCEL_WAIT_S = 10.0


class LoopThread:
    """An event loop on a daemon thread; coroutines run there, awaited from other threads."""

    def __init__(self) -> None:
        """Start the loop and its thread."""
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="vramfabric", daemon=True
        )
        self._thread.start()
        self._started: set[asyncio.Task[None]] = set()

    def call(self, coro: Coroutine[Any, Any, T], relay: Relay | None = None) -> T:
        """Run `coro` on the loop and block until it ends; Ctrl-C cancels it, then re-raises.

        Meanwhile this thread runs what `coro` posts to `relay`, in order.
        """
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("a sync vramfabric call from the fabric's own loop would deadlock")
        if not self.loop.is_running():
            coro.close()
            raise RuntimeError("the fabric is closed")
        ended = threading.Event()
        task: asyncio.Task[T] | None = None

        def start() -> None:
            nonlocal task
            task = self.loop.create_task(coro)
            task.add_done_callback(lambda _t: ended.set())
            if relay is not None:
                task.add_done_callback(lambda _t: relay.end())

        self.loop.call_soon_threadsafe(start)
        try:
            if relay is None:
                ended.wait()
            else:
                relay.serve()
        except KeyboardInterrupt:
            # Runs after `start` (the loop takes callbacks in order), so `task` is set.
            self.loop.call_soon_threadsafe(lambda: task.cancel() if task else None)
            ended.wait(CANCEL_WAIT_S)
            raise
        assert task is not None
        return task.result()

    def call_or_start(self, coro: Coroutine[Any, Any, None]) -> None:
        """`call`, or only start `coro` where a sync call cannot wait for it.

        That is on the loop's own thread (a generator finalized there) and once the fabric
        is closed (nothing left to run it: `coro` is dropped).
        """
        if threading.current_thread() is self._thread:
            task = self.loop.create_task(coro)
            self._started.add(task)  # held until done: the loop keeps only a weak reference
            task.add_done_callback(self._started.discard)
        elif not self.loop.is_running():
            coro.close()
        else:
            self.call(coro)

    async def call_async(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await `coro`, run on the loop, from another loop (cancelling this cancels it)."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def stop(self) -> None:
        """Stop the loop and its thread."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(CANCEL_WAIT_S)
        if not self._thread.is_alive():
            self.loop.close()


class Relay:
    """What the fabric's loop hands to a thread waiting in a sync call: text to print."""

    def __init__(self) -> None:
        """An empty relay; `serve` runs what is posted until `end`."""
        self._queue: queue.SimpleQueue[tuple[str, str] | None] = queue.SimpleQueue()

    def post(self, stream: str, text: str) -> None:
        """From the loop: print `text` on `stream` ("stdout" or "stderr") in the caller."""
        self._queue.put((stream, text))

    def end(self) -> None:
        """From the loop: the call ended, after everything posted before."""
        self._queue.put(None)

    def serve(self) -> None:
        """In the caller's thread: print what is posted, in order, until the end."""
        while (item := self._queue.get()) is not None:
            try:
                to_own_streams(*item)
            except (OSError, ValueError) as exc:  # a closed stream: the call goes on, unprinted
                log.debug("printed text not written: %s", exc)
