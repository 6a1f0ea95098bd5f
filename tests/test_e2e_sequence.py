"""Stateful models end to end (issue 28): Triton's sequence batcher and sequence extension over REST, gRPC
ModelInfer and ModelStreamInfer, on one server holding the example models and a few written here.

- many sequences interleaved under concurrency, each answer checked against a running total kept here,
  on both strategies, with implicit state (onnxruntime, our python API, Triton's python API) and with
  state kept by the model itself (Triton's python API, correlation_id() and flags());
- Triton's refusals on every door; a sequence ID on a model without sequence batching reaches its model;
- an idle sequence released and its next request refused; unload with sequences live;
- statistics and the pending-requests metric count sequence requests.

The examples run by onnxruntime are served only where it is installed, and the tests of them skip
without it (or fail, under TENSORGATE_REQUIRE_PEERS); the python models' tests run either way.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
import zlib
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from e2e_helpers import EXAMPLES, ServerProcess, assert_error, need_module, stop_all, write_model
from grpc_helpers import Stub, outputs, rest
from grpclib import GRPCError
from grpclib.client import Channel
from grpclib.const import Status

import tensorgate.proto.inference as pb

ONNX_MODELS = ("sequence_accumulator", "simple_sequence", "simple_dyna_sequence")  # the examples' onnx models
STATE = """state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ]
  initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" } } ]"""
IO = """input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]"""


def python_config(name: str, batching: str, *, max_batch_size: int = 4, instances: int = 1) -> str:
    return f"""name: "{name}"
backend: "python"
max_batch_size: {max_batch_size}
sequence_batching {{ {batching} }}
{IO}
instance_group [ {{ count: {instances} }} ]
"""


def control(name: str, kind: str, value: str) -> str:
    return f'control_input [ {{ name: "{name}" control [ {{ kind: CONTROL_SEQUENCE_{kind} {value} }} ] }} ]'


READY = control("READY", "READY", "int32_false_true: [ 0, 1 ]")
# our python API, implicit state: an empty direct slot (READY 0) adds nothing
STATE_MODEL = """
class Model:
    def execute(self, inputs):
        total = inputs["STATE_IN"] + inputs["INPUT"] * inputs["READY"]
        return {"OUTPUT": total, "STATE_OUT": total}
"""
# Triton's python API, implicit state, a string CORRID that must be the request's correlation_id()
TRITON_STATE_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            state = pb_utils.get_input_tensor_by_name(request, "STATE_IN").as_numpy()
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()
            if corrid[0, 0].decode() != request.correlation_id():
                raise ValueError(f"CORRID {corrid} is not {request.correlation_id()!r}")
            total = state + value
            tensors = [pb_utils.Tensor(name, total) for name in ("OUTPUT", "STATE_OUT")]
            responses.append(pb_utils.InferenceResponse(tensors))
        return responses
"""
STRING_CORRID = control("CORRID", "CORRID", "data_type: TYPE_STRING")
TRITON_STATE_CONFIG = python_config(
    "triton_state", f"oldest {{ max_candidate_sequences: 64 }} {STRING_CORRID} {STATE}", max_batch_size=8
)
# a model without sequence batching that forwards its request's sequence to a stateful one (BLS)
BLS_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            forwarded = pb_utils.InferenceRequest(
                model_name="sequence_accumulator",
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT")],
                requested_output_names=["OUTPUT"],
                correlation_id=request.correlation_id(),
                flags=request.flags(),
            )
            answer = forwarded.exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
                continue
            total = pb_utils.get_output_tensor_by_name(answer, "OUTPUT").as_numpy()
            flags = np.array([[request.flags()]], dtype=np.int32)
            tensors = [pb_utils.Tensor("OUTPUT", total), pb_utils.Tensor("FLAGS", flags)]
            responses.append(pb_utils.InferenceResponse(tensors))
        return responses
"""
BLS_CONFIG = """name: "bls_sequence"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "FLAGS" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
IDLE_US = 300_000


def onnxruntime_here() -> bool:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def need_onnx_models() -> None:
    """The test needs ONNX_MODELS (served only where onnxruntime is)."""
    need_module("onnxruntime", "the onnx sequence models: " + ", ".join(ONNX_MODELS))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("sequence_models")
    for name in ("sequence_python", *(ONNX_MODELS if onnxruntime_here() else ())):
        shutil.copytree(EXAMPLES / name, repository / name)
    write_model(repository, "direct_state", python_config("direct_state", f"direct {{ }} {READY} {STATE}",
                                                          instances=2), {1: STATE_MODEL})  # fmt: skip
    write_model(repository, "triton_state", TRITON_STATE_CONFIG, {1: TRITON_STATE_MODEL})
    write_model(repository, "bls_sequence", BLS_CONFIG, {1: BLS_MODEL})
    one_slot = f"max_sequence_idle_microseconds: {IDLE_US} direct {{ }} {READY} {STATE}"
    write_model(
        repository, "idle_slot", python_config("idle_slot", one_slot, max_batch_size=1), {1: STATE_MODEL}
    )
    long_slot = one_slot.replace(str(IDLE_US), "60000000")
    write_model(
        repository, "unload_slot", python_config("unload_slot", long_slot, max_batch_size=1), {1: STATE_MODEL}
    )
    log = tmp_path_factory.mktemp("sequence_server") / "server.log"
    extra = ("--model-control-mode", "explicit", "--load-model", "*")
    started = ServerProcess(repository, log, extra_args=extra).start()
    yield started
    stop_all([started])


# ----------------------------------------------------------------------------------------- the wire


def rest_body(
    sequence_id: int | str, value: int, start: bool = False, end: bool = False, dtype: str = "INT32"
) -> dict:
    parameters = {"sequence_id": sequence_id, "sequence_start": start, "sequence_end": end}
    return {
        "parameters": parameters,
        "inputs": [{"name": "INPUT", "datatype": dtype, "shape": [1, 1], "data": [value]}],
    }


def grpc_request(
    model: str,
    sequence_id: int | str,
    value: int,
    start: bool = False,
    end: bool = False,
    dtype: str = "INT32",
) -> pb.ModelInferRequest:
    if isinstance(sequence_id, str):
        ident = pb.InferParameter(string_param=sequence_id)
    else:
        ident = pb.InferParameter(int64_param=sequence_id)
    parameters = {
        "sequence_id": ident,
        "sequence_start": pb.InferParameter(bool_param=start),
        "sequence_end": pb.InferParameter(bool_param=end),
    }
    tensor = pb.ModelInferRequestInferInputTensor(name="INPUT", datatype=dtype, shape=[1, 1])
    raw = np.array([[value]], dtype="<i8" if dtype == "INT64" else "<i4").tobytes()
    return pb.ModelInferRequest(
        model_name=model, inputs=[tensor], parameters=parameters, raw_input_contents=[raw]
    )


# model -> (input datatype, output, the kind of ID it takes)
MODELS = {
    "sequence_accumulator": ("INT32", "OUTPUT", "mixed"),  # onnxruntime, oldest, implicit state
    "direct_state": ("INT32", "OUTPUT", "mixed"),  # our python API, direct (2 instances), implicit state
    "sequence_python": ("INT64", "TOTAL", "mixed"),  # Triton's python API, direct, state in the model
    "triton_state": (
        "INT32",
        "OUTPUT",
        "string",
    ),  # Triton's python API, oldest, implicit state, string CORRID
}
SEQUENCES, STEPS = 12, 5


def plan(model: str, transport: str) -> tuple[list[int | str], dict[int | str, list[int]]]:
    """Sequence IDs and the values each sends, unique to this model and transport."""
    rng = np.random.default_rng(zlib.crc32(f"{model} {transport}".encode()))  # the same in every run
    base = 1000 * (list(MODELS).index(model) * 3 + ("rest", "grpc", "stream").index(transport) + 1)
    string = MODELS[model][2] == "string"
    ids = [f"{transport}-{n}" if string or n % 2 else base + n for n in range(SEQUENCES)]
    return ids, {i: rng.integers(-1000, 1000, STEPS).tolist() for i in ids}


def running_totals(values: list[int]) -> list[int]:
    return np.cumsum(values).tolist()


async def rest_sequences(server: ServerProcess, model: str, ids: list, values: dict) -> dict:
    dtype, output, _ = MODELS[model]
    limits = httpx.Limits(max_connections=SEQUENCES)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=20, limits=limits) as client:

        async def one(sequence_id: int | str) -> list[int]:
            got = []
            for step, value in enumerate(values[sequence_id]):
                body = rest_body(sequence_id, value, step == 0, step == STEPS - 1, dtype)
                response = await client.post(f"/v2/models/{model}/infer", json=body)
                assert response.status_code == 200, response.text
                got.append(response.json()["outputs"][0]["data"][0])
            return got

        answers = await asyncio.gather(*(one(i) for i in ids))
    return dict(zip(ids, answers, strict=True))


async def grpc_sequences(server: ServerProcess, model: str, ids: list, values: dict, streamed: bool) -> dict:
    dtype, output, _ = MODELS[model]
    channel = Channel("127.0.0.1", server.grpc_port)
    stub = Stub(channel)
    try:
        if not streamed:

            async def one(sequence_id: int | str) -> list[int]:
                got = []
                for step, value in enumerate(values[sequence_id]):
                    request = grpc_request(model, sequence_id, value, step == 0, step == STEPS - 1, dtype)
                    got.append(outputs(await stub.model_infer(request, timeout=20))[output][0])
                return got

            return dict(zip(ids, await asyncio.gather(*(one(i) for i in ids)), strict=True))
        # one stream, the sequences' requests interleaved at random, all sent without waiting
        rng = np.random.default_rng(7)
        order = [i for i in ids for _ in range(STEPS)]
        rng.shuffle(order)
        steps = dict.fromkeys(ids, 0)
        requests, owners = [], []
        for sequence_id in order:
            step = steps[sequence_id]
            steps[sequence_id] += 1
            value = values[sequence_id][step]
            requests.append(grpc_request(model, sequence_id, value, step == 0, step == STEPS - 1, dtype))
            owners.append(sequence_id)
        answers = [m async for m in stub.model_stream_infer(requests, timeout=30)]
        got: dict = {i: [] for i in ids}
        for owner, message in zip(owners, answers, strict=True):
            assert message.error_message == "", message.error_message
            got[owner].append(outputs(message.infer_response)[output][0])
        return got
    finally:
        channel.close()


def counts(server: ServerProcess, model: str) -> tuple[int, int, int, int]:
    """(success, fail, inference_count, execution_count) from the statistics extension."""
    stats = rest(server, "GET", f"/v2/models/{model}/stats").json()["model_stats"][0]
    inference = stats["inference_stats"]
    return (
        inference["success"]["count"],
        inference["fail"]["count"],
        stats["inference_count"],
        stats["execution_count"],
    )


# ------------------------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("transport", ["rest", "grpc", "stream"])
@pytest.mark.parametrize("model", list(MODELS))
def test_interleaved_sequences_match_a_running_total(
    server: ServerProcess, model: str, transport: str
) -> None:
    if model in ONNX_MODELS:
        need_onnx_models()
    ids, values = plan(model, transport)
    before = counts(server, model)
    if transport == "rest":
        got = asyncio.run(rest_sequences(server, model, ids, values))
    else:
        got = asyncio.run(grpc_sequences(server, model, ids, values, streamed=transport == "stream"))
    assert got == {i: running_totals(values[i]) for i in ids}
    success, fail, inferences, executions = counts(server, model)
    requests = SEQUENCES * STEPS
    assert (success - before[0], fail - before[1]) == (requests, 0)
    assert 0 < executions - before[3] <= requests
    if model != "direct_state" and model != "sequence_python":  # direct batches count their empty slots too
        assert inferences - before[2] == requests


def test_the_onnx_twins_answer_as_tritons_examples(server: ServerProcess) -> None:
    """simple_sequence: READY * (INPUT + START); simple_dyna_sequence: READY * (INPUT + START + END *
    CORRID), on the controls the sequence batcher fills."""
    need_onnx_models()
    with httpx.Client(base_url=server.base_url, timeout=10) as client:

        def infer(model: str, sequence_id: int, value: int, start: bool = False, end: bool = False) -> int:
            response = client.post(
                f"/v2/models/{model}/infer", json=rest_body(sequence_id, value, start, end)
            )
            assert response.status_code == 200, response.text
            return response.json()["outputs"][0]["data"][0]

        assert [infer("simple_sequence", 50, 3, start=True), infer("simple_sequence", 50, 4),
                infer("simple_sequence", 50, 5, end=True)] == [4, 4, 5]  # fmt: skip
        assert [infer("simple_dyna_sequence", 51, 3, start=True), infer("simple_dyna_sequence", 51, 4),
                infer("simple_dyna_sequence", 51, 5, end=True)] == [4, 4, 5 + 51]  # fmt: skip


def test_a_model_without_sequence_batching_gets_the_sequence(server: ServerProcess) -> None:
    """As in Triton, a sequence ID on a model without sequence batching is no error: its python model reads
    it (correlation_id(), flags()) and may send it on to a stateful model (BLS): sequence_accumulator."""
    need_onnx_models()
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        got = []
        for value, start, end in ((5, True, False), (6, False, False), (7, False, True)):
            response = client.post(
                "/v2/models/bls_sequence/infer", json=rest_body("bls-1", value, start, end)
            )
            assert response.status_code == 200, response.text
            got.append([o["data"][0] for o in response.json()["outputs"]])
        assert got == [[5, 1], [11, 0], [18, 2]]
        response = client.post("/v2/models/bls_sequence/infer", json=rest_body("bls-1", 1))
        assert_error(response, 400, "must specify the START flag")


START_MISSING = (
    "inference request for sequence 404 to model 'sequence_accumulator' must specify the START flag on the "
    "first request of the sequence"
)
REFUSALS = [
    # (model, sequence id, start, batch rows, message)
    ("sequence_accumulator", 404, False, 1, START_MISSING),
    ("sequence_accumulator", 0, True, 1,
     "inference request to model 'sequence_accumulator' must specify a non-zero or non-empty correlation ID"),
    ("sequence_accumulator", 405, True, 2,
     "inference request to model 'sequence_accumulator' must specify batch-size 1 due to requirements of "
     "sequence batcher"),
    ("simple_dyna_sequence", "text-id", True, 1,
     "sequence batching control 'CORRID' data-type is 'BYTES', but model 'simple_dyna_sequence' expects "
     "'UINT64'"),
]  # fmt: skip


def test_refusals_on_every_door(server: ServerProcess) -> None:
    need_onnx_models()  # REFUSALS are of sequence_accumulator and simple_dyna_sequence
    before = counts(server, "sequence_accumulator")[1]
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        for model, sequence_id, start, rows, message in REFUSALS:
            body = rest_body(sequence_id, 1, start)
            body["inputs"][0].update(shape=[rows, 1], data=[1] * rows)
            assert assert_error(client.post(f"/v2/models/{model}/infer", json=body), 400) == message
        bad = {"parameters": {"sequence_id": [1]}, "inputs": rest_body(1, 1)["inputs"]}
        response = client.post("/v2/models/sequence_accumulator/infer", json=bad)
        assert (
            assert_error(response, 400)
            == "Unable to parse 'sequence_id': expected a uint64 or a string, got [1]"
        )

    async def over_grpc() -> tuple[list, list]:
        channel = Channel("127.0.0.1", server.grpc_port)
        stub = Stub(channel)
        requests = []
        for model, sequence_id, start, rows, _ in REFUSALS:
            request = grpc_request(model, sequence_id, 1, start)
            request.inputs[0].shape = [rows, 1]
            request.raw_input_contents = [np.ones((rows, 1), "<i4").tobytes()]
            requests.append(request)
        unary = []
        for request in requests:
            with pytest.raises(GRPCError) as refused:
                await stub.model_infer(request, timeout=10)
            unary.append((refused.value.status, refused.value.message))
        streamed = [m.error_message async for m in stub.model_stream_infer(requests, timeout=10)]
        channel.close()
        return unary, streamed

    unary, streamed = asyncio.run(over_grpc())
    messages = [message for *_, message in REFUSALS]
    assert unary == [(Status.INVALID_ARGUMENT, m) for m in messages]
    assert streamed == messages
    # refused before they reach a queue: not counted, as Triton counts no failed enqueue
    assert counts(server, "sequence_accumulator")[1] == before


def test_an_idle_sequence_is_released_and_its_next_request_refused(server: ServerProcess) -> None:
    """idle_slot has one slot and a 0.3 s idle limit: a second sequence waits in the backlog until the
    first idles out, then the first's next request is refused."""
    with httpx.Client(base_url=server.base_url, timeout=20) as client:
        infer = "/v2/models/idle_slot/infer"
        assert client.post(infer, json=rest_body(61, 5, start=True)).json()["outputs"][0]["data"] == [5]
        began = time.monotonic()
        waited = client.post(infer, json=rest_body(62, 7, start=True))  # answered once 61 is released
        elapsed = time.monotonic() - began
        assert waited.json()["outputs"][0]["data"] == [7]
        assert IDLE_US / 1e6 * 0.9 <= elapsed < 15, elapsed
        expected = (
            "inference request for sequence 61 to model 'idle_slot' must specify the START flag on the first "
            f"request of the sequence (sequence 61 was released after {IDLE_US} us without a request: "
            "max_sequence_idle_microseconds)"
        )
        assert assert_error(client.post(infer, json=rest_body(61, 1)), 400) == expected

    async def over_grpc() -> tuple[tuple, str]:
        channel = Channel("127.0.0.1", server.grpc_port)
        stub = Stub(channel)
        request = grpc_request("idle_slot", 61, 1)
        with pytest.raises(GRPCError) as refused:
            await stub.model_infer(request, timeout=10)
        streamed = [m.error_message async for m in stub.model_stream_infer([request], timeout=10)]
        channel.close()
        return (refused.value.status, refused.value.message), streamed[0]

    assert asyncio.run(over_grpc()) == ((Status.INVALID_ARGUMENT, expected), expected)


def pending(server: ServerProcess, model: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith("nv_inference_pending_request_count{") and f'model="{model}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_unload_with_live_sequences_ends_them(server: ServerProcess) -> None:
    """unload_slot has one slot: sequence 71 holds it, 72 waits in the backlog. Unloading refuses the
    backlog with Triton's text, ends 71 (its next request is refused), and nothing hangs."""
    infer = "/v2/models/unload_slot/infer"
    with httpx.Client(base_url=server.base_url, timeout=20) as client:
        assert client.post(infer, json=rest_body(71, 1, start=True)).status_code == 200
        backlogged: dict = {}

        def wait_in_backlog() -> None:
            backlogged["response"] = client.post(infer, json=rest_body(72, 2, start=True))

        waiter = threading.Thread(target=wait_in_backlog)
        waiter.start()
        deadline = time.monotonic() + 10
        while pending(server, "unload_slot") != 1:  # the request is in, waiting for the slot
            assert time.monotonic() < deadline, "the backlogged request never arrived"
            time.sleep(0.01)
        unloaded = client.post("/v2/repository/models/unload_slot/unload", json={})
        assert unloaded.status_code == 200, unloaded.text
        waiter.join(10)
        assert not waiter.is_alive()
        assert assert_error(backlogged["response"], 503) == (
            "Server is stopping, scheduler for model has stopped accepting new inference requests"
        )
        gone = client.post(infer, json=rest_body(71, 3))
        assert_error(gone, 503, "unload_slot", "has no available versions")
        reloaded = client.post("/v2/repository/models/unload_slot/load", json={})
        assert reloaded.status_code == 200, reloaded.text
        assert_error(client.post(infer, json=rest_body(71, 3)), 400, "must specify the START flag")
        assert client.post(infer, json=rest_body(71, 3, start=True)).json()["outputs"][0]["data"] == [3]
