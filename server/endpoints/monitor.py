"""grps's monitor over REST: the page at `/` and the JSON it polls, `GET /grps/v1/monitor/metrics`
(server/monitor.py keeps the metrics)."""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING

import orjson

from tensorgate.server.endpoints.grps import ROOT, error_response
from tensorgate.server.router import HttpRequest, HttpResponse, Router, body_response

if TYPE_CHECKING:
    from tensorgate.server.monitor import Monitor

HTML = b"text/html; charset=utf-8"
PAGE = resources.files("tensorgate.server.endpoints").joinpath("monitor_page.html").read_bytes()


class MonitorEndpoints:
    def __init__(self, monitor: Monitor) -> None:
        self.monitor = monitor

    def install(self, router: Router) -> None:
        router.add("GET", "/", self.page, error_response)
        router.add("GET", ROOT + "/monitor/metrics", self.metrics, error_response)

    async def page(self, request: HttpRequest) -> HttpResponse:
        response = body_response(PAGE, HTML)
        # the page loads nothing from elsewhere, and must not: a policy the browser enforces
        response.headers.append(
            (b"content-security-policy", b"default-src 'none'; script-src 'unsafe-inline'; "
             b"style-src 'unsafe-inline'; connect-src 'self'; img-src 'self'")
        )  # fmt: skip
        return response

    async def metrics(self, request: HttpRequest) -> HttpResponse:
        return body_response(orjson.dumps(self.monitor.snapshot()))
