"""The machine's gauges, polled as Triton polls them: a thread reads the CPU's utilization and memory
from /proc (`--allow-cpu-metrics`) and each GPU's from NVML (`--allow-gpu-metrics`) every
`--metrics-interval-ms`; and the pinned memory pool's gauges (always 0: we keep no pinned pool).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client.metrics_core import Metric

from tensorgate.server.metrics_family import build_family
from tensorgate.server.metrics_settings import Settings

log = logging.getLogger("tensorgate.metrics")

PINNED_TOTAL = "nv_pinned_memory_pool_total_bytes"
PINNED_USED = "nv_pinned_memory_pool_used_bytes"


class Polled:
    """A prometheus_client collector: what a thread reads every --metrics-interval-ms, as Triton polls
    it: the CPU's utilization and memory from /proc (--allow-cpu-metrics), each GPU's from NVML
    (--allow-gpu-metrics; none where NVML or a GPU is missing), and the pinned memory pool's gauges
    (always; 0, as we keep no pinned pool)."""

    def __init__(self, settings: Settings, proc: Path = Path("/proc")) -> None:
        self.settings = settings
        self.proc = proc
        self.families: list[Metric] = []
        self.last_cpu: list[int] = []
        self.nvml: Any = None
        self.gpus: list[tuple[Any, str, float]] = []  # (handle, uuid, energy at start in mJ)
        if settings.gpu:
            self._open_nvml()
        self.poll()
        if settings.cpu or self.gpus:
            threading.Thread(target=self._run, name="metrics-poll", daemon=True).start()

    def collect(self) -> Iterator[Metric]:
        yield from self.families
        yield build_family(PINNED_TOTAL, "Pinned memory pool total memory size, in bytes", "gauge", [({}, 0)])
        yield build_family(PINNED_USED, "Pinned memory pool used memory size, in bytes", "gauge", [({}, 0)])

    def _run(self) -> None:
        while True:
            time.sleep(self.settings.interval_s)
            self.poll()

    def poll(self) -> None:
        families = []
        if self.settings.cpu:
            families += self._cpu()
        if self.gpus:
            families += self._gpu()
        self.families = families  # one assignment: a scrape sees one poll's values

    def _cpu(self) -> list[Metric]:
        """Triton's: utilization since the last poll from /proc/stat's first line, memory from
        /proc/meminfo (used = MemTotal - MemAvailable); 0 where they cannot be read."""
        utilization = 0.0
        try:
            fields = (self.proc / "stat").read_text().splitlines()[0].split()
            ticks = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
        except (OSError, IndexError, ValueError):
            ticks = []
        if len(ticks) == 8:
            last = self.last_cpu or [0] * 8
            diff = [max(new - old, 0) for new, old in zip(ticks, last, strict=True)]
            busy = diff[0] + diff[1] + diff[2] + diff[5] + diff[6] + diff[7]
            idle = diff[3] + diff[4]
            utilization = busy / (busy + idle) if busy + idle else 0.0
            self.last_cpu = ticks
        memory = {}
        try:
            for line in (self.proc / "meminfo").read_text().splitlines():
                name, _, value = line.partition(":")
                memory[name] = int(value.split()[0]) * 1024
        except (OSError, IndexError, ValueError):
            memory = {}
        total, available = memory.get("MemTotal", 0), memory.get("MemAvailable", 0)
        used = total - available if available <= total else 0
        gauges = (
            ("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", utilization),
            ("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", total),
            ("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", used),
        )
        return [build_family(name, help_, "gauge", [({}, value)]) for name, help_, value in gauges]

    def _open_nvml(self) -> None:
        try:
            import pynvml  # nvidia-ml-py, the gpu extra

            pynvml.nvmlInit()
            gpus = []
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = pynvml.nvmlDeviceGetUUID(handle)
                uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
                gpus.append((handle, uuid, self._energy(pynvml, handle)))
        except Exception as e:  # no nvidia-ml-py, no driver, no GPU
            log.info("--allow-gpu-metrics: no GPU metrics: NVML is not available (%s)", e)
            return
        if not gpus:
            log.info("--allow-gpu-metrics: no GPU metrics: NVML sees no GPU")
        self.nvml, self.gpus = pynvml, gpus

    @staticmethod
    def _energy(nvml: Any, handle: Any) -> float:
        try:
            return float(nvml.nvmlDeviceGetTotalEnergyConsumption(handle))  # mJ
        except Exception:
            return math.nan  # not supported by this GPU

    def _gpu(self) -> list[Metric]:
        """Triton's GPU gauges, per GPU, labelled `gpu_uuid`; a value NVML cannot read is left out."""
        nvml = self.nvml
        reads: dict[str, list[tuple[dict[str, str], float]]] = {name: [] for name, _, _ in GPU_METRICS}
        for handle, uuid, energy_at_start in self.gpus:
            labels = {"gpu_uuid": uuid}
            readers: dict[str, Callable[[], float]] = {
                "nv_gpu_utilization": lambda h=handle: nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100,
                "nv_gpu_memory_total_bytes": lambda h=handle: nvml.nvmlDeviceGetMemoryInfo(h).total,
                "nv_gpu_memory_used_bytes": lambda h=handle: nvml.nvmlDeviceGetMemoryInfo(h).used,
                "nv_gpu_power_usage": lambda h=handle: nvml.nvmlDeviceGetPowerUsage(h) / 1000,
                "nv_gpu_power_limit": lambda h=handle: nvml.nvmlDeviceGetPowerManagementLimit(h) / 1000,
                "nv_energy_consumption": lambda h=handle, e=energy_at_start: (
                    (self._energy(nvml, h) - e) / 1e3
                ),
            }
            for name, read in readers.items():
                try:
                    value = float(read())
                except Exception:
                    continue
                if not math.isnan(value):
                    reads[name].append((labels, value))
        return [
            build_family(name, help_, kind, reads[name]) for name, help_, kind in GPU_METRICS if reads[name]
        ]


GPU_METRICS = (  # Triton's (core src/metrics.cc): name, HELP text, type
    ("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", "gauge"),
    ("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", "gauge"),
    ("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", "gauge"),
    ("nv_gpu_power_usage", "GPU power usage in watts", "gauge"),
    ("nv_gpu_power_limit", "GPU power management limit in watts", "gauge"),
    ("nv_energy_consumption", "GPU energy consumption in joules since the Triton Server started", "counter"),
)
