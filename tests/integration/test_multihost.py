"""Servers across hosts: `vramfabric server --host --routes`, with TLS for clients and routes.

The first test needs no root: three members on loopback addresses of their own. The second
makes hosts of network namespaces joined by a bridge (tests/netns.py): 3 servers, 4 workers
and a coordinator, each on a host of its own, and cuts hosts off mid-job;
bench/multihost.py runs the same and prints figures.
"""

from __future__ import annotations

import functools
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.js.api import StreamConfig

from tests import netns
from tests.helpers import eventually, interrupt, wait_for_line
from tests.multihost import MultiHost, run
from tests.multihost_outcome import SLICES
from tests.tls_certs import greetings, make_certs
from vramfabric.broker import BrokerSettings, connect
from vramfabric.broker.cluster import free_ports
from vramfabric.broker.tls import client_context

CLI = [sys.executable, "-m", "vramfabric", "server"]
LOOPBACKS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")


def _usable(address: str) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((address, 0))
        except OSError:
            return False
    return True


@pytest.mark.timeout(180)
async def test_three_members_on_addresses_of_their_own_form_a_cluster_over_tls(
    tmp_path: Path,
) -> None:
    if not all(_usable(a) for a in LOOPBACKS):
        pytest.skip("127.0.0.2 and 127.0.0.3 are not loopback addresses here (Linux has them)")
    # Given a certificate per address, and one `vramfabric server --routes` per address, each
    # listening on its own address only, given every member's route URL (its own among them)
    certs = make_certs(tmp_path / "tls", {a: a for a in LOOPBACKS})
    ports = {a: free_ports(2, a) for a in LOOPBACKS}
    routes = ",".join(f"nats-route://{a}:{ports[a][1]}" for a in LOOPBACKS)
    members = []
    try:
        for a in LOOPBACKS:
            cert, key = certs.servers[a]
            flags = ["--host", a, "--port", str(ports[a][0]), "--cluster-port", str(ports[a][1])]
            flags += ["--routes", routes, "--store", str(tmp_path / a)]
            flags += ["--tls-cert", cert, "--tls-key", key, "--tls-ca", certs.ca]
            members.append(
                subprocess.Popen([*CLI, *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            )
        urls = []
        for a, member in zip(LOOPBACKS, members, strict=True):
            # When each says it is ready, it hands out its own address's tls:// URL
            line = wait_for_line(member.stdout, "nats-server ready", timeout_s=60)
            match = re.search(r"VRAMFABRIC_NATS_URL=(\S+)", line)
            assert match is not None and match.group(1) == f"tls://{a}:{ports[a][0]}", line
            assert f"VRAMFABRIC_TLS_CA={certs.ca}" in line and "cluster member" in line
            urls.append(match.group(1))
        # Then their route listeners speak TLS only, to peers with a certificate the CA signed
        for a in LOOPBACKS:
            cert, key = certs.servers[a]
            said = greetings([a], ports[a][1], certs.ca, cert, key)[a]
            assert "CERTIFICATE_REQUIRED" in said["stranger"], said
            assert said["peer"].startswith("INFO ") and '"cluster":"vf"' in said["peer"], said
        # And a client with the CA makes an R3 stream through them
        broker = BrokerSettings(url=",".join(urls), tls=client_context(certs.ca), replicas=3)
        conn = await connect(broker)
        try:
            add = functools.partial(
                conn.js.add_stream, StreamConfig(name="MEMBERS", subjects=["m.>"], num_replicas=3)
            )
            await broker.call_retry.call(add, what="add stream")
            for i in range(10):
                publish = functools.partial(conn.js.publish, f"m.{i}", b"x")
                await broker.call_retry.call(publish, what="publish")

            # And its leader and two replicas, kept current over the TLS routes, are the three
            # members, named for their route addresses
            async def replicated() -> bool:
                info = await conn.js.stream_info("MEMBERS")
                assert info.cluster is not None
                peers = info.cluster.replicas or []
                names = {info.cluster.leader, *(p.name for p in peers)}
                expected = {f"vf-{a.replace('.', '-')}-{ports[a][1]}" for a in LOOPBACKS}
                return (
                    info.state.messages == 10
                    and names == expected
                    and all(p.current for p in peers)
                )

            await eventually(replicated, timeout_s=60, interval_s=0.2)
        finally:
            await conn.close()
    finally:
        codes = [interrupt(m) for m in members]
    assert codes == [0, 0, 0]


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--routes", "http://10.0.0.2:6222"], "is not a route URL"),
        (["--routes", "10.0.0.2"], "is not a route URL"),
        (["--cluster-port", "7000"], "--cluster-port and --server-name go with --routes"),
        (["--routes", "10.0.0.2:6222", "--cluster", "3"], "does not go with --cluster"),
        (["--routes", "10.0.0.2:6222", "--tenants", "t.toml"], "--routes and --tenants"),
        (["--routes", "10.0.0.2:6222", "--server-name", "a b"], "server name 'a b'"),
        (["--cluster-name", "v f"], "--cluster-name 'v f'"),
    ],
)
def test_member_flags_that_do_not_fit_are_usage_errors(flags: list[str], said: str) -> None:
    done = subprocess.run(
        [*CLI, "--port", "-1", *flags], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done
    assert said in done.stderr, done.stderr


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[MultiHost]:
    """Three server hosts running, the worker and coordinator hosts made; all removed after."""
    why = netns.unavailable()
    if why is not None:
        # A root Linux CI machine can make namespaces: there, not running is a failure.
        if (
            os.environ.get("CI") == "true"
            and sys.platform.startswith("linux")
            and os.geteuid() == 0
        ):
            pytest.fail(f"the multi-host test must run under CI here: {why}")
        pytest.skip(why)
    mh = MultiHost(tmp_path)
    try:
        mh.start()
        yield mh
    finally:
        mh.stop()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_job_across_hosts_survives_a_worker_and_a_server_cut_off(hosts: MultiHost) -> None:
    # Given 3 servers whose routes speak TLS only, to peers with a certificate the CA signed
    for address, said in hosts.route_greetings().items():
        assert "CERTIFICATE_REQUIRED" in said["stranger"], (address, said)
        assert said["peer"].startswith("INFO ") and '"cluster":"vf"' in said["peer"], said
    # and 4 workers and a coordinator on hosts of their own (clients requiring TLS), and a
    # job of 3,000 chunks on 8 leases with R3 streams
    # When the first worker's host is cut off for 5 s and brought back, and then the host of
    # the server the coordinator is connected to, for 8 s
    outcome = run(hosts)
    # Then the job completes with every chunk folded exactly once
    assert outcome.error == "", f"{outcome.error}\n{_tails(hosts)}"
    assert outcome.completed and outcome.n_failed == 0
    assert outcome.lost == 0
    assert outcome.aggregated_twice == 0
    # And only chunks in the cut hosts' hands ran again, none that no cut explains: a lease
    # runs one chunk at a time, so at most one a lease when the host went, and one a lease
    # when it came back (an ack sent while a server rejoins can be lost); for the worker's
    # cut, only chunks that had run on that worker
    worker_cut, server_cut = outcome.cuts
    assert outcome.unexplained_re_executions == 0, (outcome.unexplained, outcome.cuts)
    assert worker_cut.re_executions <= 2 * SLICES, worker_cut
    assert server_cut.re_executions <= 2 * SLICES, server_cut
    assert set(worker_cut.first_ran_on) <= {"w1"}, worker_cut
    # And results flowed again after each host came back (stalls are measured, see
    # docs/BENCHMARKS.md; bounded here only by the cut plus the 30 s a client may take to
    # notice a dead connection)
    assert worker_cut.stall_s < worker_cut.down_s + 30, worker_cut
    assert server_cut.stall_s < server_cut.down_s + 30, server_cut


def _tails(mh: MultiHost) -> str:
    """The end of every process's log, for a failure's message."""
    logs = sorted(mh.logs.glob("*.log"))
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in logs)
