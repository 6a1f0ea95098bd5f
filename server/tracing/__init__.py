"""Triton's trace extension: settings (settings.py, config.py), sampling and trace files (tracer.py),
OpenTelemetry export (otel.py)."""
