"""The package as a user installs it: a wheel built from the sdist, in a fresh venv, beside
google-cloud-storage (where model files often live) and so beside proto-plus, whose import name is `proto`.

What the test relies on about those packages, in its own words: google-cloud-storage depends on
google-api-core, which depends on proto-plus; proto-plus installs the top-level package `proto`, which
has a `Message` class. A wheel of ours that installed a top-level `proto` (or `server`, `codec`, ...)
would overwrite or mix with it. Ours installs one top-level name, `tensorgate` (setup.py).

The wheel is built without the compiled request path (TENSORGATE_COMPILE=0, seconds instead of minutes
on 2 cores): where the files go is the same either way, since setup.py names every extension
`tensorgate.<module>` and `make compile` builds the same list in place (tests/test_compiled.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from e2e_helpers import EXAMPLES, ROOT, ServerProcess, make_client

PIP_TIMEOUT = 600  # s: the fresh venv's dependencies come from the package index


def run(*command: str | Path, cwd: Path | None = None, env: dict | None = None) -> str:
    done = subprocess.run(
        [str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=PIP_TIMEOUT
    )
    assert done.returncode == 0, f"{command}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "setup.py", "-q", "sdist", "-d", out, cwd=ROOT)
    (sdist,) = out.glob("tensorgate-*.tar.gz")
    env = {**os.environ, "TENSORGATE_COMPILE": "0"}
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", out, sdist,
        env=env)  # fmt: skip
    (built,) = out.glob("tensorgate-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with google-cloud-storage and our wheel (google-cloud-storage first, then ours)."""
    home = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True).create(home)
    python = home / "bin" / "python"
    run(python, "-m", "pip", "install", "-q", "google-cloud-storage")
    run(python, "-m", "pip", "install", "-q", wheel)
    return home


def test_the_wheel_installs_one_top_level_name(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert tops == {"tensorgate"}
    for package in ("server", "codec", "batcher", "proto", "perf"):
        assert f"tensorgate/{package}/__init__.py" in names
    assert "tensorgate/proto/descriptors.binpb" in names  # what reflection serves
    assert "tensorgate/server/endpoints/monitor_page.html" in names
    for pxd in ("batcher/stats.pxd", "server/http/grpc_call.pxd"):  # a build from the sdist reads them
        assert f"tensorgate/{pxd}" in names
    assert not any(name.startswith(("tensorgate/bench/", "tensorgate/tests/")) for name in names)


def test_both_import_side_by_side(installed: Path) -> None:
    program = (
        "import proto, google.cloud.storage, tensorgate.proto.inference, tensorgate.server.cli\n"
        "import tensorgate.perf.cli\n"
        "print(proto.__file__); print(hasattr(proto, 'Message')); print(tensorgate.proto.__file__)\n"
    )
    proto_file, has_message, ours = run(installed / "bin" / "python", "-c", program, cwd=installed).split()
    site = str(installed / "lib")
    assert proto_file.startswith(site) and proto_file.endswith("/site-packages/proto/__init__.py")
    assert has_message == "True", "proto is proto-plus's package, intact"
    assert ours.startswith(site) and ours.endswith("/site-packages/tensorgate/proto/__init__.py")


class InstalledServer(ServerProcess):
    """`tensorgate serve`, the console script of the fresh venv."""

    def __init__(self, home: Path, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.home = home

    @property
    def command(self) -> list[str]:
        return [str(self.home / "bin" / "tensorgate"), *super().command[3:]]


def test_the_installed_server_answers_a_request(installed: Path, tmp_path: Path) -> None:
    explicit = ("--model-control-mode", "explicit", "--load-model", "simple")
    server = InstalledServer(installed, EXAMPLES, tmp_path / "server.log", extra_args=explicit).start()
    try:
        request = {
            "inputs": [
                {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
                {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
            ]
        }
        with make_client(server.base_url, "http1") as client:
            answer = client.post("/v2/models/simple/infer", json=request)
        assert answer.status_code == 200, answer.text
        outputs = {output["name"]: output["data"] for output in answer.json()["outputs"]}
        assert outputs == {"OUTPUT0": [i + 1 for i in range(16)], "OUTPUT1": [i - 1 for i in range(16)]}
    finally:
        server.stop()
