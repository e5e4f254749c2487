"""OpenTelemetry traces, when `OTEL_EXPORTER_OTLP_ENDPOINT` is set.

Unset, `configure_tracing` does nothing and imports nothing, `tracer()` is None and every
call site skips its span after one `is None` test: the cost is nil.

Set, each process gets one tracer provider (service `bernard-api` or `bernard-worker`,
unless `OTEL_SERVICE_NAME` says otherwise) that batches its spans to the collector over
OTLP/HTTP; the SDK reads the other `OTEL_EXPORTER_OTLP_*` variables (headers, timeout,
a `..._TRACES_ENDPOINT`) itself. Bernard keeps the provider to itself rather than making
it the process-wide one, so no library's instrumentation starts sending spans unasked.

A turn's trace crosses processes on its record: the API stores the W3C `traceparent` of
its request span on the turn (`current_traceparent`, shared/turn_record.py `TurnRecord`), and the
worker parents the queue wait and the turn on it (`parent_context`), so one trace holds the
request, the wait, the turn, each model call and each tool call
(api/access_log.py, worker/telemetry.py).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from shared.settings import Settings

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Tracer

__all__ = [
    "configure_tracing",
    "current_traceparent",
    "flush_tracing",
    "install",
    "parent_context",
    "tracer",
]

_TRACER_NAME = "bernard"
_provider: TracerProvider | None = None
_tracer: Tracer | None = None


def tracer() -> Tracer | None:
    """Bernard's tracer, or None when tracing is off."""
    return _tracer


def install(provider: TracerProvider | None) -> None:
    """Trace through `provider` from now on (None: stop tracing). For tests, which give it an
    in-memory exporter, and for a program that embeds Bernard with a provider of its own."""
    global _provider, _tracer
    _provider = provider
    _tracer = provider.get_tracer(_TRACER_NAME) if provider is not None else None


def configure_tracing(settings: Settings, service_name: str) -> bool:
    """Set up tracing to the OTLP endpoint the settings name; True when this call did.

    False, and nothing done, when no endpoint is set or a provider is already installed
    (the API and a worker in one process share the first one).
    """
    endpoint = settings.otel_exporter_otlp_endpoint
    if not endpoint or _provider is not None:
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
    provider = TracerProvider(resource=Resource.create(attributes))
    # The SDK appends the signal's path itself only to an endpoint it read from the
    # environment; one read from `.env` gets it here. A traces-only endpoint wins, as the
    # OTLP specification says.
    explicit = None
    if not any(
        os.environ.get(name)
        for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    ):
        explicit = f"{endpoint.rstrip('/')}/v1/traces"
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=explicit)))
    install(provider)
    return True


def flush_tracing() -> None:
    """Send the spans still batched (at a process's shutdown)."""
    if _provider is not None:
        _provider.force_flush()


def current_traceparent() -> str | None:
    """The W3C `traceparent` of the span current in this task, or None (tracing off, or
    no span)."""
    if _tracer is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent")


def parent_context(traceparent: str | None) -> Context:
    """The context a `traceparent` names, to start spans under; empty (a new trace) for
    None or one that does not parse."""
    from opentelemetry.context import Context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if not traceparent:
        return Context()
    return TraceContextTextMapPropagator().extract({"traceparent": traceparent}, Context())
