"""The discovery file: how `vramfabric up` tells clients on this machine where its server is.

`up` writes `fabric.json` (url and pid) into a per-user state directory and removes it on
exit; BrokerSettings.from_env reads it when VRAMFABRIC_NATS_URL is not set, and only while
the process that wrote it is alive (a file left behind by a killed `up` is ignored).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger(__name__)

FILE_NAME = "fabric.json"


def state_dir(environ: Mapping[str, str]) -> Path:
    """The per-user directory for the discovery file.

    $XDG_RUNTIME_DIR/vramfabric where the session has one (it goes at logout), else
    $XDG_STATE_HOME/vramfabric, else ~/.local/state/vramfabric.
    """
    if environ.get("XDG_RUNTIME_DIR"):
        return Path(environ["XDG_RUNTIME_DIR"]) / "vramfabric"
    if environ.get("XDG_STATE_HOME"):
        return Path(environ["XDG_STATE_HOME"]) / "vramfabric"
    home = environ.get("HOME") or str(Path.home())
    return Path(home) / ".local" / "state" / "vramfabric"


def discovery_path(environ: Mapping[str, str]) -> Path:
    """Where `up` writes, and clients look for, the discovery file."""
    return state_dir(environ) / FILE_NAME


def write(path: Path, url: str, pid: int) -> None:
    """Write the discovery file atomically (readers never see half of it), user-only."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{pid}")
    tmp.write_text(json.dumps({"url": url, "pid": pid}))
    tmp.chmod(0o600)
    tmp.replace(path)


def remove(path: Path, pid: int) -> None:
    """Remove the discovery file if it is still the one `pid` wrote."""
    if _read(path).get("pid") == pid:
        path.unlink(missing_ok=True)


def live_url(environ: Mapping[str, str]) -> str | None:
    """The URL in the discovery file if the process that wrote it is alive, else None."""
    path = discovery_path(environ)
    found = _read(path)
    url, pid = found.get("url"), found.get("pid")
    if not isinstance(url, str) or not isinstance(pid, int):
        return None
    if not _alive(pid):
        log.debug("stale discovery file ignored path=%s pid=%d", path, pid)
        return None
    return url


def _read(path: Path) -> dict[str, object]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, but another user's
        return True
    return True
