"""The fuzz targets (fuzz/targets.py) in the suite: each seed passes through its target, and each target
runs under atheris for a few thousand inputs from a fixed seed (the same on every machine; `make fuzz`
searches for longer), so the targets keep working.
Inputs the fuzzer found that once broke a parser are named regression tests here."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import proto.grps.protos.v1 as pb
from codec.errors import InferError
from codec.grps import payload_from_message
from fuzz import transport
from fuzz.targets import TARGETS, run_one, seeds
from server.model_config import ConfigError, normalize_config, parse_pbtxt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUNS = 3000  # inputs per target, from a fixed seed: the same run on every machine


@pytest.mark.parametrize("name", list(TARGETS))
def test_every_seed_passes_its_target(name: str) -> None:
    corpus = seeds(name)
    assert corpus, f"fuzz/corpus/{name} has no seeds"
    for data in corpus:
        run_one(name, data)


@pytest.mark.parametrize("name", list(TARGETS))
def test_a_short_fuzz_run_finds_nothing(name: str) -> None:
    pytest.importorskip("atheris")
    done = subprocess.run(
        [sys.executable, "-m", "fuzz", "--runs", str(RUNS), "--only", name],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "nothing found" in done.stdout


# --- what the fuzzers found (each failed with another exception than the parser's own error) ------------


def test_found_a_config_tensor_name_that_is_not_a_string() -> None:
    """config_json and repository_load, 2026-11-26: `"name": [[[]]]` raised TypeError (unhashable)."""
    doc = {
        "name": "m",
        "backend": "onnxruntime",
        "inputs": [{"name": "I", "datatype": "FP32", "shape": [1]}],
        "outputs": [{"name": [[[]]], "datatype": "FP32", "shape": [[1]]}],
    }
    with pytest.raises(ConfigError, match="output #0: 'name' must be a string"):
        normalize_config(doc, "m")


@pytest.mark.parametrize("escape", ["\\u", "\\x", "\\U", "\\uZZZZ", "\\UFFFFFFFF"])
def test_found_a_pbtxt_escape_without_its_digits(escape: str) -> None:
    """config_pbtxt, 2026-11-26: `"\\u<"` raised ValueError from int(''); an escape past the last code
    point would have raised it from chr()."""
    with pytest.raises(ConfigError, match="invalid escape"):
        parse_pbtxt(f'name: "a{escape}<"')


def test_found_a_v2_metadata_datatype_that_is_not_a_string() -> None:
    """config_json, 2026-11-26 (second run): `"datatype": [...]` in the metadata form raised TypeError."""
    doc = {
        "name": "m",
        "backend": "onnxruntime",
        "inputs": [{"name": "I", "datatype": ["FP32"], "shape": [1]}],
    }
    with pytest.raises(ConfigError, match="input 'I' has unknown datatype"):
        normalize_config(doc, "m")


def test_found_a_pbtxt_escape_of_a_digit_that_is_not_octal() -> None:
    """config_pbtxt, 2026-11-26 (second run): `\\9` raised ValueError from int('9', 8)."""
    with pytest.raises(ConfigError, match="invalid escape"):
        parse_pbtxt('name: "a\\9"')


def test_found_a_gtensor_dtype_the_enum_does_not_have() -> None:
    """grps_protobuf, 2026-11-26 (second run): dtype 0xfffffff7 parsed as None; int(None) raised."""
    message = pb.GrpsMessage.parse(b"*\x14\n\x12\n\x01a\x10\x07\xff\xff\xff\xfe*\x14\n\x80?\x00\x00\x00@")
    with pytest.raises(InferError, match="unknown dtype"):
        payload_from_message(message)


def test_found_a_gtensors_list_holding_a_number() -> None:
    """grps_protobuf, 2026-11-26 (make test's short run): a field of the wrong wire type inside gtensors
    parsed as an int in the list of tensors; reading its dtype raised AttributeError."""
    message = pb.GrpsMessage.parse(b"*R\x08\x00\x00\x83?\xff\xff\x00\xc3")
    with pytest.raises(InferError, match="malformed GrpsMessage"):
        payload_from_message(message)


def test_found_a_grps_message_with_two_members_of_its_oneof() -> None:
    """grps_protobuf, 2026-11-26: str_data then gtensors on the wire (protobuf allows it) made
    betterproto2 raise RuntimeError; the gRPC door answered an internal error."""
    with pytest.raises(InferError, match="more than one of data_oneof"):
        payload_from_message(pb.GrpsMessage.parse(b'"\x02hi*\x14'))


def test_found_a_streamed_answer_cancelled_before_its_task_first_ran() -> None:
    """http1, 2026-11-26: a malformed request pipelined behind one being answered in a stream closes the
    connection, which cancels the answer's task before that task's first step. The task ended at once,
    but the answer's coroutine (started eagerly, server/http/eager.py) never learned: it stayed suspended
    until the garbage collector closed it, and its stream's generator failed to close ("aclose():
    asynchronous generator is already running"). A model's stream would have stayed open the same way."""
    transport.http1(
        b"\x07POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello"
        b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n"
        b"PO\xad\xab /refuseHTTP/1.1\r\nhost: x\r\ntransfer-e5coding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    )


def test_a_task_cancelled_before_its_first_step_cancels_the_eager_coroutine() -> None:
    """The fix of the finding above, at its root: the coroutine eager.start began receives the
    cancellation, and its finally blocks run, even when its task never ran."""
    import asyncio

    from server.http import eager

    async def main() -> list[str]:
        seen: list[str] = []
        never = asyncio.get_running_loop().create_future()

        async def answer() -> None:
            try:
                await never
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise
            finally:
                seen.append("finally")

        task = eager.start(answer(), asyncio.get_running_loop())
        task.cancel()  # before the task's first step
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled()
        return seen

    assert asyncio.run(main()) == ["cancelled", "finally"]
