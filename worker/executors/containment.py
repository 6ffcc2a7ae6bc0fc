"""Executor containment: each tenant's executors run as an unprivileged uid of their own.

Where the worker may switch uids (root, or CAP_SETUID/CAP_SETGID/CAP_CHOWN with a range in
`VRAMFABRIC_EXECUTOR_UIDS`), a tenant's executors run as uid (and gid) `uid_for(tenant)`,
with no supplementary groups, in a private 0700 directory that is also their HOME and holds
their TMPDIR. Different uids keep tenants from signalling, ptracing or reading /proc of the
agent and of each other, and from writing the installed packages. Elsewhere executors run
as the worker's own uid (`shared-uid`), and the worker says so at start and in its adverts;
such a worker refuses tenants' code (`code_refused`) unless the operator says
`--allow-shared-uid` (dangerous: tenants' code then runs as the worker, with its credentials).
"""

from __future__ import annotations

import grp
import hashlib
import importlib
import logging
import os
import pwd
import shutil
import stat
import sys
import sysconfig
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs

from ..node.uids import DEFAULT_UIDS, UidRange

log = logging.getLogger(__name__)

CONTAINED = "uid-per-tenant"
SHARED = "shared-uid"
# Executors get only these variables of the worker's environment: never its credentials.
_KEEP_NAMES = frozenset({"PATH", "LANG", "LANGUAGE", "TZ", "LD_LIBRARY_PATH", "PYTHONPATH"})
_KEEP_PREFIXES = ("LC_", "CUDA_", "CUPY_", "NVIDIA_", "OMP_", "MKL_", "OPENBLAS_")
# Thread pools an executor gets one thread of unless the worker's environment says otherwise.
_THREAD_COUNTS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# Capability bits (linux/capability.h) a non-root worker needs to start executors as others.
_CAP_CHOWN, _CAP_SETGID, _CAP_SETUID = 0, 6, 7
# Packages an executor imports: its code must not be writable by tenants.
_PACKAGES = (
    "vramfabric",
    "vramfabric.broker",
    "vramfabric.worker",
    "vramfabric.worker.executor",
    "vramfabric.kernels",
)


def uid_for(tenant: str, uids: UidRange, taken: Callable[[int], bool]) -> int | None:
    """The tenant's uid: sha256(tenant) mod size, then the next one not `taken`; None if full.

    The same tenant gets the same uid on every node with the same range and accounts,
    unless another tenant's hash took it first on that node.
    """
    start = int.from_bytes(hashlib.sha256(tenant.encode()).digest()[:8], "big") % uids.size
    for step in range(uids.size):
        uid = uids.first + (start + step) % uids.size
        if not taken(uid):
            return uid
    return None


@attrs.frozen
class Sandbox:
    """Who a tenant's executor runs as, and its private directory (HOME and cwd)."""

    uid: int
    gid: int
    home: str

    @property
    def tmp(self) -> str:
        """The executor's TMPDIR, inside its home."""
        return os.path.join(self.home, "tmp")


def executor_env(environ: Mapping[str, str], sandbox: Sandbox | None) -> dict[str, str]:
    """The environment of an executor: a few harmless variables, never the worker's secrets."""
    env = {k: v for k, v in environ.items() if k in _KEEP_NAMES or k.startswith(_KEEP_PREFIXES)}
    # The installed packages are read-only to a contained executor: do not try to write them.
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # A node runs an executor per lane, several per core: each starting a BLAS pool of every
    # core oversubscribed them, and NumPy's OpenBLAS pool alone cost an executor's start
    # 0.13 s of CPU (0.35 s instead of 0.22 s), the first chunk waiting for it.
    for name in _THREAD_COUNTS:
        env.setdefault(name, "1")
    if sandbox is None:
        env.update({k: environ[k] for k in ("HOME", "TMPDIR", "USER") if k in environ})
        return env
    env.update(HOME=sandbox.home, TMPDIR=sandbox.tmp)
    # Kernel modules named relative to the worker's directory still import (its cwd was on
    # the path before executors got a directory of their own), unless tenants could write it.
    cwd = os.getcwd()
    if not _writable(Path(cwd)):
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (cwd, env.get("PYTHONPATH"))))
    return env


@attrs.define
class Containment:
    """How this node's executors are kept from the agent and from each other."""

    uids: UidRange | None
    _base: Path | None = None
    # Why tenants' code is refused here ("" when it is not): shared uid, not allowed.
    code_refusal: str = ""
    _assigned: dict[str, int] = attrs.field(factory=dict)

    @property
    def mode(self) -> str:
        """`uid-per-tenant` or `shared-uid`, as adverts carry it."""
        return CONTAINED if self.uids is not None else SHARED

    @classmethod
    def start(
        cls, uids: UidRange | None, allow_code: bool, allow_shared_uid: bool = False
    ) -> Containment:
        """Decide the mode for this worker and say it in one log line.

        Raises:
            ValueError: a range was configured but executors cannot run as its uids.
        """
        chosen = uids or DEFAULT_UIDS
        problem = "this worker is not root and VRAMFABRIC_EXECUTOR_UIDS is not set"
        if uids is not None or os.geteuid() == 0:
            problem = obstacle(chosen)
        if problem and uids is not None:
            raise ValueError(f"VRAMFABRIC_EXECUTOR_UIDS={uids}: {problem}")
        if problem:
            # A root worker is stopped only by an install other uids cannot use.
            fix = (
                "install vramfabric where other users can read it (e.g. a venv under /opt)"
                if os.geteuid() == 0
                else "run as root or set VRAMFABRIC_EXECUTOR_UIDS with CAP_SETUID, CAP_SETGID "
                "and CAP_CHOWN"
            )
            if allow_code and not allow_shared_uid:
                # Fail closed: tenants' code as this worker could read its credentials.
                refusal = (
                    f"this worker cannot run tenants' code under uids of their own ({problem}) "
                    "and refuses to run it as its own uid (start it with --allow-shared-uid, "
                    "dangerous, to allow that)"
                )
                log.warning("tenants' code is refused (no shared-uid): %s; %s", refusal, fix)
                return cls(None, code_refusal=refusal)
            # Tenants' code only matters where it runs; built-in kernels are ours.
            log.log(
                logging.WARNING if allow_code else logging.INFO,
                "executors run as this worker's uid=%d (shared-uid%s: tenants' code can signal "
                "the agent and each other, and shares its files) because %s; %s",
                os.geteuid(),
                ", allowed by --allow-shared-uid" if allow_code else "",
                problem,
                fix,
            )
            return cls(None)
        base = Path(tempfile.mkdtemp(prefix="vramfabric-executors-"))
        base.chmod(0o711)  # each uid may reach its own directory, and list none
        log.info(
            "executors run as one uid per tenant uids=%s%s dir=%s",
            chosen,
            "" if uids else " (the default: set VRAMFABRIC_EXECUTOR_UIDS to choose)",
            base,
        )
        return cls(chosen, base)

    def sandbox(self, tenant: str) -> Sandbox | None:
        """The tenant's uid and fresh private directory; None in shared-uid mode.

        Raises:
            LookupError: every uid of the range is taken by other tenants or by accounts.
        """
        if self.uids is None or self._base is None:
            return None
        uid = self._assigned.get(tenant)
        if uid is None:
            used = set(self._assigned.values())
            uid = uid_for(tenant, self.uids, lambda u: u in used or _has_account(u))
            if uid is None:
                raise LookupError(
                    f"no executor uid left for tenant {tenant!r}: all {self.uids.size} uids "
                    f"of {self.uids} are taken by other tenants or accounts"
                )
            self._assigned[tenant] = uid
            log.info("tenant executors run as uid=%d tenant=%s", uid, tenant)
        home = self._base / f"u{uid}"
        sandbox = Sandbox(uid, uid, str(home))
        for path in (home, Path(sandbox.tmp)):
            path.mkdir(mode=0o700, exist_ok=True)
            os.chown(path, uid, uid)
            path.chmod(0o700)  # mkdir's mode passes through the umask
        return sandbox

    def close(self) -> None:
        """Remove the executors' directories (their processes are gone by now)."""
        if self._base is not None:
            shutil.rmtree(self._base, ignore_errors=True)


def obstacle(uids: UidRange) -> str:
    """Why executors cannot run as `uids` here, or "" when they can."""
    if not sys.platform.startswith("linux"):
        return "uid switching is implemented for Linux only"
    if not _has_caps(_CAP_SETUID, _CAP_SETGID, _CAP_CHOWN):
        return f"uid={os.geteuid()} lacks CAP_SETUID, CAP_SETGID or CAP_CHOWN"
    if uids.first <= os.geteuid() <= uids.last:
        return f"the range holds this worker's own uid {os.geteuid()}"
    for path in _install_paths():
        if _writable(path):
            return f"{path} would be writable by executors"
        if not _reachable(path):
            return f"{path} is not readable by other users (see its folders' modes)"
    return ""


def _install_paths() -> list[Path]:
    """The interpreter, the standard library, site-packages and vramfabric's own folders."""
    paths = [Path(os.path.realpath(sys.executable))]
    scheme = sysconfig.get_paths()
    paths += [Path(os.path.realpath(scheme[k])) for k in ("stdlib", "purelib", "platlib")]
    for name in _PACKAGES:
        module_file = importlib.import_module(name).__file__ or ""
        paths.append(Path(os.path.realpath(module_file)).parent)
    return list(dict.fromkeys(paths))


def _other(path: Path, bits: int) -> bool:
    """Whether a uid that owns nothing here (and is in no group) has `bits` of `path`."""
    return path.stat().st_mode & bits == bits


def _reachable(path: Path) -> bool:
    """Whether others can traverse to `path` and read it (run it, for the interpreter)."""
    if not all(_other(parent, stat.S_IXOTH) for parent in path.parents):
        return False
    # A folder must be listed and entered; the interpreter, run.
    return _other(path, stat.S_IROTH | stat.S_IXOTH if path.is_dir() else stat.S_IXOTH)


def _writable(path: Path) -> bool:
    """Whether others may change `path` or replace it through a folder above it.

    A sticky folder (such as /tmp) lets others rename only their own entries.
    """
    for folder in path.parents:
        mode = folder.stat().st_mode
        if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
            return True
    return _other(path, stat.S_IWOTH)


def _has_account(uid: int) -> bool:
    """Whether `uid` (or the gid of the same number) belongs to a user or group already."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
        except KeyError:
            continue
        return True
    return False


def _has_caps(*caps: int) -> bool:
    """Whether this process holds all of `caps` in its effective set."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return os.geteuid() == 0
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            effective = int(line.split()[1], 16)
            return all(effective >> cap & 1 for cap in caps)
    return os.geteuid() == 0
