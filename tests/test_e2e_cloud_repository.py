"""Model repositories in S3 (`--model-repository s3://host:port/bucket/path`), served from a local copy:
against moto's S3 server on loopback, through the same s3fs client a real bucket is read with."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from e2e_helpers import ROOT, ServerProcess, assert_error, int32_config, need_module, stop_all, write_model

need_module("s3fs", "the cloud extra")
moto_server = need_module("moto.server", "moto[server], the test extra")
boto3 = need_module("boto3", "comes with moto")

CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
POLL = ("--model-control-mode", "poll", "--repository-poll-secs", "0.2")
EXPLICIT = ("--model-control-mode", "explicit")


def adding(amount: int) -> str:
    return f"""
class Model:
    def execute(self, inputs):
        return {{"OUTPUT0": inputs["INPUT0"] + {amount}}}
"""


class S3:
    """moto's S3 server on 127.0.0.1, and a bucket in it for each test."""

    def __init__(self) -> None:
        self.server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"{host}:{port}"
        self.client = boto3.client(
            "s3",
            endpoint_url=f"http://{self.endpoint}",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        )
        self.buckets = 0

    def bucket(self) -> str:
        self.buckets += 1
        name = f"models{self.buckets}"
        self.client.create_bucket(Bucket=name)
        return name

    def put(self, bucket: str, key: str, body: str) -> None:
        self.client.put_object(Bucket=bucket, Key=key, Body=body.encode())

    def put_model(self, bucket: str, name: str, config: str, versions: dict[int, str]) -> None:
        self.put(bucket, f"repo/{name}/config.pbtxt", config)
        for number, code in versions.items():
            self.put(bucket, f"repo/{name}/{number}/model.py", code)

    def delete_model(self, bucket: str, name: str) -> None:
        listed = self.client.list_objects_v2(Bucket=bucket, Prefix=f"repo/{name}/")
        for entry in listed.get("Contents", []):
            self.client.delete_object(Bucket=bucket, Key=entry["Key"])


@pytest.fixture(scope="module")
def s3() -> Iterator[S3]:
    storage = S3()
    yield storage
    storage.server.stop()


class Server(ServerProcess):
    """A server whose first --model-repository is a URL (ServerProcess takes a local path)."""

    def __init__(self, location: str, log: Path, extra_args: tuple[str, ...], env: dict[str, str]) -> None:
        super().__init__(Path("."), log, extra_args=extra_args, env=env)
        self.location = location

    @property
    def command(self) -> list[str]:
        command = super().command
        command[command.index("--model-repository") + 1] = self.location
        return command


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    servers: list[ServerProcess] = []

    def start(location: str, *flags: str, env: dict[str, str] | None = None) -> Server:
        log = tmp_path / f"server-{len(servers)}.log"
        server = Server(location, log, flags, env or {**os.environ, **CREDENTIALS})
        servers.append(server)
        return server.start()

    yield start
    stop_all(servers)


def infer(client: httpx.Client, model: str) -> httpx.Response:
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [0]}]}
    return client.post(f"/v2/models/{model}/infer", json=body)


def added_by(client: httpx.Client, model: str) -> int | None:
    response = infer(client, model)
    return response.json()["outputs"][0]["data"][0] if response.status_code == 200 else None


def wait_for(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_model_in_s3_is_served_from_its_local_copy(s3: S3, serve, tmp_path: Path) -> None:
    bucket = s3.bucket()
    s3.put_model(bucket, "adder", int32_config("adder"), {1: adding(7)})
    s3.put(bucket, "repo/ensemble_like/1/", "")  # an S3 console's folder marker: an empty version folder
    s3.put(bucket, "repo/evil/../../../escaped.txt", "a key naming a path outside the copy")
    mount = tmp_path / "mount"  # Triton's variable: where the copies go
    mount.mkdir()
    env = {**os.environ, **CREDENTIALS, "TRITON_AWS_MOUNT_DIRECTORY": str(mount)}
    server = serve(f"s3://{s3.endpoint}/{bucket}/repo", env=env)
    with httpx.Client(base_url=server.base_url, timeout=20) as c:
        assert added_by(c, "adder") == 7
        config = c.get("/v2/models/adder/config").json()
        assert config["name"] == "adder" and config["backend"] == "python"
        names = {e["name"] for e in c.post("/v2/repository/index").json()}
        assert names == {"adder", "ensemble_like"}  # nothing of the key leaving the copy
    (copy,) = mount.iterdir()
    assert (copy / "adder" / "1" / "model.py").read_text() == adding(7)
    assert not list(tmp_path.rglob("escaped.txt"))
    assert server.stop() == 0
    assert list(mount.iterdir()) == []  # the copy is removed at shutdown


TRITON_MODEL = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        # Triton gives the model's folder (of the local copy, for a bucket) as "model_repository"
        with open(os.path.join(args["model_repository"], args["model_version"], "weight.txt")) as f:
            self.weight = int(f.read())

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", (x + self.weight).astype(np.int32))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""


def test_a_triton_python_model_reads_its_files_from_the_local_copy(s3: S3, serve) -> None:
    bucket = s3.bucket()
    s3.put_model(bucket, "weighted", int32_config("weighted"), {1: TRITON_MODEL})
    s3.put(bucket, "repo/weighted/1/weight.txt", "40")
    server = serve(f"s3://{s3.endpoint}/{bucket}/repo")
    with httpx.Client(base_url=server.base_url, timeout=20) as c:
        assert added_by(c, "weighted") == 40


def test_poll_mode_follows_the_bucket(s3: S3, serve) -> None:
    bucket = s3.bucket()
    s3.put_model(bucket, "adder", int32_config("adder"), {1: adding(100)})
    server = serve(f"s3://{s3.endpoint}/{bucket}/repo", *POLL)
    with httpx.Client(base_url=server.base_url, timeout=20) as c:
        assert added_by(c, "adder") == 100
        s3.put_model(bucket, "newcomer", int32_config("newcomer"), {1: adding(1)})  # a new model
        wait_for(lambda: added_by(c, "newcomer") == 1, "the new model")
        s3.put(bucket, "repo/adder/2/model.py", adding(200))  # a new version: the newest serves
        wait_for(lambda: added_by(c, "adder") == 200, "version 2")
        pinned = int32_config("adder", policy="version_policy: { specific: { versions: [ 1 ] } }")
        s3.put(bucket, "repo/adder/config.pbtxt", pinned)  # a changed config
        wait_for(lambda: added_by(c, "adder") == 100, "the config pinning version 1")
        s3.put(bucket, "repo/adder/1/model.py", adding(150))  # a changed model file
        wait_for(lambda: added_by(c, "adder") == 150, "the changed model.py")
        s3.delete_model(bucket, "newcomer")  # a deleted model
        wait_for(lambda: infer(c, "newcomer").status_code == 404, "the deleted model unloaded")
    assert "model 'newcomer' removed from the repository: unloaded" in server.log_text()


def test_explicit_load_reads_the_bucket_as_it_is_now(s3: S3, serve) -> None:
    bucket = s3.bucket()
    server = serve(f"s3://{s3.endpoint}/{bucket}/repo", *EXPLICIT)
    with httpx.Client(base_url=server.base_url, timeout=20) as c:
        assert_error(c.post("/v2/repository/models/late/load"), 500, "failed to load 'late'", "no such model")
        s3.put_model(bucket, "late", int32_config("late"), {1: adding(5)})
        assert c.post("/v2/repository/models/late/load").status_code == 200
        assert added_by(c, "late") == 5
        s3.put(bucket, "repo/late/1/model.py", adding(6))
        assert c.post("/v2/repository/models/late/load").status_code == 200
        assert added_by(c, "late") == 6
        s3.delete_model(bucket, "late")
        assert_error(c.post("/v2/repository/models/late/load"), 500, "failed to load 'late'", "no such model")


def test_a_missing_bucket_is_an_error_and_the_local_repository_serves(s3: S3, serve, repo: Path) -> None:
    write_model(repo, "local", int32_config("local"), {1: adding(3)})
    missing = f"s3://{s3.endpoint}/no-such-bucket/repo"
    server = serve(str(repo), "--model-repository", missing, *EXPLICIT, "--load-model", "*")
    with httpx.Client(base_url=server.base_url, timeout=20) as c:
        assert added_by(c, "local") == 3
        response = c.post("/v2/repository/models/elsewhere/load")
        assert_error(
            response, 500, "failed to load 'elsewhere'", f"failed to poll model repository '{missing}'"
        )
        assert c.post("/v2/repository/models/local/load").status_code == 200
    assert f"failed to poll model repository '{missing}'" in server.log_text()


def test_a_missing_bucket_with_exit_on_error_exits(s3: S3, repo: Path, tmp_path: Path) -> None:
    write_model(repo, "local", int32_config("local"), {1: adding(3)})
    missing = f"s3://{s3.endpoint}/no-such-bucket/repo"
    flags = ("--model-repository", missing, "--exit-on-error", "true")
    command = ServerProcess(repo, tmp_path / "server.log", extra_args=flags).command
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=60, env={**os.environ, **CREDENTIALS}
    )
    assert done.returncode == 1
    assert f"failed to poll model repository '{missing}'" in done.stdout + done.stderr


def test_wrong_credentials_are_an_error(serve, repo: Path) -> None:
    """moto's server checks credentials once told to (INITIAL_NO_AUTH_ACTION_COUNT=0): the key is then
    unknown to it, as a wrong one is to S3."""
    port = _free_port()
    strict = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_listening(port)
        write_model(repo, "local", int32_config("local"), {1: adding(3)})
        location = f"s3://127.0.0.1:{port}/models/repo"
        server = serve(str(repo), "--model-repository", location)
        with httpx.Client(base_url=server.base_url, timeout=20) as c:
            assert added_by(c, "local") == 3
        log = server.log_text()
        assert f"failed to poll model repository '{location}'" in log
        assert "PermissionError: Forbidden (check the credentials: AWS_ACCESS_KEY_ID" in log
    finally:
        strict.terminate()
        strict.wait(10)


def test_an_s3_repository_without_the_cloud_extra_names_it(repo: Path, tmp_path: Path) -> None:
    """A server whose s3fs cannot be imported (a package of that name that raises ImportError first on
    its path) says which extra to install, and does not start."""
    shadow = tmp_path / "shadow" / "s3fs"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('No module named s3fs', name='s3fs')\n")
    flags = ("--model-repository", "s3://bucket/repo")
    command = ServerProcess(repo, tmp_path / "server.log", extra_args=flags).command
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(shadow.parent), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2
    assert "needs the cloud extra (pip install 'tensorgate[cloud]')" in done.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_listening(port: int) -> None:
    wait_for(lambda: _connects(port), f"moto_server on port {port}")


def _connects(port: int) -> bool:
    try:
        httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
    except httpx.HTTPError:
        return False
    return True
