"""broker/subjects/: the names Subjects builds, token checks, and lease subject parsing."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from nats.aio.msg import Msg

from vramfabric.broker.subjects import HEADER_MSG_ID, LEASE_OPS, MAX_PACK_CHUNKS, Subjects, token


def test_default_prefix_is_vf() -> None:
    assert Subjects().prefix == "vf"
    assert Subjects().node_advert("n1") == "vf.node.n1.advert"


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda s: s.node_advert("n1"), "t1.node.n1.advert"),
        (lambda s: s.advert_filter(), "t1.node.*.advert"),
        (lambda s: s.lease("acme", "n1", "acquire"), "t1.lease.acme.n1.acquire"),
        (lambda s: s.lease("acme", "n1", "renew"), "t1.lease.acme.n1.renew"),
        (lambda s: s.lease("acme", "n1", "release"), "t1.lease.acme.n1.release"),
        (lambda s: s.lease_filter("n1"), "t1.lease.*.n1.*"),
        (lambda s: s.work("acme", "job-1"), "t1.work.acme.job-1"),
        (lambda s: s.work_filter("acme"), "t1.work.acme.>"),
        (lambda s: s.result("acme", "job-1", 42), "t1.result.acme.job-1.42"),
        (lambda s: s.result_filter("acme"), "t1.result.acme.>"),
        (lambda s: s.result_filter("acme", "job-1"), "t1.result.acme.job-1.>"),
        (lambda s: s.event("granted"), "t1.events.granted"),
        (lambda s: s.work_stream("acme"), "T1_WORK_acme"),
        (lambda s: s.results_stream("acme"), "T1_RESULTS_acme"),
        (lambda s: s.job_consumer("job-1"), "t1_job_job-1"),
        (
            lambda s: s.pull_next("T1_WORK_acme", "t1_job_job-1"),
            "$JS.API.CONSUMER.MSG.NEXT.T1_WORK_acme.t1_job_job-1",
        ),
        (lambda s: s.stream_info_api("T1_RESULTS_acme"), "$JS.API.STREAM.INFO.T1_RESULTS_acme"),
        (lambda s: s.nodes_bucket(), "t1_nodes"),
        (lambda s: s.jobs_bucket(), "t1_jobs"),
        (lambda s: s.kernels_store("ten"), "t1_kernels_ten"),
        (lambda s: s.job_key("acme", "job-1"), "acme.job-1"),
        (lambda s: s.chunk_msg_id("job-1", 7), "job-1:7"),
        (lambda s: s.result_msg_id("job-1", 7, 12), "r:job-1:7:12"),
    ],
)
def test_names_are_built_from_the_prefix(build: Callable[[Subjects], str], expected: str) -> None:
    assert build(Subjects("t1")) == expected


def test_prefixes_keep_fabrics_apart() -> None:
    # Given two fabrics on one server
    a, b = Subjects("ta"), Subjects("tb")
    # Then none of their names collide
    assert a.node_advert("n") != b.node_advert("n")
    assert a.work_stream("x") != b.work_stream("x")
    assert a.nodes_bucket() != b.nodes_bucket()


def test_result_index_is_rendered_as_an_integer() -> None:
    assert Subjects().result("t", "j", True) == "vf.result.t.j.1"
    assert Subjects().chunk_msg_id("j", 3) == "j:3"


def test_msg_id_header_is_the_jetstream_dedup_header() -> None:
    assert HEADER_MSG_ID == "Nats-Msg-Id"


BAD_TOKENS = [
    pytest.param("", id="empty"),
    pytest.param(".", id="dot"),
    pytest.param("a.b", id="inner-dot"),
    pytest.param("*", id="star"),
    pytest.param(">", id="gt"),
    pytest.param("a*", id="star-suffix"),
    pytest.param("a b", id="space"),
    pytest.param(" a", id="leading-space"),
    pytest.param("a\tb", id="tab"),
    pytest.param("\na", id="leading-newline"),
    pytest.param("a\r", id="trailing-cr"),
    pytest.param("ü", id="non-ascii"),
    pytest.param("a\n", id="trailing-newline"),
]


@pytest.mark.parametrize("bad", BAD_TOKENS)
def test_token_rejects_unsafe_values(bad: str) -> None:
    with pytest.raises(ValueError, match="is not a subject token"):
        token(bad, "node")


@pytest.mark.parametrize("bad", BAD_TOKENS)
def test_names_reject_unsafe_tokens(bad: str) -> None:
    s = Subjects()
    with pytest.raises(ValueError, match="node"):
        s.node_advert(bad)
    with pytest.raises(ValueError, match="tenant"):
        s.work(bad, "job")
    with pytest.raises(ValueError, match="job"):
        s.result("t", bad, 0)


@pytest.mark.parametrize("bad", BAD_TOKENS)
def test_prefix_rejects_unsafe_tokens(bad: str) -> None:
    with pytest.raises(ValueError, match="prefix"):
        Subjects(bad)


@pytest.mark.parametrize("prefix", ["VF", "Vf", "vF"])
def test_prefix_must_be_lower_case_so_stream_names_stay_apart(prefix: str) -> None:
    # Stream names upper-case the prefix: `vf` and `VF` would share VF_WORK_<tenant>
    with pytest.raises(ValueError, match="must be lower case"):
        Subjects(prefix)


def test_token_rejects_non_strings() -> None:
    with pytest.raises(ValueError, match="job_id"):
        token(42, "job_id")  # type: ignore[arg-type]


@pytest.mark.parametrize("ok", ["a", "A-z_0-9", "x" * 200, "-", "_"])
def test_token_accepts_letters_digits_dash_and_underscore(ok: str) -> None:
    assert token(ok) == ok


def test_token_error_names_what_was_checked() -> None:
    with pytest.raises(ValueError, match=r"^tenant 'a\.b' is not a subject token"):
        token("a.b", "tenant")


@pytest.mark.parametrize("op", LEASE_OPS)
def test_parse_lease_inverts_lease(op: str) -> None:
    s = Subjects("t1")
    assert s.parse_lease(s.lease("acme", "node-7", op)) == ("acme", "node-7", op)


@pytest.mark.parametrize(
    "subject",
    [
        "vf.lease.acme.n1.acquire",  # another prefix
        "t1.node.acme.n1.acquire",  # not a lease subject
        "t1.lease.acme.acquire",  # too few tokens
        "t1.lease.acme.n1.acquire.x",  # too many tokens
        "",
    ],
)
def test_parse_lease_rejects_other_subjects(subject: str) -> None:
    with pytest.raises(ValueError, match="not a lease subject"):
        Subjects("t1").parse_lease(subject)


def test_parse_lease_rejects_unknown_op() -> None:
    with pytest.raises(ValueError, match="unknown lease op 'steal'"):
        Subjects("t1").parse_lease("t1.lease.acme.n1.steal")


def test_lease_with_unknown_op_raises() -> None:
    with pytest.raises(ValueError, match="unknown lease op 'steal'"):
        Subjects().lease("acme", "n1", "steal")


def test_lease_ops_are_acquire_renew_release_held() -> None:
    assert LEASE_OPS == ("acquire", "renew", "release", "held")


@pytest.mark.parametrize(
    ("msg_id", "index"),
    [
        ("job1:7", (7, 7)),
        ("job1:7:ab12cd34", (7, 7)),
        ("job1:7:123", (7, 7)),
        ("job1:7-9", (7, 9)),
        ("job1:7-9:ab12cd34", (7, 9)),
        ("job1:9-7", None),  # backwards
        ("job1:7-", None),
        ("job1:-7", None),
        ("job1", None),
        ("job1:x", None),
        ("a:1:2:3", None),
        ("", None),
    ],
)
def test_chunk_range_of_reads_the_chunks_of_chunk_pack_and_rerun_ids(
    msg_id: str, index: tuple[int, int] | None
) -> None:
    assert Subjects.chunk_range_of(msg_id) == index


def test_pack_ids_and_subjects_name_first_and_last_chunk() -> None:
    s = Subjects("t1")
    assert s.chunk_msg_id("j", 3, 9) == "j:3-9"
    assert s.chunk_retry_msg_id("j", 3, "run1", 9) == "j:3-9:run1"
    assert s.result_msg_id("j", 3, 12, 9) == "r:j:3-9:12"
    assert s.result("acme", "j", 3, 9) == "t1.result.acme.j.3.9"
    assert s.parse_result("t1.result.acme.j.3.9") == ("acme", "j", 3, 9)


@pytest.mark.parametrize(
    "reply",
    [
        "$JS.ACK.VF_WORK_default.job1.3.77.12.1700000000000000000.5",
        "$JS.ACK.hub.ACCHASH.VF_WORK_default.job1.3.77.12.1700000000000000000.5",
        "$JS.ACK.hub.ACCHASH.VF_WORK_default.job1.3.77.12.1700000000000000000.5.rnd",
    ],
)
def test_delivery_of_reads_what_nats_py_metadata_reads(reply: str) -> None:
    meta = Msg(None, subject="x", reply=reply).metadata  # type: ignore[arg-type]
    assert Subjects.delivery_of(reply) == (meta.num_delivered, meta.sequence.stream)


@pytest.mark.parametrize(
    "reply", ["", "_INBOX.abc", "$JS.ACK.S.C.x.77.12.1.5", "$JS.ACK.a.b.c.d.1.2.3.4.5.6.7.8"]
)
def test_delivery_of_is_none_for_other_subjects(reply: str) -> None:
    assert Subjects.delivery_of(reply) is None


@pytest.mark.parametrize("index", [0, 7, 424242, 10**17])
def test_parse_result_inverts_result(index: int) -> None:
    s = Subjects("t1")
    assert s.parse_result(s.result("acme", "job-1", index)) == ("acme", "job-1", index, index)


@pytest.mark.parametrize(
    "subject",
    [
        "t1.result.acme.job-1.x",  # a non-numeric tail: the stray message of issue 13
        "t1.result.acme.job-1.-1",  # signed
        "t1.result.acme.job-1.+1",
        "t1.result.acme.job-1.007",  # not how `result()` writes 7: it would shadow chunk 7
        "t1.result.acme.job-1.1e3",
        "t1.result.acme.job-1.²",  # passes str.isdigit, fails int()
        "t1.result.acme.job-1.\u0661",  # an Arabic-Indic digit: int() reads it, we must not
        "t1.result.acme.job-1." + "9" * 19,  # past int64
        "t1.result.acme.job-1." + "9" * 5000,  # int() raises past 4300 digits
        "t1.result.acme.job-1.",
        "t1.result.acme.job-1",
        "t1.result.acme.job-1.2.1",  # a pack that runs backwards
        "t1.result.acme.job-1.2.2",  # a pack of one is never written
        "t1.result.acme.job-1.1.2.3",
        "t1.result.acme..1",
        "t1.result.ac me.job-1.1",
        "t2.result.acme.job-1.1",  # another fabric's
        "t1.work.acme.job-1",
        "",
    ],
)
def test_parse_result_rejects_what_result_never_builds(subject: str) -> None:
    assert Subjects("t1").parse_result(subject) is None


def test_result_range_is_the_chunks_of_this_job_only() -> None:
    s = Subjects("t1")
    subject = s.result("acme", "job-1", 3)
    assert s.result_range(subject, "acme", "job-1", 4) == (3, 3)
    assert s.result_range(subject, "acme", "job-1", 3) is None  # past the job's last chunk
    assert s.result_range(subject, "acme", "job-2", 4) is None
    assert s.result_range(subject, "other", "job-1", 4) is None
    assert s.result_range("t1.result.acme.job-1.x", "acme", "job-1", 4) is None
    pack = s.result("acme", "job-1", 2, 5)
    assert s.result_range(pack, "acme", "job-1", 6) == (2, 5)
    assert s.result_range(pack, "acme", "job-1", 5) is None  # its last chunk is past the end
    # No pack is longer than MAX_PACK_CHUNKS: a forged one cannot claim a whole job.
    long = s.result("acme", "job-1", 0, MAX_PACK_CHUNKS)
    assert s.result_range(long, "acme", "job-1", 10**6) is None


@pytest.mark.parametrize(
    ("subject", "owner"),
    [
        ("t1.work.acme.job-1", ("acme", "job-1")),
        ("t1.result.acme.job-1.3", ("acme", "job-1")),
        ("t1.result.acme.job-1.x", ("acme", "job-1")),  # a stray still goes with its job
        ("t1.result.acme.job-1.x.y", ("acme", "job-1")),
        ("t1.result.acme", None),
        ("t1.lease.acme.n1.renew", None),
        ("t2.work.acme.job-1", None),
        ("t1.work.acme.", None),
    ],
)
def test_job_of_names_the_job_a_work_or_result_subject_belongs_to(
    subject: str, owner: tuple[str, str] | None
) -> None:
    assert Subjects("t1").job_of(subject) == owner


def test_parse_output_object_inverts_output_object() -> None:
    assert Subjects.parse_output_object(Subjects.output_object("job-1", 12)) == ("job-1", 12)
    for name in ("job-1.x", "job-1", "job-1.-1", "a.b.1", ".1"):
        assert Subjects.parse_output_object(name) is None
