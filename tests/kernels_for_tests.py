"""Kernels used only by tests: loaded into worker subprocesses with --kernel-module."""

from __future__ import annotations

import os
import struct
import time
import uuid
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import numpy as np

from vramfabric.kernels import Kernel


def _sleepy(xp: ModuleType, args: Mapping[str, Any], data: bytes) -> bytes:
    """Sleep `sleep_s`, log the execution to `log_dir` if given, return float32(input value)."""
    (value,) = struct.unpack("<i", data)
    if args.get("log_dir"):
        # One file per execution: tests count how often each chunk really ran.
        with open(os.path.join(str(args["log_dir"]), f"{value}-{uuid.uuid4().hex}"), "w"):
            pass
    time.sleep(float(args.get("sleep_s", 0.0)))  # stands in for a long GPU kernel
    return np.float32(value).tobytes()


SLEEPY = Kernel(name="sleepy", reference=_sleepy, max_input_bytes=4, max_output_bytes=4)
KERNELS = (SLEEPY,)


def sleepy_input(value: int) -> bytes:
    """Input bytes of the sleepy kernel."""
    return struct.pack("<i", value)


def executions(log_dir: str) -> dict[int, int]:
    """How many times each value ran, from the execution log."""
    counts: dict[int, int] = {}
    for name in os.listdir(log_dir):
        value = int(name.split("-", 1)[0])
        counts[value] = counts.get(value, 0) + 1
    return counts
