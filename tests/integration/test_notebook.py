"""Notebooks: a real Jupyter kernel runs cells against a local fabric; `notebook run` too."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

from tests.integration.conftest import AgentFactory
from vramfabric.broker import buckets
from vramfabric.broker.settings import BrokerSettings
from vramfabric.coordinator.calls.interactive import call_work

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(180),
    # jupyter_client and zmq warn about their own internals.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
]

CELLS = [
    "import vramfabric\nfabric = vramfabric.connect()",
    "def power(x, n):\n    return x ** n",
    'with fabric.gpu(vram="1GiB") as gpu:\n    r = gpu.run(power, 2, 10)\nprint(r)',
    "%load_ext vramfabric",
    "x = 21",
    '%%gpu --vram 1GiB\ny = x * 2\nprint("on the slice", y)',
    "print(y + 1)",
    "with fabric.gpu() as gpu:\n    gpu.run(power, 0, -1)",
    "import threading\nlock = threading.Lock()",
    "%%gpu\nwith lock:\n    z = 1",
    "print(fabric.leased_bytes().get('default', 0))",
]
RAISES = {7, 9}  # cells that raise on purpose: marked, as nbconvert users do


def notebook(cells: list[str], raises: set[int]) -> Any:
    nb = nbformat.v4.new_notebook()
    for i, source in enumerate(cells):
        cell = nbformat.v4.new_code_cell(source)
        if i in raises:
            cell.metadata["tags"] = ["raises-exception"]
        nb.cells.append(cell)
    return nb


def text_of(cell: Any) -> str:
    parts = []
    for out in cell.outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type == "error":
            parts.append(f"{out.ename}: {out.evalue}")
    return "".join(parts)


def fabric_env(monkeypatch: pytest.MonkeyPatch, broker: BrokerSettings) -> None:
    monkeypatch.setenv("VRAMFABRIC_NATS_URL", broker.url)
    monkeypatch.setenv("VRAMFABRIC_PREFIX", broker.prefix)
    monkeypatch.setenv("VRAMFABRIC_SLICE_BYTES", str(2**30))
    monkeypatch.setenv("VRAMFABRIC_LEASE_TTL_S", "5")


async def test_a_notebook_holds_a_slice_only_while_a_cell_computes(
    agent_factory: AgentFactory, broker: BrokerSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a node that runs code, and a notebook whose kernel connects to it
    agent = await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric_env(monkeypatch, broker)
    nb = notebook(CELLS, RAISES)
    held_after: list[int] = []

    def after_cell(**_kw: Any) -> None:
        held_after.append(agent.ledger.advert(0).tenants.get("default", 0))

    client = NotebookClient(nb, timeout=60, on_cell_executed=after_cell)
    # When a real Jupyter kernel executes it cell by cell
    await client.async_execute()
    # Then each cell's outputs are as if it ran here: the block's value, the magic's stdout
    # and the variable it assigned, the remote exceptions raised in the notebook
    out = [text_of(c) for c in nb.cells]
    assert out[2] == "1024\n"
    assert out[5] == "on the slice 42\n"
    assert out[6] == "43\n"
    assert out[7] == "ZeroDivisionError: 0.0 cannot be raised to a negative power"
    assert out[9].startswith("UsageError: variable 'lock' (lock) cannot be sent")
    # And after every cell, the fleet shows nothing leased for the tenant
    assert held_after == [0] * len(CELLS)
    assert out[10] == "0\n"


SAMPLE = [
    "import math\nvalues = [math.sqrt(i) for i in range(5)]",
    "print(round(sum(values), 6))",
    "values[:2]",
    "import sys\nprint('to stderr', file=sys.stderr)",
]


async def test_notebook_run_writes_an_executed_copy_matching_a_local_run(
    agent_factory: AgentFactory,
    broker: BrokerSettings,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # Given a node that runs code, and a sample notebook
    await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric_env(monkeypatch, broker)
    source, out = tmp_path / "sample.ipynb", tmp_path / "out.ipynb"
    nbformat.write(notebook(SAMPLE, set()), source)
    # When `vramfabric notebook run` runs it on a slice
    cmd = [sys.executable, "-m", "vramfabric", "notebook", "run", str(source), "--vram", "1GiB"]
    proc = await asyncio.to_thread(
        subprocess.run, [*cmd, "-o", str(out)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    # Then the executed copy's outputs match a local run of the same notebook
    local = notebook(SAMPLE, set())
    await NotebookClient(local, timeout=60).async_execute()
    remote = nbformat.read(out, as_version=4)
    assert [c.outputs for c in remote.cells] == [c.outputs for c in local.cells]
    assert "written to" in proc.stdout


async def test_notebook_run_marks_the_failing_cell_and_exits_1(
    agent_factory: AgentFactory,
    broker: BrokerSettings,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric_env(monkeypatch, broker)
    source, out = tmp_path / "bad.ipynb", tmp_path / "bad.out.ipynb"
    nbformat.write(notebook(["a = 1", "1 / 0", "print('never')"], set()), source)
    cmd = [sys.executable, "-m", "vramfabric", "notebook", "run", str(source)]
    proc = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "cell 2 of 3 ('1 / 0') failed" in proc.stderr
    assert "ZeroDivisionError" in proc.stderr and "\x1b[" not in proc.stderr
    cells = nbformat.read(out, as_version=4).cells
    assert cells[1].outputs[0].output_type == "error"
    assert cells[2].get("execution_count") is None


WAIT_FOR_GO = """
import os, time
print("first", flush=True)
deadline = time.monotonic() + 60
while not os.path.exists(GO) and time.monotonic() < deadline:
    time.sleep(0.01)  # waits for the kernel client to have seen "first"
print("second", os.path.exists(GO))
"""
STREAMING = [
    "import vramfabric\nfabric = vramfabric.connect()\n%load_ext vramfabric",
    "%%gpu --vram 1GiB" + WAIT_FOR_GO,
    "def waits(GO):" + WAIT_FOR_GO.replace("\n", "\n    ") + "return 'back'",
    'with fabric.gpu(vram="1GiB") as gpu:\n    print(gpu.run(waits, GO2))',
    "%%gpu\nblob = bytes(range(256)) * (5 * 2**20 // 256)\nz = 6\nz * 7",
    "print(len(blob), blob[:3], z)",
    "%%gpu\nsent = len(blob) + z\nz * 7;",
    "print(sent)",
]


class GoOnSeeingFirst(NotebookClient):
    """A client that lets a waiting cell go on once it has seen the cell's first print."""

    def __init__(self, nb: Any, go: dict[int, Path], **kw: Any) -> None:
        super().__init__(nb, **kw)
        self.go = go

    def output(
        self, outs: list[Any], msg: dict[str, Any], display_id: str | None, cell_index: int
    ) -> Any:
        """Touch the cell's go-file on its first print, then handle the output as usual."""
        text = msg["content"].get("text", "") if msg["msg_type"] == "stream" else ""
        if "first" in text and cell_index in self.go:
            self.go[cell_index].touch()  # seen while the cell still runs: it waits for this
        return super().output(outs, msg, display_id, cell_index)


async def test_gpu_cells_stream_prints_show_their_last_value_and_move_5_mib_both_ways(
    agent_factory: AgentFactory,
    broker: BrokerSettings,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # Given a node that runs code, and a notebook whose %%gpu cell and gpu.run function
    # print, then wait until the kernel client has seen that print, then print again
    agent = await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric_env(monkeypatch, broker)
    go = {1: tmp_path / "go1", 3: tmp_path / "go3"}
    cells = [f"GO, GO2 = {str(go[1])!r}, {str(go[3])!r}\n" + STREAMING[0], *STREAMING[1:]]
    nb = notebook(cells, set())
    # When a real Jupyter kernel executes it
    await GoOnSeeingFirst(nb, go, timeout=60).async_execute()
    # Then each waiting cell saw its first print reach the client before it ended
    out = [text_of(c) for c in nb.cells]
    assert out[1] == "first\nsecond True\n"
    assert out[3] == "first\nsecond True\nback\n"
    # And a %%gpu cell's last expression is displayed, unless it ends with `;`
    results = [o for o in nb.cells[4].outputs if o.output_type == "execute_result"]
    assert [r.data["text/plain"] for r in results] == ["42"]
    assert not [o for o in nb.cells[6].outputs if o.output_type == "execute_result"]
    # And a 5 MiB assignment came back (five times what a message carries), and went out
    # again to a cell that read it
    assert out[5] == "5242880 b'\\x00\\x01\\x02' 6\n"
    assert out[7] == "5242886\n"
    assert agent.ledger.leased_bytes == 0


IN_PLACE = [
    "import csv\nrows = list(csv.reader(open('data.csv')))\nprint(len(rows))",
    "%load_ext vramfabric",
    "%%gpu --vram 1GiB\ntotal = sum(int(r[0]) for r in rows)\nprint('total', total)\ntotal * 2",
    "import vramfabric\nfabric = vramfabric.connect()\n"
    "def size(ctx):\n    return ctx.slice_bytes\n"
    "with fabric.gpu() as gpu:\n    print(gpu.run(size), gpu.node)",
    "print(sorted(fabric.map(lambda x: x * x, range(4))))",
    "print(open('notes/readme.txt').read())",
]


async def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "vramfabric", "notebook", "run", *args]
    return await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, timeout=150)


async def test_notebook_run_ships_its_folder_and_runs_gpu_cells_and_connect_in_place(
    agent_factory: AgentFactory,
    broker: BrokerSettings,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # Given a notebook that reads data.csv and notes/ beside it, and uses %%gpu, connect(),
    # a block and a map (as it would at home), in a folder with a data file
    agent = await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric_env(monkeypatch, broker)
    folder = tmp_path / "project"
    (folder / "notes").mkdir(parents=True)
    (folder / "data.csv").write_text("1,a\n2,b\n3,c\n")
    (folder / "notes" / "readme.txt").write_text("shipped too")
    source = folder / "analysis.ipynb"
    nbformat.write(notebook(IN_PLACE, set()), source)
    # When `vramfabric notebook run` runs it on a slice
    proc = await run_cli(str(source), "--vram", "1GiB")
    # Then it ran there, every cell on the slice it holds: the data file was found, the
    # %%gpu cell ran in place and showed its last value, the block and map ran there too
    assert proc.returncode == 0, proc.stderr
    cells = nbformat.read(folder / "analysis.out.ipynb", as_version=4).cells
    out = [text_of(c) for c in cells]
    assert out[0] == "3\n"
    assert out[2] == "total 6\n"
    assert [o.data["text/plain"] for o in cells[2].outputs if "data" in o] == ["12"]
    assert out[3] == f"{2**30} n1\n"
    assert out[4] == "[0, 1, 4, 9]\n"
    assert out[5] == "shipped too\n"
    # And the slice is back, and the shipped folder is not kept in the kernels store
    assert agent.ledger.leased_bytes == 0
    store = await buckets.kernels_store(agent.conn.js, broker, "default")
    kept = {info.name for info in await store.list(ignore_deletes=True)}
    assert kept == {call_work().digest}  # the interactive calls' own work only


async def test_a_cell_past_its_deadline_still_gives_the_copy_and_names_the_cell(
    agent_factory: AgentFactory,
    broker: BrokerSettings,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    # Given a notebook whose second cell sleeps past its deadline
    await agent_factory("n1", simulate="1x4GiB", allow_code=True)
    fabric_env(monkeypatch, broker)
    source, out = tmp_path / "slow.ipynb", tmp_path / "slow.out.ipynb"
    cells = ["print('one')", "import time\ntime.sleep(120)", "print('never')"]
    nbformat.write(notebook(cells, set()), source)
    # When it runs with a 3 s cell deadline
    proc = await run_cli(str(source), "--cell-timeout-s", "3")
    # Then the command fails naming the cell, and the copy holds every cell run until then
    assert proc.returncode == 1
    assert "cell 2 of 3 ('import time')" in proc.stderr
    assert "did not finish within --cell-timeout-s 3 s" in proc.stderr
    copy = nbformat.read(out, as_version=4).cells
    assert text_of(copy[0]) == "one\n"
    assert copy[2].get("execution_count") is None
