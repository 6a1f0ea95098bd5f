"""TLS on the HTTP port (--ssl-certfile, --ssl-keyfile): HTTP/1.1 and HTTP/2 chosen by ALPN, gRPC too."""

from __future__ import annotations

import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from e2e_helpers import EXAMPLES, ServerProcess, need_program, simple_inputs, stop_all

import tensorgate.proto.inference as pb

pytestmark = pytest.mark.ours


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    base = tmp_path_factory.mktemp("tls")
    cert, key = base / "cert.pem", base / "key.pem"
    openssl = need_program("openssl", "apt-get install openssl: it makes the test's certificate")
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    server = ServerProcess(
        EXAMPLES, base / "server.log", extra_args=("--ssl-certfile", str(cert), "--ssl-keyfile", str(key))
    ).start()
    yield server, cert
    stop_all([server])


@pytest.mark.parametrize(("http2", "version"), [(False, "HTTP/1.1"), (True, "HTTP/2")])
def test_https_answers_over_the_protocol_alpn_chose(tls_server, http2: bool, version: str) -> None:
    server, cert = tls_server
    context = ssl.create_default_context(cafile=str(cert))
    with httpx.Client(verify=context, http1=not http2, http2=http2, timeout=10) as client:
        base = f"https://127.0.0.1:{server.port}"
        live = client.get(f"{base}/v2/health/live")
        assert (live.http_version, live.json()) == (version, {"live": True})
        body = {"inputs": simple_inputs(list(range(16)), [2] * 16, [1, 16])}
        infer = client.post(f"{base}/v2/models/simple/infer", json=body)
        assert infer.http_version == version
        assert infer.json()["outputs"][0]["data"] == [x + 2 for x in range(16)]


def test_plain_http_on_the_tls_port_is_not_served(tls_server) -> None:
    server, _ = tls_server
    with httpx.Client(timeout=5) as client, pytest.raises(httpx.HTTPError):
        client.get(f"http://127.0.0.1:{server.port}/v2/health/live")


def test_grpc_over_tls_on_the_http_port(tls_server) -> None:
    """grpcio with TLS credentials reaches the gRPC services on the HTTP port (ALPN h2)."""
    server, cert = tls_server
    credentials = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    with grpc.secure_channel(f"127.0.0.1:{server.port}", credentials) as channel:
        ready = channel.unary_unary(
            "/inference.GRPCInferenceService/ServerReady",
            request_serializer=bytes,
            response_deserializer=pb.ServerReadyResponse.parse,
        )
        assert ready(pb.ServerReadyRequest(), timeout=10).ready
