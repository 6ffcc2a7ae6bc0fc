"""Colocated: several simulated nodes in one worker process, for fleets of hundreds here.

Each node is an Agent of its own: its name, ledger, adverts, lease service, pullers and
executors, so the fleet a coordinator sees is the one hundreds of machines would make.
They share only what would cost per node for nothing: one NATS connection, one subscription
to the fleet's adverts (each decoded once, into one AdvertBook), and the start-up probe (the
first node's shows that executors start here). They start no executor ahead: one starts
when a chunk needs it.
"""

from __future__ import annotations

import asyncio
import logging

import attrs
import nats.errors
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from vramfabric.broker.connection import Connection
from vramfabric.broker.settings import BrokerSettings

from .agent import Agent
from .node.advert_book import AdvertBook
from .node.metrics import WorkerMetrics
from .node.settings import WorkerSettings

log = logging.getLogger(__name__)


def node_names(node: str, count: int) -> list[str]:
    """The names of `count` colocated nodes: `node-0`, `node-1`, ..."""
    return [f"{node}-{i}" for i in range(count)]


@attrs.define
class Colocated:
    """`count` simulated nodes named `<settings.node>-<i>`, in this process, on one connection."""

    broker: BrokerSettings
    settings: WorkerSettings
    conn: Connection
    count: int
    metrics: WorkerMetrics = attrs.field(factory=WorkerMetrics)
    agents: list[Agent] = attrs.field(factory=list, init=False)
    _sub: Subscription | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        if not self.settings.simulate:
            raise ValueError("--nodes runs simulated nodes side by side: give --simulate too")
        book = AdvertBook(self.broker.node_ttl_s)
        base = attrs.evolve(self.settings, eager_executors=False)
        self.agents = [
            # The first node's metrics are the process's (one port serves them).
            Agent(
                self.broker,
                attrs.evolve(base, node=name),
                self.conn,
                self.metrics if i == 0 else WorkerMetrics(),
                adverts=book,
            )
            for i, name in enumerate(node_names(self.settings.node, self.count))
        ]

    async def start(self) -> None:
        """Start every node: the first with the executors' probe, then the rest at once."""
        first, rest = self.agents[0], self.agents[1:]
        await first.start()
        self._sub = await self.conn.nc.subscribe(
            self.broker.subjects.advert_filter(), cb=self._hear
        )
        await asyncio.gather(*(agent.start(probe=False) for agent in rest))
        log.info("colocated nodes started count=%d first=%s", self.count, first.settings.node)

    async def _hear(self, msg: Msg) -> None:
        # One decode for every node: they share the book it goes into.
        await self.agents[0].hear_advert(msg)

    async def stop(self, grace_s: float | None = None) -> None:
        """Stop every node (each drains its chunks and releases its leases)."""
        await self._unsubscribe()
        await asyncio.gather(*(agent.stop(grace_s) for agent in self.agents))

    async def abort(self) -> None:
        """Undo a start that did not finish."""
        await self._unsubscribe()
        await asyncio.gather(*(agent.abort() for agent in self.agents))

    async def _unsubscribe(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.unsubscribe()
            except nats.errors.Error as exc:  # a closed connection: nothing to undo
                log.debug("adverts subscription not closed error=%s", exc)
