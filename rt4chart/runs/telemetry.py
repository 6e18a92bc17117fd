"""rt4chart's own runs as OpenTelemetry traces (the ``otel`` extra).

When the standard ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_ENDPOINT`` variable
is set (``OTEL_EXPORTER_OTLP_HEADERS`` and the other ``OTEL_EXPORTER_OTLP_*`` variables are read by
the exporter itself), an audit sends its spans over OTLP/HTTP: ``rt4chart.run`` for the run, a
``rt4chart.sample`` child per input line with the verdict as attributes, and a child of that per
judge call named and attributed after the OpenTelemetry GenAI semantic conventions. Unset, nothing
of OpenTelemetry is imported and nothing is added to a call. Every string attribute is scrubbed of
API keys (:func:`rt4chart.scrubbing.scrub`); the exporter's headers never become attributes.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING

from rt4chart.protocol import Backend, BackendWrapper, JudgeRequest, JudgeResponse
from rt4chart.records.io import InputLine
from rt4chart.records.manifest import RunCounts, rt4chart_version
from rt4chart.scrubbing import scrub
from rt4chart.types import AuditRecord, Sample, Usage

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

    from rt4chart.method.repair import RepairRecord


ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
"""The variables that turn tracing on (either names where the OTLP/HTTP exporter sends spans)."""

AttributeValue = str | bool | int | float


class TelemetryUnavailable(RuntimeError):
    """An OTLP endpoint is configured but the ``otel`` extra is not installed."""


def tracing_configured(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for traces: an endpoint variable is set and the SDK is not
    disabled (``OTEL_SDK_DISABLED=true``, the standard off switch)."""
    environ = os.environ if environ is None else environ
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def _scrubbed(attributes: Mapping[str, AttributeValue | None]) -> dict[str, AttributeValue]:
    # Traces leave the machine: a judge name, a sample id or an error may hold a key.
    return {
        key: scrub(value) if isinstance(value, str) else value
        for key, value in attributes.items()
        if value is not None
    }


def _usage_attributes(usage: Usage) -> dict[str, AttributeValue | None]:
    return {
        "gen_ai.usage.input_tokens": usage.prompt_tokens,
        "gen_ai.usage.output_tokens": usage.completion_tokens,
        "rt4chart.cost_usd": usage.cost_usd,
        "rt4chart.calls": usage.calls,
        "rt4chart.cache_hits": usage.cache_hits,
    }


class RunTracing:
    """One run's tracer: its spans go to the configured OTLP endpoint through a batch processor
    (exported off the event loop), flushed by :meth:`shutdown`."""

    def __init__(self, provider: TracerProvider, tracer: Tracer) -> None:
        self._provider = provider
        self._tracer = tracer

    @contextmanager
    def span(self, name: str, attributes: Mapping[str, AttributeValue | None] | None = None) -> Iterator[Span]:
        """A span of the run's own, current inside (the spans started there become its children): a
        command's root, or a judge's run in a comparison."""
        with self._tracer.start_as_current_span(
            name, attributes=_scrubbed(attributes or {}), record_exception=False
        ) as span:
            yield span

    @contextmanager
    def run_span(self, command: str = "verify") -> Iterator[Span]:
        """The run's span, current while the run audits (sample spans become its children); a run that
        cannot start (a usage error) ends it as an error span."""
        with self.span("rt4chart.run", {"rt4chart.command": command}) as span:
            yield span

    def end_run(self, span: Span, judge: str, counts: RunCounts, usage: Usage, status: str, reason: str) -> None:
        """The run's tally on its span; a run that could not audit everything (stopped, invalid input,
        verdicts left open, a crash) is an error span. Hallucinated answers are findings, not errors."""
        from opentelemetry.trace import Status, StatusCode

        attributes: dict[str, AttributeValue | None] = {
            "rt4chart.judge": judge,
            "gen_ai.request.model": judge,
            "rt4chart.run.status": status,
            "rt4chart.run.records": counts.records,
            "rt4chart.run.hallucinated": counts.hallucinated,
            "rt4chart.run.incomplete": counts.incomplete,
            "rt4chart.run.invalid": counts.invalid,
            **{f"rt4chart.run.labels.{label}": count for label, count in counts.labels.items()},
            **_usage_attributes(usage),
        }
        span.set_attributes(_scrubbed(attributes))
        if status not in ("passed", "failed"):
            span.set_status(Status(StatusCode.ERROR, scrub(reason or status)))

    @contextmanager
    def sample_span(self, line: int | None, sample: Sample | None,
                    attributes: Mapping[str, AttributeValue | None] | None = None) -> Iterator[Span]:
        """The span of one answer, current inside (its judge calls become its children): its input line
        (a service's answer has none), id and the production trace it came from."""
        source = sample.trace if sample is not None else None
        with self.span("rt4chart.sample", {
            "rt4chart.sample.line": line,
            "rt4chart.sample.id": sample.id if sample is not None else None,
            "rt4chart.source.trace_id": source.trace_id if source is not None else None,
            "rt4chart.source.span_id": source.answer_span_id if source is not None else None,
            **(attributes or {}),
        }) as span:
            yield span

    async def sample(self, item: InputLine, audit: Callable[[InputLine], Awaitable[AuditRecord]]) -> AuditRecord:
        """``audit(item)`` inside the line's span, the verdict on the span (:func:`_verdict`)."""
        with self.sample_span(item.line, item.sample) as span:
            record = await audit(item)
            _verdict(span, record)
            return record

    async def answer(self, sample: Sample, audit: Callable[[], Awaitable[AuditRecord]]) -> AuditRecord:
        """``rt4 guard``'s audit of one answer (``audit()``) inside its own span, a trace's root
        (``rt4chart.command`` guard: a service has no run span), the verdict on it (:func:`_verdict`)."""
        with self.sample_span(None, sample, {"rt4chart.command": "guard"}) as span:
            record = await audit()
            _verdict(span, record)
            return record

    async def repair(self, item: InputLine, repair: Callable[[InputLine], Awaitable[RepairRecord]]) -> RepairRecord:
        """``repair(item)`` inside the line's span (``rt4 repair``), its outcome on the span: strategy,
        claims and unsupported claims, retention, usage; an error span when the record has an error."""
        with self.sample_span(item.line, item.sample) as span:
            record = await repair(item)
            span.set_attributes(_scrubbed({
                "rt4chart.repair.strategy": record.strategy,
                "rt4chart.repair.changed": record.repaired is not None and record.repaired != record.original,
                "rt4chart.repair.claims": record.claims,
                "rt4chart.repair.unsupported_claims": record.unsupported_claims,
                "rt4chart.repair.claim_retention": record.claim_retention,
                **_usage_attributes(record.usage),
            }))
            _error_if(span, bool(record.errors), record.errors[0] if record.errors else "")
            return record

    def context_carrier(self) -> dict[str, str]:
        """The current span as W3C trace context (``traceparent``), for another process to continue it."""
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
        return carrier

    @contextmanager
    def continued(self, carrier: Mapping[str, str]) -> Iterator[None]:
        """Spans started inside are children of the span ``carrier`` names (:meth:`context_carrier`, made
        in another process: a Ray worker's samples under the driver's run span)."""
        from opentelemetry import context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        token = context.attach(TraceContextTextMapPropagator().extract(dict(carrier)))
        try:
            yield
        finally:
            context.detach(token)

    def flush(self) -> None:
        """Export what is queued now (a Ray worker, after each shard: Ray may end it without notice)."""
        self._provider.force_flush()

    def traced(self, backend: Backend) -> Backend:
        """``backend`` with a span per call (:class:`TracedBackend`)."""
        return TracedBackend(backend, self._tracer)

    async def shutdown(self) -> None:
        """Export what is still queued and stop (a blocking flush, run off the event loop)."""
        await asyncio.to_thread(self._provider.shutdown)


def _verdict(span: Span, record: AuditRecord) -> None:
    """A record's verdict on its sample span: label, claims, hallucinated, usage; an error span when the
    record has an error or an open verdict."""
    span.set_attributes(_scrubbed({
        "rt4chart.verdict.label": record.label.value if record.label is not None else None,
        "rt4chart.verdict.claims": len(record.claims),
        "rt4chart.verdict.hallucinated": record.hallucinated,
        "rt4chart.verdict.incomplete": record.incomplete,
        **_usage_attributes(record.usage),
    }))
    why = record.errors[0] if record.errors else "judge errors left the verdict open"
    _error_if(span, bool(record.errors or record.incomplete), why)


def _error_if(span: Span, failed: bool, why: str) -> None:
    if failed:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, scrub(why)))


class TracedBackend(BackendWrapper):
    """A judge whose every call is a span after the GenAI conventions: ``chat MODEL``, the model,
    tokens, cost, whether the cache answered, and the error of a failed call."""

    def __init__(self, inner: Backend, tracer: Tracer) -> None:
        super().__init__(inner)
        self._tracer = tracer

    async def complete(self, request: JudgeRequest) -> JudgeResponse:
        from opentelemetry.trace import SpanKind, Status, StatusCode

        attributes = _scrubbed({
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": self.name,
            "rt4chart.task": request.task,
        })
        with self._tracer.start_as_current_span(
            scrub(f"chat {self.name}"), kind=SpanKind.CLIENT, attributes=attributes,
            record_exception=False, set_status_on_exception=False,
        ) as span:
            try:
                response = await self.inner.complete(request)
            except BaseException as error:  # a budget stop, an unreachable judge: the span says which
                span.set_attributes({"error.type": type(error).__name__})
                span.set_status(Status(StatusCode.ERROR, scrub(str(error))))
                raise
            span.set_attributes(_scrubbed({
                "gen_ai.response.model": response.judge or self.name,
                "rt4chart.cached": response.cached,
                **_usage_attributes(response.usage),
            }))
            if response.error is not None:
                span.set_attributes({"error.type": "judge_reply"})
                span.set_status(Status(StatusCode.ERROR, scrub(response.error)))
            return response


def otel_environment() -> dict[str, str]:
    """This process's ``OTEL_*`` variables: what a Ray worker configures its own tracing from."""
    return {name: value for name, value in os.environ.items() if name.startswith("OTEL_")}


def worker_tracing(environment: Mapping[str, str]) -> RunTracing | None:
    """A Ray worker's tracing, from the driver's ``OTEL_*`` variables (:func:`otel_environment`) set in the
    worker's own process (an actor's process is its own); ``None`` when the driver traces nothing, or
    when the worker lacks the ``otel`` extra (the driver, which has it, still traces its run)."""
    if not environment:
        return None
    os.environ.update(environment)
    try:
        return start_tracing()
    except TelemetryUnavailable:
        return None


def start_tracing() -> RunTracing | None:
    """The run's tracing when the environment configures an endpoint, else ``None`` (nothing
    imported). Raises :class:`TelemetryUnavailable` when it does but the ``otel`` extra is missing."""
    if not tracing_configured():
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise TelemetryUnavailable(
            "an OTLP endpoint is set (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) but "
            "OpenTelemetry is not installed: pip install 'rt4chart[otel]', or set OTEL_SDK_DISABLED=true"
        ) from None
    # A provider of the run's own, not the process's global one: a host application's tracing stays its own.
    service = os.environ.get("OTEL_SERVICE_NAME", "").strip() or "rt4chart"
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return RunTracing(provider, provider.get_tracer("rt4chart", rt4chart_version()))
