"""worker/leases/ledger.py: SliceLedger grants, renews, releases, reaps slices; time a number."""

from __future__ import annotations

from vramfabric.broker import codec
from vramfabric.broker.messages import LeaseRequest, NodeAdvert
from vramfabric.worker.leases.ledger import SliceLedger
from vramfabric.worker.node.gpus import GpuSpec
from vramfabric.worker.node.health import GpuReading

GiB = 2**30
T0 = 1_700_000_000.0


def make_ledger(*sizes_gib: int, granule: int = GiB, max_ttl_s: float = 3600.0) -> SliceLedger:
    """A node `n1` with one simulated GPU per size (in GiB)."""
    gpus = tuple(GpuSpec(i, "sim", size * GiB) for i, size in enumerate(sizes_gib))
    return SliceLedger(node="n1", gpus=gpus, granule_bytes=granule, max_ttl_s=max_ttl_s)


def req(
    request_id: str = "r1",
    count: int = 1,
    slice_bytes: int = GiB,
    ttl_s: float = 30.0,
    job: str = "j1",
) -> LeaseRequest:
    return LeaseRequest(
        request_id=request_id, job=job, count=count, slice_bytes=slice_bytes, ttl_s=ttl_s
    )


def test_grant_spreads_slices_over_gpus() -> None:
    # Given two 4 GiB GPUs
    ledger = make_ledger(4, 4)
    # When three 1 GiB slices are asked for
    grant = ledger.grant(req(count=3), "acme", T0)
    # Then they alternate, the lower index first on a tie
    assert [lease.gpu for lease in grant.leases] == [0, 1, 0]
    assert grant.denied is None
    # And the next request starts on the GPU with more free memory
    more = ledger.grant(req("r2", count=3), "acme", T0)
    assert [lease.gpu for lease in more.leases] == [1, 0, 1]


def test_grant_goes_to_the_gpu_with_most_free_memory_first() -> None:
    # Given GPUs of 2, 8 and 4 GiB
    ledger = make_ledger(2, 8, 4)
    # When seven 1 GiB slices are asked for
    grant = ledger.grant(req(count=7), "acme", T0)
    # Then the 8 GiB GPU takes slices until it is level with the next, and so on
    assert [lease.gpu for lease in grant.leases] == [1, 1, 1, 1, 1, 2, 1]
    assert [g.free_bytes // GiB for g in ledger.advert(T0).gpus] == [2, 2, 3]


def test_a_node_of_four_gpus_spreads_250_leases_over_all_four() -> None:
    ledger = make_ledger(48, 48, 48, 48, granule=GiB // 8)
    grant = ledger.grant(req(count=250, slice_bytes=GiB // 8), "acme", T0)
    by_gpu = [sum(1 for lease in grant.leases if lease.gpu == i) for i in range(4)]
    assert by_gpu == [63, 63, 62, 62]


def test_granted_leases_describe_the_request() -> None:
    ledger = make_ledger(4)
    grant = ledger.grant(req(count=2, ttl_s=30.0, job="j7"), "acme", T0)
    assert grant.node == "n1"
    assert len({lease.lease_id for lease in grant.leases}) == 2
    for lease in grant.leases:
        assert lease.lease_id.startswith("r1-")
        assert (lease.node, lease.job, lease.tenant) == ("n1", "j7", "acme")
        assert lease.expires_at == T0 + 30.0
        assert ledger.get(lease.lease_id) == lease
        assert ledger.is_live(lease.lease_id, T0)


def test_slice_bytes_are_rounded_up_to_the_granule() -> None:
    # Given a 4 GiB GPU cut in 1 GiB granules
    ledger = make_ledger(4)
    # When 1.5 GiB slices are asked for
    grant = ledger.grant(req(count=5, slice_bytes=GiB + GiB // 2), "acme", T0)
    # Then each takes 2 GiB, so only two fit
    assert [lease.slice_bytes for lease in grant.leases] == [2 * GiB, 2 * GiB]
    assert ledger.leased_bytes == 4 * GiB


def test_tiny_slice_still_takes_a_whole_granule() -> None:
    ledger = make_ledger(1, granule=256 * 2**20)
    grant = ledger.grant(req(count=10, slice_bytes=1), "acme", T0)
    assert len(grant.leases) == 4
    assert all(lease.slice_bytes == 256 * 2**20 for lease in grant.leases)


def test_partial_grant_when_the_node_is_short() -> None:
    # Given 2 + 3 free slices
    ledger = make_ledger(2, 3)
    # When ten are asked for
    grant = ledger.grant(req(count=10), "acme", T0)
    # Then the node grants what it has, without a denial
    assert len(grant.leases) == 5
    assert grant.denied is None
    assert ledger.leased_bytes == 5 * GiB


def test_denial_with_a_reason_when_nothing_fits() -> None:
    # Given a full node
    ledger = make_ledger(2)
    ledger.grant(req(count=2), "acme", T0)
    # When another slice is asked for
    grant = ledger.grant(req("r2"), "acme", T0)
    # Then it is denied and says why
    assert grant.leases == ()
    assert grant.denied is not None
    assert "no free slice" in grant.denied
    assert str(GiB) in grant.denied
    assert "n1" in grant.denied
    assert len(ledger) == 2


def test_slice_larger_than_any_gpu_is_denied() -> None:
    ledger = make_ledger(4, 4)
    grant = ledger.grant(req(slice_bytes=5 * GiB), "acme", T0)
    assert grant.leases == ()
    assert grant.denied
    assert ledger.leased_bytes == 0


def test_retried_request_id_returns_the_same_leases() -> None:
    # Given a granted request
    ledger = make_ledger(8)
    first = ledger.grant(req(count=3), "acme", T0)
    # When the same request is retried (lost reply), even a little later
    again = ledger.grant(req(count=3), "acme", T0 + 1)
    # Then it gets the same leases and no more VRAM is taken
    assert again.leases == first.leases
    assert len(ledger) == 3
    assert ledger.leased_bytes == 3 * GiB


def test_retried_request_after_a_partial_release_returns_what_is_still_held() -> None:
    ledger = make_ledger(8)
    first = ledger.grant(req(count=3), "acme", T0)
    ledger.release([first.leases[0].lease_id], "acme")
    again = ledger.grant(req(count=3), "acme", T0)
    assert again.leases == first.leases[1:]
    assert len(ledger) == 2


def test_request_id_can_be_reused_once_all_its_leases_are_gone() -> None:
    ledger = make_ledger(8)
    first = ledger.grant(req(count=2), "acme", T0)
    ledger.release([lease.lease_id for lease in first.leases], "acme")
    fresh = ledger.grant(req(count=1), "acme", T0 + 5)
    assert len(fresh.leases) == 1
    assert fresh.leases[0].expires_at == T0 + 5 + 30.0


def test_denied_request_is_not_remembered() -> None:
    ledger = make_ledger(1)
    ledger.grant(req("r1"), "acme", T0)
    assert ledger.grant(req("r2"), "acme", T0).denied
    ledger.release(["r1-0"], "acme")
    # The retry of the denied request now finds room
    assert len(ledger.grant(req("r2"), "acme", T0).leases) == 1


def test_request_id_of_another_tenant_does_not_return_their_leases() -> None:
    # Given tenant acme holding a lease from request r1
    ledger = make_ledger(8)
    ledger.grant(req("r1"), "acme", T0)
    # When tenant beta sends a request with the same id
    grant = ledger.grant(req("r1", job="other"), "beta", T0)
    # Then beta never sees acme's leases
    assert all(lease.tenant == "beta" for lease in grant.leases)


def test_max_ttl_clamps_grant_expiry() -> None:
    ledger = make_ledger(4, max_ttl_s=60.0)
    grant = ledger.grant(req(ttl_s=7200.0), "acme", T0)
    assert grant.leases[0].expires_at == T0 + 60.0


def test_renew_extends_live_leases_from_now() -> None:
    ledger = make_ledger(4)
    ids = [lease.lease_id for lease in ledger.grant(req(count=2), "acme", T0).leases]
    reply = ledger.renew(ids, "acme", 45.0, T0 + 20)
    assert reply.expires_at == dict.fromkeys(ids, T0 + 20 + 45.0)
    assert reply.unknown == ()
    assert ledger.get(ids[0]).expires_at == T0 + 65.0  # type: ignore[union-attr]
    # The renewed lease outlives its original expiry
    assert ledger.reap(T0 + 31) == []
    assert ledger.is_live(ids[0], T0 + 31)


def test_renew_clamps_to_max_ttl() -> None:
    ledger = make_ledger(4, max_ttl_s=60.0)
    ledger.grant(req(), "acme", T0)
    reply = ledger.renew(["r1-0"], "acme", 3600.0, T0 + 10)
    assert reply.expires_at == {"r1-0": T0 + 70.0}


def test_renew_reports_unknown_foreign_and_expired_leases() -> None:
    # Given one live lease of acme, one lease of beta, and one expired lease of acme
    ledger = make_ledger(8)
    ledger.grant(req("live"), "acme", T0)
    ledger.grant(req("theirs"), "beta", T0)
    ledger.grant(req("old", ttl_s=5.0), "acme", T0)
    # When acme renews all of them plus one that never existed
    reply = ledger.renew(["live-0", "theirs-0", "old-0", "nope"], "acme", 30.0, T0 + 10)
    # Then only its live lease is renewed
    assert set(reply.expires_at) == {"live-0"}
    assert reply.unknown == ("theirs-0", "old-0", "nope")
    # And beta's lease keeps its own expiry
    assert ledger.get("theirs-0").expires_at == T0 + 30.0  # type: ignore[union-attr]


def test_renew_at_the_exact_expiry_is_too_late() -> None:
    ledger = make_ledger(4)
    ledger.grant(req(ttl_s=10.0), "acme", T0)
    assert ledger.renew(["r1-0"], "acme", 10.0, T0 + 10).unknown == ("r1-0",)


def test_release_frees_vram_at_once() -> None:
    # Given a full GPU
    ledger = make_ledger(2)
    ids = [lease.lease_id for lease in ledger.grant(req(count=2), "acme", T0).leases]
    assert ledger.advert(T0).gpus[0].free_bytes == 0
    # When the leases are released
    reply = ledger.release(ids, "acme")
    # Then the VRAM is free again and the slots can be granted
    assert reply.released == tuple(ids)
    assert reply.unknown == ()
    assert ledger.leased_bytes == 0
    assert len(ledger) == 0
    assert ledger.advert(T0).gpus[0].free_bytes == 2 * GiB
    assert len(ledger.grant(req("r2", count=2), "acme", T0).leases) == 2


def test_release_only_for_the_owning_tenant() -> None:
    ledger = make_ledger(4)
    ledger.grant(req(), "acme", T0)
    reply = ledger.release(["r1-0"], "beta")
    assert reply.released == ()
    assert reply.unknown == ("r1-0",)
    assert ledger.get("r1-0") is not None
    assert ledger.leased_bytes == GiB


def test_release_twice_reports_unknown_the_second_time() -> None:
    ledger = make_ledger(4)
    ledger.grant(req(), "acme", T0)
    assert ledger.release(["r1-0"], "acme").released == ("r1-0",)
    second = ledger.release(["r1-0", "never"], "acme")
    assert second.released == ()
    assert second.unknown == ("r1-0", "never")
    assert ledger.leased_bytes == 0


def test_reap_removes_expired_leases_and_the_advert_shows_vram_free() -> None:
    # Given a short lease and a long one on a 4 GiB GPU
    ledger = make_ledger(4)
    short = ledger.grant(req("short", count=2, ttl_s=10.0), "acme", T0).leases
    ledger.grant(req("long", ttl_s=100.0), "acme", T0)
    assert ledger.advert(T0).gpus[0].free_bytes == GiB
    # When the short ones pass their expiry
    reaped = ledger.reap(T0 + 10)
    # Then they are removed and returned, and the advert shows their VRAM free again
    assert sorted(lease.lease_id for lease in reaped) == sorted(x.lease_id for x in short)
    advert = ledger.advert(T0 + 10)
    assert advert.gpus[0].free_bytes == 3 * GiB
    assert advert.gpus[0].leased_bytes == GiB
    assert advert.tenants == {"acme": GiB}
    assert not ledger.is_live("short-0", T0 + 10)
    assert ledger.get("short-0") is None
    assert ledger.is_live("long-0", T0 + 10)


def test_reap_before_expiry_removes_nothing() -> None:
    ledger = make_ledger(4)
    ledger.grant(req(ttl_s=10.0), "acme", T0)
    assert ledger.reap(T0 + 9.999) == []
    assert len(ledger) == 1


def test_expired_but_unreaped_lease_is_not_live() -> None:
    ledger = make_ledger(4)
    ledger.grant(req(ttl_s=10.0), "acme", T0)
    assert ledger.is_live("r1-0", T0 + 9)
    assert not ledger.is_live("r1-0", T0 + 10)


def test_unhealthy_gpu_grants_nothing_and_says_why() -> None:
    # Given GPU 0 reported with an uncorrected ECC error
    ledger = make_ledger(4, 4)
    ledger.observe([GpuReading(0, problem="2 uncorrected ECC errors"), GpuReading(1)])
    # Then grants skip it
    grant = ledger.grant(req(count=6), "acme", T0)
    assert [lease.gpu for lease in grant.leases] == [1, 1, 1, 1]
    # And its advert says it is unhealthy, and why
    advert = ledger.advert(T0)
    assert [(g.healthy, g.problem) for g in advert.gpus] == [
        (False, "2 uncorrected ECC errors"),
        (True, ""),
    ]
    assert advert.free_slices(GiB) == 0
    assert codec.decode(NodeAdvert, codec.encode(advert)) == advert


def test_all_gpus_unhealthy_denies_and_recovery_grants_again() -> None:
    ledger = make_ledger(4)
    ledger.observe([GpuReading(0, problem="xid 79")])
    assert ledger.grant(req("r1"), "acme", T0).denied
    assert ledger.problem(0) == "xid 79"
    ledger.observe([GpuReading(0)])
    assert ledger.problem(0) == ""
    assert len(ledger.grant(req("r2"), "acme", T0).leases) == 1


def test_a_gpu_turning_unhealthy_drains_its_leases() -> None:
    # Given two leases on each of two GPUs, one of GPU 0's running a chunk
    ledger = make_ledger(4, 4)
    leases = ledger.grant(req(count=4), "acme", T0).leases
    on_0 = [lease for lease in leases if lease.gpu == 0]
    ledger.occupy(on_0[0].lease_id)
    # When GPU 0 turns unhealthy
    drained = ledger.observe([GpuReading(0, problem="xid 48"), GpuReading(1)])
    # Then its leases end at once and are returned (the agent wakes their jobs' pullers)
    assert sorted(lease.lease_id for lease in drained) == sorted(x.lease_id for x in on_0)
    assert all(ledger.get(lease.lease_id) is None for lease in on_0)
    # And renewing them finds them unknown, while GPU 1's are renewed
    reply = ledger.renew([x.lease_id for x in leases], "acme", 30.0, T0 + 1)
    assert sorted(reply.unknown) == sorted(x.lease_id for x in on_0)
    assert len(reply.expires_at) == 2
    # And the running chunk's VRAM is held until its slot is idle
    assert ledger.advert(T0).gpus[0].leased_bytes == GiB
    ledger.vacate(on_0[0].lease_id)
    assert ledger.advert(T0).gpus[0].leased_bytes == 0
    # And a later reading with the same problem drains nothing more
    assert ledger.observe([GpuReading(0, problem="xid 48")]) == []


def test_nvml_free_memory_caps_what_is_advertised_and_granted() -> None:
    # Given a 4 GiB GPU where NVML sees only 2 GiB free (another process holds the rest)
    ledger = make_ledger(4, 4)
    ledger.observe([GpuReading(0, free_bytes=2 * GiB), GpuReading(1, free_bytes=4 * GiB)])
    # Then the advert shows the smaller of NVML's and the ledger's free memory
    assert [g.free_bytes for g in ledger.advert(T0).gpus] == [2 * GiB, 4 * GiB]
    # And grants count only that: what is leased after the reading comes off NVML's figure
    grant = ledger.grant(req(count=8), "acme", T0)
    assert sorted(lease.gpu for lease in grant.leases) == [0, 0, 1, 1, 1, 1]
    assert [g.free_bytes for g in ledger.advert(T0).gpus] == [0, 0]
    # And a GPU NVML cannot measure falls back to the ledger's own count
    ledger.observe([GpuReading(0, free_bytes=None)])
    assert ledger.free_bytes(0) == 2 * GiB


def test_advert_shows_per_gpu_state_and_per_tenant_usage() -> None:
    ledger = make_ledger(4, 8)
    ledger.grant(req("a", count=5), "acme", T0)
    ledger.grant(req("b", count=2, slice_bytes=2 * GiB), "beta", T0)
    advert = ledger.advert(T0 + 1)
    assert isinstance(advert, NodeAdvert)
    assert (advert.node, advert.sent_at) == ("n1", T0 + 1)
    assert advert.tenants == {"acme": 5 * GiB, "beta": 4 * GiB}
    g0, g1 = advert.gpus
    # Spread by free memory: 1 + 1 GiB leases on GPU 0; 4 + 2 on GPU 1
    assert (g0.index, g0.total_bytes, g0.free_bytes, g0.leased_bytes) == (
        0,
        4 * GiB,
        1 * GiB,
        3 * GiB,
    )
    assert (g1.index, g1.total_bytes, g1.free_bytes, g1.leased_bytes) == (
        1,
        8 * GiB,
        2 * GiB,
        6 * GiB,
    )
    assert g0.slice_bytes == g1.slice_bytes == GiB
    assert g0.model == "sim"
    assert advert.free_slices(GiB) == 3
    # The advert is a valid wire object
    assert codec.decode(NodeAdvert, codec.encode(advert)) == advert


def test_empty_ledger_advert() -> None:
    advert = make_ledger(4).advert(T0)
    assert advert.tenants == {}
    assert advert.gpus[0].free_bytes == 4 * GiB
    assert advert.free_slices(GiB) == 4


def test_leases_of_is_per_tenant_and_job() -> None:
    ledger = make_ledger(8)
    ledger.grant(req("a", count=2, job="j1"), "acme", T0)
    ledger.grant(req("b", count=1, job="j2"), "acme", T0)
    ledger.grant(req("c", count=1, job="j1"), "beta", T0)
    assert sorted(x.lease_id for x in ledger.leases_of("acme", "j1")) == ["a-0", "a-1"]
    assert [x.lease_id for x in ledger.leases_of("acme", "j2")] == ["b-0"]
    assert [x.lease_id for x in ledger.leases_of("beta", "j1")] == ["c-0"]
    assert ledger.leases_of("beta", "j2") == []
    # Releasing and reaping keep the index in step
    ledger.release(["a-0"], "acme")
    assert [x.lease_id for x in ledger.leases_of("acme", "j1")] == ["a-1"]
    ledger.reap(T0 + 30)
    assert ledger.leases_of("acme", "j1") == []
    assert len(ledger) == 0


def test_released_busy_lease_keeps_its_vram_until_its_slot_is_idle() -> None:
    # Given a 2 GiB GPU with both slices leased, one of them running a chunk
    ledger = make_ledger(2)
    first, second = ledger.grant(req(count=2), "acme", T0).leases
    ledger.occupy(first.lease_id)
    # When both are released
    assert sorted(ledger.release([first.lease_id, second.lease_id], "acme").released) == sorted(
        [first.lease_id, second.lease_id]
    )
    # Then the busy one is gone for its holder but its VRAM is not free: one slice is grantable
    assert not ledger.is_live(first.lease_id, T0) and ledger.get(first.lease_id) is None
    assert ledger.advert(T0).gpus[0].leased_bytes == GiB
    assert len(ledger.grant(req("r2", count=2), "beta", T0).leases) == 1
    # And once its chunk ends the slice comes back
    ledger.vacate(first.lease_id)
    assert len(ledger.grant(req("r3", count=2), "beta", T0).leases) == 1
    assert ledger.advert(T0).gpus[0].leased_bytes == 2 * GiB


def test_expired_busy_lease_is_reaped_but_holds_its_vram_until_idle() -> None:
    ledger = make_ledger(1)
    (lease,) = ledger.grant(req(ttl_s=10.0), "acme", T0).leases
    ledger.occupy(lease.lease_id)
    assert [x.lease_id for x in ledger.reap(T0 + 10)] == [lease.lease_id]
    assert ledger.grant(req("r2"), "beta", T0 + 10).denied is not None
    ledger.vacate(lease.lease_id)
    assert len(ledger.grant(req("r3"), "beta", T0 + 10).leases) == 1


def test_expiry_runs_on_the_clock_passed_in_while_expires_at_is_wall_time() -> None:
    # Given a grant made at monotonic time 100 and wall time T0
    ledger = make_ledger(1)
    (lease,) = ledger.grant(req(ttl_s=30.0), "acme", 100.0, T0).leases
    # Then the holder reads a unix expiry, and the node expires it on its own clock
    assert lease.expires_at == T0 + 30.0
    assert ledger.is_live(lease.lease_id, 129.9)
    assert not ledger.is_live(lease.lease_id, 130.0)
    renewed = ledger.renew([lease.lease_id], "acme", 30.0, 120.0, T0 + 20)
    assert renewed.expires_at[lease.lease_id] == T0 + 50.0
    assert ledger.is_live(lease.lease_id, 149.0)
