"""Where clients find `vramfabric up`: the URL setting, a live discovery file, the default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from vramfabric.broker import discovery
from vramfabric.broker.settings import DEFAULT_URL, BrokerSettings


def env_for(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"HOME": str(tmp_path), **extra}


def test_settings_take_the_url_of_a_live_discovery_file(tmp_path: Path) -> None:
    # Given a discovery file written by this (live) process
    env = env_for(tmp_path)
    discovery.write(discovery.discovery_path(env), "nats://127.0.0.1:4999", os.getpid())
    # Then settings from an environment without a URL use it
    assert BrokerSettings.from_env(env).url == "nats://127.0.0.1:4999"
    # And VRAMFABRIC_NATS_URL still wins
    env["VRAMFABRIC_NATS_URL"] = "nats://10.0.0.1:4222"
    assert BrokerSettings.from_env(env).url == "nats://10.0.0.1:4222"


def test_a_discovery_file_of_a_dead_process_is_ignored(tmp_path: Path) -> None:
    # Given a discovery file whose writer has exited
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    env = env_for(tmp_path)
    discovery.write(discovery.discovery_path(env), "nats://127.0.0.1:4999", dead.pid)
    # Then settings fall back to the default URL
    assert BrokerSettings.from_env(env).url == DEFAULT_URL


def test_the_runtime_dir_comes_first_and_the_file_is_private(tmp_path: Path) -> None:
    # Given a session runtime dir
    env = env_for(tmp_path, XDG_RUNTIME_DIR=str(tmp_path / "run"))
    path = discovery.discovery_path(env)
    # When the file is written there
    discovery.write(path, "nats://127.0.0.1:4999", os.getpid())
    # Then it is under the runtime dir, readable by its user only, and removed by its writer
    assert path == tmp_path / "run" / "vramfabric" / "fabric.json"
    assert path.stat().st_mode & 0o077 == 0
    discovery.remove(path, os.getpid() + 1)  # not the writer: left alone
    assert path.exists()
    discovery.remove(path, os.getpid())
    assert not path.exists()


def test_without_a_file_the_default_url_is_used(tmp_path: Path) -> None:
    assert BrokerSettings.from_env(env_for(tmp_path)).url == DEFAULT_URL
