"""The series that Triton's own Grafana dashboards query exist here under Triton's names (issue 43).

The facts relied on, in our words: the dashboards Triton's repository ships for its deployments
(deploy/aws, deploy/gcp, deploy/oci, deploy/fleetcommand, deploy/k8s-onprem, each a dashboard.json) plot
the request counters nv_inference_count, nv_inference_request_success and nv_inference_request_failure
(summed by pod), the queue time nv_inference_queue_duration_us (also divided by the successes: the
average queue time the autoscaling example reads), the compute time nv_inference_compute_infer_duration_us
summed by model, the CPU's nv_cpu_utilization and nv_cpu_memory_used_bytes, and the GPU's
nv_gpu_utilization, nv_gpu_memory_used_bytes and nv_gpu_power_usage. Two of their panels query series that
Triton 2.x itself no longer exports (nv_inference_compute_duration_us, nv_inference_load_ratio_bucket): we
do not export them either.
"""

from __future__ import annotations

import httpx
from e2e_helpers import A, ServerProcess, simple_inputs
from gpu_helpers import gpu_count
from prometheus_client.parser import text_string_to_metric_families

PER_MODEL = (
    "nv_inference_count",
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_infer_duration_us",
)
CPU = ("nv_cpu_utilization", "nv_cpu_memory_used_bytes")
GPU = ("nv_gpu_utilization", "nv_gpu_memory_used_bytes", "nv_gpu_power_usage")


def test_the_series_tritons_dashboards_plot(v2_server: ServerProcess) -> None:
    body = {"inputs": simple_inputs(A, A, [1, 16])}
    answer = httpx.post(f"{v2_server.base_url}/v2/models/simple/infer", json=body, timeout=15)
    assert answer.status_code == 200
    text = httpx.get(f"http://127.0.0.1:{v2_server.metrics_port}/metrics", timeout=15).text
    families = {family.name: family for family in text_string_to_metric_families(text)}
    for name in PER_MODEL:  # per model and version, as the panels sum them by model
        samples = [s for s in families[name].samples if s.labels.get("model") == "simple"]
        assert samples and all(s.labels["version"] == "1" for s in samples), name
    assert sum(s.value for s in families["nv_inference_count"].samples if s.labels["model"] == "simple") >= 1
    for name in CPU:  # --allow-cpu-metrics is on by default, as in Triton
        (sample,) = families[name].samples
        assert sample.value >= 0, name
    assert 0 <= families["nv_cpu_utilization"].samples[0].value <= 1  # a ratio: the panels multiply by 100
    for name in GPU:  # read through NVML where a GPU is; absent without one, as Triton leaves them
        present = name in families and bool(families[name].samples)
        assert present == (gpu_count() > 0), name
