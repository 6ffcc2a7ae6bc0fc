"""HostCache: where the host path keeps what it builds, so a node builds each thing once.

Two folders: the process's own (mode 0700, this uid: users' kernels land there) and the
node's built-ins folder, which the node agent fills with the project's own kernels (mode
0755, readable by executors of any uid, written by the agent's uid alone). A file is looked
up in both; one missing is made in the own folder. A maker holds an exclusive `flock` on
`<name>.lock` while it makes the file, and writes it under a temporary name it then
renames, so N processes that need the same new file wait for one maker and never load a
half-written file.
"""

from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs

from .errors import KernelCompileError

OWN_MODE = 0o700
BUILTINS_MODE = 0o755
# An own folder's file not used this long is deleted when an executor starts.
UNUSED_S = 30 * 86_400.0


@attrs.frozen
class HostCache:
    """The own folder (made on first write) and the node's built-ins folder, if any."""

    own: Path
    builtins: Path | None = None
    own_mode: int = OWN_MODE

    def find(self, name: str) -> Path | None:
        """The file `name` in the built-ins folder or the own one, or None.

        A built-in the agent is making now is waited for (its lock), not made again here.
        """
        shared = self.builtins if self.builtins is not None and trusted(self.builtins) else None
        if shared is not None:
            _wait_for_maker(shared / f"{name}.lock")
        for folder in (shared, self.own):
            if folder is not None and (folder / name).exists():
                if folder == self.own:
                    _touch(folder / name)  # a use: `prune` keeps what is used
                return folder / name
        return None

    def prune(self, unused_s: float, now: float) -> list[Path]:
        """Delete the own folder's files not used for `unused_s` seconds; what was deleted.

        A process that has a library loaded keeps it (an unlinked file stays mapped); one
        that needs it later builds it again.
        """
        if not self.own.is_dir():
            return []
        gone = []
        for path in self.own.iterdir():
            try:
                if path.is_file() and now - path.stat().st_mtime > unused_s:
                    path.unlink()
                    gone.append(path)
            except OSError:  # removed by another process meanwhile
                continue
        return gone

    def make(self, name: str, produce: Callable[[Path], object]) -> Path:
        """The file `name`, found, or made in the own folder by `produce(temporary_path)`.

        Raises:
            KernelCompileError: the own folder is another user's, or `produce` raised it.
        """
        found = self.find(name)
        if found is not None:
            return found
        folder = own_folder(self.own, self.own_mode)
        path = folder / name
        with _exclusive(folder / f"{name}.lock"):
            if not path.exists():  # another process may have made it while this one waited
                partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
                try:
                    produce(partial)
                    os.replace(partial, path)
                finally:
                    partial.unlink(missing_ok=True)
        return path


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:  # not ours to touch: it is kept by its owner's use
        return


def own_folder(path: Path, mode: int = OWN_MODE) -> Path:
    """`path`, made with `mode` if missing; it must be this uid's and writable by it alone.

    Raises:
        KernelCompileError: another user owns it, or others may write it.
    """
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    # A folder another user owns (or may write) could hold a library this process loads.
    if not _safe(path, os.getuid()):
        raise KernelCompileError(f"host kernel cache {path} is not this user's alone")
    if path.stat().st_mode & 0o777 != mode:
        path.chmod(mode)
    return path


def trusted(path: Path) -> bool:
    """Whether libraries in `path` may be loaded: root's or this uid's, writable by no other."""
    try:
        return _safe(path, 0) or _safe(path, os.getuid())
    except OSError:
        return False


def _safe(path: Path, owner: int) -> bool:
    info = path.stat()
    return info.st_uid == owner and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _wait_for_maker(lock: Path) -> None:
    """Block while another process holds `lock` exclusively (read-only: any uid may wait)."""
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return  # no maker now
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)  # closing releases the lock


@contextmanager
def _exclusive(lock: Path) -> Iterator[None]:
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
