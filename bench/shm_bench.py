"""python -m bench.shm_bench: a 64 MiB FP32 round trip through identity_fp32 in system shared memory beside
the binary HTTP/1.1 round trip, in the same run, on one server (issue 15).

One server: `python -m tensorgate.server serve` on the example repository with `--allow-client-shm true`.

- A, binary-h1: the tensor in the request body and back in the answer (Triton's binary tensor data), as
  bench.transport's binary-h1: one round trip by curl checked byte for byte (once, before the rounds),
  then `--trips` by `h2load --h1 -c1 -m1`, one at a time.
- B, system-shm: the client creates two POSIX regions with multiprocessing.shared_memory (the input
  holding the payload, the output as large), registers them once, then each trip is a small JSON infer
  naming them (http.client, one keep-alive connection); a trip is done when the answer arrives. The
  first trip is checked: the answer names the output region and the output region equals the input.

A and B alternate over `--rounds` rounds (A B, B A, ...). Per scenario: GB/s = tensor bytes both ways
(2 x payload a trip) / wall time of the timed trips; server CPU per trip (the process's CPU clock); the
server's peak RSS growth (VmHWM after the trips, reset first, minus VmRSS before) as a share of the
payload. The ratio B / A per round; targets: B / A >= 5x (the median of the rounds), B's RSS growth
<= 0.1x the payload (its worst round). The regions are unregistered and unlinked at the end, even on
failure. The report goes to `<--out>/<date>-shm.md` and `.json`.

    python -m bench.shm_bench [--rounds 3] [--trips 10] [--mib 64] [--out bench/results]
"""

import argparse
import contextlib
import http.client
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from datetime import date
from multiprocessing import shared_memory

import numpy as np
import orjson

from bench.procs import ServerProcess, cpu_clock, memory_kib, reset_peak_rss, serve_argv
from bench.transport import _H2LOAD, _H2LOAD_TIME, BINARY_PATH, _run, binary_body, curl_trip, save

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RATIO_TARGET, RSS_TARGET = 5.0, 0.1  # B / A GB/s at least; B's peak RSS growth at most (x payload)
SCENARIOS = {"A": "binary-h1", "B": "system-shm"}


def cpu_seconds(pid: int) -> float:
    """CPU seconds a process (all its threads, gone ones too) has used, from its CPU clock (ns); /proc's
    ticks (10 ms) where that clock cannot be read. A trip in shared memory costs a few ms."""
    try:  # the clock id clock_getcpuclockid(pid) gives: CPUCLOCK_SCHED of the whole process
        return time.clock_gettime(((~pid) << 3) | 2)
    except OSError:
        return cpu_clock(pid)


def rss_shmem_mib(pid: int) -> float:
    """The shared-memory pages resident in a process's RSS (RssShmem), in MiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssShmem:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Client:
    """One HTTP/1.1 keep-alive connection (http.client: a few tens of µs a small request)."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.headers = {"Content-Type": "application/json"}

    def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        self.conn.request("POST", path, body, self.headers)
        response = self.conn.getresponse()
        return response.status, response.read()

    def close(self) -> None:
        self.conn.close()


class Regions:
    """The input and output regions: created here, filled, registered with the server, and in `close`
    unregistered (where the server still answers) and unlinked, whatever happened before."""

    def __init__(self, raw: bytes) -> None:
        tag = f"tensorgate_shmbench_{os.getpid()}"
        self.names = {"input": f"{tag}_in", "output": f"{tag}_out"}
        self.shm: dict[str, shared_memory.SharedMemory] = {}
        self.registered: list[str] = []
        try:
            for role, name in self.names.items():
                self.shm[role] = shared_memory.SharedMemory(name=name, create=True, size=len(raw))
            self.shm["input"].buf[: len(raw)] = raw
        except BaseException:
            self.close(None)
            raise

    def register(self, client: Client) -> str | None:
        for role, name in self.names.items():
            shm = self.shm[role]
            body = orjson.dumps({"key": shm.name, "offset": 0, "byte_size": shm.size})
            status, answer = client.post(f"/v2/systemsharedmemory/region/{name}/register", body)
            if status != 200:
                return f"registering {role} region: HTTP {status} {answer[:200]!r}"
            self.registered.append(name)
        return None

    def same(self) -> bool:
        """Whether the output region holds the input region's bytes."""
        inp = np.frombuffer(self.shm["input"].buf, dtype=np.uint8)
        out = np.frombuffer(self.shm["output"].buf, dtype=np.uint8)
        equal = bool(np.array_equal(inp, out))
        del inp, out  # no views may be left when the segments are closed
        return equal

    def close(self, port: int | None) -> None:
        if port is not None and self.registered:
            try:
                client = Client(port)
                for name in self.registered:
                    client.post(f"/v2/systemsharedmemory/region/{name}/unregister", b"")
                client.close()
            except OSError:
                pass
        for shm in self.shm.values():
            shm.close()
            with contextlib.suppress(FileNotFoundError):
                shm.unlink()


def shm_body(regions: Regions, byte_size: int) -> bytes:
    return orjson.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [byte_size // 4],
                    "parameters": {
                        "shared_memory_region": regions.names["input"],
                        "shared_memory_byte_size": byte_size,
                    },
                }
            ],
            "outputs": [
                {
                    "name": "OUTPUT0",
                    "parameters": {
                        "shared_memory_region": regions.names["output"],
                        "shared_memory_byte_size": byte_size,
                    },
                }
            ],
        }
    )


def check_a(server: ServerProcess, files: dict) -> str | None:
    """One binary round trip by curl, the answer's tensor compared byte for byte."""
    body, raw, header_length = files["binary"]
    out = os.path.join(files["dir"], "answer.bin")
    _, code = curl_trip(server.port, body, header_length, False, out)
    with open(out, "rb") as f:
        answer = f.read()
    os.remove(out)
    if code != 200 or not answer.endswith(raw):
        return f"binary-h1: the checked round trip came back wrong (HTTP {code}, {len(answer)} bytes)"
    return None


def check_b(client: Client, regions: Regions, body: bytes, byte_size: int) -> str | None:
    """One shared-memory trip: the answer names the output region (no data), which then equals the input."""
    status, answer = client.post(BINARY_PATH, body)
    if status != 200:
        return f"system-shm: HTTP {status} {answer[:300]!r}"
    output = orjson.loads(answer)["outputs"][0]
    parameters = output.get("parameters", {})
    if (
        "data" in output
        or parameters.get("shared_memory_region") != regions.names["output"]
        or parameters.get("shared_memory_byte_size") != byte_size
    ):
        return f"system-shm: unexpected answer {answer[:300]!r}"
    if not regions.same():
        return "system-shm: the output region does not equal the input after a round trip"
    return None


def measured(server: ServerProcess, payload: int, trips: int, drive) -> dict:
    """Runs `drive()` -> (trips done, seconds, note) between the server's RSS and CPU readings."""
    rss_before = memory_kib(server.pid)["VmRSS"]
    peak_reset = reset_peak_rss(server.pid)
    cpu = cpu_seconds(server.pid)
    done, seconds, note = drive()
    used = cpu_seconds(server.pid) - cpu
    peak = memory_kib(server.pid)["VmHWM"]
    if done != trips:
        return {"error": f"{done} of {trips} trips answered: {note}"}
    return {
        "trips": done,
        "bytes": 2 * payload * done,
        "seconds": seconds,
        "gb_s": 2 * payload * done / seconds / 1e9,
        "mean_trip_ms": 1000 * seconds / done,
        "cpu_ms_per_trip": 1000 * used / done,
        "rss_growth_x": (peak - rss_before) * 1024 / payload,
        "peak_reset": peak_reset,
        "note": note,
    }


def round_a(server: ServerProcess, args, files) -> dict:
    """`args.trips` binary round trips by h2load over one HTTP/1.1 connection, one at a time."""
    body, raw, header_length = files["binary"]
    argv = ["h2load", "--h1", f"-n{args.trips}", "-c1", "-m1", "-w30", "-W30", "-d", body,
            "-H", f"inference-header-content-length: {header_length}",
            "-H", "content-type: application/octet-stream",
            f"http://127.0.0.1:{server.port}{BINARY_PATH}"]  # fmt: skip

    def drive() -> tuple[int, float, str]:
        output = _run(argv, 300)
        done, took = _H2LOAD.search(output), _H2LOAD_TIME.search(output)
        if not done or not took:
            return 0, 0.0, output[-200:]
        seconds = float(took.group(1)) / (1000 if took.group(2) == "ms" else 1)
        failed = int(done.group(2)) + int(done.group(3))
        return int(done.group(1)), seconds, f"{failed} failed" if failed else ""

    return measured(server, len(raw), args.trips, drive)


def round_b(server: ServerProcess, client: Client, body: bytes, payload: int, args) -> dict:
    """`args.trips` JSON infers naming the regions, one at a time on the keep-alive connection."""
    client_cpu = 0.0

    def drive() -> tuple[int, float, str]:
        nonlocal client_cpu
        done, bad = 0, ""
        cpu = time.process_time()
        start = time.perf_counter()
        for _ in range(args.trips):
            status, answer = client.post(BINARY_PATH, body)
            if status != 200:
                bad = f"HTTP {status} {answer[:200]!r}"
                break
            done += 1
        seconds = time.perf_counter() - start
        client_cpu = time.process_time() - cpu
        return done, seconds, bad

    result = measured(server, payload, args.trips, drive)
    if "error" not in result:
        result["client_cpu_ms_per_trip"] = 1000 * client_cpu / args.trips
    return result


def summarize(rounds: list[dict]) -> dict:
    good = [r for r in rounds if "error" not in r]
    if not good:
        return {"error": "; ".join(sorted({r["error"] for r in rounds}))}
    trips = sum(r["trips"] for r in good)
    seconds = sum(r["seconds"] for r in good)
    summary = {
        "gb_s": sum(r["bytes"] for r in good) / seconds / 1e9,
        "mean_trip_ms": 1000 * seconds / trips,
        "cpu_ms_per_trip": statistics.median(r["cpu_ms_per_trip"] for r in good),
        "rss_growth_x": max(r["rss_growth_x"] for r in good),
        "failed_rounds": len(rounds) - len(good),
    }
    if "client_cpu_ms_per_trip" in good[0]:
        summary["client_cpu_ms_per_trip"] = statistics.median(r["client_cpu_ms_per_trip"] for r in good)
    return summary


def report(results: dict, args) -> str:
    a, b = results.get("A", {}), results.get("B", {})
    lines = [
        f"# Shared-memory bench, {date.today()} ({platform.node()}, {os.cpu_count()} cores, "
        f"load {os.getloadavg()[0]:.2f} at the end)",
        "",
        f"A {args.mib} MiB FP32 tensor through `identity_fp32` and back, one server "
        "(`--allow-client-shm true`), "
        f"{args.rounds} rounds of {args.trips} sequential round trips per scenario, alternating "
        "(A B, B A, ...). "
        "A (binary-h1): the tensor in the HTTP/1.1 body both ways, `h2load --h1 -c1 -m1` after one round "
        "trip by curl checked byte for byte. B (system-shm): input and output in POSIX shared memory "
        "(multiprocessing.shared_memory), registered once; each trip a small JSON infer naming both "
        "regions (http.client, keep-alive), done when its answer arrives; the output region checked "
        "equal to the input once. GB/s = 2 x payload per trip / wall time, over all rounds; server CPU "
        "per trip the median of the rounds; peak RSS growth = server VmHWM after a round's trips (reset "
        "first) - VmRSS before, the worst round, as a share of the payload.",
        "",
    ]
    if "error" in results:
        lines += [f"**Error:** {results['error']}", ""]
    lines += [
        "| scenario | GB/s | mean trip | server CPU/trip | peak RSS growth | notes |",
        "|---|---|---|---|---|---|",
    ]
    for key, value in (("A", a), ("B", b)):
        summary = value.get("summary")
        if not summary:
            continue
        if "error" in summary:
            lines.append(f"| {key}: {SCENARIOS[key]} | | | | | {summary['error']} |")
            continue
        notes = []
        if "client_cpu_ms_per_trip" in summary:
            notes.append(f"client CPU {summary['client_cpu_ms_per_trip']:.2f} ms/trip")
        if key == "B" and "rss_shmem_mib" in results:
            notes.append(
                f"server RssShmem {results['rss_shmem_mib']:.0f} MiB (the regions, mapped, resident from "
                "the checked trip on)"
            )
        if summary["failed_rounds"]:
            notes.append(f"{summary['failed_rounds']} rounds failed")
        lines.append(
            f"| {key}: {SCENARIOS[key]} | {summary['gb_s']:.2f} | {summary['mean_trip_ms']:.1f} ms | "
            f"{summary['cpu_ms_per_trip']:.2f} ms | {summary['rss_growth_x']:.3f}x payload | "
            f"{'; '.join(notes)} |"
        )
    ratios = results.get("ratios", [])
    lines += ["", "| round | order | A GB/s | B GB/s | B / A |", "|---|---|---|---|---|"]
    for i, (ra, rb) in enumerate(zip(a.get("rounds", []), b.get("rounds", []), strict=False)):
        order = "A B" if i % 2 == 0 else "B A"
        ga = f"{ra['gb_s']:.2f}" if "gb_s" in ra else ra.get("error", "")
        gb = f"{rb['gb_s']:.2f}" if "gb_s" in rb else rb.get("error", "")
        ratio = f"{rb['gb_s'] / ra['gb_s']:.2f}x" if "gb_s" in ra and "gb_s" in rb else ""
        lines.append(f"| {i + 1} | {order} | {ga} | {gb} | {ratio} |")
    lines += [
        "",
        "## Targets",
        "",
        "| target | value | per-round range | target | met |",
        "|---|---|---|---|---|",
    ]
    if ratios:
        mid = statistics.median(ratios)
        lines.append(
            f"| B / A GB/s ({args.mib} MiB FP32 round trip) | {mid:.2f}x | "
            f"{min(ratios):.2f}-{max(ratios):.2f} | >= {RATIO_TARGET:g}x | "
            f"{'yes' if mid >= RATIO_TARGET else 'NO'} |"
        )
    else:
        lines.append(f"| B / A GB/s | no round with both | | >= {RATIO_TARGET:g}x | NO |")
    summary = b.get("summary", {})
    if "rss_growth_x" in summary:
        growths = [r["rss_growth_x"] for r in b["rounds"] if "rss_growth_x" in r]
        met = summary["rss_growth_x"] <= RSS_TARGET
        lines.append(
            f"| B peak RSS growth (worst round) | {summary['rss_growth_x']:.3f}x payload | "
            f"{min(growths):.3f}-{max(growths):.3f} | <= {RSS_TARGET:g}x | {'yes' if met else 'NO'} |"
        )
    else:
        lines.append(f"| B peak RSS growth | no round measured | | <= {RSS_TARGET:g}x | NO |")
    if any(not r.get("peak_reset", True) for v in (a, b) for r in v.get("rounds", [])):
        lines += [
            "",
            "Note: VmHWM could not be reset (/proc/PID/clear_refs): RSS growth is over an older peak.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.shm_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trips", type=int, default=10, help="timed round trips per scenario per round")
    parser.add_argument("--mib", type=int, default=64, help="payload size")
    parser.add_argument("--out", default="bench/results")
    args = parser.parse_args(argv)
    missing = [tool for tool in ("h2load", "curl") if shutil.which(tool) is None]
    if missing:
        parser.error(f"needs {', '.join(missing)} (apt-get install nghttp2-client curl)")
    results: dict = {"A": {"rounds": []}, "B": {"rounds": []}, "ratios": []}
    with tempfile.TemporaryDirectory() as directory:
        files = {"dir": directory, "binary": binary_body(args.mib, directory)}
        raw = files["binary"][1]
        payload = len(raw)
        regions: Regions | None = None
        client: Client | None = None
        server = ServerProcess([*serve_argv(), "--allow-client-shm", "true"], cwd=ROOT)
        try:
            regions = Regions(raw)
            client = Client(server.port)
            body = shm_body(regions, payload)
            error = (
                check_a(server, files) or regions.register(client) or check_b(client, regions, body, payload)
            )
            if error:
                raise RuntimeError(error)
            results["rss_shmem_mib"] = rss_shmem_mib(server.pid)
            for round_no in range(args.rounds):
                order = ("A", "B") if round_no % 2 == 0 else ("B", "A")
                for key in order:
                    if key == "A":
                        result = round_a(server, args, files)
                    else:
                        result = round_b(server, client, body, payload, args)
                    results[key]["rounds"].append(result)
                    shown = (
                        f"{result['gb_s']:.2f} GB/s, {result['cpu_ms_per_trip']:.1f} ms CPU/trip, "
                        f"RSS +{result['rss_growth_x']:.3f}x"
                        if "gb_s" in result
                        else result["error"]
                    )
                    print(f"  round {round_no + 1} {key} {SCENARIOS[key]}: {shown}", file=sys.stderr)
                ra, rb = results["A"]["rounds"][-1], results["B"]["rounds"][-1]
                if "gb_s" in ra and "gb_s" in rb:
                    results["ratios"].append(rb["gb_s"] / ra["gb_s"])
        except (RuntimeError, OSError) as e:
            results["error"] = str(e)
            print(f"shm_bench: {e}", file=sys.stderr)
        finally:
            if client is not None:
                client.close()
            if regions is not None:
                regions.close(server.port if server.proc.poll() is None else None)
            server.stop()
    for key in ("A", "B"):
        if results[key]["rounds"]:
            results[key]["summary"] = summarize(results[key]["rounds"])
    save(report(results, args), results, args, "shm")
    return 1 if "error" in results else 0


if __name__ == "__main__":
    raise SystemExit(main())
