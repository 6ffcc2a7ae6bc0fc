"""BrokerSettings: how to reach NATS and name things on it, read from the environment once."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import attrs

from . import discovery
from .retrying import CallRetry
from .subjects import JS_API, Subjects
from .tls import client_context, load_cert

if TYPE_CHECKING:
    import ssl

DEFAULT_URL = "nats://127.0.0.1:4222"

# The fabric's own users (account FABRIC when auth is on); any other user is a tenant, in an
# account of its own (broker/auth.py).
OPERATOR_USER = "vf_operator"
WORKERS_USER = "vf_workers"
RESERVED_USERS = (OPERATOR_USER, WORKERS_USER)

_UNITS = {
    "": 1,
    "B": 1,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
}
# The schemes nats-py connects with; a URL without one is taken as nats:// (HOST:PORT).
URL_SCHEMES = ("nats", "tls", "ws", "wss")
_URL_HINT = "expected nats://HOST:PORT, several comma-separated"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str) -> int:
    """Parse `512MiB`, `48GiB`, `1.5GB` or a plain byte count into bytes."""
    match = _SIZE.match(text)
    unit = match.group(2).upper() if match else ""
    if not match or unit not in _UNITS:
        raise ValueError(f"not a size: {text!r} (try 512MiB, 48GiB or a byte count)")
    n_bytes = int(float(match.group(1)) * _UNITS[unit])
    if n_bytes <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    return n_bytes


def check_url(url: str) -> None:
    """Raise ValueError naming the first server URL in `url` that nats-py cannot use.

    nats-py fails late and obscurely on these (an AssertionError for `HOST:1:2`, a connect
    timeout for `http://...` or a bare word), so they are refused before any connect.
    """
    servers = [u.strip() for u in url.split(",") if u.strip()]
    if not servers:
        raise ValueError(f"no server URL in {url!r} ({_URL_HINT})")
    for server in servers:
        if why := _url_problem(server):
            shown = re.sub(r"//[^@/]*@", "//***@", server)  # no password in an error line
            raise ValueError(f"{shown!r} is not a NATS URL: {why} ({_URL_HINT})")


def _url_problem(server: str) -> str | None:
    if "://" not in server:
        if ":" not in server:
            return "no scheme and no port"
        server = f"nats://{server}"
    parts = urlsplit(server)
    if parts.scheme not in URL_SCHEMES:
        return f"scheme {parts.scheme}:// is not one of {', '.join(URL_SCHEMES)}"
    try:
        port = parts.port
    except ValueError:
        where = parts.netloc.rpartition("@")[2]
        return f"the port in {where!r} is not a number from 0 to 65535"
    if not parts.hostname:
        return "no host"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return "a NATS URL has no path, query or fragment"
    return None if port is None or port > 0 else "port 0"


def env_float(environ: Mapping[str, str], name: str, default: float) -> float:
    """Read a float variable, naming the variable in the error if it does not parse."""
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number") from None


def env_size(environ: Mapping[str, str], name: str, default: int) -> int:
    """Read a size (`512MiB`, bytes), naming the variable in the error if it does not parse."""
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return parse_size(raw)
    except ValueError as exc:
        raise ValueError(f"{name}: {exc}") from None


def env_flag(environ: Mapping[str, str], name: str, default: bool) -> bool:
    """Read a yes/no variable (1/0, true/false, yes/no), naming it in the error."""
    raw = (environ.get(name) or "").strip().lower()
    if not raw:
        return default
    if raw in ("1", "true", "yes"):
        return True
    if raw in ("0", "false", "no"):
        return False
    raise ValueError(f"{name}={environ[name]!r} is not a yes/no value (1/0, true/false)")


def env_int(environ: Mapping[str, str], name: str, default: int) -> int:
    """Read an integer variable, naming the variable in the error if it does not parse."""
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


@attrs.frozen
class BrokerSettings:
    """Connection and naming settings shared by workers and coordinators."""

    url: str = DEFAULT_URL
    prefix: str = attrs.field(default="vf", validator=lambda _i, _a, v: Subjects(v))
    user: str | None = None
    password: str | None = None
    creds_file: str | None = None
    # A file holding the user's nkey seed (`SU...`): logs in with the nkey, not a password.
    nkey_seed_file: str | None = None
    # With credentials, each tenant is in a NATS account of its own (the config broker/auth.py
    # generates). False for a server of your own whose users share one account.
    tenant_accounts: bool = True
    replicas: int = attrs.field(default=1, validator=attrs.validators.in_((1, 3, 5)))
    connect_timeout_s: float = 2.0
    request_timeout_s: float = 2.0
    # Adverts vanish from KV this long after a node's last heartbeat.
    node_ttl_s: float = attrs.field(default=5.0, validator=attrs.validators.ge(1.0))
    # How long a call to NATS (connect, publish, topology) retries transient failures, and
    # its first and longest pause between tries (see broker/retrying.py).
    retry_deadline_s: float = attrs.field(default=30.0, validator=attrs.validators.gt(0))
    retry_pause_s: float = attrs.field(default=0.1, validator=attrs.validators.gt(0))
    retry_max_pause_s: float = attrs.field(default=1.0, validator=attrs.validators.gt(0))
    # Verifies the server (and presents a client certificate, for mutual TLS); built by
    # from_env from VRAMFABRIC_TLS_CA/CERT/KEY. None with a tls:// URL: the system's CAs.
    tls: ssl.SSLContext | None = attrs.field(default=None, eq=False, repr=False)
    # The name the server's certificate must carry, where it is not the host in the URL.
    tls_hostname: str | None = None

    @property
    def tls_required(self) -> bool:
        """Whether every connection must be TLS: TLS settings given, or a `tls://` URL.

        nats-py upgrades to TLS only when the server asks; a connection that must be TLS
        refuses a server that does not ask, before any credential is sent.
        """
        tls_url = any(u.startswith("tls://") for u in self.servers)
        return tls_url or self.tls is not None or self.tls_hostname is not None

    @property
    def authenticated(self) -> bool:
        """Whether credentials are given (auth is on)."""
        return bool(self.user or self.creds_file or self.nkey_seed_file)

    @property
    def accounts(self) -> bool:
        """Whether the fabric runs one NATS account per tenant (auth on, generated config)."""
        return self.authenticated and self.tenant_accounts

    @property
    def in_tenant_account(self) -> bool:
        """Whether this client logs in to a tenant's own account (not a service user).

        Such a client reaches the fleet's shared state (adverts) only through its account's
        imports, under `Subjects.fleet_api()`.
        """
        return self.accounts and self.user not in RESERVED_USERS

    @property
    def fleet_api(self) -> str:
        """The JetStream API prefix of the adverts bucket, as this client reaches it."""
        return self.subjects.fleet_api() if self.in_tenant_account else JS_API

    def tenant_api(self, tenant: str) -> str:
        """The JetStream API prefix of a tenant's streams, as the workers reach them."""
        return self.subjects.tenant_api(tenant) if self.accounts else JS_API

    @property
    def call_retry(self) -> CallRetry:
        """The retry policy for calls to NATS, with this deadline and these pauses."""
        return CallRetry(self.retry_deadline_s, self.retry_pause_s, self.retry_max_pause_s)

    @property
    def subjects(self) -> Subjects:
        """The subject names for this prefix."""
        return Subjects(self.prefix)

    @property
    def servers(self) -> list[str]:
        """The server URLs (comma-separated in `url`)."""
        return [u.strip() for u in self.url.split(",") if u.strip()]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> BrokerSettings:
        """Build settings from `VRAMFABRIC_*` variables; absent ones keep their defaults.

        The URL is VRAMFABRIC_NATS_URL, else that of a live `vramfabric up` on this machine
        (its discovery file), else DEFAULT_URL.
        """
        url = environ.get("VRAMFABRIC_NATS_URL")
        if url:
            try:
                check_url(url)
            except ValueError as exc:
                raise ValueError(f"VRAMFABRIC_NATS_URL: {exc}") from None
        return cls(
            url=url or discovery.live_url(environ) or DEFAULT_URL,
            prefix=environ.get("VRAMFABRIC_PREFIX") or "vf",
            user=environ.get("VRAMFABRIC_NATS_USER") or None,
            password=environ.get("VRAMFABRIC_NATS_PASSWORD") or None,
            creds_file=environ.get("VRAMFABRIC_NATS_CREDS") or None,
            nkey_seed_file=environ.get("VRAMFABRIC_NATS_NKEY_SEED") or None,
            tenant_accounts=env_flag(environ, "VRAMFABRIC_TENANT_ACCOUNTS", True),
            replicas=env_int(environ, "VRAMFABRIC_REPLICAS", 1),
            connect_timeout_s=env_float(environ, "VRAMFABRIC_CONNECT_TIMEOUT_S", 2.0),
            request_timeout_s=env_float(environ, "VRAMFABRIC_REQUEST_TIMEOUT_S", 2.0),
            node_ttl_s=env_float(environ, "VRAMFABRIC_NODE_TTL_S", 5.0),
            retry_deadline_s=env_float(environ, "VRAMFABRIC_RETRY_DEADLINE_S", 30.0),
            retry_pause_s=env_float(environ, "VRAMFABRIC_RETRY_PAUSE_S", 0.1),
            retry_max_pause_s=env_float(environ, "VRAMFABRIC_RETRY_MAX_PAUSE_S", 1.0),
            tls=_tls_context(environ),
            tls_hostname=environ.get("VRAMFABRIC_TLS_HOSTNAME") or None,
        )


def _tls_context(environ: Mapping[str, str]) -> ssl.SSLContext | None:
    """The client's TLS context from VRAMFABRIC_TLS_CA, _CERT and _KEY; None if none is set.

    Built here, at start: a missing or bad file is an error now, not a connect that hangs.
    """
    ca_file = environ.get("VRAMFABRIC_TLS_CA") or None
    cert_file = environ.get("VRAMFABRIC_TLS_CERT") or None
    key_file = environ.get("VRAMFABRIC_TLS_KEY") or None
    if not (ca_file or cert_file or key_file):
        return None
    try:
        context = client_context(ca_file)
    except ValueError as exc:
        raise ValueError(f"VRAMFABRIC_TLS_CA: {exc}") from None
    if cert_file or key_file:
        try:
            load_cert(context, cert_file, key_file)
        except ValueError as exc:
            raise ValueError(f"VRAMFABRIC_TLS_CERT, VRAMFABRIC_TLS_KEY: {exc}") from None
    return context
