"""What the grps REST and gRPC tests share: the test models and their repository, and helpers to call
/grps/v1/infer/predict and read its answers (the grps_server and grps_client fixtures are conftest's)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
from e2e_helpers import write_model

PREDICT = "/grps/v1/infer/predict"
OK_STATUS = {"code": 200, "msg": "OK", "status": "SUCCESS"}


# ------------------------------------------------------------------------------------- test models


def bytes_config(name: str, *, policy: str = "") -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "TOKEN" data_type: TYPE_STRING dims: [ -1 ] }} ]
{policy}
"""


def echo_version(version: int) -> str:
    return f"""
import numpy as np

class Model:
    def execute(self, inputs):
        return {{"TOKEN": np.array([b"v{version}:" + inputs["TEXT"][0]], dtype=object)}}
"""


# TEXT is the path of a gate file: "first" comes at once, "second" only once the client has created the
# gate. A client that reads "first" before it opens the gate proves the answer is not held back.
GATED = """
import asyncio
import os

import numpy as np

class Model:
    async def execute_stream(self, inputs):
        gate = inputs["TEXT"][0].decode()
        yield {"TOKEN": np.array([b"first"], dtype=object)}
        for _ in range(1000):
            if os.path.exists(gate):
                yield {"TOKEN": np.array([b"second"], dtype=object)}
                return
            await asyncio.sleep(0.01)
        yield {"TOKEN": np.array([b"the gate never opened"], dtype=object)}
"""

# TEXT is the path of a marker file, written when the generator ends: "closed after N ticks" when it was
# closed early (its client went away), "ran to its end" after its 150 ticks (3 s).
TICKER = """
import asyncio

import numpy as np

class Model:
    async def execute_stream(self, inputs):
        marker = inputs["TEXT"][0].decode()
        ticks = 0
        try:
            while ticks < 150:
                yield {"TOKEN": np.array([b"tick %d" % ticks], dtype=object)}
                ticks += 1
                await asyncio.sleep(0.02)
        finally:
            with open(marker, "w") as f:
                f.write("ran to its end" if ticks == 150 else f"closed after {ticks} ticks")
"""

# TEXT is the path of a progress file: the model writes how many steps its generator has taken there, and
# yields 1000 answers of ~4 KB each ("<step> ....").
COUNTING = """
import numpy as np

class Model:
    async def execute_stream(self, inputs):
        progress = inputs["TEXT"][0].decode()
        for i in range(1000):
            with open(progress, "w") as f:
                f.write(str(i + 1))
            yield {"TOKEN": np.array([(b"%d " % i).ljust(4000, b".")], dtype=object)}
"""

FAILING = """
import numpy as np

class Model:
    async def execute_stream(self, inputs):
        yield {"TOKEN": np.array([b"one"], dtype=object)}
        raise ValueError("boom in the middle of the stream")
"""

# TEXT is the path of a marker file, written when the model executes; for a path ending in "block" the
# model then holds its one queue until a "release" file beside it exists.
QUEUED = """
import asyncio
import os

import numpy as np

class Model:
    async def execute(self, inputs):
        path = inputs["TEXT"][0].decode()
        with open(path, "w") as f:
            f.write("executed")
        release = os.path.join(os.path.dirname(path), "release")
        for _ in range(1000):
            if not path.endswith("block") or os.path.exists(release):
                break
            await asyncio.sleep(0.01)
        return {"TOKEN": np.array([b"done"], dtype=object)}
"""

BROKEN = """
class Model:
    def execute(self, inputs):
        raise RuntimeError("kaput")
"""


def write_grps_repository(repository: Path) -> Path:
    """echo (versions 1 and 2), my-model (a '-' in its name), gated, ticker, counting and failing (streaming),
    queued (dynamic batching), broken (raises), unloadable (fails to load). Every model takes TEXT and
    answers TOKEN (BYTES)."""
    all_versions = "version_policy { all {} }"
    write_model(
        repository,
        "echo",
        bytes_config("echo", policy=all_versions),
        {1: echo_version(1), 2: echo_version(2)},
    )
    write_model(repository, "my-model", bytes_config("my-model"), {1: echo_version(7)})
    write_model(repository, "gated", bytes_config("gated"), {1: GATED})
    write_model(repository, "ticker", bytes_config("ticker"), {1: TICKER})
    write_model(repository, "counting", bytes_config("counting"), {1: COUNTING})
    write_model(repository, "failing", bytes_config("failing"), {1: FAILING})
    write_model(repository, "queued", bytes_config("queued", policy="dynamic_batching { }"), {1: QUEUED})
    write_model(repository, "broken", bytes_config("broken"), {1: BROKEN})
    write_model(
        repository, "unloadable", bytes_config("unloadable"), {1: "raise ImportError('cannot load')\n"}
    )
    return repository


# ------------------------------------------------------------------------------------------ helpers


def predict(
    client: httpx.Client, body: object = None, *, raw: bytes | None = None, **params: str
) -> httpx.Response:
    if raw is not None:
        return client.post(
            PREDICT, content=raw, headers={"content-type": "application/octet-stream"}, params=params
        )
    return client.post(
        PREDICT, content=orjson.dumps(body), headers={"content-type": "application/json"}, params=params
    )


def ok(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("application/json")
    doc = response.json()
    assert doc["status"] == OK_STATUS
    return doc


def failure(response: httpx.Response, code: int, *fragments: str) -> str:
    """A grps error: the HTTP status is status.code, the body only the status."""
    assert response.status_code == code, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    doc = response.json()
    assert set(doc) == {"status"}, doc
    status = doc["status"]
    assert status["code"] == code and status["status"] == "FAILURE", status
    for fragment in fragments:
        assert fragment in status["msg"], (fragment, status["msg"])
    return status["msg"]


def gtensor(name: str, dtype: str, shape: list[int], values: list, field: str | None = None) -> dict:
    return {"name": name, "dtype": dtype, "shape": shape, field or "flat_" + dtype[3:].lower(): values}


def messages(response: httpx.Response) -> Iterator[tuple[float, bytes]]:
    """(arrival time, line) for each newline-ended message of a streamed answer, read as it comes."""
    buffer = b""
    for piece in response.iter_raw():
        buffer += piece
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            yield time.monotonic(), line
    assert buffer == b"", f"the stream ended inside a message: {buffer!r}"


def streamed(client: httpx.Client, body: dict, **params: str) -> list[dict]:
    with client.stream(
        "POST", PREDICT, content=orjson.dumps(body), params={"streaming": "true", **params}
    ) as r:
        assert r.status_code == 200
        return [orjson.loads(line) for _, line in messages(r)]


def ticker_end(marker: Path, timeout: float = 10.0) -> str:
    """How the ticker model's stream ended, once it has (its 150 ticks take 3 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if marker.exists() and marker.read_text():
            return marker.read_text()
        time.sleep(0.02)
    return "still running"
