"""Certificates for tests across hosts: a CA, and one certificate per server for its address.

Each server certificate names its host's IP address and allows server and client auth:
clients verify the server by the address they connect to, and route peers present their
certificate as a client's (broker/tls.py). `greetings` checks what route listeners say to
a stranger and to a peer; run it on a host of the network with

    python -m tests.tls_certs OUT_JSON PORT CA CERT KEY ADDRESS...
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import socket
import ssl
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@attrs.frozen
class Certs:
    """The CA's certificate file, and each server's certificate and key files by name."""

    ca: str
    servers: dict[str, tuple[str, str]]


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _sign(
    subject: str, issuer: str, public: ec.EllipticCurvePublicKey, signer: ec.EllipticCurvePrivateKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
    )


def _write(folder: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> str:
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (folder / f"{name}-key.pem").write_bytes(key_pem)
    (folder / f"{name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(folder / f"{name}.pem")


def make_certs(folder: Path, addresses: Mapping[str, str]) -> Certs:
    """A CA, and a certificate it signed for each server name's IP address, under `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        _sign("vramfabric test CA", "vramfabric test CA", ca_key.public_key(), ca_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )
    ca_file = _write(folder, "ca", ca_cert, ca_key)
    servers = {}
    usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    authority = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    for name, address in addresses.items():
        key = ec.generate_private_key(ec.SECP256R1())
        san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address))])
        cert = (
            _sign(name, "vramfabric test CA", key.public_key(), ca_key)
            .add_extension(san, critical=False)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(authority, critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        servers[name] = (_write(folder, name, cert, key), str(folder / f"{name}-key.pem"))
    return Certs(ca_file, servers)


def _greeting(address: str, port: int, context: ssl.SSLContext) -> str:
    """The first line a TLS listener sends after the handshake, or why there is none."""
    try:
        with (
            socket.create_connection((address, port), timeout=20) as raw,
            context.wrap_socket(raw, server_hostname=address) as tls,
        ):
            return tls.recv(65536).split(b"\r\n")[0].decode(errors="replace")
    except OSError as exc:  # ssl.SSLError too: the refusal is the answer
        return f"{type(exc).__name__}: {exc}"


def greetings(
    addresses: Sequence[str], port: int, ca: str, cert: str, key: str
) -> dict[str, dict[str, str]]:
    """Per address, what its route listener answers: `stranger` (the CA only), `peer` (cert)."""
    stranger = ssl.create_default_context(cafile=ca)
    peer = ssl.create_default_context(cafile=ca)
    peer.load_cert_chain(cert, key)
    return {
        a: {"stranger": _greeting(a, port, stranger), "peer": _greeting(a, port, peer)}
        for a in addresses
    }


if __name__ == "__main__":
    out, port, ca, cert, key, *addresses = sys.argv[1:]
    Path(out).write_text(json.dumps(greetings(addresses, int(port), ca, cert, key)))
