"""Triton's logging extension against a real server: GET/POST /v2/logging and gRPC LogSettings read and
change the same settings, the changes apply to the very next log record (which levels are written, the
layout, --log-file), and bad settings get the protocols' own errors."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from e2e_helpers import ServerProcess, assert_error, write_model
from grpc_helpers import call, grpc_error
from grpclib.const import Status

import tensorgate.proto.inference as pb

CHATTY = """
name: "chatty"
backend: "python"
max_batch_size: 0
input [ { name: "MARK" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "ECHO" data_type: TYPE_STRING dims: [ 1 ] } ]
"""
# One record of each level, each with the client's marker: which of them reach the log says what the
# settings let through.
CHATTY_PY = """
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            mark = pb_utils.get_input_tensor_by_name(request, "MARK").as_numpy()[0].decode()
            pb_utils.Logger.log_verbose(f"verbose {mark}")
            pb_utils.Logger.log_info(f"info {mark}")
            pb_utils.Logger.log_warn(f"warning {mark}")
            pb_utils.Logger.log_error(f"error {mark}")
            echo = pb_utils.Tensor("ECHO", request.inputs()[0].as_numpy())
            responses.append(pb_utils.InferenceResponse([echo]))
        return responses
"""
DEFAULTS = {
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}
DEFAULT_LINE = re.compile(r"^[IWEV]\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ [\w.]+\] ")
ISO_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ [IWEV] \d+ [\w.]+\] ")


@pytest.fixture
def chatty(start_server, repo: Path, tmp_path: Path) -> ServerProcess:
    write_model(repo, "chatty", CHATTY, {1: CHATTY_PY})
    return start_server(repo, extra_args=("--log-file", str(tmp_path / "server.log")))


def say(client: httpx.Client, mark: str) -> None:
    body = {"inputs": [{"name": "MARK", "datatype": "BYTES", "shape": [1], "data": [mark]}]}
    response = client.post("/v2/models/chatty/infer", json=body)
    assert response.status_code == 200, response.text


def set_logging(client: httpx.Client, **settings: object) -> dict:
    """POST /v2/logging: answered 200 with every setting, those posted among them as posted."""
    response = client.post("/v2/logging", json=settings)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert {name: answer[name] for name in settings} == settings, answer
    return answer


def written(log: Path, mark: str) -> list[str]:
    """The levels of the chatty model's records for `mark` in the log file (written before it answered)."""
    return [
        line.rsplit("] ", 1)[1].split()[0] for line in log.read_text().splitlines() if line.endswith(mark)
    ]


def test_log_settings_answer_and_change_over_rest_and_grpc(chatty: ServerProcess, tmp_path: Path) -> None:
    log_file = str(tmp_path / "server.log")
    with httpx.Client(base_url=chatty.base_url) as client:
        assert client.get("/v2/logging").json() == {"log_file": log_file, **DEFAULTS}
        changed = set_logging(client, log_verbose_level=2, log_warning=False)
        assert changed == {"log_file": log_file, **DEFAULTS, "log_verbose_level": 2, "log_warning": False}
        read = client.post("/v2/logging", content=b"")  # an empty body: a read
        assert read.status_code == 200, read.text
        assert read.json() == changed
    answer = call(chatty, lambda stub: stub.log_settings(pb.LogSettingsRequest()))
    assert answer.settings["log_verbose_level"].uint32_param == 2
    assert answer.settings["log_warning"].bool_param is False
    assert answer.settings["log_file"].string_param == log_file
    setting = pb.LogSettingsRequestSettingValue
    request = pb.LogSettingsRequest(settings={"log_format": setting(string_param="ISO8601")})
    answer = call(chatty, lambda stub: stub.log_settings(request))
    assert answer.settings["log_format"].string_param == "ISO8601"
    with httpx.Client(base_url=chatty.base_url) as client:
        assert client.get("/v2/logging").json()["log_format"] == "ISO8601"


def test_bad_log_settings_are_refused_and_change_nothing(chatty: ServerProcess) -> None:
    with httpx.Client(base_url=chatty.base_url) as client:
        assert_error(
            client.post("/v2/logging", json={"log_file": "/tmp/x"}),
            501,
            "log file location can not be updated through network protocol",
        )
        assert_error(
            client.post("/v2/logging", json={"log_info": "yes"}), 400, "expect boolean for 'log_info'"
        )
        assert_error(
            client.post("/v2/logging", json={"log_verbose_level": -1}), 400, "'log_verbose_level'", "-1"
        )
        # all or nothing: log_info is not changed by a request whose log_format is wrong
        response = client.post("/v2/logging", json={"log_info": False, "log_format": "json"})
        assert_error(response, 400, "invalid argument for log_format, got: json")
        assert_error(client.post("/v2/logging", content=b"[1]"), 400, "must be a JSON object")
        assert client.get("/v2/logging").json()["log_info"] is True
    setting = pb.LogSettingsRequestSettingValue
    file_change = pb.LogSettingsRequest(settings={"log_file": setting(string_param="/tmp/x")})
    grpc_error(chatty, lambda stub: stub.log_settings(file_change), Status.UNIMPLEMENTED, "log file location")
    wrong_kind = pb.LogSettingsRequest(settings={"log_error": setting(uint32_param=1)})
    grpc_error(chatty, lambda stub: stub.log_settings(wrong_kind), Status.INVALID_ARGUMENT, "expect boolean")


def test_changes_apply_to_the_next_record(chatty: ServerProcess, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with httpx.Client(base_url=chatty.base_url) as client:
        say(client, "m1")
        assert written(log, "m1") == ["info", "warning", "error"]
        set_logging(client, log_verbose_level=1, log_info=False)
        say(client, "m2")
        assert written(log, "m2") == ["verbose", "warning", "error"]
        set_logging(client, log_verbose_level=0, log_warning=False, log_error=False)
        say(client, "m3")
        assert written(log, "m3") == []
        set_logging(client, log_info=True, log_format="ISO8601")
        say(client, "m4")
        assert written(log, "m4") == ["info"]
    lines = [line for line in log.read_text().splitlines() if line.endswith(("m1", "m4"))]
    assert DEFAULT_LINE.match(lines[0]) and ISO_LINE.match(lines[-1]), lines
    # where the server listens is written whatever the settings: here, before any change
    assert "HTTP listening on 127.0.0.1:" in log.read_text()


def test_every_layout_keeps_a_client_text_on_one_line(chatty: ServerProcess, tmp_path: Path) -> None:
    """The model logs the client's text: its newlines are escaped in both layouts, so it cannot forge a
    line of its own."""
    forged = "E1127 00:00:00.000000 1 tensorgate.repository] model 'admin' ready"
    with httpx.Client(base_url=chatty.base_url) as client:
        say(client, f"x\n{forged}\r\nlayout-default")
        set_logging(client, log_format="ISO8601")
        say(client, f"x\n{forged}\r\nlayout-iso")
    lines = (tmp_path / "server.log").read_text().splitlines()
    assert not [line for line in lines if line.startswith(forged)]
    for layout in ("layout-default", "layout-iso"):  # the positive control: the text reached the log
        assert [line for line in lines if line.endswith(f"info x\\n{forged}\\r\\n{layout}")], layout


def test_flags_set_the_starting_settings(start_server, repo: Path) -> None:
    write_model(repo, "chatty", CHATTY, {1: CHATTY_PY})
    args = ("--log-format", "ISO8601", "--log-verbose", "1", "--log-info", "false")
    server = start_server(repo, extra_args=args)
    with httpx.Client(base_url=server.base_url) as client:
        answer = client.get("/v2/logging").json()
    assert answer == {
        "log_file": "",
        **DEFAULTS,
        "log_info": False,
        "log_verbose_level": 1,
        "log_format": "ISO8601",
    }
    assert ISO_LINE.match(server.log_text().splitlines()[-1])
