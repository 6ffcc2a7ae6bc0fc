"""FabricTenants as a hub's config builds it: the docs' jupyterhub_config.py, bad settings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from traitlets.config import Config

from vramfabric.jupyterhub import FabricTenants, TenantLogin

NOTEBOOKS_MD = Path(__file__).resolve().parents[2] / "docs" / "notebooks.md"


def docs_config() -> str:
    """The jupyterhub_config.py of docs/notebooks.md's JupyterHub section."""
    section = NOTEBOOKS_MD.read_text().split("## JupyterHub", 1)[1]
    match = re.search(r"```python\n(# jupyterhub_config.py\n.*?)```", section, re.S)
    assert match, "docs/notebooks.md's JupyterHub section has no jupyterhub_config.py"
    return match.group(1)


def test_the_documented_config_sets_the_hook_and_touches_nothing_at_load() -> None:
    # Given the documented jupyterhub_config.py, loaded as JupyterHub loads it
    config = Config()
    namespace = {"get_config": lambda: config, "__name__": "jupyterhub_config"}
    # When it is run (its tenants file does not exist here)
    exec(compile(docs_config(), "jupyterhub_config.py", "exec"), namespace)
    # Then the spawner's pre-spawn hook is a FabricTenants for the documented fabric
    hook = config.Spawner.pre_spawn_hook
    assert isinstance(hook, FabricTenants)
    assert hook.nats_url == "nats://gpu-head.example:4222"
    assert (hook.prefix, hook.quota, hook.allow_code) == ("vf", "8GiB", True)
    # And what it gives a user's server names that fabric and the user's own tenant
    env = hook.environment(TenantLogin("alice", "pw"))
    assert env == {
        "VRAMFABRIC_NATS_URL": "nats://gpu-head.example:4222",
        "VRAMFABRIC_PREFIX": "vf",
        "VRAMFABRIC_TENANT": "alice",
        "VRAMFABRIC_NATS_USER": "alice",
        "VRAMFABRIC_NATS_PASSWORD": "pw",
    }


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"nats_url": "http://gpu-head:8222"}, "nats://"),
        ({"nats_url": "nats://h:4222", "prefix": "Bad.Prefix"}, "prefix"),
        ({"nats_url": "nats://h:4222", "quota": "lots"}, "not a size"),
        ({"nats_url": "nats://h:4222", "weight": 0}, "weight"),
    ],
)
def test_bad_settings_stop_the_hub_at_start(kwargs: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        FabricTenants("/etc/vramfabric/tenants.toml", **kwargs)  # type: ignore[arg-type]
