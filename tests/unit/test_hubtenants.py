"""Hub users' tenants in the tenants file: names, creation once, collisions refused."""

from __future__ import annotations

import json
import stat
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vramfabric.broker import tenants
from vramfabric.broker.settings import RESERVED_USERS
from vramfabric.broker.subjects import token
from vramfabric.hubtenants import MAX_TENANT_CHARS, HubTenants, TenantDefaults, tenant_name

OPERATOR_FILE = """# the course's fabric
[operator]
password = "op-secret"
[workers]
password = "workers-secret"
[tenants.staff]
password = "staff-secret"
[tenants.keyed]
nkey = "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4"
"""


@pytest.fixture
def tenants_file(tmp_path: Path) -> Path:
    """A tenants file the operator wrote: one tenant with a password, one with an nkey."""
    path = tmp_path / "tenants.toml"
    path.write_text(OPERATOR_FILE)
    path.chmod(0o600)
    return path


@pytest.mark.parametrize(
    ("hub_user", "tenant"),
    [
        ("alice", "alice"),
        ("Alice.Smith@uni.example", "alice_smith_uni_example"),
        ("bob-2", "bob-2"),
        ("  dana  ", "dana"),
        ("vf_operator", "u_vf_operator"),
        ("vf_x", "u_vf_x"),
        ("vf_workers", "u_vf_workers"),
        ("émile", "mile"),
    ],
)
def test_tenant_names_from_hub_user_names(hub_user: str, tenant: str) -> None:
    assert tenant_name(hub_user) == tenant


def test_long_names_are_cut_and_keep_apart_by_a_hash() -> None:
    a, b = "x" * 80 + "@one.example", "x" * 80 + "@two.example"
    assert len(tenant_name(a)) == len(tenant_name(b)) == MAX_TENANT_CHARS
    assert tenant_name(a) != tenant_name(b)


def test_a_name_with_no_letter_or_digit_is_refused() -> None:
    with pytest.raises(ValueError, match="no letter or digit"):
        tenant_name("...")


@given(st.text(min_size=1).filter(lambda s: any(c.isascii() and c.isalnum() for c in s)))
def test_every_tenant_name_is_a_token_the_fabric_does_not_reserve(hub_user: str) -> None:
    name = tenant_name(hub_user)
    assert token(name) == name and len(name) <= MAX_TENANT_CHARS
    assert not name.startswith(tenants.RESERVED_PREFIX) and name not in RESERVED_USERS


def test_a_first_claim_adds_the_tenant_and_a_second_gives_the_same_login(
    tenants_file: Path,
) -> None:
    # Given the operator's tenants file, and a hub that makes tenants with code and a quota
    hub = HubTenants(tenants_file, TenantDefaults(allow_code=True, quota="4GiB", weight=2.0))
    # When a hub user is claimed a tenant twice
    first = hub.claim("Alice.Smith")
    second = hub.claim("Alice.Smith")
    # Then the first added it to the file with a fresh password, and the second found it
    assert (first.tenant, first.created, second.created) == ("alice_smith", True, False)
    assert second.password == first.password and len(first.password) >= 32
    file = tenants.load(tenants_file)
    alice = file.tenant("alice_smith")
    assert alice.credential.password == first.password
    assert (alice.quota_bytes, alice.weight, alice.allow_code) == (4 * 2**30, 2.0, True)
    # And the operator's part of the file is kept as written, the file still theirs alone
    text = tenants_file.read_text()
    assert text.startswith(OPERATOR_FILE)
    assert '# added by vramfabric.jupyterhub for hub user "Alice.Smith"' in text
    assert stat.S_IMODE(tenants_file.stat().st_mode) == 0o600
    # And the owners file says whose it is
    assert json.loads(Path(f"{tenants_file}.hub.json").read_text()) == {
        "alice_smith": "Alice.Smith"
    }


def test_a_second_hub_user_mapping_to_the_same_tenant_is_refused(tenants_file: Path) -> None:
    # Given a tenant made for hub user Alice.Smith
    hub = HubTenants(tenants_file)
    hub.claim("Alice.Smith")
    before = tenants_file.read_text()
    # When hub user alice_smith (the same tenant name) spawns
    with pytest.raises(ValueError) as refused:
        hub.claim("alice_smith")
    # Then it is refused, naming both users and the tenant, and nothing changed
    assert "'alice_smith'" in str(refused.value) and "'Alice.Smith'" in str(refused.value)
    assert tenants_file.read_text() == before


def test_a_tenant_the_operator_wrote_is_handed_out_only_when_adopting(
    tenants_file: Path,
) -> None:
    # Given the operator's tenant "staff" (no hub user owns it)
    # When hub user "staff" spawns on a hub that does not adopt
    with pytest.raises(ValueError, match="no hub user owns"):
        HubTenants(tenants_file).claim("staff")
    # Then it gets nothing; on a hub that adopts, it gets the operator's tenant, now its own
    login = HubTenants(tenants_file, adopt_existing=True).claim("staff")
    assert (login.tenant, login.password, login.created) == ("staff", "staff-secret", False)
    assert HubTenants(tenants_file).claim("staff").password == "staff-secret"
    with pytest.raises(ValueError, match="belongs to hub user 'staff'"):
        HubTenants(tenants_file).claim("Staff", tenant="staff")


def test_a_tenant_with_an_nkey_has_no_password_to_hand_out(tenants_file: Path) -> None:
    with pytest.raises(ValueError, match="nkey or a bcrypt hash"):
        HubTenants(tenants_file, adopt_existing=True).claim("keyed")


def test_a_bad_quota_is_refused_when_the_hub_starts() -> None:
    with pytest.raises(ValueError, match="not a size"):
        TenantDefaults(quota="lots")


def test_claims_at_once_from_threads_lose_no_tenant(tenants_file: Path) -> None:
    # Given a hub whose spawns claim tenants on threads at the same time
    hub = HubTenants(tenants_file)
    users = [f"student{i}" for i in range(12)]
    logins = {}

    def claim(user: str) -> None:
        logins[user] = hub.claim(user)

    threads = [threading.Thread(target=claim, args=(u,)) for u in users]
    # When twelve users are claimed at once
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    # Then every one is in the file, with the password its claim gave, and owned
    file = tenants.load(tenants_file)
    assert {u: file.tenant(u).credential.password for u in users} == {
        u: logins[u].password for u in users
    }
    owners = json.loads(Path(f"{tenants_file}.hub.json").read_text())
    assert owners == {u: u for u in users}
