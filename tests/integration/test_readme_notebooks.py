"""README's Notebooks example runs as written against a local fabric."""

from __future__ import annotations

import asyncio
import contextlib
import io
import re
from pathlib import Path

import pytest

from tests.helpers import eventually
from tests.integration.conftest import AgentFactory
from vramfabric.broker.settings import BrokerSettings

README = Path(__file__).resolve().parents[2] / "README.md"


def example() -> str:
    section = README.read_text().split("## Notebooks", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README's Notebooks section has no python example"
    return match.group(1)


def run_example(source: str) -> str:
    out = io.StringIO()
    namespace: dict[str, object] = {"__name__": "__main__"}
    with contextlib.redirect_stdout(out):
        exec(compile(source, "README.md", "exec"), namespace)
    namespace["fabric"].close()  # type: ignore[attr-defined]
    return out.getvalue()


async def test_the_readme_notebook_example_runs(
    agent_factory: AgentFactory, broker: BrokerSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    monkeypatch.setenv("VRAMFABRIC_NATS_URL", broker.url)
    monkeypatch.setenv("VRAMFABRIC_PREFIX", broker.prefix)
    printed = await asyncio.to_thread(run_example, example())
    assert printed.splitlines() == ["6.0", "9900.0"]
    await eventually(lambda: agent.ledger.leased_bytes == 0)
