"""TLS for NATS: a server's certificate blocks in its config, and a client's SSL context.

A server presents its certificate to clients and, in a cluster, to its route peers. Routes
always verify both ways (nats-server's rule), so in a cluster the same certificate is also
a client's: it must name the route host (`127.0.0.1` for a LocalCluster) and allow client
auth. Clients verify the server against a CA (BrokerSettings, VRAMFABRIC_TLS_CA) or the
system's trust store. `ssl` is imported on first use: `vramfabric up` runs without TLS.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs

if TYPE_CHECKING:
    import ssl

# How long nats-server waits for a client's or a route's handshake; its own default (0.5 to
# 2 s by version) is short for a busy 2-core machine starting several clients at once.
HANDSHAKE_TIMEOUT_S = 5.0
# asyncio's warning each time a TLS connection nats-py made is closed: its stream protocol
# asks to stay half open, which TLS cannot do. The close itself goes as it should.
_CLOSING_NOISE = "returning true from eof_received() has no effect when using ssl"


class _DropClosingNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != _CLOSING_NOISE


_DROP_CLOSING_NOISE = _DropClosingNoise()


def quiet_closing_noise() -> None:
    """Drop asyncio's warning about every closed TLS connection (it would log each close)."""
    logging.getLogger("asyncio").addFilter(_DROP_CLOSING_NOISE)  # once, however often called


# Why a client that must use TLS refused a server (broker/guarded.py), and the sign of it
# among the errors of a failed connect.
NOT_OFFERED = "the server does not ask for TLS"


def client_context(
    ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None
) -> ssl.SSLContext:
    """An SSL context that verifies a server against `ca_file` (None: the system's trust store).

    With `cert_file` and `key_file` it also presents that certificate (mutual TLS).

    Raises:
        ValueError: a file is missing or unreadable, or holds no usable certificate or key.
    """
    import ssl

    try:
        context = ssl.create_default_context(cafile=ca_file)
    except OSError as exc:  # a missing file, or ssl.SSLError (an OSError): no certificate
        raise ValueError(f"the CA file {ca_file!r} does not load: {_why(exc)}") from None
    if cert_file or key_file:
        load_cert(context, cert_file, key_file)
    return context


def load_cert(context: ssl.SSLContext, cert_file: str | None, key_file: str | None) -> None:
    """Have `context` present this certificate (ValueError: a file missing or not loading)."""
    if not (cert_file and key_file):
        raise ValueError("a TLS certificate needs its key, and a key its certificate")
    try:
        context.load_cert_chain(cert_file, key_file)
    except OSError as exc:
        raise ValueError(
            f"the certificate {cert_file!r} and key {key_file!r} do not load: {_why(exc)}"
        ) from None


def _why(exc: OSError) -> str:
    """An OSError or SSLError as one line (`No such file...`, `[X509: ...] no certificate...`)."""
    why = exc.strerror or str(exc)
    # OpenSSL's reason for a file that is not PEM at all, or not of the kind expected.
    return f"{why} (not a PEM certificate, or not a PEM key?)" if "PEM lib" in why else why


def _absolute(path: str) -> str:
    return os.path.abspath(path)


@attrs.frozen
class ServerTls:
    """A server's certificate and key, and the CA it verifies peers with (routes, clients).

    The files are checked when this is made: a missing file or a key that is not the
    certificate's is a ValueError here, not a server that fails to start. Paths are kept
    absolute (nats-server reads them relative to its own working directory).
    """

    cert_file: str = attrs.field(converter=_absolute)
    key_file: str = attrs.field(converter=_absolute)
    # Verifies route peers (and clients' certificates with `verify_clients`); None: the
    # system's trust store, which knows no private CA.
    ca_file: str | None = attrs.field(default=None, converter=attrs.converters.optional(_absolute))
    # Clients must present a certificate the CA signed (mutual TLS); else any client may
    # connect over TLS and is held to its user and password.
    verify_clients: bool = False

    def __attrs_post_init__(self) -> None:
        if self.verify_clients and self.ca_file is None:
            raise ValueError("verifying clients' certificates needs the CA that signs them")
        import ssl

        load_cert(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), self.cert_file, self.key_file)
        if self.ca_file is not None:
            client_context(self.ca_file)

    def client_block(self) -> dict[str, object]:
        """nats-server's `tls { ... }` for client connections."""
        block = self._block()
        if self.verify_clients:
            block["verify"] = True
        return block

    def route_block(self) -> dict[str, object]:
        """nats-server's `cluster { tls { ... } }`: routes verify each other both ways."""
        return self._block()

    def _block(self) -> dict[str, object]:
        block: dict[str, object] = {
            "cert_file": self.cert_file,
            "key_file": self.key_file,
            "timeout": HANDSHAKE_TIMEOUT_S,
        }
        if self.ca_file is not None:
            block["ca_file"] = self.ca_file
        return block

    def probe_context(self) -> ssl.SSLContext:
        """A context for this process's own checks of its server (the CA, its own certificate).

        The server's certificate is presented as a client's, as a route peer presents it.
        """
        return client_context(self.ca_file, self.cert_file, self.key_file)


def failure(errors: Sequence[str], ca_given: bool) -> str | None:
    """Why a first connect failed on TLS, from the errors seen on the way; None if it did not.

    `errors` are nats-py's, as `TypeName: message`; `ca_given`: the client had a CA of its
    own (else it trusted the system's CAs).
    """
    failed = next((e for e in reversed(errors) if e.startswith("SSL") or NOT_OFFERED in e), None)
    if failed is None:
        return None
    if NOT_OFFERED in failed:
        return (
            f"{NOT_OFFERED} while this client requires it (a tls:// URL or VRAMFABRIC_TLS_* "
            "set): nothing was sent to it"
        )
    if "mismatch, certificate is not valid for" in failed:
        return (
            f"its certificate does not name the host connected to ({failed}); connect by a "
            "name it carries, or set VRAMFABRIC_TLS_HOSTNAME to one"
        )
    if "CERTIFICATE_VERIFY_FAILED" in failed and not ca_given:
        return (
            f"its certificate is not signed by a CA this machine trusts ({failed}); set "
            "VRAMFABRIC_TLS_CA to the CA certificate that signed the server's"
        )
    if "CERTIFICATE_VERIFY_FAILED" in failed:
        return f"its certificate is not signed by the CA in VRAMFABRIC_TLS_CA ({failed})"
    if "CERTIFICATE_REQUIRED" in failed:
        return (
            f"it requires a client certificate ({failed}); set VRAMFABRIC_TLS_CERT and "
            "VRAMFABRIC_TLS_KEY to one its CA signed"
        )
    return f"the TLS handshake failed ({failed})"
