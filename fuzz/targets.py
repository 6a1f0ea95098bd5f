"""One fuzz target per parser that reads bytes from strangers: `TARGETS[name](data)`.

A target feeds `data` to the real parser, as the server would, and returns what it parsed (None when
the input was refused before it reached the parser: not JSON, say). It lets only the errors that parser
is meant to answer with through to `run_one`, which counts them as refusals: our InferError (every
protocol's bad input), ConfigError (model configs), GRPCError (gRPC framing), HpackError /
HeaderListTooLarge (HPACK, a COMPRESSION_ERROR). Anything else escaping is a finding, and so is a
`Mismatch`: some targets also check what was parsed against an independent reading (HPACK against the
`hpack` package's decoder, gRPC messages against what was framed, the transport's output parsed back).
`fuzz/__main__.py` drives them with atheris (coverage-guided); tests/test_fuzz.py runs each over its
seed corpus (a seed named `refused_*` must be refused with the parser's own error, every other one must
parse) and for a few thousand inputs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import orjson
from grpclib import GRPCError
from hpack import Decoder as ReferenceDecoder

from fuzz import transport
from fuzz.readback import Mismatch
from tensorgate.codec import grps as grps_wire
from tensorgate.codec import tfserving, tfserving_grpc, v2_grpc_request, v2_http
from tensorgate.codec.errors import InferError, invalid
from tensorgate.codec.tensor import Tensor
from tensorgate.server.config_error import ConfigError
from tensorgate.server.endpoints import repository as repository_api
from tensorgate.server.http.grpc_wire import MessageReader
from tensorgate.server.http.hpack_decode import Decoder, HeaderListTooLarge, HpackError
from tensorgate.server.model_config import normalize_config
from tensorgate.server.pbtxt import parse_pbtxt
from tensorgate.server.repository_files import override_path
from tensorgate.server.router import HttpRequest
from tensorgate.server.shared_memory import SharedMemory

EXPECTED = (InferError, ConfigError, GRPCError, HpackError, HeaderListTooLarge)
MAX_MESSAGE = 1 << 20  # the gRPC target's --grpc-max-message-bytes
REFUSED = "refused_"  # a seed whose file name starts so is a bad input its parser must refuse


def v2_json(data: bytes) -> object:
    """A v2 REST infer body, all JSON."""
    return v2_http.decode_request(data, None, "m")


def v2_binary(data: bytes) -> object:
    """A v2 REST infer body split at Inference-Header-Content-Length: the first two bytes say where."""
    if len(data) < 2:
        return None
    header_length = v2_http.parse_header_length(str(int.from_bytes(data[:2], "little")), len(data) - 2)
    return v2_http.decode_request(data[2:], header_length, "m")


def model_infer(data: bytes) -> object:
    """gRPC ModelInferRequest bytes, through the hand-written decoder (twice: the second read may come
    from the skeleton the first one left)."""
    v2_grpc_request.decode_request(data)
    return v2_grpc_request.decode_request(data)


def _framed(body: bytes) -> tuple[list[tuple[bool, bytes]], bool, int]:
    """gRPC's length-prefixed messages read from all of `body` at once, the plain way (the reference the
    reader is checked against): the messages, whether a prefix broke the framing or the size limit, and
    the bytes left over after the last whole message (a message begun and not ended)."""
    messages, pos = [], 0
    while len(body) - pos >= 5:
        flag, size = body[pos], int.from_bytes(body[pos + 1 : pos + 5], "big")
        if flag > 1 or size > MAX_MESSAGE:
            return messages, True, 0
        if len(body) - pos - 5 < size:
            break
        messages.append((flag == 1, body[pos + 5 : pos + 5 + size]))
        pos += 5 + size
    return messages, False, len(body) - pos


def _feed_reader(stream: bytes, sizes: list[int], messages: list[tuple[bool, bytes]]) -> MessageReader:
    """`stream` through one MessageReader in pieces of `sizes` (cycled); the messages it gives go to
    `messages`, as bytes (those before a GRPCError too)."""
    reader = MessageReader(MAX_MESSAGE)
    given: list = []
    view, start, turn = memoryview(stream), 0, 0
    try:
        while start < len(view):
            size = sizes[turn % len(sizes)]
            reader.feed(view[start : start + size], given)
            start, turn = start + size, turn + 1
    finally:
        messages += [(compressed, bytes(message)) for compressed, message in given]
    return reader


def grpc_framing(data: bytes) -> object:
    """gRPC length-prefixed messages fed to the reader in pieces, checked two ways.
    - Reassembly: messages cut from the data (a byte each gives its flag and size: bit 7, low 7 bits)
      are framed and fed in pieces of the sizes the data's first bytes give: the reader must give back
      exactly the messages framed, and nothing left begun.
    - The data after its first byte as a stream, in pieces of a size that byte chooses: the messages
      the reader gives, the error it raises and a message left begun must be what reading the whole
      stream at once gives (`_framed`)."""
    if not data:
        return None
    framed, pos = [], 1
    while pos < len(data):
        flag, size = data[pos] >> 7, data[pos] & 0x7F
        framed.append((flag == 1, data[pos + 1 : pos + 1 + size]))
        pos += 1 + size
    stream = b"".join(bytes([compressed]) + len(m).to_bytes(4, "big") + m for compressed, m in framed)
    sizes = [byte % 13 + 1 for byte in data[:4]]
    messages: list[tuple[bool, bytes]] = []
    reader = _feed_reader(stream, sizes, messages)
    if messages != framed or reader.partial:
        raise Mismatch(f"framed {framed!r} in pieces of {sizes}: reassembled {messages!r}")

    body = data[1:]
    expected, broken, left = _framed(body)
    messages = []
    try:
        reader = _feed_reader(body, [data[0] % 7 + 1], messages)
    except GRPCError:
        if not broken or messages != expected:
            raise Mismatch(f"the reader refused {body!r} after {messages!r}; at once: {expected!r}") from None
        raise
    if broken or messages != expected or reader.partial != bool(left):
        raise Mismatch(f"the reader gave {messages!r} (one begun: {reader.partial}) for {body!r}")
    return messages


def hpack(data: bytes) -> object:
    """HPACK header blocks (three 0x00 bytes separate blocks of one connection: the table carries over),
    decoded by ours and by the `hpack` package: where both accept a block, the header lists must be
    equal. Once either refuses one, the tables may differ and the comparing stops (ours goes on)."""
    decoder = Decoder(max_header_list_size=16384)
    reference: ReferenceDecoder | None = ReferenceDecoder(max_header_list_size=16384)
    decoded = []
    for block in data.split(b"\x00\x00\x00"):
        expected = None
        if reference is not None:
            try:
                expected = [(bytes(n), bytes(v)) for n, v in reference.decode(block, raw=True)]
            except Exception:  # the hpack package's refusal (any of its errors): no reference from here on
                reference = None
        fields = decoder.decode(block)
        if expected is not None and [(bytes(n), bytes(v)) for n, v in fields] != expected:
            raise Mismatch(f"HPACK block {block!r}: ours {fields!r}, the hpack package's {expected!r}")
        decoded.append(fields)
    return decoded


TF_INPUTS = [
    tfserving.TensorInfo("x", "FP32", (-1, 1), (-1, 1)),
    tfserving.TensorInfo("s", "BYTES", (-1,), (-1,), optional=True),
]


def tfserving_predict(data: bytes) -> object:
    """A TF Serving predict body (NaN tokens, b64, nesting, row and columnar forms)."""
    from tensorgate.codec.tfserving_json import loads

    doc = loads(data, "the predict request")
    if not isinstance(doc, dict):
        raise invalid("the predict request must be a JSON object")  # as the endpoint answers
    return tfserving.decode_predict(doc, TF_INPUTS, "m", "1")


def tfserving_grpc_predict(data: bytes) -> object:
    """TF Serving's gRPC PredictRequest bytes through the hand-written reader, then its tensors checked
    against a model's inputs as the service checks them."""
    request = tfserving_grpc.decode_predict(data)
    return tfserving.decode_tensors(request.inputs, TF_INPUTS, "m", "1", request.output_filter or None)


def grps_json(data: bytes) -> object:
    return grps_wire.payload_from_json(data)


def grps_protobuf(data: bytes) -> object:
    """A GrpsMessage as the gRPC door receives it: betterproto2's parse, then our payload reading."""
    import tensorgate.proto.grps.protos.v1 as pb

    try:
        message = pb.GrpsMessage.parse(data)
    except Exception:  # betterproto2's own parse error: the gRPC layer answers INVALID_ARGUMENT
        return None
    return grps_wire.payload_from_message(message)


def config_pbtxt(data: bytes) -> object:
    return normalize_config(parse_pbtxt(data.decode("utf-8", "replace")), "m")


def config_json(data: bytes) -> object:
    try:
        raw = json.loads(data)
    except ValueError:
        return None  # the loader's JSON error
    return normalize_config(raw, "m") if isinstance(raw, dict) else None


def repository_load(data: bytes) -> object:
    """A repository load body: its parameters, file overrides (paths checked) and config override."""
    request = HttpRequest("POST", "/v2/repository/models/m/load", b"", {}, data)
    parameters = repository_api._parameters(repository_api._body(request))
    for key in repository_api._files(parameters):
        override_path(key)
    config = parameters.get("config")
    if isinstance(config, str):
        from tensorgate.server.repository_files import parse_config

        parse_config("m", config)
    return parameters


class _Regions:
    """A real POSIX shared-memory segment the shared-memory target registers parts of."""

    def __init__(self) -> None:
        self.key = f"tensorgate-fuzz-{os.getpid()}"
        self.path = f"/dev/shm/{self.key}"
        with open(self.path, "wb") as f:
            f.write(b"\0" * 4096)
        self.memory = SharedMemory(allowed=True)


_regions: _Regions | None = None


def shared_memory(data: bytes) -> object:
    """A register body and then a request's shared-memory parameters against what it registered."""
    global _regions
    if _regions is None:
        _regions = _Regions()
        import atexit

        atexit.register(os.unlink, _regions.path)
    memory = _regions.memory
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(doc, dict):
        return None
    register, parameters = doc.get("register", {}), doc.get("parameters", {})
    if not isinstance(register, dict) or not isinstance(parameters, dict):
        return None
    name = "r"
    try:
        memory.register_system(name, _regions.key, register.get("offset", 0), register.get("byte_size"))
        count = doc.get("count")
        tensor = Tensor(
            "x", "FP32", (count if type(count) is int and 0 <= count < 1 << 20 else 1,), None, parameters
        )
        return memory._input(tensor, True), memory._target("y", parameters)
    finally:
        memory.regions.pop(name, None)


TARGETS: dict[str, Callable[[bytes], object]] = {
    "http1": transport.http1,
    "http2": transport.http2,
    "v2_json": v2_json,
    "v2_binary": v2_binary,
    "model_infer": model_infer,
    "grpc_framing": grpc_framing,
    "hpack": hpack,
    "tfserving_predict": tfserving_predict,
    "tfserving_grpc_predict": tfserving_grpc_predict,
    "grps_json": grps_json,
    "grps_protobuf": grps_protobuf,
    "config_pbtxt": config_pbtxt,
    "config_json": config_json,
    "repository_load": repository_load,
    "shared_memory": shared_memory,
}

# targets whose input is a JSON document (fuzz/one.py mutates those structurally too)
JSON_TARGETS = frozenset(
    {"v2_json", "tfserving_predict", "grps_json", "config_json", "repository_load", "shared_memory"}
)


def run_one(name: str, data: bytes) -> bool:
    """One input through one target: whether it was accepted (parsed); the errors the parser is meant to
    answer with are refusals, and fine."""
    try:
        return TARGETS[name](data) is not None
    except EXPECTED:
        return False


def corpus_dir(name: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", name)


def seeds(name: str) -> list[tuple[str, bytes]]:
    """The target's seeds, (file name, bytes) each; those named `refused_*` are bad inputs on purpose."""
    directory = corpus_dir(name)
    if not os.path.isdir(directory):
        return []
    return [(f, open(os.path.join(directory, f), "rb").read()) for f in sorted(os.listdir(directory))]
