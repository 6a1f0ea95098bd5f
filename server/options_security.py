"""`tensorgate serve`'s security flags: TLS and mutual TLS on the HTTP and gRPC ports, Triton's restricted
APIs (the groups of endpoints that need a header or metadata value), and whether clients may register
shared-memory regions."""

import argparse

from tensorgate.server import restricted
from tensorgate.server.options_values import boolean


def add_security_flags(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--ssl-certfile", default=None, help="serve HTTP over TLS with this certificate (PEM)")
    serve.add_argument("--ssl-keyfile", default=None, help="the private key of --ssl-certfile (PEM)")
    serve.add_argument(
        "--ssl-ca-certs",
        default=None,
        metavar="PEM",
        help="mutual TLS on the HTTP port: a client must present a certificate these CAs signed (needs "
        "--ssl-certfile)",
    )
    serve.add_argument(
        "--grpc-use-ssl",
        type=boolean,
        default=False,
        metavar="true|false",
        help="serve the gRPC port over TLS with --grpc-server-cert and --grpc-server-key (default false: "
        "cleartext)",
    )
    serve.add_argument(
        "--grpc-use-ssl-mutual",
        type=boolean,
        default=False,
        metavar="true|false",
        help="the gRPC port over mutual TLS: a client must present a certificate --grpc-root-cert signed "
        "(implies --grpc-use-ssl; default false)",
    )
    serve.add_argument("--grpc-server-cert", default=None, metavar="PEM", help="the gRPC port's certificate")
    serve.add_argument("--grpc-server-key", default=None, metavar="PEM", help="the gRPC port's private key")
    serve.add_argument(
        "--grpc-root-cert", default=None, metavar="PEM", help="with --grpc-use-ssl-mutual: the CAs whose "
        "certificates gRPC clients must present",
    )  # fmt: skip
    groups = ", ".join(restricted.GROUPS)
    serve.add_argument(
        "--http-restricted-api",
        action="append",
        default=[],
        metavar="<apis>:<key>=<value>",
        help=f"Triton's restricted APIs (repeatable): the REST APIs of the comma-separated groups answer "
        f"only a request with the header <key> set to <value>, else 403. The groups: {groups}",
    )
    serve.add_argument(
        "--grpc-restricted-protocol",
        action="append",
        default=[],
        metavar="<protocols>:<key>=<value>",
        help=f"the same for gRPC (repeatable): the methods of the groups need the metadata "
        f"{restricted.GRPC_KEY_PREFIX}<key> set to <value>, else UNAVAILABLE. The groups: {groups}",
    )
    serve.add_argument(
        "--allow-client-shm",
        type=boolean,
        nargs="?",
        const=True,
        default=False,
        metavar="true|false",
        help="let clients register system and CUDA shared-memory regions (default false: a client could "
        "make the server read or write any segment its user may open)",
    )
