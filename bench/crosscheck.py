"""Optional second opinion: the same requests from wrk (HTTP/1.1) and h2load (HTTP/2), when installed."""

import os
import re
import shutil
import subprocess
import tempfile

_WRK_RPS = re.compile(r"Requests/sec:\s*([\d.]+)")
_H2LOAD_RPS = re.compile(r"finished in [\d.]+\w*, ([\d.]+) req/s")
_H2LOAD_DONE = re.compile(
    r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded, (\d+) failed, (\d+) errored"
)


def available() -> dict[str, bool]:
    return {"wrk": shutil.which("wrk") is not None, "h2load": shutil.which("h2load") is not None}


def _lua_string(data: bytes) -> str:
    return '"' + "".join(f"\\{b:03d}" for b in data) + '"'


def run_wrk(url: str, body: bytes, content_type: str, concurrency: int, duration: float) -> tuple[float, str]:
    """wrk's req/s for POSTing `body` to `url` over `concurrency` connections; ('nan', why) on failure."""
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "post.lua")
        with open(script, "w") as f:
            f.write(f'wrk.method = "POST"\nwrk.body = {_lua_string(body)}\n')
            f.write(f'wrk.headers["Content-Type"] = "{content_type}"\n')
        argv = ["wrk", "-t1", f"-c{concurrency}", f"-d{max(1, round(duration))}s", "-s", script, url]
        out = _run(argv, duration)
    match = _WRK_RPS.search(out)
    if not match:
        return float("nan"), out[-300:]
    note = "non-2xx or socket errors reported" if "Non-2xx" in out or "Socket errors" in out else ""
    return float(match.group(1)), note


def run_h2load(
    url: str, body: bytes, content_type: str, concurrency: int, requests: int, connections: int
) -> tuple[float, str]:
    """h2load's req/s (prior-knowledge h2c) with `concurrency` streams over `connections` connections.

    A request count (-n) rather than a duration (-D): at the end of -D, h2load drops its connections
    with streams in flight, which hypercorn 0.18 handles badly (a stuck task per connection).
    """
    connections = max(1, min(connections, concurrency))
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "body")
        with open(data, "wb") as f:
            f.write(body)
        argv = [
            "h2load",
            f"-c{connections}",
            f"-m{max(1, concurrency // connections)}",
            f"-n{requests}",
            "-d",
            data,
            "-H",
            f"content-type: {content_type}",
            url,
        ]
        out = _run(argv, 60)
    match = _H2LOAD_RPS.search(out)
    if not match:
        return float("nan"), out[-300:]
    done = _H2LOAD_DONE.search(out)
    failed, errored = (int(done.group(2)), int(done.group(3))) if done else (0, 0)
    note = f"{failed} failed, {errored} errored" if failed or errored else ""
    return float(match.group(1)), note


def _run(argv: list[str], duration: float) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 30)
    except subprocess.TimeoutExpired:
        return f"{argv[0]} timed out"
    return proc.stdout + proc.stderr
