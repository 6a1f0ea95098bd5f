"""grps's monitor: the JSON endpoint (`GET /grps/v1/monitor/metrics`), the page at `/` in a real
headless Chromium, the monitor log (`--monitor-log`), and the metrics models record through app_monitor
(JSON, log, Prometheus). A real server; httpx and a browser driven over WebDriver."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import webdriver
from e2e_helpers import ServerProcess, int32_config, missing, stop_all, write_model

WEIRD = "<img src=x onerror=document.title='pwned'>"  # a legal folder name, shown as text
IDENT = """
class Model:
    def execute(self, inputs):
        if (inputs["INPUT0"] < 0).any():
            raise ValueError("negative")
        return {"OUTPUT0": inputs["INPUT0"]}
"""
RECORDER = """
from grps_framework.monitor.monitor import app_monitor

class Model:
    def execute(self, inputs):
        values = inputs["INPUT0"].astype(float)
        app_monitor.inc("recorder_calls", 1)
        app_monitor.avg("recorder_avg", float(values.mean()))
        app_monitor.max("recorder_max", float(values.max()))
        app_monitor.min("recorder_min", float(values.min()))
        app_monitor.cdf("recorder_cdf", float(values.mean()))
        return {"OUTPUT0": inputs["INPUT0"]}
"""
LOG_LINE = re.compile(r"^(\S.*) : (-?\d+\.\d\d)$")


@pytest.fixture(scope="module")
def monitor_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("monitor") / "grps_monitor.log"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, monitor_log: Path) -> Iterator[ServerProcess]:
    repository = tmp_path_factory.mktemp("monitor_models")
    batching = "dynamic_batching { max_queue_delay_microseconds: 2000 }"
    write_model(repository, "ident", int32_config("ident", max_batch_size=8, policy=batching), {1: IDENT})
    write_model(repository, "recorder", int32_config("recorder"), {1: RECORDER})
    write_model(repository, WEIRD, int32_config(WEIRD), {1: IDENT})
    log = tmp_path_factory.mktemp("monitor_server") / "server.log"
    server = ServerProcess(repository, log, extra_args=("--monitor-log", str(monitor_log))).start()
    yield server
    stop_all([server])


def infer(client: httpx.Client, model: str, values: list[int], rows: int | None = None) -> httpx.Response:
    shape = [rows, len(values) // rows] if rows else [len(values)]
    body = {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": shape, "data": values}]}
    return client.post(f"/v2/models/{model}/infer", json=body)


def snapshot(server: ServerProcess) -> dict:
    return httpx.get(f"{server.base_url}/grps/v1/monitor/metrics", timeout=10).json()


def settled(server: ServerProcess) -> dict:
    """A snapshot taken once a sample has been made after every request so far was answered."""
    asked = time.time()
    deadline = asked + 10
    while time.time() < deadline:
        doc = snapshot(server)
        points = doc["metrics"].get("*qps", {}).get("data")
        if points and points[-1][0] > asked:
            return doc
        time.sleep(0.2)
    raise TimeoutError("the monitor took no sample")


def sample_times(server: ServerProcess, count: int) -> list[float]:
    """The times of the monitor's samples, once it has taken `count` of them."""
    deadline = time.monotonic() + 10 + count
    while True:
        points = [t for t, _ in snapshot(server)["metrics"].get("*qps", {}).get("data", [])]
        if len(points) >= count:
            return points
        assert time.monotonic() < deadline, f"{len(points)} samples, not {count}"
        time.sleep(0.2)


def counted(server: ServerProcess, model: str) -> int:
    stats = httpx.get(f"{server.base_url}/v2/models/{model}/stats").json()["model_stats"][0]
    return stats["inference_stats"]["success"]["count"] + stats["inference_stats"]["fail"]["count"]


def monitor_log_with(path: Path, name: str, timeout: float = 10) -> dict[str, str]:
    """The monitor log, {metric: value}, once a whole copy of it names `name` (the server rewrites it in
    place each second: a read may catch it half written, and is then read again)."""
    deadline = time.monotonic() + timeout
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        matches = [LOG_LINE.match(line) for line in lines]
        if lines and all(matches) and any(m.group(1) == name for m in matches):
            return dict(m.groups() for m in matches)
        assert time.monotonic() < deadline, f"no whole monitor log naming {name}: {lines}"
        time.sleep(0.05)


def model_entry(doc: dict, name: str) -> dict:
    return next(m for m in doc["models"] if m["name"] == name)


def test_the_json_endpoint_counts_what_the_statistics_count(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        for i in range(20):
            assert infer(client, "ident", [i, i + 1], rows=1).status_code == 200
        for _ in range(5):
            assert infer(client, "ident", [-1, 0], rows=1).status_code == 500
    doc = settled(server)
    ident = model_entry(doc, "ident")
    assert ident["state"] == "READY" and ident["version"] == "1"
    assert ident["requests"] == counted(server, "ident") >= 25
    assert sum(int(n) for n in ident["batch_sizes"].values()) >= 1
    trends = doc["metrics"]
    assert max(v for _, v in trends["*qps"]["data"]) > 0
    assert max(v for _, v in trends["*fail_rate(%)"]["data"]) > 0
    assert max(v for _, v in trends["*latency_max(ms)"]["data"]) > 0
    assert [p for p, _ in trends["*latency_cdf(ms)"]["data"]] == [80, 90, 99, 99.9, 99.99]
    assert trends["*mem_rss(MIB)"]["data"][-1][1] > 10 and 0 < trends["*mem_usage(%)"]["data"][-1][1] < 100
    # one a second: in order, never faster than the period, and (a generous bound) none skipped for long
    points = sample_times(server, 3)
    assert all(0.5 < b - a < 10 for a, b in zip(points, points[1:], strict=False)), points


def test_models_record_their_own_metrics(server: ServerProcess, monitor_log: Path) -> None:
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        assert infer(client, "recorder", [2, 4, 9]).status_code == 200
    doc = settled(server)
    assert doc["custom"] == {
        "recorder_calls": "inc",
        "recorder_avg": "avg",
        "recorder_max": "max",
        "recorder_min": "min",
        "recorder_cdf": "cdf",
    }
    metrics = doc["metrics"]
    assert 1.0 in [v for _, v in metrics["recorder_calls"]["data"]]
    assert metrics["recorder_avg"]["data"][-1][1] == 5.0
    assert (metrics["recorder_max"]["data"][-1][1], metrics["recorder_min"]["data"][-1][1]) == (9.0, 2.0)
    assert metrics["recorder_cdf"] == {"label": "cdf", "data": [[p, 5.0] for p in (80, 90, 99, 99.9, 99.99)]}
    # the log: every metric, grps's form, rewritten each second
    parsed = monitor_log_with(monitor_log, "recorder_avg")
    for name in ("*qps", "*fail_rate(%)", "*latency_avg(ms)", "*latency_max(ms)", "*cpu_usage(%)"):
        assert name in parsed
    for suffix in ("80", "90", "99", "999", "9999"):
        assert f"*latency_cdf(ms)_{suffix}" in parsed
    assert parsed["recorder_avg"] == "5.00" and parsed["recorder_cdf_99"] == "5.00"
    # Prometheus, on the metrics port
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics").text
    assert 'tensorgate_app_metric{name="recorder_avg",aggregation="avg"} 5.0' in text
    assert 'tensorgate_app_metric{name="recorder_cdf",aggregation="cdf",quantile="0.99"} 5.0' in text


def test_a_model_that_records_wrongly_fails_its_request_not_the_server(start_server, repo: Path) -> None:
    bad = RECORDER.replace('app_monitor.inc("recorder_calls", 1)', 'app_monitor.inc("recorder_calls", "x")')
    write_model(repo, "bad", int32_config("bad"), {1: bad})
    server = start_server(repo)
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        response = infer(client, "bad", [1])
        assert response.status_code == 500
        assert "a value is a finite int or float, got 'x'" in response.json()["error"]
        assert client.get("/grps/v1/monitor/metrics").status_code == 200


def test_the_page_is_self_contained(server: ServerProcess) -> None:
    page = httpx.get(server.base_url + "/")
    assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page.text)  # nothing from elsewhere
    assert WEIRD not in page.text  # names only ever arrive as data


def test_the_page_in_a_browser_under_load(server: ServerProcess, tmp_path: Path) -> None:
    if webdriver.missing():
        missing(webdriver.missing())
    stop = threading.Event()

    def load() -> None:
        with httpx.Client(base_url=server.base_url, timeout=10) as client:
            while not stop.is_set():
                infer(client, "ident", [1, 2], rows=1)
                infer(client, WEIRD, [3])

    worker = threading.Thread(target=load)
    worker.start()
    try:
        with webdriver.Browser(tmp_path / "profile") as browser:
            browser.open(server.base_url + "/")
            # the charts have data: the qps card shows a rate above 0, the ident row too
            browser.wait_for(
                "const c = document.querySelector('[data-metric=\"*qps\"] .value');"
                "return c && parseFloat(c.textContent) > 0;"
            )
            browser.wait_for(
                "const r = [...document.querySelectorAll('#models tbody tr')]"
                ".find(r => r.dataset.model === 'ident');"
                "return r && parseFloat(r.children[4].textContent) > 0;"
            )
            card = "document.querySelector('[data-metric=\"*latency_cdf(ms)\"]')"
            cdf = browser.run(f"return JSON.parse({card}.dataset.points);")
            assert [p for p, _ in cdf] == [80, 90, 99, 99.9, 99.99]
            stop.set()
            worker.join()
            # the load is over, every request answered: the page must come to show the statistics' totals
            want = {model: counted(server, model) for model in ("ident", WEIRD)}
            browser.wait_for(
                f"const want = {json.dumps(want)};"
                "const rows = [...document.querySelectorAll('#models tbody tr')];"
                "return Object.entries(want).every(([m, n]) => rows.some("
                "r => r.dataset.model === m && parseInt(r.children[3].textContent) === n));"
            )
            shown = browser.run(
                "const rows = [...document.querySelectorAll('#models tbody tr')];"
                "return rows.map(r => [r.dataset.model, r.children[0].textContent, "
                "r.children[3].textContent]);"
            )
            totals = {model: (text, int(total)) for model, text, total in shown if total}
            assert totals["ident"] == ("ident", want["ident"])
            assert totals[WEIRD] == (WEIRD, want[WEIRD])  # shown as text, counted
            assert browser.run("return document.title;") == "tensorgate monitor"  # the name ran nothing
            assert browser.run("return document.querySelectorAll('#models img').length;") == 0
            browser.screenshot(tmp_path / "monitor.png")
        assert (tmp_path / "monitor.png").stat().st_size > 10_000
    finally:
        stop.set()
        worker.join()
