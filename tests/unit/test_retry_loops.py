"""No hand-written retry loop outside broker/retrying.py: every retry goes through CallRetry.

A loop may sleep as its period (a renewal, pruning or check period; polling a child's log):
then the sleep runs on every pass. A retry loop sleeps only after something failed: in an
`except` handler, in an `if failed:` branch, or after a `try` whose success leaves the loop.
Loops counting attempts (`for attempt in ...`) and comments naming a "retry pause" count too.
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import TypeGuard

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("broker", "worker", "coordinator", "fabric", "kernels")
POLICY_MODULE = ROOT / "broker" / "retrying.py"
_ATTEMPT_NAME = re.compile(r"attempt|tries|retr", re.IGNORECASE)
_RETRY_COMMENT = re.compile(r"#.*\bretry (pause|again|loop)\b", re.IGNORECASE)
_LOOPS = (ast.For, ast.AsyncFor, ast.While)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _is_sleep(node: ast.AST) -> TypeGuard[ast.Call]:
    """A call of `asyncio.sleep`, `time.sleep` or a bare `sleep`."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name == "sleep"


def _call_of(stmt: ast.stmt) -> ast.AST | None:
    """The call a statement such as `await asyncio.sleep(1)` or `time.sleep(1)` makes."""
    value = getattr(stmt, "value", None)
    return value.value if isinstance(value, ast.Await) else value


def _walk_pass(node: ast.AST) -> Iterator[ast.AST]:
    """Nodes of one loop pass: not into nested loops or function/class bodies."""
    for child in ast.iter_child_nodes(node):
        yield child
        if not isinstance(child, _LOOPS + _SCOPES):
            yield from _walk_pass(child)


def _every_pass(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Statements that run on every pass: top level, or inside a top-level with/try body.

    Stops at a `try` whose body leaves the loop on success (return/break): what follows it
    runs only after the try failed.
    """
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.With | ast.AsyncWith):
            yield from _every_pass(stmt.body)
        elif isinstance(stmt, ast.Try):
            yield from _every_pass(stmt.body)
            if any(isinstance(n, ast.Return | ast.Break) for n in _walk_pass(stmt)):
                return


def _retry_loops(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for loop in ast.walk(tree):
        if not isinstance(loop, _LOOPS):
            continue
        if isinstance(loop, ast.For | ast.AsyncFor):
            names = [n.id for n in ast.walk(loop.target) if isinstance(n, ast.Name)]
            if any(_ATTEMPT_NAME.search(n) for n in names):
                yield loop.lineno, f"loop over attempts ({', '.join(names)})"
                continue
        periodic = {id(_call_of(stmt)) for stmt in _every_pass(loop.body)}
        for node in _walk_pass(loop):
            if _is_sleep(node) and id(node) not in periodic:
                yield node.lineno, "sleep after a failure inside a loop"


def find_retry_loops(source: str) -> list[tuple[int, str]]:
    """(line, why) for each hand-written retry loop or retry-pause comment in `source`."""
    found = list(_retry_loops(ast.parse(source)))
    found += [
        (i, "comment names a retry pause")
        for i, line in enumerate(source.splitlines(), start=1)
        if _RETRY_COMMENT.search(line)
    ]
    return sorted(set(found))


def _sources() -> list[Path]:
    return sorted(p for d in SOURCE_DIRS for p in (ROOT / d).rglob("*.py"))


def test_no_hand_written_retry_loop_outside_the_policy_module() -> None:
    # Given every source file of the five code folders but the policy module
    sources = [p for p in _sources() if p != POLICY_MODULE]
    # the tree was found: each folder holds code (a renamed folder must not drop out)
    assert all(any((ROOT / d).rglob("*.py")) for d in SOURCE_DIRS)
    assert len(sources) > 50
    # When each is searched for retry loops
    found = [
        f"{path.relative_to(ROOT)}:{line}: {why}"
        for path in sources
        for line, why in find_retry_loops(path.read_text())
    ]
    # Then there are none: retries go through broker/retrying.py
    assert not found, "hand-written retry loops (use CallRetry):\n" + "\n".join(found)


# The loops this project had before CallRetry, cut to their shape: each must be found.
_RETRY_SHAPES = {
    "sleep-after-successful-return": """
        async def f():
            while True:
                try:
                    return await connect()
                except Disconnected:
                    if late():
                        raise
                await asyncio.sleep(1.0)
        """,
    "sleep-in-handler": """
        async def f():
            while True:
                try:
                    return await make()
                except Disconnected:
                    if late():
                        raise
                    await asyncio.sleep(0.5)
        """,
    "sleep-if-failed": """
        async def f(pending):
            while pending:
                outcomes = await publish(pending)
                failed = [o for o in outcomes if o]
                if failed:
                    await asyncio.sleep(0.5)
                pending = failed
        """,
    "for-attempt": """
        async def f():
            for attempt in (1, 2):
                try:
                    reply = await request()
                    break
                except Exception:
                    log.warning("failed attempt=%d", attempt)
        """,
    "time-sleep-in-handler": """
        def f():
            for _ in range(5):
                try:
                    return call()
                except OSError:
                    time.sleep(0.1)
        """,
    "comment": """
        async def f():
            await asyncio.sleep(0.5)  # retry pause while the server recovers
        """,
}

# Loops that sleep as their period or poll a state: none may be flagged.
_PERIODIC_SHAPES = {
    "renewal-period": """
        async def f(self):
            while not self.closing:
                await asyncio.sleep(self.ttl_s / 3)
                if not self.closing:
                    await self.renew()
        """,
    "check-period-with-failure-logged": """
        async def f(self):
            while self.running:
                await asyncio.sleep(1.0)
                try:
                    await sub.consumer_info()
                except Exception as exc:
                    self.resubscribe()
        """,
    "beat-then-coalesce": """
        async def f(self):
            while self.running:
                try:
                    await self.beat()
                except VramfabricError as exc:
                    log.warning("advert failed error=%s", exc)
                try:
                    await asyncio.wait_for(self.poked.wait(), self.heartbeat_s)
                    await asyncio.sleep(0.05)
                except TimeoutError:
                    pass
        """,
    "poll-a-log-file": """
        def f(log_file, deadline):
            while time.monotonic() < deadline:
                seen = log_file.read()
                if b"ready" in seen:
                    return
                time.sleep(0.01)
        """,
    "loop-over-items-with-try": """
        async def f(keys):
            for key in keys:
                try:
                    entry = await kv.get(key)
                except KeyError:
                    continue
        """,
}


@pytest.mark.parametrize("name", sorted(_RETRY_SHAPES))
def test_detector_finds_each_retry_shape(name: str) -> None:
    assert find_retry_loops(textwrap.dedent(_RETRY_SHAPES[name])), name


@pytest.mark.parametrize("name", sorted(_PERIODIC_SHAPES))
def test_detector_leaves_periodic_loops_alone(name: str) -> None:
    assert find_retry_loops(textwrap.dedent(_PERIODIC_SHAPES[name])) == [], name
