"""The one exception tree of vramfabric: transient errors are retried, permanent ones are not.

Every error carries an `ErrorKind`, the value that travels in `ChunkResult.error_kind` and in
error replies (tree.py). `from_nats` is the single place where nats-py exceptions become
ours (nats_mapping.py). Import them from here: `from vramfabric.broker.errors import ...`.
"""

from __future__ import annotations

from .nats_mapping import ERR_CODE_NO_PEERS, ERR_CODE_RESULT_RECORDED, from_nats, nats_errors
from .tree import (
    CapacityExceeded,
    ChunkFailed,
    ChunkTimeout,
    CodeRefused,
    Disconnected,
    ErrorKind,
    ExecutorCrashed,
    InvalidMessage,
    JobCancelled,
    JobFailed,
    JobNotFound,
    JobTimeout,
    KernelLoadFailed,
    KernelNotFound,
    LeaseDenied,
    LeaseExpired,
    LimitExceeded,
    PermanentError,
    PermissionDenied,
    RemoteError,
    ResultAlreadyRecorded,
    ResultRefused,
    ServerError,
    SliceTooLarge,
    SliceVramExceeded,
    StaleRead,
    TransientError,
    VramfabricError,
)

__all__ = [
    "ERR_CODE_NO_PEERS",
    "ERR_CODE_RESULT_RECORDED",
    "CapacityExceeded",
    "ChunkFailed",
    "ChunkTimeout",
    "CodeRefused",
    "Disconnected",
    "ErrorKind",
    "ExecutorCrashed",
    "InvalidMessage",
    "JobCancelled",
    "JobFailed",
    "JobNotFound",
    "JobTimeout",
    "KernelLoadFailed",
    "KernelNotFound",
    "LeaseDenied",
    "LeaseExpired",
    "LimitExceeded",
    "PermanentError",
    "PermissionDenied",
    "RemoteError",
    "ResultAlreadyRecorded",
    "ResultRefused",
    "ServerError",
    "SliceTooLarge",
    "SliceVramExceeded",
    "StaleRead",
    "TransientError",
    "VramfabricError",
    "from_nats",
    "nats_errors",
]
