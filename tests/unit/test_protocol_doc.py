"""docs/protocol.md lists exactly the names broker/subjects/ builds."""

from __future__ import annotations

import re
from pathlib import Path

from vramfabric.broker.subjects import HEADER_MSG_ID, LEASE_OPS, Subjects

DOCS = Path(__file__).resolve().parents[2] / "docs"
# The protocol's pages: the index (docs/protocol.md) and the pages it lists.
PAGES = [DOCS / "protocol.md", *sorted((DOCS / "protocol").glob("*.md"))]


def doc_text() -> str:
    """The protocol's pages, one after another."""
    return "\n".join(page.read_text() for page in PAGES)
PLACEHOLDERS = {
    "nodeid": "<node>",
    "tenantid": "<tenant>",
    "jobid": "<job>",
    "kindid": "<kind>",
    "streamid": "<stream>",
    "consumerid": "<consumer>",
    "424242": "<chunk>",
    "737373": "<work_seq>",
    "515151": "<first>",
    "626262": "<last>",
    "runid": "<run>",
    "bucketid": "<bucket>",
    "keyid": "<key>",
    "userid": "<user>",
    "nuidid": "<nuid>",
    "_gpu_name": "_gpu_<name>",
    "callid": "<call>",
}


def code_names() -> set[str]:
    """Every name the code can build, with ids replaced by placeholders."""
    s = Subjects("vf")
    names = {
        s.node_advert("nodeid"),
        s.advert_filter(),
        s.lease_filter("nodeid"),
        s.work("tenantid", "jobid"),
        s.work_filter("tenantid"),
        s.result("tenantid", "jobid", 424242),
        s.result_filter("tenantid", "jobid"),
        s.result_filter("tenantid"),
        s.event("kindid"),
        s.work_stream("tenantid"),
        s.results_stream("tenantid"),
        s.dead_stream("tenantid"),
        s.max_deliveries("streamid", "consumerid"),
        s.max_deliveries_filter("tenantid"),
        s.job_consumer("jobid"),
        s.pull_next("streamid", "consumerid"),
        s.stream_info_api("streamid"),
        s.nodes_bucket(),
        s.jobs_bucket(),
        s.kernels_store("tenantid"),
        s.job_spec("tenantid", "jobid"),
        s.kv_stream("bucketid"),
        s.kv_subjects("bucketid"),
        s.object_stream("bucketid"),
        s.object_subjects("bucketid"),
        s.object_chunks("bucketid", "nuidid"),
        s.fleet_api(),
        s.tenant_api("tenantid"),
        s.inbox_prefix("userid"),
        s.job_key("tenantid", "jobid"),
        s.job_state_key("tenantid", "jobid"),
        s.job_alive_key("tenantid", "jobid"),
        s.job_origin_key("tenantid", "jobid"),
        s.kv_stream("bucketid"),
        s.kv_subject("bucketid", "keyid"),
        s.kv_job_filter("bucketid", "tenantid", "jobid"),
        s.chunk_msg_id("jobid", 424242),
        s.result_msg_id("jobid", 424242, 737373),
        s.chunk_retry_msg_id("jobid", 424242, "runid"),
        s.result("tenantid", "jobid", 515151, 626262),
        s.chunk_results("tenantid", "jobid"),
        s.pack_results("tenantid", "jobid"),
        s.chunk_msg_id("jobid", 515151, 626262),
        s.result_msg_id("jobid", 515151, 737373, 626262),
        s.chunk_retry_msg_id("jobid", 515151, "runid", 626262),
        s.outputs_store("tenantid"),
        s.output_object("jobid", 424242),
        s.checkpoints_bucket(),
        s.quota_bucket(),
        s.checkpoint_key("tenantid", "jobid", 424242),
        HEADER_MSG_ID,
        *(s.lease("tenantid", "nodeid", op) for op in LEASE_OPS),
        s.call("tenantid", "nodeid"),
        s.call_filter("nodeid"),
        s.tenant_calls_filter("tenantid"),
        s.call_printed("tenantid", "callid"),
        s.call_printed_filter("tenantid"),
        s.interactive_job("name"),
    }
    out = set()
    for name in names:
        for raw, placeholder in PLACEHOLDERS.items():
            name = name.replace(raw, placeholder)
        out.add(name)
    return out


def doc_names() -> set[str]:
    """Backticked names in the first column of the tables under '## Names'."""
    text = doc_text()
    section = text.split("## Names", 1)[1].split("\n## ", 1)[0]
    names = set()
    for line in section.splitlines():
        match = re.match(r"^\|\s*`([^`]+)`", line)
        if match:
            names.add(match.group(1))
    return names


def test_protocol_doc_lists_every_name_the_code_builds() -> None:
    # Given the names the code builds and the names the doc lists
    code, doc = code_names(), doc_names()
    # Then neither has a name the other lacks
    assert code - doc == set(), f"missing from docs/protocol.md: {sorted(code - doc)}"
    assert doc - code == set(), f"in docs/protocol.md but not in the code: {sorted(doc - code)}"


def test_documented_kernel_digest_and_job_id_match_the_code() -> None:
    """A client following the doc's recipe derives the same digest and job id as we do."""
    from vramfabric.broker.messages import JobSpec
    from vramfabric.broker.retry import RetryPolicy
    from vramfabric.kernels import HYPERPARAM_EVAL

    text = doc_text()
    assert f"`{HYPERPARAM_EVAL.digest}`" in text
    # Whole-number seconds given as ints hash like floats (the doc's float 64 rule).
    spec = JobSpec(
        tenant="lab",
        kernel="hyperparam_eval",
        kernel_digest=HYPERPARAM_EVAL.digest,
        n_chunks=4,
        args={"steps": 3, "lr": 0.5},
        inputs_digest="0" * 64,
        retry=RetryPolicy(3, 1, 16),
        ack_wait_s=30,
    )
    assert f"job id `{spec.job_id}`" in text
