"""The embedded server started in two steps: launched, then waited for (as `up` does)."""

from __future__ import annotations

import nats
import pytest
from nats.aio.msg import Msg

from vramfabric.broker.errors import ServerError
from vramfabric.broker.server import NatsServer


async def test_a_launched_server_serves_clients_once_waited_for() -> None:
    # Given a server launched without waiting (it comes up while `up` imports)
    server = NatsServer().launch()
    try:
        # When it is waited for
        server.wait_ready()
        # Then a client connects to the port it bound and gets a reply through it
        nc = await nats.connect(server.url)

        async def pong(msg: Msg) -> None:
            await msg.respond(b"pong")

        try:
            sub = await nc.subscribe("ping", cb=pong)
            reply = await nc.request("ping", b"", timeout=5)
            assert reply.data == b"pong"
            await sub.unsubscribe()
        finally:
            await nc.close()
    finally:
        server.stop()


def test_waiting_for_a_server_never_launched_is_a_clear_error() -> None:
    with pytest.raises(ServerError, match="not launched"):
        NatsServer().wait_ready()
    server = NatsServer().start()
    try:
        with pytest.raises(ServerError, match="already started"):
            server.launch()
    finally:
        server.stop()
