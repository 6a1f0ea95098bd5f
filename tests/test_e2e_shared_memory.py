"""Triton's system and CUDA shared-memory extensions end to end: a real server started with
`--allow-client-shm true`, regions made as tritonclient.utils.shared_memory makes them (POSIX shared memory
created under the key "/<name>", the key registered with the server), inputs read from and outputs written
into them over REST (JSON and binary), gRPC ModelInfer (grpclib and grpcio) and ModelStreamInfer; status
and unregister; Triton's error texts; the server never unlinks a client's segment; a region unregistered
while a request that uses it waits in the queue; and CUDA regions from a CuPy device buffer (GPU only)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from e2e_helpers import (
    EXAMPLES,
    A,
    B,
    ServerProcess,
    assert_error,
    binary_body,
    int32_config,
    split_binary_response,
    stop_all,
    wait_for_file,
    wait_for_pending,
    write_model,
)
from grpc_helpers import DIFFS, SUMS, call, rest, stream
from grpclib.const import Status
from shm_helpers import (
    A32,
    ALLOW,
    B32,
    NOPE,
    Segment,
    grpc_request,
    grpcio_infer,
    grpclib_infer,
    in_region,
    infer,
    ints,
    register,
    register_cuda,
    rest_doc,
    rpc,
    segments,
    shm,
    shm_call,
)
from test_staging import needs

import tensorgate.proto.inference as pb

# ------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def shm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server on the examples with client shared memory allowed; each test unregisters its regions."""
    server = ServerProcess(EXAMPLES, tmp_path_factory.mktemp("shm") / "server.log", extra_args=ALLOW).start()
    yield server
    stop_all([server])


@pytest.fixture
def regions(shm_server: ServerProcess) -> Iterator[tuple[Segment, Segment]]:
    """Two registered regions: `inp` (128 bytes, A at 0 and B at 64) and `out` (192 bytes, zeros)."""
    with segments(128, 192) as (inp, out):
        inp.write(0, A)
        inp.write(64, B)
        try:
            for seg in (inp, out):
                assert register(shm_server, seg).status_code == 200
            yield inp, out
        finally:
            for seg in (inp, out):
                shm_call(shm_server, "unregister", seg.name)


# ------------------------------------------------------------------------------------------ infer


def test_server_metadata_lists_both_extensions(shm_server: ServerProcess) -> None:
    extensions = rest(shm_server, "GET", "/v2").json()["extensions"]
    assert {"system_shared_memory", "cuda_shared_memory"} <= set(extensions)
    assert call(shm_server, lambda s: s.server_metadata()).extensions == extensions


def test_rest_json_inputs_and_outputs_in_regions(shm_server: ServerProcess, regions) -> None:
    inp, out = regions
    doc = rest_doc(
        [("INPUT0", shm(inp.name, 64)), ("INPUT1", shm(inp.name, 64, 64))],
        [("OUTPUT0", shm(out.name, 64)), ("OUTPUT1", shm(out.name, 96, 96))],  # room to spare: 64 used
    )
    response = infer(shm_server, doc)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["outputs"] == [
        in_region("OUTPUT0"),
        in_region("OUTPUT1"),
    ]
    assert (out.read(0), out.read(96)) == (SUMS, DIFFS)

    # Mixed: INPUT0 from the region, INPUT1 as JSON data; OUTPUT0 into the region, OUTPUT1 in the body.
    inp.write(0, B)
    for binary in (False, True):
        out.write(128, [0] * 16)
        outputs = [("OUTPUT0", shm(out.name, 64, 128)), ("OUTPUT1", {"binary_data": binary})]
        response = infer(shm_server, rest_doc([("INPUT0", shm(inp.name, 64)), ("INPUT1", A32)], outputs))
        assert response.status_code == 200, response.text
        if binary:
            body, raw = split_binary_response(response)
            assert list(raw) == ["OUTPUT1"] and ints(raw["OUTPUT1"]) == [-d for d in DIFFS]
        else:
            body = response.json()
            assert body["outputs"][1]["data"] == [-d for d in DIFFS]
        assert body["outputs"][0] == in_region("OUTPUT0")
        assert out.read(128) == SUMS


def test_rest_binary_request_with_one_input_in_a_region(shm_server: ServerProcess, regions) -> None:
    inp, out = regions
    header = rest_doc(
        [("INPUT0", shm(inp.name, 64)), ("INPUT1", {"binary_data_size": 64})],
        [("OUTPUT0", shm(out.name, 64, 64)), ("OUTPUT1", {"binary_data": True})],
    )
    body, headers = binary_body(header, (2 * B32).tobytes())
    response = rest(shm_server, "POST", "/v2/models/simple/infer", content=body, headers=headers)
    assert response.status_code == 200, response.text
    doc, raw = split_binary_response(response)
    assert doc["outputs"][0] == in_region("OUTPUT0")
    assert ints(raw["OUTPUT1"]) == (A32 - 2 * B32).tolist()
    assert out.read(64) == (A32 + 2 * B32).tolist()


@pytest.mark.parametrize("infer_with", [grpclib_infer, grpcio_infer], ids=["grpclib", "grpcio"])
def test_grpc_model_infer(shm_server: ServerProcess, regions, infer_with) -> None:
    inp, out = regions
    request = grpc_request(
        [("INPUT0", shm(inp.name, 64)), ("INPUT1", 3 * B32)],
        [("OUTPUT0", shm(out.name, 64, 64)), ("OUTPUT1", {})],
    )
    assert len(request.raw_input_contents) == 1 and request.inputs[0].contents is None
    response = infer_with(shm_server, request)
    assert [(o.name, o.datatype, o.shape) for o in response.outputs] == [
        ("OUTPUT0", "INT32", [1, 16]),
        ("OUTPUT1", "INT32", [1, 16]),
    ]
    assert [o.parameters for o in response.outputs] == [{}, {}]  # as Triton answers: no parameters
    assert response.raw_output_contents[0] == b""  # an entry per output; this one's bytes are in the region
    assert ints(response.raw_output_contents[1]) == (A32 - 3 * B32).tolist()
    assert out.read(64) == (A32 + 3 * B32).tolist()

    request = grpc_request(  # everything in shared memory: no raw contents either way
        [("INPUT0", shm(inp.name, 64)), ("INPUT1", shm(inp.name, 64, 64))],
        [("OUTPUT0", shm(out.name, 64)), ("OUTPUT1", shm(out.name, 64, 128))],
    )
    response = infer_with(shm_server, request)
    assert response.raw_output_contents == [b"", b""]
    assert [o.parameters for o in response.outputs] == [{}, {}]
    assert (out.read(0), out.read(128)) == (SUMS, DIFFS)


def test_grpc_stream_infer(shm_server: ServerProcess, regions) -> None:
    inp, out = regions
    both = [("INPUT0", shm(inp.name, 64)), ("INPUT1", shm(inp.name, 64, 64))]
    swapped = [("INPUT0", shm(inp.name, 64, 64)), ("INPUT1", shm(inp.name, 64))]  # B - A
    requests = [
        grpc_request(both, [("OUTPUT0", shm(out.name, 64)), ("OUTPUT1", shm(out.name, 64, 64))], id="a"),
        grpc_request([("INPUT0", shm("nope", 64)), ("INPUT1", B32)], id="bad"),
        grpc_request(swapped, [("OUTPUT0", shm(out.name, 64, 128)), ("OUTPUT1", {})], id="c"),
    ]
    answers = stream(shm_server, requests)
    assert [m.error_message for m in answers] == ["", NOPE, ""]  # the stream goes on after the error
    first, third = answers[0].infer_response, answers[2].infer_response
    assert (first.id, third.id, first.raw_output_contents) == ("a", "c", [b"", b""])
    assert third.outputs[0].parameters == {}
    assert third.raw_output_contents[0] == b"" and ints(third.raw_output_contents[1]) == [-d for d in DIFFS]
    assert (out.read(0), out.read(64), out.read(128)) == (SUMS, DIFFS, SUMS)


# A model that answers where its input lives: the address of the array's first element.
ADDRESS_MODEL = """
import numpy as np

class Model:
    def execute(self, inputs):
        return {"OUTPUT0": np.array([inputs["INPUT0"].ctypes.data], dtype=np.int64)}
"""
ADDRESS_CONFIG = """
name: "address"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT64 dims: [ 1 ] } ]
"""


def mappings_of(pid: int, segment: Segment) -> list[tuple[int, int, int]]:
    """(start, end, file offset) of each mapping of the segment's file in the process, from the kernel."""
    found = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 6 and fields[5] == f"/dev/shm/{segment.name}":
                start, end = (int(x, 16) for x in fields[0].split("-"))
                found.append((start, end, int(fields[2], 16)))
    return found


def test_the_model_reads_an_input_in_place_in_the_mapped_region(start_server, repo: Path) -> None:
    """docs/protocols/shared-memory.md: an input naming a region is read as a numpy view of the mapped
    region (no copy). The array the model gets starts inside the server's mapping of the client's segment
    (the kernel's map of the server's memory), exactly at region offset + input offset: not a copy made
    elsewhere."""
    write_model(repo, "address", ADDRESS_CONFIG, {1: ADDRESS_MODEL})
    server = start_server(repo, extra_args=ALLOW)
    with segments(4096) as (segment,):
        segment.write(256 + 64, A)
        try:
            assert register(server, segment, offset=256, byte_size=1024).status_code == 200
            doc = rest_doc([("INPUT0", shm(segment.name, 64, 64))], shape=(16,))
            response = infer(server, doc, model="address")
            assert response.status_code == 200, response.text
            (address,) = response.json()["outputs"][0]["data"]
            ((start, end, file_offset),) = mappings_of(server.proc.pid, segment)  # mapped once, whole
            assert file_offset == 0 and end - start >= 4096
            assert address == start + 256 + 64, (hex(address), hex(start))
            # the control: an input sent as data is not in the mapping
            plain = infer(server, rest_doc([("INPUT0", A32)], shape=(16,)), model="address")
            assert not start <= plain.json()["outputs"][0]["data"][0] < end
        finally:
            shm_call(server, "unregister", segment.name)


# ------------------------------------------------------------------------------------------ status


def test_status_and_unregister(start_server) -> None:
    server = start_server(EXAMPLES, extra_args=ALLOW)

    def grpc_status(name: str = "") -> dict:
        regions = rpc(server, "system_shared_memory_status", name).regions
        return {n: {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
                for n, r in regions.items()}  # fmt: skip

    with segments(64, 64, 64) as (one, two, three):
        assert register(server, one).status_code == 200
        assert register(server, two, offset=16, byte_size=32).status_code == 200
        rpc(server, "system_shared_memory_register", three.name, three.key, 0, 64)
        expected = [
            {"name": one.name, "key": one.key, "offset": 0, "byte_size": 64},
            {"name": two.name, "key": two.key, "offset": 16, "byte_size": 32},
            {"name": three.name, "key": three.key, "offset": 0, "byte_size": 64},
        ]
        assert shm_call(server, "status").json() == expected
        assert grpc_status() == {r["name"]: r for r in expected}
        assert shm_call(server, "status", two.name).json() == [expected[1]]
        assert grpc_status(two.name) == {two.name: expected[1]}
        assert shm_call(server, "status", kind="cuda").json() == []

        message = f"Unable to find system shared memory region: '{one.name}x'"
        assert_error(shm_call(server, "status", one.name + "x"), 404, message)
        rpc(server, "system_shared_memory_status", one.name + "x", error=Status.NOT_FOUND, message=message)
        message = (
            f"The region named '{one.name}' is registered as system shared memory, not CUDA shared memory"
        )
        assert_error(shm_call(server, "status", one.name, kind="cuda"), 404, message)
        rpc(server, "cuda_shared_memory_status", one.name, error=Status.NOT_FOUND, message=message)
        message = "Unable to find cuda shared memory region: 'x'"
        assert_error(shm_call(server, "status", "x", kind="cuda"), 404, message)

        assert shm_call(server, "unregister", one.name, kind="cuda").status_code == 200  # not CUDA: kept
        assert shm_call(server, "unregister", one.name).status_code == 200
        assert shm_call(server, "unregister", "never-registered").status_code == 200  # as Triton: OK
        rpc(server, "system_shared_memory_unregister", "never-registered")
        assert [r["name"] for r in shm_call(server, "status").json()] == [two.name, three.name]
        rpc(server, "system_shared_memory_unregister", two.name)
        assert list(grpc_status()) == [three.name]
        assert register(server, one).status_code == 200
        assert shm_call(server, "unregister").status_code == 200  # all of them
        assert shm_call(server, "status").json() == []
        assert register(server, one).status_code == 200
        rpc(server, "system_shared_memory_unregister")  # all of them
        assert grpc_status() == {}


# ------------------------------------------------------------------------------------------ errors

# INPUT0's and OUTPUT0's shared-memory parameters (None: INPUT0 as data, OUTPUT0 not asked for) and the
# message, the same over REST (400) and gRPC (INVALID_ARGUMENT); "{in}" and "{out}" stand for the regions of
# the `regions` fixture (128 and 192 bytes).
PAST = "Invalid offset + byte size for shared memory region: "
INFER_ERRORS = {
    "unknown region": (shm("nope", 64), None, NOPE),
    "output in an unknown region": (None, shm("nope", 64), NOPE),
    "past the region": (shm("{in}", 64, 96), None, PAST + "'{in}'"),
    "offset past the region": (shm("{in}", 64, 128), None, "Invalid offset for shared memory region: '{in}'"),
    "output past the region": (None, shm("{out}", 64, 160), PAST + "'{out}'"),
    "output region too small": (
        None,
        shm("{out}", 32),
        "shared memory size specified with the request for output 'OUTPUT0' (32 bytes) should be at least "
        "64 bytes to hold the results",
    ),
    "region without byte size": (shm("{in}"), None, "shared_memory_region and shared_memory_byte_size"),
    "byte size without region": ({"shared_memory_byte_size": 64}, None, "shared_memory_region and shared"),
    "byte size not the shape's": (shm("{in}", 32), None, "shared_memory_byte_size 32 does not match shape"),
    "negative offset": (shm("{in}", 64, -8), None, "shared_memory_offset must be a non-negative integer"),
}


@pytest.mark.parametrize("case", INFER_ERRORS)
def test_infer_errors(shm_server: ServerProcess, regions, case: str) -> None:
    names = {"in": regions[0].name, "out": regions[1].name}

    def fill(params: dict | None) -> dict | None:
        return params and {k: v.format(**names) if isinstance(v, str) else v for k, v in params.items()}

    input0, output0, message = INFER_ERRORS[case]
    message = message.format(**names)
    inputs = [("INPUT0", fill(input0) or A32), ("INPUT1", B32)]
    outputs = [("OUTPUT0", fill(output0))] if output0 else None
    assert_error(infer(shm_server, rest_doc(inputs, outputs)), 400, message)
    rpc(
        shm_server,
        "model_infer",
        grpc_request(inputs, outputs or ()),
        error=Status.INVALID_ARGUMENT,
        message=message,
    )


def test_data_beside_shared_memory_parameters(shm_server: ServerProcess, regions) -> None:
    name = regions[0].name
    doc = rest_doc([("INPUT0", A32), ("INPUT1", B32)])
    doc["inputs"][0]["parameters"] = shm(name, 64)
    assert_error(
        infer(shm_server, doc),
        400,
        "Input must set only one of the following fields",
        "But set 'data' 'shared_memory_region'",
    )
    header = rest_doc([("INPUT0", {**shm(name, 64), "binary_data_size": 64}), ("INPUT1", B32)])
    body, headers = binary_body(header, A32.tobytes())
    response = rest(shm_server, "POST", "/v2/models/simple/infer", content=body, headers=headers)
    assert_error(response, 400, "But set 'binary_data_size' 'shared_memory_region'")

    request = grpc_request([("INPUT0", shm(name, 64)), ("INPUT1", B32)])
    request.inputs[0].contents = pb.InferTensorContents(int_contents=A)
    message = "unexpected 'content' provided when using shared memory for input tensor 'INPUT0'"
    rpc(shm_server, "model_infer", request, error=Status.INVALID_ARGUMENT, message=message)
    request = grpc_request([("INPUT0", shm(name, 64)), ("INPUT1", B32)])
    request.raw_input_contents.append(A32.tobytes())  # two raw contents, one input not in a region
    message = "the number of inputs not in shared memory (1) does not match the number of raw_input_contents"
    rpc(shm_server, "model_infer", request, error=Status.INVALID_ARGUMENT, message=message)


OPEN_FAILED = "Unable to open shared memory region: '{key}'"
INVALID_ARGS = "failed to register shared memory region '{name}': invalid args"
# (key, offset, byte_size, message): "{seg}" is a fresh 128-byte segment's name (its key "/{seg}"), "{name}"
# the region's (already registered for "name taken"), "{key}" the key asked for. /dev/shm/{seg}_ln links to
# the segment: glibc's shm_open, hence Triton, opens with O_NOFOLLOW and refuses it.
REGISTER_ERRORS = {
    "name taken": ("/{seg}", 0, 64, "shared memory region '{name}' already in manager"),
    "no such key": ("/{seg}_nope", 0, 64, OPEN_FAILED),
    "past the segment": ("/{seg}", 0, 129, INVALID_ARGS),
    "offset past the segment": ("/{seg}", 64, 65, INVALID_ARGS),
    "a path in the key": ("../{seg}", 0, 64, OPEN_FAILED),
    "a path to /dev/shm": ("/dev/shm/{seg}", 0, 64, OPEN_FAILED),
    "the directory": ("/..", 0, 64, OPEN_FAILED),
    "a symlink": ("/{seg}_ln", 0, 64, OPEN_FAILED),
    "a NUL in the key": ("/{seg}\0x", 0, 64, OPEN_FAILED),
}


@pytest.mark.parametrize("case", list(REGISTER_ERRORS))
def test_register_errors(shm_server: ServerProcess, case: str) -> None:
    key, offset, byte_size, message = REGISTER_ERRORS[case]
    with segments(128) as (seg,):
        name, key = seg.name + "_r", key.format(seg=seg.name)
        message = message.format(name=name, key=key)
        link = Path(f"/dev/shm/{seg.name}_ln")
        try:
            if case == "name taken":
                assert register(shm_server, seg, name).status_code == 200
            if case == "a symlink":
                link.symlink_to(f"/dev/shm/{seg.name}")
            body = {"key": key, "offset": offset, "byte_size": byte_size}
            response = rest(shm_server, "POST", f"/v2/systemsharedmemory/region/{name}/register", json=body)
            assert_error(response, 400, message)
            args = (name, key, offset, byte_size)
            rpc(
                shm_server,
                "system_shared_memory_register",
                *args,
                error=Status.INVALID_ARGUMENT,
                message=message,
            )
            if case != "name taken":
                assert shm_call(shm_server, "status", name).status_code == 404
        finally:
            shm_call(shm_server, "unregister", name)
            link.unlink(missing_ok=True)


def test_disabled_by_default(start_server) -> None:
    server = start_server(EXAMPLES)
    flag, refused = "--allow-client-shm true", Status.INVALID_ARGUMENT
    with segments(128) as (seg,):
        assert_error(register(server, seg), 400, flag)
        rpc(server, "system_shared_memory_register", seg.name, seg.key, 0, 128, error=refused, message=flag)
        assert_error(register_cuda(server, seg.name, bytes(64)), 400, flag)
        inputs = [("INPUT0", shm(seg.name, 64)), ("INPUT1", B32)]
        assert_error(infer(server, rest_doc(inputs)), 400, flag)
        rpc(server, "model_infer", grpc_request(inputs), error=refused, message=flag)
        assert shm_call(server, "status").json() == []
        assert infer(server, rest_doc([("INPUT0", A32), ("INPUT1", B32)])).status_code == 200


# ------------------------------------------------------------------------------------------ lifetime


def test_the_server_never_unlinks_a_segment(start_server) -> None:
    server = start_server(EXAMPLES, extra_args=ALLOW)
    with segments(256) as (seg,):
        seg.write(0, A)
        seg.write(64, B)
        assert register(server, seg).status_code == 200
        doc = rest_doc(
            [("INPUT0", shm(seg.name, 64)), ("INPUT1", shm(seg.name, 64, 64))],
            [("OUTPUT0", shm(seg.name, 64, 128)), ("OUTPUT1", shm(seg.name, 64, 192))],
        )
        assert infer(server, doc).status_code == 200
        assert shm_call(server, "unregister", seg.name).status_code == 200
        assert server.stop() == 0
        assert Path("/dev/shm", seg.name).is_file()
        assert [seg.read(offset) for offset in (0, 64, 128, 192)] == [A, B, SUMS, DIFFS]


GATED_MODEL = """
import asyncio, pathlib
HERE = pathlib.Path(__file__).parent

class Model:
    async def execute(self, inputs):
        (HERE / "ran").touch()
        while not (HERE / "release").exists():
            await asyncio.sleep(0.01)
        return {"OUTPUT0": inputs["INPUT0"] * 2}
"""
GATED_POLICY = "instance_group [ { kind: KIND_CPU count: 1 } ]\ndynamic_batching { }"


def test_a_region_unregistered_while_a_request_using_it_is_queued(start_server, repo: Path) -> None:
    config = int32_config("gated", policy=GATED_POLICY, max_batch_size=4, dims="[ 16 ]")
    version_dir = write_model(repo, "gated", config, {1: GATED_MODEL}) / "1"
    server = start_server(repo, extra_args=ALLOW)
    with segments(128) as (seg,), ThreadPoolExecutor(2) as pool:
        seg.write(0, A)
        assert register(server, seg).status_code == 200
        doc = rest_doc([("INPUT0", shm(seg.name, 64))], [("OUTPUT0", shm(seg.name, 64, 64))])
        try:
            first = pool.submit(infer, server, rest_doc([("INPUT0", B32)]), "gated")
            wait_for_file(version_dir / "ran")  # the one instance is busy from now on
            second = pool.submit(infer, server, doc, "gated")
            wait_for_pending(server, "gated", 1)
            assert shm_call(server, "unregister", seg.name).status_code == 200
            assert shm_call(server, "status", seg.name).status_code == 404
            message = f"Unable to find shared memory region: '{seg.name}'"
            assert_error(infer(server, doc, "gated"), 400, message)  # refused before the queue
        finally:
            (version_dir / "release").write_text("1")
        assert first.result(timeout=10).json()["outputs"][0]["data"] == [2 * b for b in B]
        # Ours keeps the mapping while a request views it: the queued one completes, into the region.
        response = second.result(timeout=10)
        assert response.status_code == 200, response.text
        assert response.json()["outputs"] == [in_region("OUTPUT0")]
        assert seg.read(64) == [2 * a for a in A]

        assert rest(server, "GET", "/v2/health/ready").status_code == 200
        assert register(server, seg).status_code == 200  # the name is free again
        seg.write(0, B)
        assert infer(server, doc, "gated").status_code == 200
        assert seg.read(64) == [2 * b for b in B]
        assert shm_call(server, "unregister").status_code == 200


# ------------------------------------------------------------------------------------------ CUDA


def test_cuda_register_without_a_usable_handle(shm_server: ServerProcess) -> None:
    """Without CuPy: a clear 400 naming it; with it, a bogus handle is Triton's 'invalid args'."""
    message = assert_error(register_cuda(shm_server, "bogus", b"\x01" * 64), 400)
    assert "CuPy" in message or "invalid args" in message, message
    args = ("bogus", b"\x01" * 64, 0, 64)
    assert message == rpc(shm_server, "cuda_shared_memory_register", *args, error=Status.INVALID_ARGUMENT)
    assert shm_call(shm_server, "status", "bogus", kind="cuda").status_code == 404
    body = {"raw_handle": {"b64": "not base64!"}, "device_id": 0, "byte_size": 64}
    response = rest(shm_server, "POST", "/v2/cudasharedmemory/region/bogus/register", json=body)
    assert_error(response, 400, "'raw_handle.b64' is not valid base64")


@pytest.mark.parametrize("via", [pytest.param(v, marks=needs("cupy")) for v in ("rest", "grpc")])
def test_gpu_cuda_regions(shm_server: ServerProcess, via: str) -> None:
    import cupy

    values = np.arange(16, dtype=np.float32) * 1.5 - 4
    with cupy.cuda.Device(0):
        # Each a cudaMalloc of its own, not a slice of CuPy's pool (as tritonclient's cuda_shared_memory
        # makes them): an IPC handle names the start of an allocation.
        memories = [cupy.cuda.Memory(64) for _ in range(2)]
        arrays = [cupy.ndarray((16,), cupy.float32, cupy.cuda.MemoryPointer(m, 0)) for m in memories]
        arrays[0].set(values)
        arrays[1].fill(0)
        cupy.cuda.Device(0).synchronize()
        handles = [cupy.cuda.runtime.ipcGetMemHandle(a.data.ptr) for a in arrays]
    assert all(isinstance(h, bytes) and len(h) == 64 for h in handles)
    names = [f"tg_cuda_{uuid.uuid4().hex[:12]}" for _ in arrays]
    try:
        for name, handle in zip(names, handles, strict=True):
            if via == "rest":
                response = register_cuda(shm_server, name, handle)
                assert response.status_code == 200, response.text
            else:
                rpc(shm_server, "cuda_shared_memory_register", name, handle, 0, 64)
        status = {"name": names[0], "device_id": 0, "byte_size": 64}
        assert shm_call(shm_server, "status", names[0], kind="cuda").json() == [status]
        message = (
            f"The region named '{names[0]}' is registered as CUDA shared memory, not system shared memory"
        )
        assert_error(shm_call(shm_server, "status", names[0]), 404, message)
        inputs, outputs = [("INPUT0", shm(names[0], 64))], [("OUTPUT0", shm(names[1], 64))]
        if via == "rest":
            response = infer(shm_server, rest_doc(inputs, outputs, "FP32", (16,)), "identity_fp32")
            assert response.status_code == 200, response.text
            assert response.json()["outputs"] == [in_region("OUTPUT0", (16,), "FP32")]
        else:
            response = grpclib_infer(
                shm_server, grpc_request(inputs, outputs, "identity_fp32", "FP32", (16,))
            )
            assert response.raw_output_contents == [b""]
            assert response.outputs[0].parameters == {}
        with cupy.cuda.Device(0):
            assert arrays[1].get().tolist() == values.tolist()
    finally:
        for name in names:
            shm_call(shm_server, "unregister", name, kind="cuda")
