"""A kernel module that tests give to one worker only: placement must send its jobs there."""

from __future__ import annotations

import struct
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy as np

from vramfabric.kernels import Kernel


def _doubled(xp: ModuleType, args: Mapping[str, Any], data: bytes) -> bytes:
    """float32(2 * input value)."""
    (value,) = struct.unpack("<i", data)
    return np.float32(2 * value).tobytes()


ONLY_HERE = Kernel(name="only_here", reference=_doubled, max_input_bytes=4, max_output_bytes=4)
KERNELS = (ONLY_HERE,)
