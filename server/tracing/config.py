"""`--trace-config`, Triton's flag, read: `--trace-config <setting>=<value>` for the global settings
(rate, level (repeatable), count, mode, file, log-frequency) and `--trace-config <mode>,<setting>=<value>`
for a mode's own: `triton,file=PATH`, `triton,log-frequency=N`, `opentelemetry,url=URL`,
`opentelemetry,resource=KEY=VALUE` (repeatable), `opentelemetry,bsp_max_queue_size=N`,
`opentelemetry,bsp_schedule_delay=MS`, `opentelemetry,bsp_max_export_batch_size=N`."""

from __future__ import annotations

from dataclasses import dataclass, field

from tensorgate.codec.trace import LEVELS
from tensorgate.server.tracing.settings import INT32_MAX, OPENTELEMETRY, TRITON, UINT32_MAX, TraceSetting

OTLP_URL = "http://localhost:4318/v1/traces"  # OTLP/HTTP's default, as Triton's


@dataclass(frozen=True)
class OtelConfig:
    """The OpenTelemetry exporter's settings (Triton's names and defaults)."""

    url: str = OTLP_URL
    resource: dict[str, str] = field(default_factory=lambda: {"service.name": "tensorgate"})
    bsp_max_queue_size: int = 2048
    bsp_schedule_delay: int = 5000  # ms
    bsp_max_export_batch_size: int = 512

    def answer(self) -> dict[str, str]:
        """As the trace setting endpoints list them (Triton's: each as a string)."""
        doc = {"url": self.url}
        doc.update({"resource": ",".join(f"{k}={v}" for k, v in self.resource.items())})
        for name in ("bsp_max_queue_size", "bsp_schedule_delay", "bsp_max_export_batch_size"):
            doc[name] = str(getattr(self, name))
        return doc


def parse(entries: list[str]) -> tuple[TraceSetting, OtelConfig]:
    """The global trace setting and the OpenTelemetry settings the flags give; ValueError says what is
    wrong with one."""
    values: dict = {}
    levels: list[str] = []
    otel: dict = {}
    resource: dict[str, str] = {}
    for entry in entries:
        head, equals, rest = entry.partition("=")
        mode, comma, key = head.rpartition(",")
        if not equals or not key:
            raise ValueError(f"--trace-config {entry!r}: expected [<mode>,]<setting>=<value>")
        if comma and mode not in (TRITON, OPENTELEMETRY):
            raise ValueError(f"--trace-config {entry!r}: unknown mode {mode!r} (triton or opentelemetry)")
        if key == "level":
            if rest not in (*LEVELS, "OFF"):
                raise ValueError(f"--trace-config level={rest}: expected OFF, TIMESTAMPS or TENSORS")
            levels.append(rest)
        elif key == "mode":
            if rest not in (TRITON, OPENTELEMETRY):
                raise ValueError(f"--trace-config mode={rest}: expected triton or opentelemetry")
            values["mode"] = rest
        elif key in ("rate", "count", "log-frequency"):
            values[key.replace("-", "_")] = _integer(entry, rest, -1 if key == "count" else 0)
        elif key == "file":
            values["file"] = rest
        elif mode == OPENTELEMETRY and key == "url":
            otel["url"] = rest
        elif mode == OPENTELEMETRY and key == "resource":
            name, equals, value = rest.partition("=")
            if not equals or not name:
                raise ValueError(f"--trace-config {entry!r}: expected resource=<key>=<value>")
            resource[name] = value
        elif mode == OPENTELEMETRY and key.startswith("bsp_") and key in OtelConfig.__dataclass_fields__:
            otel[key] = _integer(entry, rest, 1)
        else:
            raise ValueError(f"--trace-config {entry!r}: unknown setting {key!r}")
    if "OFF" in levels and len(levels) > 1:
        raise ValueError("--trace-config level=OFF cannot be given with another level")
    setting = TraceSetting(level=tuple(level for level in LEVELS if level in levels), **values)
    config = OtelConfig(**otel)
    if resource:
        config = OtelConfig(**otel, resource={**config.resource, **resource})
    if config.bsp_max_export_batch_size > config.bsp_max_queue_size:
        raise ValueError(
            "--trace-config opentelemetry,bsp_max_export_batch_size must be <= bsp_max_queue_size"
        )
    return setting, config


def _integer(entry: str, text: str, low: int) -> int:
    high = INT32_MAX if low < 0 else UINT32_MAX
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"--trace-config {entry!r}: {text!r} is not an integer") from None
    if not low <= value <= high:
        raise ValueError(f"--trace-config {entry!r}: expected an integer in [{low}, {high}]")
    return value
