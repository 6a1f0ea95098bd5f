"""End to end: the metrics Triton's dashboards and alerts read (issue 43, part 3). The failure `reason`
label, --metrics-config's histograms and summaries with model_metrics buckets, --allow-cpu-metrics,
--allow-gpu-metrics (absent without a GPU), the pinned memory gauges, and pb_utils.MetricFamily from a
python model in thread and process mode. A real server; /metrics read with httpx."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import httpx
import pytest
from e2e_helpers import ServerProcess, assert_error, wait_for_file, write_model

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(server: ServerProcess) -> tuple[dict[tuple[str, frozenset], float], dict[str, str]]:
    """The samples of /metrics by (name, labels), and each family's TYPE."""
    response = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=15)
    assert response.status_code == 200, response.text
    samples, types = {}, {}
    for line in response.text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            types[name] = kind
            continue
        if line.startswith("#") or not line:
            continue
        found = SAMPLE.match(line)
        assert found, line
        labels = frozenset(LABEL.findall(found.group(2) or ""))
        samples[(found.group(1), labels)] = float(found.group(3))
    return samples, types


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


def names(samples: dict) -> set[str]:
    return {name for name, _ in samples}


def infer(server: ServerProcess, model: str, values: list[int]) -> httpx.Response:
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [len(values)], "data": values}]}
    return httpx.post(f"{server.base_url}/v2/models/{model}/infer", json=body, timeout=30)


CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT32 dims: [ -1 ] }} ]
{extra}
"""
# Fails on a negative input (the model's error: BACKEND). With a file WAIT beside its config, the next
# request takes it, says STARTED and holds the model until a file GATE appears.
PICKY = """
import asyncio
import os

FOLDER = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Model:
    async def execute(self, inputs):
        x = inputs["INPUT0"]
        if (x < 0).any():
            raise ValueError("negative input")
        if os.path.exists(os.path.join(FOLDER, "WAIT")):
            os.remove(os.path.join(FOLDER, "WAIT"))
            open(os.path.join(FOLDER, "STARTED"), "w").close()
            while not os.path.exists(os.path.join(FOLDER, "GATE")):
                await asyncio.sleep(0.01)
        return {"OUTPUT0": x}
"""


def test_failures_carry_triton_reasons(repo: Path, start_server) -> None:
    write_model(repo, "picky", CONFIG.format(name="picky", extra=""), {1: PICKY})
    server = start_server(repo)
    assert infer(server, "picky", [1, 2]).status_code == 200
    assert_error(infer(server, "picky", [-1]), 500, "negative input")
    samples, types = scrape(server)
    assert types["nv_inference_request_failure"] == "counter"
    reasons = {r: value(samples, "nv_inference_request_failure", model="picky", version="1", reason=r)
               for r in ("REJECTED", "CANCELED", "BACKEND", "OTHER")}  # fmt: skip
    assert reasons == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 1, "OTHER": 0}
    assert value(samples, "nv_inference_request_success", model="picky", version="1") == 1


def test_a_request_timed_out_in_the_queue_is_rejected(repo: Path, start_server) -> None:
    policy = "dynamic_batching { default_queue_policy { default_timeout_microseconds: 100000 } }"
    folder = write_model(repo, "queued", CONFIG.format(name="queued", extra=policy), {1: PICKY})
    server = start_server(repo)
    (folder / "WAIT").touch()
    with httpx.Client(timeout=30) as client:
        first: list[httpx.Response] = []
        body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [1]}]}
        url = f"{server.base_url}/v2/models/queued/infer"
        busy = threading.Thread(target=lambda: first.append(client.post(url, json=body)))
        busy.start()
        wait_for_file(folder / "STARTED")
        assert_error(infer(server, "queued", [2]), 503, "Request timeout expired")
        (folder / "GATE").touch()
        busy.join()
    assert first[0].status_code == 200
    samples, _ = scrape(server)
    assert value(samples, "nv_inference_request_failure", model="queued", version="1", reason="REJECTED") == 1


def test_a_request_whose_client_leaves_in_the_queue_is_canceled(repo: Path, start_server) -> None:
    folder = write_model(
        repo, "queued", CONFIG.format(name="queued", extra="dynamic_batching { }"), {1: PICKY}
    )
    server = start_server(repo)
    (folder / "WAIT").touch()
    url = f"{server.base_url}/v2/models/queued/infer"
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1], "data": [1]}]}
    with httpx.Client(timeout=30) as client:
        first: list[httpx.Response] = []
        busy = threading.Thread(target=lambda: first.append(client.post(url, json=body)))
        busy.start()
        wait_for_file(folder / "STARTED")
        with pytest.raises(httpx.ReadTimeout):  # queued behind the first; the client gives up
            httpx.post(url, json=body, timeout=0.5)

        def canceled() -> float:
            samples, _ = scrape(server)
            return value(
                samples, "nv_inference_request_failure", model="queued", version="1", reason="CANCELED"
            )

        deadline = time.monotonic() + 10
        while canceled() != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert canceled() == 1
        (folder / "GATE").touch()
        busy.join()
    assert first[0].status_code == 200


BUCKETED = """model_metrics {
  metric_control [ {
    metric_identifier { family: "nv_inference_first_response_histogram_ms" }
    histogram_options { buckets: [ 0.5, 1000, 5 ] }
  } ]
}"""


def test_metrics_config_histograms_and_summaries(repo: Path, start_server) -> None:
    write_model(repo, "plain", CONFIG.format(name="plain", extra=""), {1: PICKY})
    write_model(repo, "bucketed", CONFIG.format(name="bucketed", extra=BUCKETED), {1: PICKY})
    config = ("histogram_latencies=true", "summary_latencies=true", "counter_latencies=false",
              "summary_quantiles=0.5:0.05,0.99:0.001")  # fmt: skip
    server = start_server(repo, extra_args=tuple(f"--metrics-config={c}" for c in config))
    for model in ("plain", "bucketed"):
        for _ in range(3):
            assert infer(server, model, [1]).status_code == 200
    samples, types = scrape(server)
    histogram = "nv_inference_first_response_histogram_ms"
    assert types[histogram] == "histogram"
    for model, bounds in (("plain", ["100", "500", "2000", "5000"]), ("bucketed", ["0.5", "5", "1000"])):
        labels = {"model": model, "version": "1"}
        assert value(samples, histogram + "_count", **labels) == 3
        assert value(samples, histogram + "_sum", **labels) > 0
        les = [le for name, ls in samples if name == histogram + "_bucket" and ("model", model) in ls
               for key, le in ls if key == "le"]  # fmt: skip
        assert les == [*bounds, "+Inf"]
        assert value(samples, histogram + "_bucket", le="+Inf", **labels) == 3
        assert value(samples, histogram + "_bucket", le=bounds[-1], **labels) == 3  # well under 1 s
        for summary in ("nv_inference_request_summary_us", "nv_inference_queue_summary_us",
                        "nv_inference_compute_input_summary_us", "nv_inference_compute_infer_summary_us",
                        "nv_inference_compute_output_summary_us"):  # fmt: skip
            assert types[summary] == "summary"
            assert value(samples, summary + "_count", **labels) == 3
            assert value(samples, summary, quantile="0.5", **labels) >= 0
            assert value(samples, summary, quantile="0.99", **labels) >= 0
        request = value(samples, "nv_inference_request_summary_us", quantile="0.99", **labels)
        infer_time = value(samples, "nv_inference_compute_infer_summary_us", quantile="0.99", **labels)
        assert request >= infer_time > 0
    # counter_latencies=false: the cumulative durations go, the counts stay
    assert "nv_inference_request_duration_us" not in names(samples)
    assert "nv_inference_compute_infer_duration_us" not in names(samples)
    assert value(samples, "nv_inference_request_success", model="plain", version="1") == 3


def test_latencies_are_counters_only_by_default(repo: Path, start_server) -> None:
    write_model(repo, "plain", CONFIG.format(name="plain", extra=""), {1: PICKY})
    server = start_server(repo, extra_args=("--allow-cpu-metrics", "false", "--allow-gpu-metrics=false"))
    assert infer(server, "plain", [1]).status_code == 200
    samples, _ = scrape(server)
    found = names(samples)
    assert "nv_inference_request_duration_us" in found
    assert not {n for n in found if n.startswith("nv_inference_first_response") or "summary" in n}
    assert not {n for n in found if n.startswith(("nv_cpu_", "nv_gpu_"))}
    assert value(samples, "nv_pinned_memory_pool_total_bytes") == 0  # no pinned pool
    assert value(samples, "nv_pinned_memory_pool_used_bytes") == 0


def test_cpu_metrics_by_default(repo: Path, start_server) -> None:
    server = start_server(repo, extra_args=("--metrics-interval-ms", "100"))
    samples, types = scrape(server)
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    total = int(meminfo["MemTotal"].split()[0]) * 1024
    assert types["nv_cpu_memory_total_bytes"] == "gauge"
    assert value(samples, "nv_cpu_memory_total_bytes") == total
    assert 0 < value(samples, "nv_cpu_memory_used_bytes") < total
    assert 0 <= value(samples, "nv_cpu_utilization") <= 1


def _nvml_gpus() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount()
    except Exception:
        return 0


def test_gpu_metrics_only_where_nvml_sees_a_gpu(repo: Path, start_server) -> None:
    server = start_server(repo)
    samples, _ = scrape(server)
    gpu = {n for n in names(samples) if n.startswith("nv_gpu_") or n == "nv_energy_consumption"}
    if not _nvml_gpus():
        assert gpu == set()
        assert "--allow-gpu-metrics: no GPU metrics" in server.log_text()
        return
    assert {"nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes"} <= gpu
    uuids = {dict(ls)["gpu_uuid"] for name, ls in samples if name == "nv_gpu_memory_total_bytes"}
    assert len(uuids) == _nvml_gpus() and all(u.startswith("GPU-") for u in uuids)


# ------------------------------------------------------------------------------------ custom metrics

METERED = """
name: "metered"
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ 1 ] } ]
parameters { key: "EXECUTION_MODE" value: { string_value: "%s" } }
"""
METERED_PY = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

COUNTER, GAUGE = pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.GAUGE


def error_of(call):
    try:
        call()
    except pb_utils.TritonModelException as e:
        return e.message()
    return None


class TritonPythonModel:
    def initialize(self, args):
        family = pb_utils.MetricFamily(
            name="custom_requests", description="Requests seen", kind=pb_utils.MetricFamily.COUNTER
        )
        self.requests = family.Metric(labels={"model": "metered", "mode": args["model_name"]})
        last = pb_utils.MetricFamily("custom_last_sum", "Sum of the last input", pb_utils.MetricFamily.GAUGE)
        self.last = last.Metric(labels={"model": "metered"})
        sizes = pb_utils.MetricFamily("custom_sizes", "Input sizes", pb_utils.MetricFamily.HISTOGRAM)
        self.sizes = sizes.Metric(labels={"model": "metered"}, buckets=[1, 4, 16])
        self.errors = [
            error_of(lambda: self.requests.set(1)),
            error_of(lambda: self.requests.increment(-1)),
            error_of(lambda: self.last.observe(1)),
            error_of(lambda: self.sizes.value()),
            error_of(lambda: sizes.Metric(labels={"model": "x"})),
            error_of(lambda: pb_utils.MetricFamily("custom_bad", "bad kind", 7)),
            error_of(lambda: pb_utils.MetricFamily("nv_inference_count", "taken", GAUGE)),
            error_of(lambda: pb_utils.MetricFamily("custom_requests", "Other text", COUNTER)),
        ]

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            self.requests.increment(1)
            self.last.set(float(x.sum()))
            self.sizes.observe(x.size)
            info = json.dumps({"requests": self.requests.value(), "last": self.last.value(),
                               "errors": self.errors})
            out = pb_utils.Tensor("OUTPUT0", np.array([info.encode()], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_custom_metrics_from_a_python_model(repo: Path, start_server, mode: str) -> None:
    write_model(repo, "metered", METERED % mode, {1: METERED_PY})
    server = start_server(repo)
    for values in ([1], [1, 2, 3], list(range(10))):
        response = infer(server, "metered", values)
        assert response.status_code == 200, response.text
    info = json.loads(response.json()["outputs"][0]["data"][0])
    assert info["requests"] == 3 and info["last"] == 45
    assert info["errors"] == [
        "TRITONSERVER_METRIC_KIND_COUNTER does not support Set",
        "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative values.",
        "TRITONSERVER_METRIC_KIND_GAUGE does not support Observe",
        "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value",
        "Bucket boundaries not found in Metric args.",
        "Unsupported kind passed to MetricFamily constructor.",
        "Metric family name 'nv_inference_count' is reserved: names starting nv_, tensorgate_, python_gc_ "
        "are the server's.",
        "Metric family 'custom_requests' already exists with a different kind or description.",
    ]
    samples, types = scrape(server)
    assert types["custom_requests"] == "counter"
    assert value(samples, "custom_requests", model="metered", mode="metered") == 3
    assert types["custom_last_sum"] == "gauge"
    assert value(samples, "custom_last_sum", model="metered") == 45
    assert types["custom_sizes"] == "histogram"
    assert value(samples, "custom_sizes_count", model="metered") == 3
    assert value(samples, "custom_sizes_sum", model="metered") == 14
    buckets = {
        le: value(samples, "custom_sizes_bucket", model="metered", le=le) for le in ("1", "4", "16", "+Inf")
    }
    assert buckets == {"1": 1, "4": 2, "16": 3, "+Inf": 3}
