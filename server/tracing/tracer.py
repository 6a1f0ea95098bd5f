"""The server's tracer (Triton's TraceManager): which requests are traced, the settings clients read and
change, and where finished traces go: Triton's JSON trace files, or OpenTelemetry (server/tracing/otel.py).

A front end asks `sample(model, traceparent, tracestate)` for each inference request while `on` is true
(one attribute read per request when tracing is off) and hands the trace back with `finish(trace)` once
the request is answered (its transport, once the answer is out: server/tracing/frontend.py). Triton's
sampling: each setting counts the requests it sees and traces every `rate`-th while `count` lasts; in
OpenTelemetry mode a request that carries a valid W3C `traceparent` is traced whatever the rate and count.

Files (Triton's layout): each trace is its entries in Triton's JSON (codec/trace.py). With log_frequency
N, every N traces of a setting go to `<trace_file>.<index>` (a JSON array; the index counts per file from
0), and so do the last ones once trace_count runs out; with 0, a setting's traces are kept and written at
shutdown, all of them in one JSON array in `<trace_file>`. A setting that a change replaces hands its
traces on the same way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from tensorgate.codec.errors import InferError, invalid
from tensorgate.codec.trace import Trace, triton_json, valid_traceparent
from tensorgate.server.tracing.config import OtelConfig
from tensorgate.server.tracing.frontend import Sampler, Timing
from tensorgate.server.tracing.settings import OPENTELEMETRY, TraceSetting, derive, with_count

if TYPE_CHECKING:
    from tensorgate.server.repository import Repository

NEVER = 1 << 62  # a countdown that does not run out
log = logging.getLogger("tensorgate.trace")


class _State:
    """A setting in force and what it has counted: requests seen, traces still to take, taken and
    written, and the traces written to no file yet."""

    __slots__ = ("setting", "model", "left", "count", "created", "collected", "buffer", "buffered")

    def __init__(self, setting: TraceSetting, model: str = "") -> None:
        self.setting = setting
        self.model = model  # "": the global setting
        # requests until the next one traced (Triton counts requests and takes every rate-th): NEVER while
        # the setting cannot sample (OFF, rate 0, no file) or its count has run out
        sampling = setting.count != 0 and not setting.invalid_reason()
        self.left = setting.rate if sampling else NEVER
        self.count = setting.count
        self.created = 0
        self.collected = 0
        self.buffer: list[dict[str, Any]] = []  # JSON entries of traces not yet written
        self.buffered = 0

    def live(self) -> TraceSetting:
        """The setting with the traces it has left as its count (what a change carries over)."""
        return self.setting if self.count == self.setting.count else with_count(self.setting, self.count)


class Tracer:
    def __init__(self, default: TraceSetting, otel: OtelConfig | None = None, exporter: Any = None) -> None:
        """`default`: the --trace-config setting; `exporter`: the OpenTelemetry exporter in that mode."""
        self.default = default
        self.otel = otel if default.mode == OPENTELEMETRY else None
        self.exporter = exporter
        self.global_state = _State(default)
        self.models: dict[str, _State] = {}
        self.following: set[str] = set()  # models whose setting follows the global one in some field
        self._unindexed: dict[str, list[dict[str, Any]]] = {}  # trace file -> entries for it at shutdown
        self._indexes: dict[str, int] = {}  # trace file -> the next index of its numbered files
        self.on = False
        self.watchers: list[Callable[[bool], None]] = []  # told when `on` changes (the engine's workers)
        self._refresh()

    # --------------------------------------------------------------------------------- sampling

    def sample(self, model: str, traceparent: Any = None, tracestate: Any = None) -> Trace | None:
        """A trace for this request, or None (most requests: a countdown, and nothing else, decides).
        The W3C context is looked at in OpenTelemetry mode only: front ends pass it in that mode."""
        state = self.models.get(model, self.global_state) if self.models else self.global_state
        state.left -= 1
        if state.left > 0 and traceparent is None:
            return None
        return self._sample(state, traceparent, tracestate)

    def _sample(self, state: _State, traceparent: Any, tracestate: Any) -> Trace | None:
        setting = state.setting
        parent = _text(traceparent) if self.otel is not None and setting.level else ""
        forced = bool(parent) and valid_traceparent(parent)
        taken = False
        if state.left <= 0:  # the rate-th request since the last: taken while the count lasts
            state.left = setting.rate
            taken = True
            if state.count > 0:
                state.count -= 1
                if state.count == 0:
                    state.left = NEVER
        if not (taken or forced):
            return None
        state.created += 1
        trace = Trace.new(setting.level, parent if forced else "", _text(tracestate) if forced else "")
        trace.sampled_by = state.model
        return trace

    def finish(self, trace: Trace | None) -> None:
        """The request of `trace` is answered: its trace is written (or exported)."""
        if trace is None or trace.sampled_by is None:
            return
        state = self.models.get(trace.sampled_by, self.global_state)  # its setting, or what replaced it
        trace.sampled_by = None  # finished once
        if self.exporter is not None:
            self.exporter.export(trace)
            return
        entries = triton_json(trace)
        if not entries:  # it failed before reaching a model: nothing to write
            state.created -= 1
            return
        state.buffer += entries
        state.buffered += 1
        state.collected += 1
        setting = state.setting
        if (state.count == 0 and state.collected == state.created) or (
            setting.log_frequency and state.buffered >= setting.log_frequency
        ):
            self._write_indexed(setting.file, state)

    # --------------------------------------------------------------------------------- settings

    def answer(self, model: str = "") -> dict[str, Any]:
        """The setting a model's requests are traced with ("": the global one), as the endpoints give it."""
        state = self.models.get(model) or self.global_state
        doc = state.setting.answer(state.count)
        if self.otel is not None:
            doc.update(self.otel.answer())
        return doc

    def update(self, model: str, changes: dict[str, Any]) -> None:
        """Applies field changes (server/tracing/settings.py) to a model's setting ("": the global one);
        an invalid setting that is not OFF is refused with Triton's message."""
        if model:
            self._update_model(model, changes)
        else:
            setting = derive(self.global_state.live(), self.default, changes)
            _check(setting)
            self._replace(self.global_state, setting)
            self.global_state = _State(setting)
            for name in list(self.following):  # fields that follow the global setting follow the change
                self._update_model(name, {})
        self._refresh()

    def _update_model(self, model: str, changes: dict[str, Any]) -> None:
        current = self.models.get(model)
        setting = derive(current.live() if current else None, self.global_state.live(), changes)
        _check(setting)
        if not setting.specified:  # it follows the global setting in everything: it has none of its own
            self.following.discard(model)
            if current is not None:
                self._replace(current, None)
                del self.models[model]
            return
        if setting.specified >= {"level", "rate", "count", "log_frequency", "file"}:
            self.following.discard(model)
        else:
            self.following.add(model)
        if current is not None:
            self._replace(current, setting)
        self.models[model] = _State(setting, model)

    def _replace(self, old: _State, new: TraceSetting | None) -> None:
        """A setting is replaced: the traces it holds are written as it would have written them."""
        if old.buffer:
            if old.setting.log_frequency:
                self._write_indexed(old.setting.file, old)
            else:
                self._unindexed.setdefault(old.setting.file, []).extend(old.buffer)
                old.buffer, old.buffered = [], 0

    def _refresh(self) -> None:
        states = [self.global_state, *self.models.values()]
        was, self.on = self.on, any(s.setting.level and (s.setting.rate or self.otel) for s in states)
        Timing.on = self.on  # the transports time what they receive while a request may be traced
        if self.on != was:
            for watcher in self.watchers:
                watcher(self.on)

    # --------------------------------------------------------------------------------- files

    def _write_indexed(self, path: str, state: _State) -> None:
        index = self._indexes.get(path, 0)
        self._indexes[path] = index + 1
        _write(f"{path}.{index}", state.buffer)
        state.buffer, state.buffered = [], 0

    def close(self) -> None:
        """At shutdown: every trace not yet written goes to its file; the exporter flushes."""
        for state in [self.global_state, *self.models.values()]:
            self._replace(state, None)
        for path, entries in self._unindexed.items():
            if path:
                _write(path, entries)
        self._unindexed.clear()
        if self.exporter is not None:
            self.exporter.close()


def sample_grpc(tracer: Sampler, model: str, metadata: dict[str, Any]) -> Trace | None:
    """`Tracer.sample` for a gRPC call: its W3C trace context from its metadata, in OpenTelemetry mode."""
    if tracer.otel is None:
        return tracer.sample(model)
    return tracer.sample(model, metadata.get("traceparent"), metadata.get("tracestate"))


def check_model(repository: Repository, model: str) -> None:
    """A model's trace setting is read and set only while it is ready (Triton's check and text)."""
    try:
        ready = repository.model(model).is_ready("")
    except InferError:
        ready = False
    if not ready:
        raise invalid(f"Request for unknown model : {model}")


def _check(setting: TraceSetting) -> None:
    reason = setting.invalid_reason()
    if reason and setting.level:
        raise invalid(f"Attempting to set invalid trace setting :{reason}")


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.decode("latin-1") if isinstance(value, bytes | bytearray) else str(value)


def _write(path: str, entries: list[dict[str, Any]]) -> None:
    try:
        with open(path, "wb") as file:
            file.write(orjson.dumps(entries))
    except OSError as e:
        log.error("failed creating trace file %s: %s", path, e)
