"""TLS on the gRPC port and mutual TLS on both ports (docs/operations/security.md), with certificates made
here: a CA, the server's certificate for 127.0.0.1, and a client certificate the CA signed, plus a client
certificate from another CA.

- `--grpc-use-ssl-mutual` with `--grpc-root-cert`: grpcio with the CA's client certificate is served; without
  a certificate, or with one another CA signed, the handshake fails (UNAVAILABLE) and the server serves on.
- `--grpc-use-ssl`: TLS without client certificates.
- `--ssl-ca-certs` on the HTTP port: httpx (HTTP/1.1 and HTTP/2) with the client certificate is served,
  without one it is refused; gRPC on the HTTP port rides the same TLS.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import grpc
import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from e2e_helpers import EXAMPLES, ServerProcess, stop_all

import tensorgate.proto.inference as pb


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _certificate(
    subject: str, key, issuer: str, issuer_key, *, ca: bool = False, usage=None, ip: bool = False
):
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if ip:
        san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
        builder = builder.add_extension(san, critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


def _write(path: Path, *items) -> str:
    chunks = []
    for item in items:
        if isinstance(item, x509.Certificate):
            chunks.append(item.public_bytes(serialization.Encoding.PEM))
        else:
            chunks.append(
                item.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
    path.write_bytes(b"".join(chunks))
    return str(path)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    base = tmp_path_factory.mktemp("pki")
    ca_key, other_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("test CA", ca_key, "test CA", ca_key, ca=True)
    other_ca = _certificate("other CA", other_key, "other CA", other_key, ca=True)
    server_key, client_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    server = _certificate(
        "127.0.0.1", server_key, "test CA", ca_key, usage=ExtendedKeyUsageOID.SERVER_AUTH, ip=True
    )
    client = _certificate("client", client_key, "test CA", ca_key, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    stranger = _certificate(
        "stranger", client_key, "other CA", other_key, usage=ExtendedKeyUsageOID.CLIENT_AUTH
    )
    return SimpleNamespace(
        ca=_write(base / "ca.pem", ca),
        server_cert=_write(base / "server.pem", server),
        server_key=_write(base / "server.key", server_key),
        client_cert=_write(base / "client.pem", client),
        client_key=_write(base / "client.key", client_key),
        stranger_cert=_write(base / "stranger.pem", stranger),
        other_ca=_write(base / "other-ca.pem", other_ca),
    )


@pytest.fixture(scope="module")
def mutual(pki: SimpleNamespace, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    flags = (
        "--grpc-use-ssl-mutual", "true", "--grpc-server-cert", pki.server_cert, "--grpc-server-key",
        pki.server_key, "--grpc-root-cert", pki.ca,
        "--ssl-certfile", pki.server_cert, "--ssl-keyfile", pki.server_key, "--ssl-ca-certs", pki.ca,
    )  # fmt: skip
    server = ServerProcess(EXAMPLES, tmp_path_factory.mktemp("mtls") / "server.log", extra_args=flags).start()
    yield server
    stop_all([server])


def read(path: str) -> bytes:
    return Path(path).read_bytes()


def live(channel: grpc.Channel) -> bool:
    method = channel.unary_unary(
        "/inference.GRPCInferenceService/ServerLive",
        request_serializer=bytes,
        response_deserializer=pb.ServerLiveResponse.parse,
    )
    return method(pb.ServerLiveRequest(), timeout=10).live


def credentials(pki: SimpleNamespace, cert: str | None) -> grpc.ChannelCredentials:
    if cert is None:
        return grpc.ssl_channel_credentials(root_certificates=read(pki.ca))
    return grpc.ssl_channel_credentials(read(pki.ca), read(pki.client_key), read(cert))


@pytest.mark.ours  # gRPC, and on the HTTP port: our transport's (the REST test runs on hypercorn too)
@pytest.mark.parametrize("port", ["grpc", "http"])
def test_grpc_with_mutual_tls(pki: SimpleNamespace, mutual: ServerProcess, port: str) -> None:
    target = f"127.0.0.1:{mutual.grpc_port if port == 'grpc' else mutual.port}"
    with grpc.secure_channel(target, credentials(pki, pki.client_cert)) as channel:
        assert live(channel)
    for cert in (None, pki.stranger_cert):  # no certificate, or one the server's CA did not sign
        with grpc.secure_channel(target, credentials(pki, cert)) as channel:
            with pytest.raises(grpc.RpcError) as caught:
                live(channel)
            assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    with grpc.insecure_channel(target) as channel, pytest.raises(grpc.RpcError):
        live(channel)  # cleartext to a TLS port
    with grpc.secure_channel(target, credentials(pki, pki.client_cert)) as channel:
        assert live(channel)  # served on after the refusals


@pytest.mark.parametrize("http2", [False, True])
def test_rest_with_mutual_tls(pki: SimpleNamespace, mutual: ServerProcess, http2: bool) -> None:
    url = f"https://127.0.0.1:{mutual.port}/v2/health/live"
    client_context = ssl.create_default_context(cafile=pki.ca)
    client_context.load_cert_chain(pki.client_cert, pki.client_key)
    with httpx.Client(verify=client_context, http1=not http2, http2=http2, timeout=10) as client:
        answer = client.get(url)
        assert answer.status_code == 200 and answer.http_version == ("HTTP/2" if http2 else "HTTP/1.1")
    bare = ssl.create_default_context(cafile=pki.ca)
    with (
        httpx.Client(verify=bare, http1=not http2, http2=http2, timeout=10) as client,
        pytest.raises(httpx.HTTPError),
    ):
        client.get(url)


@pytest.mark.ours
def test_grpc_tls_without_client_certificates(pki: SimpleNamespace, tmp_path: Path) -> None:
    flags = (
        "--grpc-use-ssl",
        "true",
        "--grpc-server-cert",
        pki.server_cert,
        "--grpc-server-key",
        pki.server_key,
    )
    server = ServerProcess(EXAMPLES, tmp_path / "server.log", extra_args=flags).start()
    try:
        with grpc.secure_channel(f"127.0.0.1:{server.grpc_port}", credentials(pki, None)) as channel:
            assert live(channel)
        with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel, pytest.raises(grpc.RpcError):
            live(channel)
        with httpx.Client(timeout=10) as client:  # the HTTP port stays cleartext
            assert client.get(f"{server.base_url}/v2/health/live").status_code == 200
    finally:
        stop_all([server])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--grpc-use-ssl", "true"), "--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key"),
        (("--grpc-use-ssl-mutual", "true", "--grpc-server-cert", "c", "--grpc-server-key", "k"),
         "--grpc-use-ssl-mutual needs --grpc-root-cert"),
        (("--ssl-ca-certs", "ca.pem"), "--ssl-ca-certs (mutual TLS) needs --ssl-certfile and --ssl-keyfile"),
    ],
)  # fmt: skip
def test_incomplete_tls_flags_stop_startup(flags: tuple, message: str) -> None:
    command = [
        sys.executable,
        "-m",
        "tensorgate.server",
        "serve",
        "--model-repository",
        str(EXAMPLES),
        *flags,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr, done.stderr
