"""The rate limiter end to end (`--rate-limit execution_count`): two models whose instances ask for the one
copy of resource R1 never execute at once; with `--rate-limit off` they do; a rate_limiter that the
`--rate-limit-resource` counts cannot satisfy fails its model's load with Triton's text.

The models here (`async def execute`, so that both can be in flight on the server's loop) mark in the
shared folder that they started, count the executions in progress (`running`, and the most ever seen in
`most`), and block until the test creates `release-<model>` or, for `overlap` runs, until the other model
has started too.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from e2e_helpers import ServerProcess, assert_error, stop_all, wait_for_file, wait_for_pending, write_model

MODEL = """
import asyncio
from pathlib import Path

SHARED = Path({shared!r})
NAME = {name!r}
OTHER = {other!r}


class Model:
    async def execute(self, inputs):
        running = int((SHARED / "running").read_text() or 0) + 1 if (SHARED / "running").exists() else 1
        (SHARED / "running").write_text(str(running))
        most = int((SHARED / "most").read_text()) if (SHARED / "most").exists() else 0
        (SHARED / "most").write_text(str(max(most, running)))
        (SHARED / f"started-{{NAME}}").write_text("started")
        overlap = (SHARED / "overlap").exists()
        while not (SHARED / f"release-{{NAME}}").exists():
            if overlap and (SHARED / f"started-{{OTHER}}").exists():
                break
            await asyncio.sleep(0.005)
        (SHARED / "running").write_text(str(int((SHARED / "running").read_text()) - 1))
        return {{"OUTPUT0": inputs["INPUT0"]}}
"""


def config(name: str, count: int = 1, batching: bool = False, priority: int = 0) -> str:
    return f"""
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{
  count: 1
  kind: KIND_CPU
  rate_limiter {{ resources [ {{ name: "R1" count: {count} }} ] priority: {priority} }}
}} ]
{"dynamic_batching { }" if batching else ""}
"""


@pytest.fixture()
def repository(tmp_path: Path) -> Path:
    repo = tmp_path / "models"
    repo.mkdir()
    shared = tmp_path / "shared"
    shared.mkdir()
    # one model with the dynamic batcher, one without: both schedulers go through the rate limiter
    write_model(repo, "first", config("first", batching=True), {1: model_code(shared, "first", "second")})
    write_model(repo, "second", config("second"), {1: model_code(shared, "second", "first")})
    return repo


def model_code(shared: Path, name: str, other: str) -> str:
    return MODEL.format(shared=str(shared), name=name, other=other)


def serve(repository: Path, *args: str) -> Iterator[ServerProcess]:
    process = ServerProcess(repository, repository.parent / "server.log", extra_args=args).start()
    try:
        yield process
    finally:
        for name in ("first", "second"):
            (repository.parent / "shared" / f"release-{name}").write_text("release")
        stop_all([process])


@pytest.fixture()
def limited(repository: Path) -> Iterator[ServerProcess]:
    yield from serve(repository, "--rate-limit", "execution_count")


@pytest.fixture()
def unlimited(repository: Path) -> Iterator[ServerProcess]:
    yield from serve(repository, "--rate-limit", "off")


def infer(server: ServerProcess, model: str, value: int) -> httpx.Response:
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 1], "data": [value]}]}
    return httpx.post(f"http://127.0.0.1:{server.port}/v2/models/{model}/infer", json=body, timeout=60)


def assert_answer(response: httpx.Response, value: int) -> None:
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [value]


@pytest.mark.parametrize("holder, waiter", [("first", "second"), ("second", "first")])
def test_models_sharing_one_resource_take_turns(
    limited: ServerProcess, repository: Path, holder: str, waiter: str
) -> None:
    shared = repository.parent / "shared"
    with ThreadPoolExecutor(2) as pool:
        held = pool.submit(infer, limited, holder, 1)
        wait_for_file(shared / f"started-{holder}")
        waiting = pool.submit(infer, limited, waiter, 2)
        # the second request reached its model and waits there for R1, not executing
        wait_for_pending(limited, waiter, 1)
        assert not (shared / f"started-{waiter}").exists()
        (shared / f"release-{holder}").write_text("release")
        wait_for_file(shared / f"started-{waiter}")
        (shared / f"release-{waiter}").write_text("release")
        assert_answer(held.result(), 1)
        assert_answer(waiting.result(), 2)
    assert (shared / "most").read_text() == "1"  # never both executing at once
    wait_for_pending(limited, waiter, 0)


def test_without_the_rate_limiter_the_models_overlap(unlimited: ServerProcess, repository: Path) -> None:
    shared = repository.parent / "shared"
    (shared / "overlap").write_text("each model runs until the other has started")
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(infer, unlimited, "first", 1)
        second = pool.submit(infer, unlimited, "second", 2)
        assert_answer(first.result(), 1)
        assert_answer(second.result(), 2)
    assert (shared / "most").read_text() == "2"


def test_a_resource_count_over_the_flag_fails_the_load(repository: Path) -> None:
    write_model(repository, "greedy", config("greedy", count=2), {1: model_code(repository, "greedy", "x")})
    args = (
        "--rate-limit=execution_count",
        "--rate-limit-resource=R1:1",
        "--model-control-mode=explicit",
        "--load-model=first",
    )
    for process in serve(repository, *args):
        url = f"http://127.0.0.1:{process.port}/v2/repository/models"
        assert_error(
            httpx.post(f"{url}/greedy/load", timeout=60),
            400,
            "failed to load 'greedy' version 1",
            'Resource count for "R1" is limited to 1 which will prevent scheduling of one or more model '
            "instances, the minimum required count is 2",
        )
        # the resources of what is loaded are as they were: the first model still executes
        (repository.parent / "shared" / "release-first").write_text("release")
        assert_answer(infer(process, "first", 3), 3)
        # a resource the flags leave out has count 0
        write_model(repository, "other", _other_config(), {1: model_code(repository, "other", "x")})
        assert_error(
            httpx.post(f"{url}/other/load", timeout=60), 400, 'Resource count for "R2" is limited to 0'
        )


def _other_config() -> str:
    return config("other").replace('name: "R1"', 'name: "R2"')


def test_a_bad_flag_is_refused(tmp_path: Path) -> None:
    process = ServerProcess(tmp_path, tmp_path / "server.log", extra_args=("--rate-limit-resource=R1",))
    with pytest.raises(RuntimeError, match="exited with 2"):
        process.start()
    assert "--rate-limit-resource option format is '<resource_name>:<count>:<device>'" in process.log_text()
