"""End-to-end fixtures: real server processes on 127.0.0.1, port 0, logs shown when a test fails."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from e2e_helpers import EXAMPLES, LOG_TAIL, ServerProcess, make_client, stop_all
from grps_helpers import write_grps_repository
from h2_wire import H2Wire

ServerFactory = Callable[..., ServerProcess]


@pytest.fixture(scope="session")
def v2_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server on examples/model_repository, shared by every test that only reads from it."""
    log = tmp_path_factory.mktemp("v2_server") / "server.log"
    server = ServerProcess(EXAMPLES, log).start()
    yield server
    stop_all([server])


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[ServerFactory]:
    """start_server(repository, extra_args=(), log_level="info") -> a started ServerProcess.

    Servers still running at teardown get SIGTERM and must exit 0.
    """
    servers: list[ServerProcess] = []

    def start(
        repository: Path, *, extra_args: tuple[str, ...] = (), log_level: str = "info"
    ) -> ServerProcess:
        log = tmp_path / f"server-{len(servers)}.log"
        server = ServerProcess(repository, log, extra_args=extra_args, log_level=log_level)
        servers.append(server)
        return server.start()

    start.servers = servers  # type: ignore[attr-defined]
    yield start
    stop_all(servers)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


@pytest.fixture(params=["http1", "http2"])
def http_version(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def h2(v2_server: ServerProcess) -> Iterator[H2Wire]:
    """A raw HTTP/2 connection to the shared server, preface and SETTINGS exchanged."""
    with H2Wire(v2_server.address) as wire:
        yield wire.open()


@pytest.fixture
def client(v2_server: ServerProcess, http_version: str) -> Iterator[httpx.Client]:
    with make_client(v2_server.base_url, http_version) as c:
        yield c


# TENSORGATE_REQUIRE_GPU=1 (the GPU check kit sets it): a GPU run that tested nothing must not look green.
REQUIRE_GPU = os.environ.get("TENSORGATE_REQUIRE_GPU") == "1"


def pytest_sessionstart(session: pytest.Session) -> None:
    """With TENSORGATE_REQUIRE_GPU=1, the run stops at once without CUDA torch, a device, or CuPy."""
    if not REQUIRE_GPU:
        return
    try:
        import torch
    except ImportError:
        raise pytest.UsageError("TENSORGATE_REQUIRE_GPU=1 but torch is not installed") from None
    if torch.version.cuda is None or not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}, no device"
        raise pytest.UsageError(f"TENSORGATE_REQUIRE_GPU=1 but torch {torch.__version__} is {build}")
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        raise pytest.UsageError(f"TENSORGATE_REQUIRE_GPU=1 but CuPy cannot use a device: {e}") from None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """On failure, attach the log of every server the test used (the tail of it). With
    TENSORGATE_REQUIRE_GPU=1, a `gpu` test that skips fails instead."""
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_GPU and report.skipped and item.get_closest_marker("gpu") is not None:
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.longrepr = f"a gpu test skipped under TENSORGATE_REQUIRE_GPU=1: {reason}"
    if not report.failed:
        return
    servers: list[ServerProcess] = []
    for value in getattr(item, "funcargs", {}).values():
        if isinstance(value, ServerProcess):
            servers.append(value)
        servers.extend(getattr(value, "servers", ()))
    for server in servers:
        report.sections.append((f"server log {server.log_path}", server.log_text()[-LOG_TAIL:]))


@pytest.fixture(scope="module")
def grps_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server on grps_helpers' test models, per test module (grps REST, streaming and gRPC)."""
    repository = write_grps_repository(tmp_path_factory.mktemp("grps_models"))
    log = tmp_path_factory.mktemp("grps_server") / "server.log"
    server = ServerProcess(repository, log, extra_args=("--max-request-bytes", "65536")).start()
    yield server
    stop_all([server])


@pytest.fixture
def grps_client(grps_server: ServerProcess, http_version: str) -> Iterator[httpx.Client]:
    with make_client(grps_server.base_url, http_version) as c:
        yield c
