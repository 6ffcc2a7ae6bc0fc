"""Steps awaited together: a run's round trips that do not depend on each other."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any


async def gather_all(*steps: Awaitable[Any]) -> list[Any]:
    """The steps' results, run at once; the first error once every step has ended."""
    outcomes = await asyncio.gather(*steps, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return outcomes
