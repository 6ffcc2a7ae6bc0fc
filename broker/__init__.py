"""The protocol: subjects, wire types, codec, errors, topology and the embedded server.

The names below load on first use: an executor process needs the codec and the errors,
not the NATS client, the server launcher and the rest.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .codec import decode, encode
    from .connection import Connection, connect
    from .errors import (
        CapacityExceeded,
        Disconnected,
        ErrorKind,
        InvalidMessage,
        JobFailed,
        JobTimeout,
        KernelLoadFailed,
        KernelNotFound,
        LeaseDenied,
        LeaseExpired,
        PermanentError,
        RemoteError,
        ResultAlreadyRecorded,
        SliceTooLarge,
        SliceVramExceeded,
        TransientError,
        VramfabricError,
        from_nats,
    )
    from .messages import (
        PROTOCOL_VERSION,
        Chunk,
        ChunkResult,
        ErrorReply,
        Event,
        GpuState,
        JobSpec,
        Lease,
        LeaseGrant,
        LeaseRequest,
        NodeAdvert,
        ReleaseReply,
        ReleaseRequest,
        RenewReply,
        RenewRequest,
    )
    from .retry import RetryPolicy
    from .server import NatsServer
    from .settings import BrokerSettings
    from .subjects import Subjects

_WHERE = {
    "PROTOCOL_VERSION": ".messages",
    "BrokerSettings": ".settings",
    "CapacityExceeded": ".errors",
    "SliceTooLarge": ".errors",
    "Chunk": ".messages",
    "ChunkResult": ".messages",
    "Connection": ".connection",
    "Disconnected": ".errors",
    "ErrorKind": ".errors",
    "ErrorReply": ".messages",
    "Event": ".messages",
    "GpuState": ".messages",
    "InvalidMessage": ".errors",
    "JobFailed": ".errors",
    "JobSpec": ".messages",
    "JobTimeout": ".errors",
    "KernelLoadFailed": ".errors",
    "KernelNotFound": ".errors",
    "Lease": ".messages",
    "LeaseDenied": ".errors",
    "LeaseExpired": ".errors",
    "LeaseGrant": ".messages",
    "LeaseRequest": ".messages",
    "NatsServer": ".server",
    "NodeAdvert": ".messages",
    "PermanentError": ".errors",
    "ReleaseReply": ".messages",
    "ReleaseRequest": ".messages",
    "RemoteError": ".errors",
    "RenewReply": ".messages",
    "RenewRequest": ".messages",
    "ResultAlreadyRecorded": ".errors",
    "RetryPolicy": ".retry",
    "SliceVramExceeded": ".errors",
    "Subjects": ".subjects",
    "TransientError": ".errors",
    "VramfabricError": ".errors",
    "connect": ".connection",
    "decode": ".codec",
    "encode": ".codec",
    "from_nats": ".errors",
}

__all__ = [
    "PROTOCOL_VERSION",
    "BrokerSettings",
    "CapacityExceeded",
    "Chunk",
    "ChunkResult",
    "Connection",
    "Disconnected",
    "ErrorKind",
    "ErrorReply",
    "Event",
    "GpuState",
    "InvalidMessage",
    "JobFailed",
    "JobSpec",
    "JobTimeout",
    "KernelLoadFailed",
    "KernelNotFound",
    "Lease",
    "LeaseDenied",
    "LeaseExpired",
    "LeaseGrant",
    "LeaseRequest",
    "NatsServer",
    "NodeAdvert",
    "PermanentError",
    "ReleaseReply",
    "ReleaseRequest",
    "RemoteError",
    "RenewReply",
    "RenewRequest",
    "ResultAlreadyRecorded",
    "RetryPolicy",
    "SliceTooLarge",
    "SliceVramExceeded",
    "Subjects",
    "TransientError",
    "VramfabricError",
    "connect",
    "decode",
    "encode",
    "from_nats",
]


def __getattr__(name: str) -> Any:
    """Import a public name's module when the name is first asked for."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(where, __name__), name)
