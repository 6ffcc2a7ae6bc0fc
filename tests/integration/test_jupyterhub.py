"""A real JupyterHub gives each user a tenant of their own (vramfabric.jupyterhub).

Three users log in through a real browser (Debian's chromium, driven by playwright), each
runs the course's notebook, whose `%%gpu` cell runs on a slice of a fabric with auth on, and
sees its output; meanwhile `vramfabric status`, run as the operator, shows each user as its
own tenant. Needs chromium and configurable-http-proxy (.ci/run installs both where it can);
skips, naming what is missing, without them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import nbformat
import pytest

from tests.helpers import poll_until
from tests.hubfabric import OPERATOR_PASSWORD, Fabric
from tests.hubsetup import CHROMIUM_ARGS, Hub, barrier, chromium, missing_packages, missing_tools

# Hub user (as typed at login) -> its name in the hub (lower case) and its tenant.
USERS = {
    "alice": ("alice", "alice"),
    "Bob.Smith": ("bob.smith", "bob_smith"),
    "carol@uni.example": ("carol@uni.example", "carol_uni_example"),
}
RUN_CELLS_JS = (Path(__file__).parent / "hub_cells.js").read_text()


def course_notebook(release_url: str) -> Any:
    """The notebook every user opens: its `%%gpu` cell holds its slice until released."""
    cells = [
        "%load_ext vramfabric",
        "import os\n"
        'who, tenant = os.environ["JUPYTERHUB_USER"], os.environ["VRAMFABRIC_TENANT"]\n'
        f"release_url = {release_url!r}",
        "%%gpu\n"
        "import urllib.request\n"
        "urllib.request.urlopen(release_url, timeout=90).read()\n"
        'print("hello", who, "as tenant", tenant, "from the slice:", sum(range(10)))',
    ]
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])


def need_hub_tools() -> None:
    """Skip (or fail under CI, where the test extra must be installed) without the tools."""
    if packages := missing_packages():
        if os.environ.get("CI") == "true":
            pytest.fail(f"the test extra is not installed: {packages}")
        pytest.skip(f"JupyterHub browser test: missing Python packages {packages}")
    if tools := missing_tools():
        pytest.skip(f"JupyterHub browser test: not installed here: {tools}")


def leases_by_tenant(fabric: Fabric) -> dict[str, int]:
    """`vramfabric status --json` as the operator: leases per tenant."""
    out = subprocess.run(
        [sys.executable, "-m", "vramfabric", "status", "--json"],
        env=fabric.env("vf_operator", OPERATOR_PASSWORD),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return dict(json.loads(out.stdout)["leases_by_tenant"])


def shown(pages: dict[str, Any]) -> dict[str, str]:
    """Each user's page as the user sees it: how its run ended (if it did) and its cells."""
    return {
        user: page.evaluate(
            "() => `${document.body.dataset.vf || 'running'}: `"
            " + [...document.querySelectorAll('pre')].map((p) => p.textContent).join(' | ')"
        )
        for user, page in pages.items()
    }


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_three_hub_users_each_run_a_gpu_cell_as_a_tenant_of_their_own(tmp_path: Path) -> None:
    need_hub_tools()
    from playwright.sync_api import expect, sync_playwright

    t0 = time.monotonic()
    # Given a fabric with auth on (its tenants file holds only the staff's tenant), and a
    # JupyterHub whose pre-spawn hook is vramfabric.jupyterhub.FabricTenants
    fabric = Fabric(tmp_path).start()
    hub = Hub(tmp_path, fabric).start()
    try:
        fabric.wait_ready()
        hub.wait_ready()
        with barrier() as (release_url, release), sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium(), args=list(CHROMIUM_ARGS))
            # When three users log in through the browser at once (each lands on the course
            # notebook, which the course put in their homes)
            pages = {}
            for typed, (user, _tenant) in USERS.items():
                hub.home(user).mkdir(parents=True)
                nbformat.write(course_notebook(release_url), hub.home(user) / "gpu.ipynb")
                pages[typed] = browser.new_context().new_page()
                # Not waited for: the three pages load side by side.
                pages[typed].goto(f"{hub.url}/hub/login", wait_until="commit")
            for typed, page in pages.items():
                page.fill("#username_input", typed)
                page.fill("#password_input", "any password")  # the DummyAuthenticator's
                page.click("#login_submit")
            for page in pages.values():
                page.wait_for_url(lambda url: url.endswith("/view/gpu.ipynb"), timeout=120_000)
            pages = {USERS[typed][0]: page for typed, page in pages.items()}
            logged_in_s = time.monotonic() - t0
            # And each runs it: its %%gpu cell takes a slice and holds it until released
            for page in pages.values():
                base = urlsplit(page.url).path.removesuffix("view/gpu.ipynb")
                page.evaluate(RUN_CELLS_JS, base)
            # Then `vramfabric status`, as the operator, shows each user as its own tenant
            tenants = {tenant for _user, tenant in USERS.values()}
            seen: dict[str, int] = {}

            def all_leasing() -> bool:
                seen.clear()  # one status, not several, must show them all
                seen.update(leases_by_tenant(fabric))
                return tenants <= {t for t, n in seen.items() if n > 0}

            # On failure: what status showed, and what each user's page showed by then.
            assert poll_until(all_leasing, timeout_s=120, interval_s=0.2), (seen, shown(pages))
            assert {t: seen[t] for t in tenants} == dict.fromkeys(tenants, 1)
            # And once released, each user sees its cell's output in the browser
            release.set()
            for user, tenant in USERS.values():
                page = pages[user]
                expect(page.locator("body")).to_have_attribute("data-vf", "done", timeout=90_000)
                expect(page.locator("#vf-cell-2")).to_have_text(
                    f"hello {user} as tenant {tenant} from the slice: 45\n"
                )
            ran_s = time.monotonic() - t0
            browser.close()
    except BaseException:
        # Shown with the failure: what the hub, its servers and the fabric said.
        print(hub.tail(12_000), fabric.tail(), sep="\n")
        raise
    finally:
        hub.stop()
        fabric.stop()
    # And the tenants file holds one tenant per user, made by the hub, the staff's kept
    file = tomllib.loads(fabric.tenants_file.read_text())
    assert set(file["tenants"]) == tenants | {"staff"}
    owners = json.loads(Path(f"{fabric.tenants_file}.hub.json").read_text())
    assert owners == {tenant: user for user, tenant in USERS.values()}
    stopped_s = time.monotonic() - t0
    print(f"logged in {logged_in_s:.1f}s, cells done {ran_s:.1f}s, stopped {stopped_s:.1f}s")
