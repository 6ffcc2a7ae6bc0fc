"""A notebook's folder, packed to travel with its run and unpacked on the slice.

`vramfabric notebook run` ships the folder the notebook is in (its data files, modules,
sub-folders) so that `pd.read_csv("data.csv")` finds the file on the slice as it does at
home. What goes: every file under the folder, symbolic links to files followed, except
names starting with `.` (`.git`, `.ipynb_checkpoints`, `.venv`) and `__pycache__`, and
files the caller leaves out (the executed copy being written). At most MAX_FOLDER_BYTES in
all: a larger folder is refused before anything is leased, naming its largest files.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

MAX_FOLDER_BYTES = 64 * 2**20
_SKIPPED_NAMES = frozenset({"__pycache__"})


class FolderTooLarge(ValueError):
    """The folder holds more than a notebook run ships."""


def folder_files(folder: Path, leave_out: Iterable[Path] = ()) -> list[tuple[Path, int]]:
    """The files that ship with a notebook in `folder`: (path, size), in a stable order."""
    skipped = {p.resolve() for p in leave_out}
    found: list[tuple[Path, int]] = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not _hidden(d))
        for name in sorted(files):
            path = Path(root) / name
            if _hidden(name) or path.resolve() in skipped or not path.is_file():
                continue
            found.append((path, path.stat().st_size))
    return found


def _hidden(name: str) -> bool:
    return name.startswith(".") or name in _SKIPPED_NAMES


def pack_folder(folder: Path, leave_out: Iterable[Path] = ()) -> bytes:
    """The folder's files as a gzipped tar (names relative to the folder).

    Raises:
        FolderTooLarge: the files add up to more than MAX_FOLDER_BYTES.
    """
    files = folder_files(folder, leave_out)
    total = sum(size for _, size in files)
    if total > MAX_FOLDER_BYTES:
        largest = sorted(files, key=lambda f: -f[1])[:3]
        names = ", ".join(f"{p.relative_to(folder)} ({n / 2**20:.1f} MiB)" for p, n in largest)
        raise FolderTooLarge(
            f"{folder} holds {total / 2**20:.1f} MiB to ship with the notebook; a run ships at "
            f"most {MAX_FOLDER_BYTES / 2**20:.0f} MiB (largest: {names}). Move large data "
            "out of the notebook's folder and read it from where the workers can reach it."
        )
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        for path, _size in files:
            tar.add(path.resolve(), arcname=str(path.relative_to(folder)), recursive=False)
    return buffer.getvalue()


@contextlib.contextmanager
def unpacked(archive: bytes) -> Iterator[Path]:
    """On the slice: the archive's files in a fresh folder, removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="vf-notebook-"))
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
            # "data": no absolute names, no links or names that leave the folder.
            tar.extractall(folder, filter="data")
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
