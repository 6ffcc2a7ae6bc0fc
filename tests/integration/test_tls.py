"""TLS between clients and servers, and between a cluster's servers (docs/operations/servers.md).

Every certificate is made here: a CA, a server certificate for 127.0.0.1 and localhost
(server and client auth: route peers present it as a client's), a client certificate, and
a second CA that signed none of them.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import ipaddress
import json
import os
import re
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from nats.js.api import StreamConfig

from tests.helpers import eventually, interrupt, wait_for_line
from vramfabric.broker import BrokerSettings, NatsServer, connect
from vramfabric.broker.cluster import LocalCluster
from vramfabric.broker.errors import PermanentError
from vramfabric.broker.tls import ServerTls, client_context
from vramfabric.coordinator import ArgMin, CoordinatorSettings, Fabric, Job
from vramfabric.demo import HYPERPARAM_RTOL, reference_argmin
from vramfabric.kernels import HYPERPARAM_EVAL
from vramfabric.kernels.hyperparam import encode_config, search_space
from vramfabric.local import LocalFleet

pytestmark = pytest.mark.timeout(180)

CLI = [sys.executable, "-m", "vramfabric"]
TENANTS = """
[operator]
password = "op-secret"
[workers]
password = "worker-secret"
[tenants.alice]
password = "alice-secret"
"""


@attrs.frozen
class Certs:
    """The files the tests' TLS uses."""

    ca: str
    server_cert: str
    server_key: str
    client_cert: str
    client_key: str
    other_ca: str  # signed none of the certificates above


@attrs.frozen
class _Authority:
    name: x509.Name
    key: ec.EllipticCurvePrivateKey


def _builder(subject: x509.Name, issuer: x509.Name, public: ec.EllipticCurvePublicKey) -> Any:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
    )


def _write(folder: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> str:
    (folder / f"{name}-key.pem").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path = folder / f"{name}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(path)


def _make_ca(folder: Path, name: str) -> tuple[str, _Authority]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"vramfabric test {name}")])
    usage = x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=True,
        crl_sign=True,
        encipher_only=False,
        decipher_only=False,
    )
    cert = (
        _builder(subject, subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(usage, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _write(folder, name, cert, key), _Authority(subject, key)


def _issue(folder: Path, name: str, ca: _Authority, *, server: bool) -> tuple[str, str]:
    """A certificate `ca` signs: for 127.0.0.1 and localhost (server), or a client's."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    builder = _builder(subject, ca.name, key.public_key())
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = (
        builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
        .sign(ca.key, hashes.SHA256())
    )
    return _write(folder, name, cert, key), str(folder / f"{name}-key.pem")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    """A CA, a server and a client certificate it signed, and a CA that signed nothing here."""
    folder = tmp_path_factory.mktemp("tls")
    ca_file, ca = _make_ca(folder, "ca")
    other_ca, _ = _make_ca(folder, "other-ca")
    server_cert, server_key = _issue(folder, "server", ca, server=True)
    client_cert, client_key = _issue(folder, "client", ca, server=False)
    return Certs(ca_file, server_cert, server_key, client_cert, client_key, other_ca)


def _server_tls(certs: Certs, verify_clients: bool = False) -> ServerTls:
    return ServerTls(certs.server_cert, certs.server_key, certs.ca, verify_clients)


@pytest.fixture
def tls_server(certs: Certs, tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server of the test's own that takes TLS clients only."""
    server = NatsServer(store_dir=str(tmp_path / "js"), tls=_server_tls(certs)).start()
    try:
        yield server
    finally:
        server.stop()


def _port(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


async def _greeting(port: int, tls: ssl.SSLContext) -> dict[str, Any]:
    """The INFO a listener sends first once a TLS handshake with `tls` is done."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    try:
        line = await asyncio.wait_for(reader.readline(), 20)
    finally:
        writer.close()
    assert line.startswith(b"INFO "), line
    return dict(json.loads(line[5:]))


async def test_a_worker_and_a_coordinator_run_a_job_over_tls_to_the_right_answer(
    certs: Certs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given `vramfabric server` started with the test's certificate, key and CA
    flags = ["--tls-cert", certs.server_cert, "--tls-key", certs.server_key, "--tls-ca", certs.ca]
    server = subprocess.Popen(
        [*CLI, "server", "--port", "-1", "--store", str(tmp_path / "js"), *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        line = wait_for_line(server.stdout, "nats-server ready", timeout_s=60)
        # (it hands out a tls:// URL and the CA clients verify it with)
        match = re.search(r"VRAMFABRIC_NATS_URL=(\S+)", line)
        assert match is not None and match.group(1).startswith("tls://127.0.0.1:"), line
        assert f"VRAMFABRIC_TLS_CA={certs.ca}" in line
        url = match.group(1)
        # When a worker process and a coordinator connect with the CA in their environment
        monkeypatch.setenv("VRAMFABRIC_NATS_URL", url)
        monkeypatch.setenv("VRAMFABRIC_TLS_CA", certs.ca)
        monkeypatch.setenv("VRAMFABRIC_PREFIX", "tlsjob")
        fleet = LocalFleet(
            workers=0, simulate="1x4GiB", slice_size="512MiB", prefix="tlsjob", url=url
        )
        try:
            fleet.add_worker("tls-node", ready_timeout_s=60)
            fabric = await Fabric.connect(
                BrokerSettings.from_env(), CoordinatorSettings(slice_bytes=512 * 2**20)
            )
            try:
                # and run the search over 200 configurations through the fabric
                configs = search_space(200)
                job = Job(HYPERPARAM_EVAL, [encode_config(*c) for c in configs])
                result = await fabric.run(job, ArgMin(), timeout_s=120)
            finally:
                await fabric.close()
        finally:
            codes = fleet.stop()
        # Then the best configuration is the one the reference finds directly
        index, loss = reference_argmin(configs)
        assert result.n_ok == 200 and result.n_failed == 0
        assert result.value[0] == index
        assert result.value[1] == pytest.approx(loss, rel=HYPERPARAM_RTOL)
        assert codes == [0]
    finally:
        assert interrupt(server) == 0


async def test_the_tenants_server_takes_passwords_over_tls_only(
    certs: Certs, tmp_path: Path
) -> None:
    # Given `vramfabric server --tenants` started with TLS (it provisions alice over TLS)
    path = tmp_path / "tenants.toml"
    path.write_text(TENANTS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VRAMFABRIC_")}
    flags = ["--tls-cert", certs.server_cert, "--tls-key", certs.server_key, "--tls-ca", certs.ca]
    server = subprocess.Popen(
        [*CLI, "server", "--port", "-1", "--tenants", str(path), *flags],
        env={**env, "VRAMFABRIC_PREFIX": "tlsauth"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        ready = wait_for_line(server.stdout, "nats-server ready", timeout_s=60)
        match = re.search(r"VRAMFABRIC_NATS_URL=(tls://\S+)", ready)
        assert match is not None and f"VRAMFABRIC_TLS_CA={certs.ca}" in ready, ready
        alice = {
            "VRAMFABRIC_NATS_URL": match.group(1),
            "VRAMFABRIC_PREFIX": "tlsauth",
            "VRAMFABRIC_NATS_USER": "alice",
            "VRAMFABRIC_NATS_PASSWORD": "alice-secret",
        }
        # When alice logs in without the CA, she is refused before her password is sent
        with pytest.raises(PermanentError, match="set VRAMFABRIC_TLS_CA"):
            await asyncio.wait_for(connect(BrokerSettings.from_env(alice)), 60)
        # Then with it she logs in and finds her streams, provisioned by the server
        broker = BrokerSettings.from_env({**alice, "VRAMFABRIC_TLS_CA": certs.ca})
        conn = await connect(broker)
        try:
            info = await conn.js.stream_info(broker.subjects.work_stream("alice"))
            assert info.state.messages == 0
        finally:
            await conn.close()
    finally:
        assert interrupt(server) == 0


async def test_a_client_without_the_ca_is_refused_and_told_what_to_set(
    certs: Certs, tls_server: NatsServer
) -> None:
    # Given a TLS server whose certificate the test's CA signed
    # When a client connects with no CA of its own (the system's CAs), then with another CA
    plain = BrokerSettings.from_env({"VRAMFABRIC_NATS_URL": tls_server.url})
    wrong = BrokerSettings.from_env(
        {"VRAMFABRIC_NATS_URL": tls_server.url, "VRAMFABRIC_TLS_CA": certs.other_ca}
    )
    # Then each connect fails at once (not retried for ever), saying the handshake failed
    with pytest.raises(PermanentError, match="set VRAMFABRIC_TLS_CA") as no_ca:
        await asyncio.wait_for(connect(plain), 60)
    assert "CERTIFICATE_VERIFY_FAILED" in str(no_ca.value)
    with pytest.raises(PermanentError, match="not signed by the CA in VRAMFABRIC_TLS_CA"):
        await asyncio.wait_for(connect(wrong), 60)
    # And a client with the CA gets in
    good = BrokerSettings.from_env(
        {"VRAMFABRIC_NATS_URL": tls_server.url, "VRAMFABRIC_TLS_CA": certs.ca}
    )
    conn = await connect(good)
    try:
        assert (await conn.js.account_info()).api.errors == 0
    finally:
        await conn.close()


async def test_a_plain_client_is_refused_by_the_tls_port(tls_server: NatsServer) -> None:
    # Given a TLS server, which greets in clear saying TLS is required
    reader, writer = await asyncio.open_connection("127.0.0.1", _port(tls_server.url))
    try:
        info = await asyncio.wait_for(reader.readline(), 20)
        assert b'"tls_required":true' in info
        # When a client answers in clear (its password in the CONNECT) and pings
        writer.write(b'CONNECT {"verbose":false,"user":"alice","pass":"secret"}\r\nPING\r\n')
        await writer.drain()
        # Then the server closes the connection, not a word (no PONG, no -ERR) in clear
        rest = await asyncio.wait_for(reader.read(), 30)
        assert rest == b""
    finally:
        writer.close()


async def test_a_client_that_requires_tls_sends_nothing_to_a_server_without_it(
    certs: Certs, tmp_path: Path
) -> None:
    # Given a plain server (or something in the middle) that traces every command it gets
    config = tmp_path / "plain.conf"
    config.write_text("listen: 127.0.0.1:-1\ndebug: true\ntrace: true\n")
    server = NatsServer(config_file=str(config), store_dir=str(tmp_path / "js")).start()
    try:
        # When a client with a CA set, and so TLS required, connects to it with a password
        settings = BrokerSettings.from_env(
            {"VRAMFABRIC_NATS_URL": server.url, "VRAMFABRIC_TLS_CA": certs.ca}
        )
        settings = attrs.evolve(settings, user="alice", password="secret")
        # Then it refuses the server, saying why
        with pytest.raises(PermanentError, match="does not ask for TLS"):
            await asyncio.wait_for(connect(settings), 60)
        # And the server never got a CONNECT (nats-py alone would send the password in clear)
        log = Path(server.log_path).read_text()
        assert "- Client connection created" in log
        assert "CONNECT" not in log
    finally:
        server.stop()


async def test_with_verify_clients_only_a_client_with_its_certificate_gets_in(
    certs: Certs, tmp_path: Path
) -> None:
    # Given a server that requires clients' certificates signed by the CA (mutual TLS)
    tls = _server_tls(certs, verify_clients=True)
    server = NatsServer(store_dir=str(tmp_path / "js"), tls=tls).start()
    env = {"VRAMFABRIC_NATS_URL": server.url, "VRAMFABRIC_TLS_CA": certs.ca}
    try:
        # When a client without a certificate connects, it is refused
        with pytest.raises(PermanentError, match="set VRAMFABRIC_TLS_CERT and VRAMFABRIC_TLS_KEY"):
            await asyncio.wait_for(connect(BrokerSettings.from_env(env)), 60)
        # Then one with VRAMFABRIC_TLS_CERT and _KEY gets in
        env.update(VRAMFABRIC_TLS_CERT=certs.client_cert, VRAMFABRIC_TLS_KEY=certs.client_key)
        conn = await connect(BrokerSettings.from_env(env))
        try:
            assert (await conn.js.account_info()).api.errors == 0
        finally:
            await conn.close()
    finally:
        server.stop()


async def test_a_three_server_cluster_with_tls_routes_serves_replicated_jetstream(
    certs: Certs, tmp_path: Path
) -> None:
    # Given three servers with TLS for clients and routes
    cluster = LocalCluster(base_dir=str(tmp_path), tls=_server_tls(certs)).start()
    ssl_ca = client_context(certs.ca)
    try:
        await cluster.wait_jetstream(timeout_s=90)
        # (every route listener speaks TLS only, to peers with a certificate the CA signed;
        # clients get tls:// URLs)
        peer, stranger = client_context(certs.ca, certs.server_cert, certs.server_key), ssl_ca
        for port in cluster.route_ports:
            assert (await _greeting(port, peer))["cluster"] == "vf"
            with pytest.raises(ssl.SSLError, match="CERTIFICATE_REQUIRED"):
                await _greeting(port, stranger)
        assert all(u.startswith("tls://127.0.0.1:") for u in cluster.urls)
        # When a client with the CA makes an R3 stream and publishes to it
        broker = BrokerSettings(url=cluster.url, tls=ssl_ca, replicas=3)
        conn = await connect(broker)
        try:
            await broker.call_retry.call(
                lambda: conn.js.add_stream(
                    StreamConfig(name="TLSR3", subjects=["tlsr3.>"], num_replicas=3)
                ),
                what="add stream",
            )
            for i in range(20):
                publish = functools.partial(conn.js.publish, f"tlsr3.{i}", b"x")
                await broker.call_retry.call(publish, what="publish")

            # Then the stream holds them on a leader and two replicas kept current over routes
            async def replicated() -> bool:
                info = await conn.js.stream_info("TLSR3")
                peers = (info.cluster.replicas or []) if info.cluster else []
                return (
                    info.state.messages == 20 and len(peers) == 2 and all(p.current for p in peers)
                )

            await eventually(replicated, timeout_s=60, interval_s=0.2)
        finally:
            await conn.close()
    finally:
        cluster.stop()


def test_bad_tls_files_are_clear_errors_at_start(certs: Certs, tmp_path: Path) -> None:
    missing, junk = str(tmp_path / "missing.pem"), tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    # A client's CA that is missing, or not a certificate, is named before any connect
    with pytest.raises(ValueError, match=r"VRAMFABRIC_TLS_CA: .*missing\.pem.*No such file"):
        BrokerSettings.from_env({"VRAMFABRIC_TLS_CA": missing})
    with pytest.raises(ValueError, match=r"VRAMFABRIC_TLS_CA: .*junk\.pem.*no certificate"):
        BrokerSettings.from_env({"VRAMFABRIC_TLS_CA": str(junk)})
    # A client certificate without its key
    with pytest.raises(ValueError, match="VRAMFABRIC_TLS_CERT, VRAMFABRIC_TLS_KEY"):
        BrokerSettings.from_env({"VRAMFABRIC_TLS_CERT": certs.client_cert})
    # A server key that is not its certificate's
    with pytest.raises(ValueError, match="do not load"):
        ServerTls(certs.server_cert, certs.client_key)
    # And the worker and `vramfabric server` say so in one line, exiting 2 (usage)
    worker = subprocess.run(
        [sys.executable, "-m", "vramfabric.worker", "--simulate", "1x4GiB"],
        env={**os.environ, "VRAMFABRIC_TLS_CA": missing},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert worker.returncode == 2
    assert worker.stderr.startswith("vramfabric worker: VRAMFABRIC_TLS_CA"), worker.stderr
    server = subprocess.run(
        [*CLI, "server", "--port", "-1", "--tls-cert", certs.server_cert],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert server.returncode == 2
    assert "TLS needs both --tls-cert and --tls-key" in server.stderr
