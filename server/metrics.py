"""Prometheus metrics on their own port (`GET /metrics`), with Triton's names, so its dashboards work.

A prometheus_client collector reads each ready model version's `ModelStats` at scrape time: serving a
request costs nothing more. The text is Triton's: counters named without a `_total` suffix
(`nv_inference_request_success{model="m",version="1"} 3`). prometheus_client's own writer would append
`_total` to every counter sample (the OpenMetrics convention), renaming Triton's series, so the few
lines that write the classic text format (0.0.4) are here.

The server is a second hypercorn listener in the same process and event loop, with its own tiny ASGI
app: the inference app and its hot path know nothing of it.
"""

from collections.abc import Awaitable, Callable, Iterator

from hypercorn.asyncio.run import worker_serve
from hypercorn.utils import repr_socket_addr, wrap_app
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import floatToGoString

from batcher.stats import ModelStats
from server.app import Receive, Send, discard_body, lifespan
from server.http_config import hypercorn_config
from server.repository import Repository
from server.router import body_response
from server.statistics import ready_versions

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"
PLAIN = b"text/plain; charset=utf-8"  # the 404 and 405 answers
METRICS_PATH = "/metrics"

# Triton's per model version counters (core src/metrics.cc): name, HELP text, what it counts.
COUNTERS: tuple[tuple[str, str, Callable[[ModelStats], int]], ...] = (
    (
        "nv_inference_request_success",
        "Number of successful inference requests, all batch sizes",
        lambda s: s.success.count,
    ),
    (
        "nv_inference_request_failure",
        "Number of failed inference requests, all batch sizes",
        lambda s: s.fail.count,
    ),
    (
        "nv_inference_count",
        "Number of inferences performed (does not include cached requests)",
        lambda s: s.inference_count,
    ),
    (
        "nv_inference_exec_count",
        "Number of model executions performed (does not include cached requests)",
        lambda s: s.execution_count,
    ),
    (
        "nv_inference_request_duration_us",
        "Cumulative inference request duration in microseconds (includes cached requests)",
        lambda s: s.success.ns // 1000,
    ),
    (
        "nv_inference_queue_duration_us",
        "Cumulative inference queuing duration in microseconds (includes cached requests)",
        lambda s: s.queue.ns // 1000,
    ),
    (
        "nv_inference_compute_input_duration_us",
        "Cumulative compute input duration in microseconds (does not include cached requests)",
        lambda s: s.compute_input.ns // 1000,
    ),
    (
        "nv_inference_compute_infer_duration_us",
        "Cumulative compute inference duration in microseconds (does not include cached requests)",
        lambda s: s.compute_infer.ns // 1000,
    ),
    (
        "nv_inference_compute_output_duration_us",
        "Cumulative inference compute output duration in microseconds (does not include cached requests)",
        lambda s: s.compute_output.ns // 1000,
    ),
)


class ModelMetrics:
    """A prometheus_client collector: Triton's counters for every ready model version, labelled
    `model` and `version`."""

    def __init__(self, repository: Repository) -> None:
        self.repository = repository

    def collect(self) -> Iterator[Metric]:
        versions = ready_versions(self.repository)
        for name, documentation, read in COUNTERS:
            family = Metric(name, documentation, "counter")
            for version in versions:
                family.add_sample(
                    name, {"model": version.name, "version": version.version_str}, read(version.stats)
                )
            yield family


def exposition(registry: CollectorRegistry) -> bytes:
    """The Prometheus text format (0.0.4) of every family, each sample under the name it carries."""
    lines: list[str] = []
    for family in registry.collect():
        kind = "untyped" if family.type == "unknown" else family.type
        lines.append(f"# HELP {family.name} {_escape(family.documentation, quote=False)}")
        lines.append(f"# TYPE {family.name} {kind}")
        for sample in family.samples:
            labels = ",".join(f'{key}="{_escape(value)}"' for key, value in sample.labels.items())
            value = str(sample.value) if isinstance(sample.value, int) else floatToGoString(sample.value)
            lines.append(f"{sample.name}{{{labels}}} {value}" if labels else f"{sample.name} {value}")
    return ("\n".join(lines) + "\n").encode()


def _escape(text: str, quote: bool = True) -> str:
    text = text.replace("\\", r"\\").replace("\n", r"\n")
    return text.replace('"', r"\"") if quote else text


class MetricsApp:
    """ASGI: `GET /metrics` (and HEAD) answers the registry's text; anything else 404 or 405."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    async def __call__(self, scope: dict, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if scope["path"] != METRICS_PATH:
            response = body_response(b"not found: this port serves GET /metrics\n", PLAIN, 404)
        elif scope["method"] not in ("GET", "HEAD"):
            response = body_response(b"method not allowed: use GET\n", PLAIN, 405)
            response.headers.append((b"allow", b"GET, HEAD"))
        else:
            response = body_response(exposition(self.registry), CONTENT_TYPE)
        if not await discard_body(receive):
            return
        await send({"type": "http.response.start", "status": response.status, "headers": response.headers})
        await send({"type": "http.response.body", "body": response.chunks[0]})


class MetricsServer:
    """The metrics listener: its sockets are bound at construction (so the port can be logged before the
    server starts), `serve` runs it until `shutdown_trigger` returns."""

    def __init__(self, repository: Repository, host: str, port: int, log_level: str = "info") -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(ModelMetrics(repository))
        self.config = hypercorn_config(host, port, log_level=log_level)
        self.config.graceful_timeout = 5  # a scrape in flight is quick; do not hold up shutdown
        self.sockets = self.config.create_sockets()

    @property
    def addresses(self) -> list[str]:
        return [repr_socket_addr(s.family, s.getsockname()) for s in self.sockets.insecure_sockets]

    async def serve(self, shutdown_trigger: Callable[[], Awaitable[object]]) -> None:
        app = wrap_app(MetricsApp(self.registry), 0, "asgi")
        await worker_serve(app, self.config, sockets=self.sockets, shutdown_trigger=shutdown_trigger)
