"""docs/protocol/ lists exactly the names, message fields and tenant grants the code has."""

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
    "tokenid": "<token>",
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
        s.call_input_object("tokenid"),
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


def wire_classes() -> list[type]:
    """Every attrs class that travels on the wire (top-level messages and nested maps)."""
    import importlib

    import attrs

    modules = [
        "vramfabric.broker.messages.jobs",
        "vramfabric.broker.messages.leases",
        "vramfabric.broker.messages.nodes",
        "vramfabric.broker.messages.quota",
        "vramfabric.broker.calls",
        "vramfabric.broker.packs",
        "vramfabric.broker.jobdriver",
        "vramfabric.broker.retry",
    ]
    out = []
    for name in modules:
        module = importlib.import_module(name)
        for obj in vars(module).values():
            if isinstance(obj, type) and attrs.has(obj) and obj.__module__ == name:
                out.append(obj)
    return out


def message_tables() -> dict[str, set[str]]:
    """The names in the first column of each `### `Class`` table of messages.md, by class.

    A heading names its classes before any "(": `RenewRequest` / `RenewReply` holds both,
    whose rows then say `RenewRequest.lease_ids`.
    """
    text = (DOCS / "protocol" / "messages.md").read_text()
    tables: dict[str, set[str]] = {}
    heading: list[str] = []
    for line in text.splitlines():
        if line.startswith("### "):
            heading = re.findall(r"`([^`]+)`", line.split("(", 1)[0])
            for name in heading:
                tables.setdefault(name, set())
        elif line.startswith("| `") and heading:
            for tok in re.findall(r"`([^`]+)`", line.split("|")[1]):
                owner, _, field = tok.rpartition(".")
                if owner not in heading:
                    assert len(heading) == 1, f"row {tok!r} under {heading} names no class"
                    owner, field = heading[0], tok
                tables[owner].add(field)
    return tables


def test_message_tables_list_every_field() -> None:
    import attrs

    from vramfabric.broker.errors import ErrorKind

    # Given every wire class and the doc's tables of messages
    tables = message_tables()
    # Then each class has a table listing exactly its fields, `v` included
    for cls in wire_classes():
        fields = {f.name for f in attrs.fields(cls)}
        assert cls.__name__ in tables, f"no table for {cls.__name__} in messages.md"
        assert tables[cls.__name__] == fields, (
            f"{cls.__name__}: missing {sorted(fields - tables[cls.__name__])}, "
            f"not a field {sorted(tables[cls.__name__] - fields)}"
        )
    # And the ErrorKind table lists exactly its values
    kinds = {kind.value for kind in ErrorKind}
    assert tables["ErrorKind"] == kinds, f"ErrorKind table differs by {tables['ErrorKind'] ^ kinds}"


def code_grants() -> set[tuple[str, str]]:
    """A tenant's user's grants, as the doc writes them: `<tenant>`, `<stream>` for all six."""
    from collections import Counter

    from vramfabric.broker.permissions import tenant_permissions

    s, t = Subjects("vf"), "tenantid"
    streams = [
        s.work_stream(t),
        s.results_stream(t),
        s.dead_stream(t),
        s.object_stream(s.kernels_store(t)),
        s.object_stream(s.outputs_store(t)),
        s.kv_stream(s.jobs_bucket()),
    ]
    perms = tenant_permissions(s, t)
    rows = [
        (pattern, kind)
        for kind in ("publish", "subscribe")
        for pattern in perms[kind]["allow"]  # type: ignore[index]
    ]

    def generic(pattern: str) -> str:
        for stream in streams:
            if stream in pattern.split("."):
                return pattern.replace(stream, "<stream>")
        return pattern

    # A pattern is written with `<stream>` only where it is granted for all six streams.
    seen = Counter(generic(p) for p, _ in rows)
    out = set()
    for pattern, kind in rows:
        shown = generic(pattern) if seen[generic(pattern)] == len(streams) else pattern
        out.add((shown.replace(t, "<tenant>"), kind))
    return out


def doc_grants() -> set[tuple[str, str]]:
    """(grant, kind) of the table under "### Grants of a tenant's user" in clients.md."""
    text = (DOCS / "protocol" / "clients.md").read_text()
    section = text.split("### Grants of a tenant's user", 1)[1].split("\n## ", 1)[0]
    out = set()
    for line in section.splitlines():
        match = re.match(r"^\|\s*`([^`]+)`\s*\|\s*(\w+)\s*\|", line)
        if match:
            out.add((match.group(1), match.group(2)))
    return out


def test_grants_table_matches_a_tenants_permissions() -> None:
    # Given what the generated config grants a tenant's user, and the doc's table of it
    code, doc = code_grants(), doc_grants()
    # Then neither has a grant the other lacks
    assert code - doc == set(), f"missing from clients.md: {sorted(code - doc)}"
    assert doc - code == set(), f"in clients.md but not granted: {sorted(doc - code)}"


# The doc's recipe for a call without Python: pickles of global references, by name.
APPLY_BY_NAME = b"cvramfabric.coordinator.calls.remote\napply\n."
POW_BY_NAME = b"cbuiltins\npow\n."


def test_documented_call_recipe_runs_through_apply() -> None:
    """A client without Python builds a call's blob and input as the doc says, and reads it."""
    import math
    import pickle

    import msgpack

    from vramfabric.coordinator.calls.remote import outcome
    from vramfabric.kernels.code import Context, PythonCode, python_version

    text = doc_text()
    for literal in (APPLY_BY_NAME, POW_BY_NAME):
        assert 'b"' + literal.decode().replace("\n", "\\n") + '"' in text
    # Given the blob and the input the doc describes
    blob = msgpack.packb(
        {
            "kind": "python",
            "name": "apply",
            "python": python_version(),
            "max_output_bytes": 67_108_864,
            "fn": APPLY_BY_NAME,
        },
        use_bin_type=True,
    )
    data = pickle.dumps((POW_BY_NAME, (2, 10), {}))
    # When the node's code loads the blob and runs it on the input
    code = PythonCode.from_blob(blob)
    ctx = Context(device=None, slice_bytes=1, xp=math, attempt=1, job="_gpu_x", index=0)
    output = code.call(code.load(), data, ctx)
    # Then the output is pickled twice, and holds ("ok", value)
    assert pickle.loads(pickle.loads(output)) == ("ok", 1024)
    assert outcome(output) == 1024
