"""Every answer waits for the peer's flow-control window, error answers included: a client that sets
SETTINGS_INITIAL_WINDOW_SIZE to 0 gets each answer's HEADERS at once and its body as the window opens
(RFC 9113 6.9.2), never DATA past the window."""

from __future__ import annotations

import pytest
from e2e_helpers import EXAMPLES, ServerProcess
from h2_wire import DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, RST_STREAM, WINDOW_UPDATE, H2Wire, frame

pytestmark = pytest.mark.ours

ZERO_WINDOW = b"\x00\x04\x00\x00\x00\x00"  # SETTINGS_INITIAL_WINDOW_SIZE 0


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory):
    server = ServerProcess(
        EXAMPLES,
        tmp_path_factory.mktemp("windows") / "server.log",
        extra_args=("--max-request-bytes", "1000"),
    ).start()
    yield server
    server.stop()


CASES = {  # what is asked -> (status, a fragment of the error)
    "unknown path": (("GET", "/v2/nowhere", None), 404, "nowhere"),
    "wrong method": (("DELETE", "/v2/health/live", None), 405, "use GET"),
    "declared body over the limit": (("POST", "/v2/models/simple/infer", 5000), 413, "--max-request-bytes"),
    "unknown model": (("POST", "/v2/models/nope/infer", 2), 404, "nope"),
    "a plain answer": (("GET", "/v2/health/live", None), 200, "live"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_answer_waits_for_a_window_of_zero(limited: ServerProcess, case: str) -> None:
    (method, path, length), status, fragment = CASES[case]
    with H2Wire(limited.address) as h2:
        h2.open(client_settings=ZERO_WINDOW)
        extra = [("content-length", str(length))] if length else []
        flags = END_HEADERS | (0 if length else END_STREAM)
        h2.send(frame(HEADERS, flags, 1, h2.block(method, path, extra)))
        if length == 2:
            h2.send(frame(DATA, END_STREAM, 1, b"{}"))
        head = h2.read_frame()
        assert head is not None and head.kind == HEADERS and head.stream == 1, head
        assert dict(h2.decoder.decode(head.payload))[":status"] == str(status)
        with pytest.raises(TimeoutError):  # nothing more until the window opens
            h2.read_frame(timeout=0.5)
        body = b""
        for _ in range(200):  # a byte at a time: every DATA frame within what the window allowed
            h2.send(frame(WINDOW_UPDATE, 0, 1, (1).to_bytes(4, "big")))
            got = h2.read_frame()
            assert got is not None and got.kind not in (GOAWAY, RST_STREAM), got
            assert got.kind == DATA and len(got.payload) <= 1, got
            body += got.payload
            if got.flags & END_STREAM:
                break
        assert fragment in body.decode()
