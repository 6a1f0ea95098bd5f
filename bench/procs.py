"""Servers under test as subprocesses: start, find the port in the log, stop, and read their memory."""

import collections
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

_LISTENING = re.compile(r"(HTTP|gRPC|Metrics) listening on (\S+):(\d+)")


class ServerProcess:
    """A server started with `argv`; `port` is parsed from its `HTTP listening on HOST:PORT` log line,
    `grpc_port` and `metrics_port` from the gRPC and Metrics ones (`listens`: the line to wait for, "HTTP"
    or "gRPC"; our server logs HTTP's last).

    Its stderr keeps being drained by a thread (so the pipe never fills); the last lines are kept for
    error messages. Use as a context manager: leaving it sends SIGTERM, then SIGKILL after `grace` s.
    """

    def __init__(
        self,
        argv: list[str],
        *,
        cwd: str | None = None,
        timeout: float = 60.0,
        grace: float = 15.0,
        listens: str = "HTTP",
        env: dict[str, str] | None = None,
    ):
        self.grace = grace
        self.tail: collections.deque[str] = collections.deque(maxlen=40)
        self.proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._found = threading.Event()
        self.host = ""
        self.port = 0
        self.grpc_port = 0
        self.metrics_port = 0
        self.listens = listens
        self._thread = threading.Thread(target=self._drain, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._found.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                why = (
                    f"exited with {self.proc.returncode}" if self.proc.returncode is not None else "timed out"
                )
                raise RuntimeError(f"{' '.join(argv)}: {why} before logging its port:\n" + "".join(self.tail))

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.tail.append(line)
            if not self._found.is_set():
                match = _LISTENING.search(line)
                if match:
                    if match.group(1) == "gRPC":
                        self.grpc_port = int(match.group(3))
                    elif match.group(1) == "Metrics":
                        self.metrics_port = int(match.group(3))
                    else:
                        self.port = int(match.group(3))
                    if match.group(1) == self.listens:
                        self.host = match.group(2)
                        self._found.set()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> int | None:
        """SIGTERM, wait up to `grace` s, then SIGKILL. Returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.grace)
            except subprocess.TimeoutExpired:
                self.tail.append(f"[bench] no exit {self.grace:.0f} s after SIGTERM: killed\n")
                self.proc.kill()
                self.proc.wait()
        self._thread.join(2)  # let the drain thread take the last lines before anyone reads `tail`
        return self.proc.returncode

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def checkout_env(checkout: str) -> dict[str, str]:
    """The environment that runs `checkout`'s own server (a --baseline): `tensorgate` is found in a link
    tree inside it (build/bench/tensorgate/server -> its server/, ...), ahead of this tree's editable
    install, whose finder would otherwise map `tensorgate.*` onto this tree's folders whatever the cwd."""
    root = Path(checkout).resolve()
    package = root / "build" / "bench" / "tensorgate"
    package.mkdir(parents=True, exist_ok=True)
    for name in ("server", "codec", "batcher", "proto", "perf"):
        link = package / name
        if not link.is_symlink() and (root / name).is_dir():
            link.symlink_to(Path("../../..") / name)
    return {**os.environ, "PYTHONPATH": str(package.parent)}


def serve_argv(model_repository: str = "examples/model_repository") -> list[str]:
    """`python -m tensorgate.server serve` on 127.0.0.1, every port picked free, logging warnings only."""
    return [sys.executable, "-m", "tensorgate.server", "serve", "--model-repository", model_repository,
            "--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
            "--log-level", "warning"]  # fmt: skip


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants alive now (a server with --workers: the engine and its workers)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError):
                continue  # gone meanwhile
            children.setdefault(parent, []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo += children.get(current, [])
    return tree


def cpu_clock(pid: int, tree: bool = True) -> float:
    """CPU seconds (user + system) a process and its descendants (or it alone) have used so far."""
    total = 0
    for each in process_tree(pid) if tree else [pid]:
        try:
            with open(f"/proc/{each}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process and its descendants, summed, in KiB (/proc/<pid>/status)."""
    values = {"VmRSS": 0, "VmHWM": 0}
    for each in process_tree(pid):
        try:
            with open(f"/proc/{each}/status") as f:
                for line in f:
                    if line.startswith(("VmRSS:", "VmHWM:")):
                        name, value = line.split(":", 1)
                        values[name] += int(value.split()[0])
        except OSError:
            continue
    return values


def reset_peak_rss(pid: int) -> bool:
    """Reset VmHWM to the current RSS (Linux: write 5 to clear_refs), of a process and its descendants.
    False where that is not allowed."""
    try:
        for each in process_tree(pid):
            with open(f"/proc/{each}/clear_refs", "w") as f:
                f.write("5")
    except OSError:
        return False
    return True


def exit_note(status: int | None) -> str:
    if status is None or status == 0 or status == -signal.SIGTERM:
        return ""
    return f"server exited with status {status} after SIGTERM"
