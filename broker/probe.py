"""What answers at a server address that did not greet like NATS: for the connect error.

A first connect that times out with no error seen means something accepted the connection.
A look at its first bytes tells a slow NATS server from an HTTP server or another service.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit


async def not_nats(server: str, wait_s: float = 0.5) -> str | None:
    """Why the service at `server` is not NATS, from its first bytes; None if it may be.

    A NATS server greets with `INFO {...}` at once. Many services say nothing until asked,
    so after `wait_s` of silence it is asked as HTTP would be (an HTTP server answers that).
    """
    parts = urlsplit(server if "://" in server else f"nats://{server}")
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(parts.hostname, parts.port or 4222), wait_s
        )
    except (OSError, TimeoutError, ValueError):
        return None
    try:
        first = await _first_bytes(reader, wait_s)
        if not first:
            writer.write(b"GET / HTTP/1.0\r\n\r\n")
            first = await _first_bytes(reader, wait_s)
    except OSError:
        return None
    finally:
        writer.close()
    if first.startswith(b"INFO"):
        return None
    if first.startswith(b"HTTP/"):
        return (
            "an HTTP server answers there, not NATS (NATS clients use port 4222 by default; "
            "8222 is a NATS server's HTTP monitoring port)"
        )
    if first:
        return f"something that is not NATS answers there (it sent {first[:32]!r}...)"
    return "something accepts connections there but never greets like a NATS server (INFO)"


async def _first_bytes(reader: asyncio.StreamReader, wait_s: float) -> bytes:
    try:
        return await asyncio.wait_for(reader.read(64), wait_s)
    except TimeoutError:
        return b""
