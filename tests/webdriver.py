"""A headless Chromium driven through chromedriver's W3C WebDriver API (plain HTTP and JSON, spoken
here with httpx: no selenium needed). Debian's `chromium` and `chromium-driver` packages provide both
programs; `make test` installs them where it can (docs/internals/development.md)."""

from __future__ import annotations

import base64
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
# As the machine's probe starts it: no sandbox (root in a container), no network of its own.
ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1400,1000",
]


def missing() -> str:
    """Why no browser test can run here ('' when it can)."""
    if CHROMIUM is None or CHROMEDRIVER is None:
        return "needs Debian's chromium and chromium-driver (make test installs them where apt-get can)"
    return ""


class Browser:
    def __init__(self, profile: Path) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.driver = subprocess.Popen(
            [CHROMEDRIVER, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
        for _ in range(100):
            try:
                self.http.get("/status")
                break
            except httpx.TransportError:
                time.sleep(0.1)
        options = {"binary": CHROMIUM, "args": [*ARGS, f"--user-data-dir={profile}"]}
        created = self._call(
            "POST", "/session", {"capabilities": {"alwaysMatch": {"goog:chromeOptions": options}}}
        )
        self.session = f"/session/{created['sessionId']}"

    def _call(self, method: str, path: str, body: dict | None = None) -> Any:
        response = self.http.request(method, path, json=body)
        value = response.json().get("value")
        if response.status_code != 200:
            raise RuntimeError(f"webdriver {method} {path}: {value}")
        return value

    def open(self, url: str) -> None:
        self._call("POST", self.session + "/url", {"url": url})

    def run(self, script: str, *args: Any) -> Any:
        """The value of `script` (a function body: `return ...`) run in the page."""
        return self._call("POST", self.session + "/execute/sync", {"script": script, "args": list(args)})

    def wait_for(self, script: str, timeout: float = 20.0) -> Any:
        """Polls `script` until it returns something truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.run(script)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"the page never satisfied: {script}")
            time.sleep(0.2)

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self._call("GET", self.session + "/screenshot")))

    def close(self) -> None:
        try:
            self._call("DELETE", self.session)
        finally:
            self.http.close()
            self.driver.terminate()
            self.driver.wait(10)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
