"""OpenTelemetry export of traces (`--trace-config mode=opentelemetry`): OTLP/HTTP through the
opentelemetry-sdk (the `otel` extra), spans batched by its BatchSpanProcessor, as Triton exports them.

A trace becomes Triton's spans, built once its request is answered from the timestamps it recorded:
- "InferRequest", the top span, child of the client's span when the request carried a valid W3C
  `traceparent` (and `tracestate`), with the front end's timestamps (HTTP_RECV_START, ...) as events;
- a span named after the model, REQUEST_START to REQUEST_END, with its timestamps as events and the
  attributes triton.model_name, triton.model_version, triton.trace_id, triton.trace_parent_id and
  triton.request_id;
- under it a "compute" span, COMPUTE_START to COMPUTE_END, with the compute timestamps as events;
- a child trace (an ensemble's step, a BLS call) as a model span under its parent's model span.
Timestamps are monotonic; spans carry wall-clock times, the offset between the two taken at start.
"""

from __future__ import annotations

import time
from typing import Any

from tensorgate.codec.trace import (
    COMPUTE_END,
    COMPUTE_INPUT_END,
    COMPUTE_OUTPUT_START,
    COMPUTE_START,
    REQUEST_END,
    REQUEST_START,
    Trace,
)
from tensorgate.server.tracing.config import OtelConfig

COMPUTE_EVENTS = (COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START, COMPUTE_END)
MISSING = (
    "--trace-config mode=opentelemetry needs the opentelemetry-sdk and "
    "opentelemetry-exporter-otlp-proto-http packages: pip install 'tensorgate[otel]'"
)


class OtelExporter:
    def __init__(self, config: OtelConfig) -> None:
        try:
            from opentelemetry import trace as api
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            raise ValueError(MISSING) from None
        self.api = api
        self.propagator = TraceContextTextMapPropagator()
        self.provider = TracerProvider(resource=Resource.create(config.resource))
        self.provider.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=config.url),
                max_queue_size=config.bsp_max_queue_size,
                schedule_delay_millis=config.bsp_schedule_delay,
                max_export_batch_size=config.bsp_max_export_batch_size,
            )
        )
        self.tracer = self.provider.get_tracer("tensorgate")
        self.offset = time.time_ns() - time.monotonic_ns()  # monotonic -> wall clock

    def export(self, trace: Trace) -> None:
        """The trace's spans, handed to the batch processor (sent from its thread)."""
        if not trace.model_name:
            return  # it failed before reaching a model
        context = None
        if trace.traceparent:
            carrier = {"traceparent": trace.traceparent}
            if trace.tracestate:
                carrier["tracestate"] = trace.tracestate
            context = self.propagator.extract(carrier)
        stamps = [ns for one in trace.walk() for _, ns in one.timestamps] + [ns for _, ns in trace.front]
        stamps = stamps or [time.monotonic_ns()]
        top = self._span("InferRequest", context, min(stamps))
        for name, ns in trace.front:
            top.add_event(name, timestamp=self.offset + ns)
        self._model_span(trace, self.api.set_span_in_context(top))
        top.end(end_time=self.offset + max(stamps))

    def _model_span(self, trace: Trace, context: Any) -> None:
        times = dict(trace.timestamps)
        start = times.get(REQUEST_START) or min((ns for _, ns in trace.timestamps), default=0)
        span = self._span(trace.model_name, context, start)
        span.set_attribute("triton.model_name", trace.model_name)
        span.set_attribute("triton.model_version", trace.model_version)
        span.set_attribute("triton.trace_id", trace.id)
        span.set_attribute("triton.trace_parent_id", trace.parent_id)
        if trace.request_id:
            span.set_attribute("triton.request_id", trace.request_id)
        inner = self.api.set_span_in_context(span)
        for name, ns in trace.timestamps:
            if name not in COMPUTE_EVENTS:
                span.add_event(name, timestamp=self.offset + ns)
        if COMPUTE_START in times:
            compute = self._span("compute", inner, times[COMPUTE_START])
            for name, ns in trace.timestamps:
                if name in COMPUTE_EVENTS:
                    compute.add_event(name, timestamp=self.offset + ns)
            compute.end(end_time=self.offset + times.get(COMPUTE_END, times[COMPUTE_START]))
        for spawned in trace.children:
            self._model_span(spawned, inner)
        span.end(end_time=self.offset + times.get(REQUEST_END, start))

    def _span(self, name: str, context: Any, start_ns: int) -> Any:
        return self.tracer.start_span(
            name, context=context, kind=self.api.SpanKind.SERVER, start_time=self.offset + start_ns
        )

    def close(self) -> None:
        """Sends what is batched and stops the processor's thread."""
        self.provider.shutdown()
