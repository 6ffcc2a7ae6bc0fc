"""In place: a notebook that already runs on a slice (`vramfabric notebook run`) uses it.

Its kernel runs in the lease's executor, where the fabric cannot be reached (executors get
no credentials) and need not be: `vramfabric.connect()` there gives an InPlaceFabric whose
`gpu()` blocks and `map()` run their functions right here, on the slice the notebook holds,
and `%%gpu` cells run as ordinary cells. The notebook run says so to its kernel through the
environment (`InPlaceSettings`): the slice's size, its device, the node.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from types import ModuleType, TracebackType
from typing import Any, NoReturn

import attrs

from vramfabric.broker.errors import ChunkFailed, ErrorKind
from vramfabric.kernels.code import Context, wants_context

_PREFIX = "VRAMFABRIC_IN_PLACE_"


@attrs.frozen
class InPlaceSettings:
    """The slice a notebook run's kernel runs on; `slice_bytes` 0 when it runs elsewhere."""

    slice_bytes: int = 0
    device: int | None = None
    node: str = ""
    job: str = ""

    @property
    def active(self) -> bool:
        """Whether this process runs on a slice already (inside `vramfabric notebook run`)."""
        return self.slice_bytes > 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> InPlaceSettings:
        """Read `VRAMFABRIC_IN_PLACE_*` (set by the notebook run for its kernel)."""
        device = environ.get(_PREFIX + "DEVICE", "")
        return cls(
            slice_bytes=int(environ.get(_PREFIX + "SLICE_BYTES", "0") or 0),
            device=int(device) if device else None,
            node=environ.get(_PREFIX + "NODE", ""),
            job=environ.get(_PREFIX + "JOB", ""),
        )

    def to_env(self) -> dict[str, str]:
        """The variables that make a kernel started with them run in place."""
        return {
            _PREFIX + "SLICE_BYTES": str(self.slice_bytes),
            _PREFIX + "DEVICE": "" if self.device is None else str(self.device),
            _PREFIX + "NODE": self.node,
            _PREFIX + "JOB": self.job,
        }

    def context(self, index: int = 0) -> Context:
        """The `ctx` a function gets here: this slice's device, size and array module."""
        xp: ModuleType = importlib.import_module("numpy" if self.device is None else "cupy")
        return Context(self.device, self.slice_bytes, xp, 1, self.job, index)


def _called(settings: InPlaceSettings, fn: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    if wants_context(fn):
        kwargs = {**kwargs, "ctx": settings.context()}
    return fn(*args, **kwargs)


@attrs.define
class InPlaceGpu:
    """`gpu` of a block in place: `run` calls the function here, on this slice."""

    settings: InPlaceSettings

    @property
    def node(self) -> str:
        """The node this notebook runs on."""
        return self.settings.node

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)`, here (`timeout_s` is the notebook run's own)."""
        kwargs.pop("timeout_s", None)
        return _called(self.settings, fn, args, kwargs)

    async def run_async(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """The async form of `run` (the function runs in the caller's thread all the same)."""
        return self.run(fn, *args, **kwargs)


@attrs.define
class InPlaceBlock:
    """`with fabric.gpu()` in place: the slice is the notebook's own, held for the whole run."""

    settings: InPlaceSettings

    def __enter__(self) -> InPlaceGpu:
        return InPlaceGpu(self.settings)

    def __exit__(self, *exc: object) -> None:
        return None

    async def __aenter__(self) -> InPlaceGpu:
        return InPlaceGpu(self.settings)

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None


@attrs.define
class InPlaceMap:
    """`fabric.map` in place: `fn(item)` for each item in order, here, as it is pulled."""

    settings: InPlaceSettings
    fn: Callable[[Any], Any]
    items: Iterable[Any]

    def __iter__(self) -> Iterator[Any]:
        for index, item in enumerate(self.items):
            try:
                yield _called(self.settings, self.fn, (item,), {})
            except Exception as exc:  # re-raised as a failed map item is, naming its index
                raise ChunkFailed(ErrorKind.ERROR, f"item {index}: {exc!r}") from exc

    async def __aiter__(self) -> AsyncIterator[Any]:
        for value in self:
            yield value

    def close(self) -> None:
        """Nothing runs ahead of the loop here: nothing to stop."""


@attrs.define
class InPlaceFabric:
    """`vramfabric.connect()` in a notebook run: blocks and maps on the notebook's own slice."""

    settings: InPlaceSettings

    def gpu(self, vram: int | str | None = None, *, wait_s: float | None = None) -> InPlaceBlock:
        """A block on this slice (`vram` and `wait_s` do not apply: it is held already)."""
        return InPlaceBlock(self.settings)

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any], **_kw: Any) -> InPlaceMap:
        """`fn(item)` for every item, here, in order (`vram`, `slices`... do not apply)."""
        return InPlaceMap(self.settings, fn, items)

    def run(self, *_args: Any, **_kw: Any) -> NoReturn:
        """Batch jobs are not run from a notebook run: it holds one slice, not a fleet."""
        raise RuntimeError(
            "fabric.run in a notebook run by `vramfabric notebook run`: the notebook runs in "
            "place on one slice, without the fabric; use fabric.map or a gpu() block, or run "
            "the notebook (or the job) from your own machine"
        )

    async def run_async(self, *args: Any, **kw: Any) -> NoReturn:
        """The async form of `run` (refused the same)."""
        self.run(*args, **kw)

    def job(self, _job_id: str) -> NoReturn:
        """Stored jobs are not reachable from a notebook run (see `run`)."""
        self.run()

    def leased_bytes(self) -> dict[str, int]:
        """Nothing leased by this notebook but the slice it runs on: no fleet view here."""
        return {}

    def close(self) -> None:
        """Nothing to close."""

    async def close_async(self) -> None:
        """Nothing to close."""

    def __enter__(self) -> InPlaceFabric:
        return self

    def __exit__(self, *exc: object) -> None:
        return None
