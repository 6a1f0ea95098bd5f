"""Scale-out (deploy/scale-out.md), end to end: replicas on one shared repository converge in poll mode,
what each replica holds stays in its own process, and a replica drains under load without losing a request.

"Loses no request" is judged as a client sees it. A request the server never read may fail, but only in a
way that tells the client so: the connection was refused, the server closed the keep-alive connection
before the request went out, the HTTP/2 stream was refused (REFUSED_STREAM), or its id is above the
GOAWAY's last stream id (RFC 9113 8.7: both mean "not processed, retry elsewhere"). A request that was
fully sent and got no answer, and any answer other than the right one, fail the test. The model also logs
every request it executed: each of them must have been answered to its client.

An HTTP/1.1 connection that is idle when SIGTERM arrives is closed at once; a request its client sends at
that very moment is lost on the wire unread (RFC 9112 9.6: a client must be prepared for that close, and
may retry a POST only if it knows the request was not applied). Once the connection is idle the server
cannot win that race (it could only have told the client to leave earlier: deploy/scale-out.md), so the
drain test holds every client's request in the model when the signal arrives: every connection is busy,
and each request must be answered.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import re
import select
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import h2.config
import h2.connection
import h2.errors
import h2.events
import httpx
import pytest
from e2e_helpers import (
    RawConnection,
    RawH2,
    http_request,
    int32_config,
    wait_until_refused,
    write_model,
)
from grps_helpers import OK_STATUS

POLL_SECS = 1.0
POLL = ("--model-control-mode", "poll", "--repository-poll-secs", str(POLL_SECS))
EXPLICIT = ("--model-control-mode", "explicit")
CONVERGE_TIMEOUT = 2 * POLL_SECS + 8  # a scan, the load, and slack for a slow machine


def versioned_model(version: int) -> str:
    return f"""
class Model:
    def execute(self, inputs):
        return {{"OUTPUT0": inputs["INPUT0"] + {100 * version}}}
"""


def infer(client: httpx.Client, model: str, values: list[int]) -> httpx.Response:
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [len(values)], "data": values}]}
    return client.post(f"/v2/models/{model}/infer", json=body)


def served_by(client: httpx.Client, model: str) -> int | None:
    """What the model adds to 0 (100 * the version that answered), or None when it does not answer."""
    response = infer(client, model, [0])
    return response.json()["outputs"][0]["data"][0] if response.status_code == 200 else None


def states(client: httpx.Client, model: str) -> list[tuple[str, str]]:
    response = client.post("/v2/repository/index")
    assert response.status_code == 200, response.text
    return [(e.get("version", ""), e.get("state", "")) for e in response.json() if e["name"] == model]


def wait_for(check: Callable[[], bool], what: str, timeout: float) -> None:
    """Polls `check` until it holds, or fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting for {what}"
        time.sleep(0.05)


def move_in(tmp_path: Path, repo: Path, name: str, versions: dict[int, str]) -> None:
    """A complete model folder built beside the repository, then renamed in at once: a poll may look at
    any moment, and a rename is atomic (what a fleet's repository updates must be too)."""
    staging = tmp_path / "staging"
    staging.mkdir(exist_ok=True)
    write_model(staging, name, int32_config(name), versions).rename(repo / name)


def metric(text: str, name: str, model: str) -> int | None:
    found = re.search(rf'^{name}{{model="{model}",version="\d+"}} (\d+)$', text, re.M)
    return int(found.group(1)) if found else None


# ------------------------------------------------------------------------------------------ a fleet


def test_replicas_on_a_shared_repository_converge_in_poll_mode(
    start_server, repo: Path, tmp_path: Path
) -> None:
    """Two replicas poll one directory: a model added, a version added, a model removed, each reaches both
    within a poll period or two; neither takes per-replica repository API calls."""
    move_in(tmp_path, repo, "base", {1: versioned_model(1)})
    replicas = [start_server(repo, extra_args=POLL), start_server(repo, extra_args=POLL)]
    clients = [httpx.Client(base_url=r.base_url, timeout=10) for r in replicas]
    try:
        for c in clients:
            assert states(c, "base") == [("1", "READY")]
            response = c.post("/v2/repository/models/base/load")
            assert response.status_code == 503, response.text
            assert "not allowed if polling is enabled" in response.json()["error"]

        def everywhere(check: Callable[[httpx.Client], bool], what: str) -> None:
            wait_for(lambda: all(check(c) for c in clients), f"{what} on both replicas", CONVERGE_TIMEOUT)

        move_in(tmp_path, repo, "added", {1: versioned_model(1)})
        everywhere(lambda c: states(c, "added") == [("1", "READY")], "the added model READY")
        everywhere(lambda c: served_by(c, "added") == 100, "the added model answering")

        # A new version folder (latest policy: version 2 replaces version 1).
        staging = tmp_path / "v2"
        write_model(staging, "added", int32_config("added"), {2: versioned_model(2)})
        (staging / "added" / "2").rename(repo / "added" / "2")
        everywhere(lambda c: states(c, "added") == [("2", "READY")], "version 2 READY")
        everywhere(lambda c: served_by(c, "added") == 200, "version 2 answering")

        # Removed (renamed out at once, then deleted): both unload it.
        (repo / "added").rename(tmp_path / "removed")
        shutil.rmtree(tmp_path / "removed")
        everywhere(lambda c: states(c, "added") == [], "the removed model gone from the index")
        for c in clients:
            response = infer(c, "added", [0])
            assert response.status_code == 404, response.text
            assert served_by(c, "base") == 100
            assert c.get("/v2/health/ready").status_code == 200
    finally:
        for c in clients:
            c.close()


def test_replica_state_lives_in_its_own_process(start_server, repo: Path, tmp_path: Path) -> None:
    """Explicit mode: a model loaded through the API, a `file:` upload, the counters, and offline are one
    replica's; the other replica, and a restarted one, have none of them."""
    move_in(tmp_path, repo, "shared", {1: versioned_model(1)})
    a, b = start_server(repo, extra_args=EXPLICIT), start_server(repo, extra_args=EXPLICIT)
    config = json.dumps(
        {
            "name": "uploaded",
            "backend": "python",
            "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [-1]}],
        }
    )
    upload = {"config": config, "file:1/model.py": base64.b64encode(versioned_model(5).encode()).decode()}
    with (
        httpx.Client(base_url=a.base_url, timeout=10) as ca,
        httpx.Client(base_url=b.base_url, timeout=10) as cb,
    ):
        assert ca.post("/v2/repository/models/shared/load").status_code == 200
        assert ca.post("/v2/repository/models/uploaded/load", json={"parameters": upload}).status_code == 200
        assert (served_by(ca, "shared"), served_by(ca, "uploaded")) == (100, 500)
        assert states(ca, "shared") == [("1", "READY")] and states(ca, "uploaded") == [("1", "READY")]
        # The other replica: the folder on disk is listed, not loaded; the upload is unknown.
        assert states(cb, "shared") == [("", "")] and states(cb, "uploaded") == []
        assert infer(cb, "shared", [0]).status_code == 404
        assert infer(cb, "uploaded", [0]).status_code == 404

        # Loaded on both, the same model counts each process's requests, under the names the HPA reads.
        assert cb.post("/v2/repository/models/shared/load").status_code == 200
        assert [served_by(ca, "shared"), served_by(ca, "shared"), served_by(cb, "shared")] == [100] * 3
        for server, requests in ((a, 3), (b, 1)):
            text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).text
            assert metric(text, "nv_inference_request_success", "shared") == requests
            assert metric(text, "nv_inference_queue_duration_us", "shared") is not None
        assert states(cb, "uploaded") == []

        # Offline is one replica's too.
        assert ca.post("/grps/v1/health/offline").json() == {"status": OK_STATUS}
        assert (ca.get("/v2/health/ready").status_code, cb.get("/v2/health/ready").status_code) == (400, 200)
        assert ca.post("/grps/v1/health/online").json() == {"status": OK_STATUS}
        assert ca.get("/v2/health/ready").status_code == 200

    # A restarted replica (a rollout, a rescheduled pod, a scale-up) starts from its flags and the disk.
    assert a.stop() == 0
    restarted = start_server(repo, extra_args=EXPLICIT)
    with httpx.Client(base_url=restarted.base_url, timeout=10) as c:
        assert states(c, "shared") == [("", "")] and states(c, "uploaded") == []
        assert infer(c, "uploaded", [0]).status_code == 404


# ------------------------------------------------------------------------------------------ draining

DRAIN_MODEL = """
import asyncio
from pathlib import Path

HERE = Path(__file__).parent
HOLD = HERE / "hold"  # while it exists, a request arriving waits in execute
HELD = HERE / "held"  # a file per request waiting
EXECUTED = HERE / "executed.log"  # a line per request executed to the end


class Model:
    async def execute(self, inputs):
        ident = int(inputs["INPUT0"][0])
        if HOLD.exists():
            (HELD / str(ident)).touch()
            while HOLD.exists():
                await asyncio.sleep(0.005)
        with EXECUTED.open("a") as log:
            log.write(f"{ident}\\n")
        return {"OUTPUT0": inputs["INPUT0"] * 2}
"""
DRAIN_PATH = "/v2/models/drain/infer"
H1_CLIENTS = 3
H2_CLIENTS, H2_STREAMS = 2, 3  # connections, and streams each keeps in flight
MAX_REQUESTS = 5000  # per client: the bound on a loop that should end with the server

OK = "ok"
# What a client may see of a request the server never read, each telling it so:
REFUSED = "connection refused"
CLOSED_BEFORE_SENDING = "closed before sending"
REFUSED_STREAM = "HTTP/2 REFUSED_STREAM"
ABOVE_GOAWAY = "HTTP/2 stream above GOAWAY's last stream id"
NOT_PROCESSED = {REFUSED, CLOSED_BEFORE_SENDING, REFUSED_STREAM, ABOVE_GOAWAY}
UNANSWERED = "sent, and no answer"  # the lost request


def drain_body(ident: int) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [ident]}]}
    ).encode()


@dataclass
class Attempt:
    client: str
    ident: int
    start: float
    outcome: str = ""
    detail: str = ""
    connection_close: bool = False


@dataclass
class Load:
    """The attempts of every load client, and what each HTTP/2 connection was told by GOAWAY."""

    address: tuple[str, int]
    attempts: list[Attempt] = field(default_factory=list)
    goaways: dict[str, tuple[int, int]] = field(default_factory=dict)  # client: (error code, last id)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    ids: itertools.count = field(default_factory=lambda: itertools.count(1))

    def begin(self, client: str) -> Attempt:
        with self.lock:
            attempt = Attempt(client, next(self.ids), time.monotonic())
            self.attempts.append(attempt)
        return attempt

    @staticmethod
    def end(attempt: Attempt, outcome: str, detail: str = "") -> None:
        attempt.outcome, attempt.detail = outcome, detail

    @staticmethod
    def answered(attempt: Attempt, status: int | None, body: bytes) -> None:
        try:
            right = status == 200 and json.loads(body)["outputs"][0]["data"] == [2 * attempt.ident]
        except (ValueError, KeyError, IndexError):
            right = False
        Load.end(attempt, OK if right else "wrong answer", "" if right else f"{status} {body[:200]!r}")

    def count(self, outcome: str = OK) -> int:
        with self.lock:
            return sum(a.outcome == outcome for a in self.attempts)

    def failures(self) -> list[Attempt]:
        with self.lock:
            return [a for a in self.attempts if a.outcome not in ("", OK)]


def peer_spoke(sock: socket.socket) -> bool:
    """What a connection pool checks before reusing a keep-alive connection: has the server closed it (or
    sent anything unasked) since the last answer?"""
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable)


def h1_client(load: Load, name: str) -> None:
    """One keep-alive connection, one request at a time; connects again when the server said close."""
    conn: RawConnection | None = None
    try:
        for _ in range(MAX_REQUESTS):
            if load.stop.is_set():
                return
            if conn is not None and peer_spoke(conn.sock):
                conn.close()
                conn = None
            attempt = load.begin(name)
            if conn is None:
                try:
                    conn = RawConnection(load.address)
                except ConnectionRefusedError:
                    load.end(attempt, REFUSED)
                    return
            request = http_request(
                "POST",
                DRAIN_PATH,
                drain_body(attempt.ident),
                {"Content-Type": "application/json"},
                port=load.address[1],
            )
            try:
                conn.send(request)
            except OSError as e:
                load.end(attempt, CLOSED_BEFORE_SENDING, repr(e))
                conn.close()
                conn = None
                continue
            try:
                response, detail = conn.read_response(), ""
            except (OSError, AssertionError) as e:  # a reset, a timeout, a close mid-answer
                response, detail = None, repr(e)
            if response is None:
                load.end(attempt, UNANSWERED, detail)
                conn.close()
                conn = None
                continue
            attempt.connection_close = response.header("connection") == "close"
            load.answered(attempt, response.status, response.body)
            if attempt.connection_close:
                conn.close()
                conn = None
    finally:
        if conn is not None:
            conn.close()


def h2_client(load: Load, name: str) -> None:
    """One HTTP/2 connection keeping H2_STREAMS requests in flight. After REFUSED_STREAM or GOAWAY it opens
    no new stream there: it reads on until the server closes, then connects again (and is refused)."""
    sock = socket.create_connection(load.address, timeout=10)
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    streams: dict[int, Attempt] = {}
    answers: dict[int, tuple[int | None, bytearray]] = {}
    draining, sent, last_id = False, 0, None
    try:
        while True:
            while (
                not draining and not load.stop.is_set() and len(streams) < H2_STREAMS and sent < MAX_REQUESTS
            ):
                attempt = load.begin(name)
                body = drain_body(attempt.ident)
                stream_id = conn.get_next_available_stream_id()
                headers = [
                    (":method", "POST"),
                    (":path", DRAIN_PATH),
                    (":scheme", "http"),
                    (":authority", f"{load.address[0]}:{load.address[1]}"),
                    ("content-type", "application/json"),
                    ("content-length", str(len(body))),
                ]
                conn.send_headers(stream_id, headers)
                conn.send_data(stream_id, body, end_stream=True)
                streams[stream_id], answers[stream_id] = attempt, (None, bytearray())
                sent += 1
            with contextlib.suppress(OSError):  # closed by the server: what was sent is judged by its GOAWAY
                sock.sendall(conn.data_to_send())
            if not streams and not draining:
                return  # stopped, or the bound reached
            try:
                data = sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:  # the server closed the connection
                for stream_id, attempt in streams.items():
                    above = last_id is not None and stream_id > last_id
                    load.end(attempt, ABOVE_GOAWAY if above else UNANSWERED, "connection closed")
                break
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    answers[event.stream_id] = (
                        int(dict(event.headers)[b":status"]),
                        answers[event.stream_id][1],
                    )
                elif isinstance(event, h2.events.DataReceived):
                    answers[event.stream_id][1].extend(event.data)
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded) and event.stream_id in streams:
                    status, body = answers.pop(event.stream_id)
                    load.answered(streams.pop(event.stream_id), status, bytes(body))
                elif isinstance(event, h2.events.StreamReset) and event.stream_id in streams:
                    refused = event.error_code == h2.errors.ErrorCodes.REFUSED_STREAM
                    load.end(
                        streams.pop(event.stream_id),
                        REFUSED_STREAM if refused else f"reset {event.error_code!r}",
                    )
                    draining = True
                elif isinstance(event, h2.events.ConnectionTerminated):
                    last_id, draining = event.last_stream_id, True
                    load.goaways[name] = (event.error_code, event.last_stream_id)
                    for stream_id in [s for s in streams if s > last_id]:
                        load.end(streams.pop(stream_id), ABOVE_GOAWAY)
    except OSError as e:  # a timeout: the server neither answered nor closed
        for attempt in streams.values():
            load.end(attempt, UNANSWERED, repr(e))
        return
    finally:
        sock.close()
    attempt = load.begin(name)
    try:
        socket.create_connection(load.address, timeout=10).close()
        load.end(attempt, "connected after the drain")
    except ConnectionRefusedError:
        load.end(attempt, REFUSED)


def goaway_of(idle: RawH2) -> tuple[int, int] | None:
    """(error code, last stream id) of the GOAWAY an idle HTTP/2 connection gets before its close."""
    found = None
    while True:
        try:
            chunk = idle.sock.recv(65536)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            return found
        for event in idle.conn.receive_data(chunk):
            if isinstance(event, h2.events.ConnectionTerminated):
                found = (event.error_code, event.last_stream_id)


# Our transport's drain. On hypercorn (--http-server hypercorn) requests in flight at SIGTERM go unanswered,
# and the process exits 1 or not within 15 s: not a drain to deploy (deploy/scale-out.md).
@pytest.mark.ours
def test_drain_under_load_answers_every_request_it_accepted(start_server, repo: Path) -> None:
    """Under HTTP/1.1 keep-alive and HTTP/2 load: offline fails readiness (/v2 400, grps 503) while every
    request is still served; SIGTERM refuses new connections at once, answers every request in flight
    (HTTP/1.1 with `connection: close`, HTTP/2 then GOAWAY NO_ERROR), and the server exits 0. Every
    failure is one the client can tell was not processed, and comes after the signal."""
    directory = write_model(
        repo, "drain", int32_config("drain", policy="instance_group [ { count: 16 } ]"), {1: DRAIN_MODEL}
    )
    version = directory / "1"
    (version / "held").mkdir()
    server = start_server(repo, extra_args=("--graceful-timeout", "10"))
    load = Load(server.address)
    threads = [
        threading.Thread(target=h1_client, args=(load, f"h1-{i}"), daemon=True) for i in range(H1_CLIENTS)
    ] + [threading.Thread(target=h2_client, args=(load, f"h2-{i}"), daemon=True) for i in range(H2_CLIENTS)]

    def served(at_least: int, what: str) -> None:
        wait_for(lambda: load.count() >= at_least or load.failures(), what, 10)
        assert not load.failures(), f"requests failed before SIGTERM: {load.failures()[:5]}"

    # Connections that are idle at SIGTERM: closed at once (HTTP/2 with GOAWAY), not held for the timeout.
    idle_h1 = RawConnection(server.address)
    idle_h1.send(http_request("GET", "/v2/health/live", port=server.port))
    assert idle_h1.read_response().status == 200
    idle_h2 = RawH2(server.address)
    idle_h2.start(1, "GET", "/v2/health/live", end=True)
    assert idle_h2.response(1)[0] == 200
    try:
        for thread in threads:
            thread.start()
        served(50, "the load to get going")

        with httpx.Client(base_url=server.base_url, timeout=10) as c:
            assert c.post("/grps/v1/health/offline").json() == {"status": OK_STATUS}
            ready = c.get("/v2/health/ready")
            assert (ready.status_code, ready.json()) == (400, {"ready": False})
            grps_ready = c.get("/grps/v1/health/ready")
            assert grps_ready.status_code == 503 and "offline" in grps_ready.json()["status"]["msg"]
            live = c.get("/v2/health/live")
            assert (live.status_code, live.json()) == (200, {"live": True}), (
                "liveness must hold while draining"
            )
        served(load.count() + 50, "requests to go on being served while offline")

        # Every client's next request waits in the model: no connection is idle when the signal comes.
        (version / "hold").touch()
        in_flight = H1_CLIENTS + H2_CLIENTS * H2_STREAMS
        wait_for(lambda: len(list((version / "held").iterdir())) == in_flight, "every client held", 10)
        answered_before = load.count()

        signalled = time.monotonic()
        server.send_signal(signal.SIGTERM)
        assert wait_until_refused(server.address, timeout=5) is not None, "new connections still accepted"
        assert idle_h1.closed_by_peer(), "an idle keep-alive connection was kept open"
        assert goaway_of(idle_h2) == (h2.errors.ErrorCodes.NO_ERROR, 1)
        assert load.count() == answered_before, "a request in flight was answered before it could be"
        assert server.running()

        (version / "hold").unlink()
        for thread in threads:
            thread.join(timeout=15)
        assert not any(t.is_alive() for t in threads), "a load client never finished"
        assert server.wait(timeout=15) == 0
        assert time.monotonic() - signalled < 8, "the drain took longer than its requests"
    finally:
        load.stop.set()
        (version / "hold").unlink(missing_ok=True)  # a failure above must not leave requests held
        idle_h1.close()
        idle_h2.sock.close()

    attempts = load.attempts
    answered = [a for a in attempts if a.outcome in (OK, "wrong answer")]
    ok = [a for a in attempts if a.outcome == OK]
    failed = [a for a in attempts if a.outcome != OK]
    assert len(ok) == len(answered), [a for a in answered if a.outcome != OK][:5]
    assert all(a.outcome in NOT_PROCESSED for a in failed), [
        a for a in failed if a.outcome not in NOT_PROCESSED
    ]
    assert all(a.start >= signalled for a in failed), "a request failed before SIGTERM"
    # The requests in flight at the signal were answered, HTTP/1.1 ones telling the client to go.
    held = {int(p.name) for p in (version / "held").iterdir()}
    by_id = {a.ident: a for a in attempts}
    assert all(by_id[i].outcome == OK for i in held), [by_id[i] for i in held if by_id[i].outcome != OK]
    assert all(by_id[i].connection_close for i in held if by_id[i].client.startswith("h1"))
    assert sorted(load.goaways) == [f"h2-{i}" for i in range(H2_CLIENTS)], "an HTTP/2 client got no GOAWAY"
    assert all(code == h2.errors.ErrorCodes.NO_ERROR for code, _ in load.goaways.values()), load.goaways
    # Each client ended on a refused connection: nothing listens once the drain is over.
    for name in [f"h1-{i}" for i in range(H1_CLIENTS)] + [f"h2-{i}" for i in range(H2_CLIENTS)]:
        assert [a for a in attempts if a.client == name][-1].outcome == REFUSED, name
    # What the model executed is exactly what was answered: no work done and its answer lost.
    executed = [int(line) for line in (version / "executed.log").read_text().split()]
    assert sorted(executed) == sorted(a.ident for a in ok)
    assert "shut down" in server.log_text()
