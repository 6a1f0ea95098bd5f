"""grps Offline moves keep-alive clients off the server before it is stopped: each HTTP/1.1 answer says
`connection: close`, each HTTP/2 connection gets GOAWAY NO_ERROR at its next idle moment (on the gRPC
port too), while every request is still served; Online keeps connections alive again."""

import grpc
import pytest
from e2e_helpers import EXAMPLES, RawConnection, http_request
from grpc_helpers import SERVICE
from h2_wire import GOAWAY, H2Wire

import tensorgate.proto.inference as pb

pytestmark = pytest.mark.ours  # the reference transport (hypercorn) knows nothing of offline


def set_online(port: int, online: bool) -> None:
    path = "/grps/v1/health/online" if online else "/grps/v1/health/offline"
    with RawConnection(("127.0.0.1", port)) as conn:
        conn.send(http_request("POST", path, port=port))
        assert conn.read_response().status == 200


def live(conn: RawConnection, port: int) -> str | None:
    """GET /v2/health/live on `conn`: its `connection` header (None: keep-alive)."""
    conn.send(http_request("GET", "/v2/health/live", port=port))
    response = conn.read_response()
    assert response is not None and response.status == 200
    return response.header("connection")


def h2_live(h2: H2Wire, stream: int) -> None:
    h2.request(stream)
    h2.expect_response(stream)


def goaway(h2: H2Wire) -> tuple[int, int]:
    """The last stream id and error code of the GOAWAY the server sends (within the wire's timeout)."""
    [found] = [f for f in h2.frames_until(lambda f: f.kind == GOAWAY, timeout=5) if f.kind == GOAWAY]
    return int.from_bytes(found.payload[:4], "big") & 0x7FFFFFFF, found.error_code


def test_offline_invites_every_keep_alive_connection_to_leave(start_server) -> None:
    server = start_server(EXAMPLES)
    port = server.port
    with RawConnection(("127.0.0.1", port)) as h1, H2Wire(("127.0.0.1", port), timeout=5) as h2:
        h2.open()
        assert live(h1, port) is None  # online: kept alive
        h2_live(h2, 1)
        set_online(port, False)
        # HTTP/2: the idle connection is told to go, after the stream it answered, and closed.
        assert goaway(h2) == (1, 0)
        assert h2.read_frame(timeout=5) is None  # closed
        # HTTP/1.1: the next answer is still given, and closes the connection.
        assert live(h1, port) == "close"
        assert h1.closed_by_peer()
    with RawConnection(("127.0.0.1", port)) as h1, H2Wire(("127.0.0.1", port), timeout=5) as h2:
        assert live(h1, port) == "close"  # a new connection is served, and told the same
        h2.open()
        h2_live(h2, 1)  # served, then GOAWAY once idle
        assert goaway(h2) == (1, 0)
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        ready = channel.unary_unary(
            SERVICE + "ServerReady",
            request_serializer=bytes,
            response_deserializer=pb.ServerReadyResponse.parse,
        )
        # grpcio reconnects after each GOAWAY by itself: every call is served
        assert [ready(b"", timeout=10).ready for _ in range(5)] == [False] * 5
    set_online(port, True)
    with RawConnection(("127.0.0.1", port)) as h1, H2Wire(("127.0.0.1", port), timeout=5) as h2:
        assert live(h1, port) is None and live(h1, port) is None  # kept alive again
        h2.open()
        h2_live(h2, 1)
        with pytest.raises(TimeoutError):  # idle: no GOAWAY (offline sent it 0.1 s after the answer)
            h2.read_frame(timeout=1)
        h2_live(h2, 3)
