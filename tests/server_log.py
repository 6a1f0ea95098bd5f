"""The shared server's log around each test of a module that imports `no_traceback_in_the_server_log`
(the h2spec modules): a Traceback written while the test ran fails it. A handler that raises may still
leave the wire looking right (the GOAWAY already sent, the connection then closed), so the verdicts on
the wire alone would pass it, and the server's exit code at the session's end says nothing of it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from e2e_helpers import ServerProcess


@pytest.fixture(autouse=True)
def no_traceback_in_the_server_log(v2_server: ServerProcess) -> Iterator[None]:
    start = v2_server.log_path.stat().st_size
    yield  # set up before the test's connection, so ended after it is closed
    # One request on a connection of its own: the server's event loop answers it only after it has seen
    # the close of the test's connections, which the test made first; what that close logs is in by then.
    assert httpx.get(f"{v2_server.base_url}/v2/health/live", timeout=10).status_code == 200
    with open(v2_server.log_path, "rb") as log:
        log.seek(start)
        written = log.read().decode("utf-8", "replace")
    assert "Traceback" not in written, f"the shared server logged a Traceback during the test:\n{written}"
