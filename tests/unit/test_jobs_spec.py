"""coordinator/jobs/job.py Job.spec: the JobSpec a run stores, and its content-derived id."""

from __future__ import annotations

import pickle
from collections.abc import Callable

import attrs
import pytest

from vramfabric.broker import codec
from vramfabric.broker.messages import JobSpec
from vramfabric.broker.retry import RetryPolicy
from vramfabric.broker.subjects import token
from vramfabric.coordinator.jobs import job as job_module
from vramfabric.coordinator.jobs import work as work_module
from vramfabric.coordinator.jobs.job import InputsDigest, Job
from vramfabric.coordinator.settings import CoordinatorSettings
from vramfabric.kernels import HYPERPARAM_EVAL
from vramfabric.kernels.hyperparam import encode_config, search_space

SETTINGS = CoordinatorSettings(tenant="acme", ack_wait_s=12.0)
INPUTS = [encode_config(*c) for c in search_space(20)]


def _double(x: object) -> object:
    return x


def job(**overrides: object) -> Job:
    fields: dict[str, object] = {"kernel": HYPERPARAM_EVAL, "inputs": INPUTS}
    fields.update(overrides)
    return Job(**fields)  # type: ignore[arg-type]


def test_spec_describes_the_job() -> None:
    spec = job(args={"seed": 1}, retry=RetryPolicy(max_retries=5)).spec(SETTINGS)
    assert isinstance(spec, JobSpec)
    assert spec.tenant == "acme"
    assert spec.kernel == "hyperparam_eval"
    assert spec.kernel_digest == HYPERPARAM_EVAL.digest
    assert spec.n_chunks == 20
    assert spec.args == {"seed": 1}
    assert spec.retry == RetryPolicy(max_retries=5)
    assert spec.ack_wait_s == 12.0
    assert len(spec.inputs_digest) == 64


def test_job_id_is_a_stable_hash_of_the_spec() -> None:
    # Given the same job built twice
    first, second = job(args={"seed": 1}).spec(SETTINGS), job(args={"seed": 1}).spec(SETTINGS)
    # Then it has the same id, a short hex subject token
    assert first.job_id == second.job_id
    assert len(first.job_id) == 16
    int(first.job_id, 16)
    assert token(first.job_id) == first.job_id
    # And the id survives the wire
    assert codec.decode(JobSpec, codec.encode(first)).job_id == first.job_id


@pytest.mark.parametrize(
    "other",
    [
        pytest.param(lambda: job(inputs=INPUTS[:-1]), id="fewer-inputs"),
        pytest.param(lambda: job(inputs=[INPUTS[1], INPUTS[0], *INPUTS[2:]]), id="reordered"),
        pytest.param(
            lambda: job(inputs=[*INPUTS[:-1], encode_config(0.5, 32, 0.1)]), id="one-input-changed"
        ),
        pytest.param(lambda: job(args={"seed": 2}), id="args-added"),
        pytest.param(
            lambda: job(kernel=attrs.evolve(HYPERPARAM_EVAL, version="9")), id="kernel-version"
        ),
    ],
)
def test_job_id_differs_when_the_spec_differs(other: Callable[[], Job]) -> None:
    assert other().spec(SETTINGS).job_id != job().spec(SETTINGS).job_id


def test_job_id_differs_when_an_arg_value_differs() -> None:
    one, two = job(args={"seed": 1}), job(args={"seed": 2})
    assert one.spec(SETTINGS).job_id != two.spec(SETTINGS).job_id


def test_job_id_differs_per_tenant() -> None:
    other = CoordinatorSettings(tenant="beta", ack_wait_s=12.0)
    assert job().spec(other).job_id != job().spec(SETTINGS).job_id


def test_chunk_boundaries_are_part_of_the_hash() -> None:
    # Same bytes, cut differently: the length prefix keeps the digests apart
    a = job(kernel=attrs.evolve(HYPERPARAM_EVAL, max_input_bytes=8), inputs=[b"ab", b"c"])
    b = job(kernel=attrs.evolve(HYPERPARAM_EVAL, max_input_bytes=8), inputs=[b"a", b"bc"])
    assert a.spec(SETTINGS).inputs_digest != b.spec(SETTINGS).inputs_digest
    assert a.spec(SETTINGS).job_id != b.spec(SETTINGS).job_id


def test_retry_and_ack_wait_are_part_of_the_job_id() -> None:
    # The id hashes everything else in the spec, retry policy and ack wait included
    base = job().spec(SETTINGS).job_id
    assert job(retry=RetryPolicy(max_retries=9)).spec(SETTINGS).job_id != base
    assert job().spec(attrs.evolve(SETTINGS, ack_wait_s=99.0)).job_id != base


@pytest.mark.parametrize(
    "args",
    [{"nested": {"a": 1}}, {"items": [1, 2]}, {"none": None}, {1: "int key"}],
    ids=["dict", "list", "none", "int-key"],
)
def test_args_must_be_flat_scalars_with_str_keys(args: dict[object, object]) -> None:
    with pytest.raises(ValueError, match="job arg"):
        job(args=args).spec(SETTINGS)


def test_scalar_args_are_accepted() -> None:
    args = {"i": 1, "f": 1.5, "s": "x", "b": b"\x00", "t": True}
    assert job(args=args).spec(SETTINGS).args == args


def test_job_id_does_not_depend_on_args_key_order() -> None:
    a = job(args={"seed": 1, "scale": 2.0}).spec(SETTINGS)
    b = job(args={"scale": 2.0, "seed": 1}).spec(SETTINGS)
    assert a.args == b.args
    assert a.job_id == b.job_id


def test_explicit_job_id_is_kept() -> None:
    assert job(job_id="my-run-1").spec(SETTINGS).job_id == "my-run-1"


@pytest.mark.parametrize("bad", ["my.run", "run*", "a b"])
def test_explicit_job_id_must_be_a_token(bad: str) -> None:
    with pytest.raises(ValueError, match="job_id"):
        job(job_id=bad).spec(SETTINGS)


@pytest.mark.parametrize("inputs", [[], ()], ids=["list", "tuple"])
def test_empty_inputs_raise(inputs: list[bytes]) -> None:
    with pytest.raises(ValueError, match="at least one chunk input"):
        job(inputs=inputs).spec(SETTINGS)


def test_chunk_over_the_kernel_limit_raises_naming_the_chunk() -> None:
    inputs = [INPUTS[0], INPUTS[1] + b"\x00"]
    with pytest.raises(ValueError, match="chunk 1 is 13 bytes; the limit is 12"):
        job(inputs=inputs).spec(SETTINGS)


def test_chunk_over_the_settings_limit_raises() -> None:
    big = attrs.evolve(HYPERPARAM_EVAL, max_input_bytes=10_000)
    tight = attrs.evolve(SETTINGS, max_chunk_bytes=100)
    assert job(kernel=big, inputs=[b"x" * 100]).spec(tight).n_chunks == 1
    with pytest.raises(ValueError, match="chunk 0 is 101 bytes; the limit is 100"):
        job(kernel=big, inputs=[b"x" * 101]).spec(tight)


def test_inputs_encoded_at_once_hash_and_read_as_one_by_one() -> None:
    # Given a job over inputs of several sizes (an int past one byte, bytes, a tuple, a float)
    values: list[object] = [1, 70_000, 2**70, b"raw", (1, "a"), 2.5, None, "x" * 5000]
    job = Job(_double, values)
    # When they are encoded at once and one by one
    many = job.encode_many(0, values, limit=10**6)
    ones = [job.encode(i, v, limit=10**6) for i, v in enumerate(values)]
    # Then the bytes are the same, each unpickles to its input, and so is the inputs digest
    assert many == ones and [pickle.loads(d) for d in many] == values
    one_by_one, at_once = InputsDigest(), InputsDigest()
    for data in ones:
        one_by_one.add(data)
    at_once.add_many(many[:3])
    at_once.add_many(many[3:])
    assert at_once.hexdigest() == one_by_one.hexdigest()
    # And with their sizes given (as the spec hashes them), and in the spec's own digest
    sized = InputsDigest()
    sized.add_many(many, [len(d) for d in many])
    assert sized.hexdigest() == one_by_one.hexdigest() == job.spec(SETTINGS).inputs_digest


def test_an_input_over_the_limit_is_named_by_its_index_when_encoded_at_once() -> None:
    # Given inputs of which the fourth is over a 100-byte limit
    job = Job(_double, [1, 2, 3, "y" * 200, 5])
    # Then encoding them at once names that chunk
    with pytest.raises(ValueError, match=r"chunk 13 is \d+ bytes; the limit is 100"):
        job.encode_many(10, list(job.inputs), limit=100)


def test_the_spec_keeps_its_encoded_inputs_for_one_run_while_small(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a job of 600 inputs (three blocks), its spec made
    values = list(range(600))
    job = Job(_double, values)
    limit = job.input_limit(SETTINGS)
    job.spec(SETTINGS)
    # Then the run takes the inputs as the spec encoded them, in blocks, once
    kept = job.take_encoded(limit)
    assert kept is not None and [len(b) for b in kept] == [256, 256, 88]
    assert [d for block in kept for d in block] == job.encode_many(0, values, limit)
    assert job.take_encoded(limit) is None
    # And a job whose encoded inputs would pass the cap keeps none (its run encodes again)
    monkeypatch.setattr(job_module, "KEEP_ENCODED_BYTES", 1000)
    big = Job(_double, values)
    big.spec(SETTINGS)
    assert big.take_encoded(limit) is None
    assert big.spec(SETTINGS).inputs_digest == job.spec(SETTINGS).inputs_digest


MODULE_DATA = bytes(range(256)) * 80  # 20 KiB read by the function: pickled with it


def reads_module_data(x: int) -> int:
    return len(MODULE_DATA) + x


def test_a_function_pickling_past_what_a_node_loads_is_refused_when_the_job_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(work_module, "MAX_BLOB_BYTES", 10_000)
    with pytest.raises(TypeError, match=r"pickles to \d+ bytes .*a node loads at most 10000"):
        Job(reads_module_data, [1])
    monkeypatch.setattr(work_module, "MAX_BLOB_BYTES", 100_000)
    assert Job(reads_module_data, [1]).work.blob is not None
