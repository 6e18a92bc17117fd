"""The service: one judge stack and pipeline for every request, admission (auth, backpressure, time
limit, JSON refusals), ``/v1/verify``, ``/health``, ``/metrics``, and starting and draining it."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from rt4chart.judges.cascade import LatencyBudget, latency_budget
from rt4chart.judges.registry import JudgeStack, judge_stack
from rt4chart.languages import load_detector
from rt4chart.method.text import split_sentences
from rt4chart.protocol import BudgetExhausted, JudgeUnavailable
from rt4chart.records.io import dump_report
from rt4chart.runs.engine import Pipeline
from rt4chart.runs.guard.messages import (
    ABORT_KEY,
    NDJSON,
    VerifyRequest,
    answer_deltas,
    body_lines,
    error_response,
    loads_line,
    parse_body,
    read_json,
    write_event,
)
from rt4chart.runs.guard.metrics import Metrics
from rt4chart.runs.guard.policy import ClaimAllowance, Decision, GuardConfig, RequestError
from rt4chart.runs.guard.proxy import ChatProxy
from rt4chart.runs.guard.streaming import SentenceVerdict, StreamingAudit
from rt4chart.runs.telemetry import start_tracing
from rt4chart.types import AuditRecord, Sample, Usage


def note_budget_cuts(record: AuditRecord, budget: LatencyBudget) -> AuditRecord:
    """The record with the claims a cascade left unconfirmed when its latency budget ran out marked:
    each such claim's errors say which judgement stands and which stage was not heard, and the record's
    errors count them, so the policy never passes the answer silently."""
    claims = [
        claim.model_copy(update={"errors": [*claim.errors, budget.cut[claim.text]]})
        if claim.text in budget.cut
        else claim
        for claim in record.claims
    ]
    cut = sum(claim.text in budget.cut for claim in record.claims)
    note = (
        f"latency budget of {budget.seconds * 1000:g} ms spent: {cut} claims not settled by the cascade's later "
        "stages (see their errors)"
    )
    return record.model_copy(update={"claims": claims, "errors": [*record.errors, note]})


class Guard:
    """The service: one judge stack and pipeline for every request, the policy, the limits."""

    def __init__(self, config: GuardConfig) -> None:
        config.check()
        self.config = config
        self.metrics = Metrics()
        self._stack: JudgeStack | None = None
        self._pipeline: Pipeline | None = None
        self._slots = asyncio.Semaphore(config.limits.max_in_flight)
        self._audit_lock = asyncio.Lock()
        self._records = 0
        self._proxy = ChatProxy(self) if config.upstream else None
        self._tracing = start_tracing()  # configured without the otel extra: TelemetryUnavailable, before serving
        self.draining = False
        """Set when shutting down: new requests get 503, the ones in flight finish."""

    @property
    def pipeline(self) -> Pipeline:
        if self._pipeline is None:
            raise RuntimeError("the guard is not started")
        return self._pipeline

    async def start(self, _app: web.Application) -> None:
        # Loaded here, off the event loop, so that no request pays for it (see load_detector).
        await asyncio.to_thread(load_detector)
        self._stack = judge_stack(
            self.config.judge, api_base=self.config.api_base, cache=self.config.cache, budget_usd=self.config.budget_usd
        )
        if self._tracing is not None:  # a span per judge call, under its answer's
            self._stack.inner = self._tracing.traced(self._stack.inner)
        self._pipeline = Pipeline(self._stack, self.config.audit_options)
        if self._proxy is not None:
            await self._proxy.start()

    async def stop(self, _app: web.Application) -> None:
        if self._proxy is not None:
            await self._proxy.close()
        if self._stack is not None:
            await self._stack.aclose()
        if self._tracing is not None:
            await self._tracing.shutdown()

    async def audit(
        self, sample: Sample, allowance: ClaimAllowance | None = None, latency_budget_ms: float | None = None
    ) -> AuditRecord:
        """Audit one text under the request's claim allowance and latency budget (default: the service's)."""
        limits = self.config.limits
        allowance = allowance or ClaimAllowance(limits.max_claims)
        budget_ms = latency_budget_ms or limits.latency_budget_ms
        with latency_budget(None if budget_ms is None else budget_ms / 1000) as budget:
            if self._tracing is None:
                record = await self.pipeline.verify_sample(sample, admit_claims=allowance.admit)
            else:
                record = await self._tracing.answer(
                    sample, lambda: self.pipeline.verify_sample(sample, admit_claims=allowance.admit))
        if budget is None or not budget.cut:
            return record
        self.metrics.budget_cuts += 1
        return note_budget_cuts(record, budget)

    async def conclude(self, record: AuditRecord, started: float) -> Decision:
        """Decide, count and log one answer's record."""
        decision = self.config.policy.decide(record)
        self.metrics.decisions[decision] += 1
        self.metrics.latency.observe(time.perf_counter() - started)
        if self.config.audit_log is not None:
            async with self._audit_lock:
                self._records += 1
                line = dump_report(record.model_copy(update={"line": self._records}))
                # One short append per record: a crash loses at most the record being written.
                with self.config.audit_log.open("a", encoding="utf-8") as log:
                    log.write(line + "\n")
        return decision

    def usage(self) -> Usage:
        return self._stack.ledger.usage if self._stack is not None else Usage()

    # --- admission -------------------------------------------------------------------------

    def _admit(self) -> None:
        limits = self.config.limits
        if self.draining:
            raise RequestError(503, "the service is shutting down", {"Retry-After": str(limits.retry_after_s)})
        if self.metrics.in_flight >= limits.max_in_flight + limits.max_queued:
            raise RequestError(
                429,
                f"{self.metrics.in_flight} requests in flight or queued (--max-in-flight {limits.max_in_flight}, "
                f"--max-queued {limits.max_queued}): retry later",
                {"Retry-After": str(limits.retry_after_s)},
            )
        self.metrics.in_flight += 1

    def _authorize(self, request: web.Request) -> None:
        if self.config.token is None:
            return
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.config.token}".encode()):
            raise RequestError(
                401, "missing or wrong bearer token (Authorization: Bearer ...)", {"WWW-Authenticate": "Bearer"}
            )

    def guarded(
        self, handler: Callable[[web.Request], Awaitable[web.StreamResponse]], *, admit: bool = True
    ) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        """The handler behind auth, admission, the time limit and JSON errors."""

        async def run(request: web.Request) -> web.StreamResponse:
            status = 500
            admitted = False
            try:
                try:
                    if request.path != "/health":
                        self._authorize(request)
                    if not admit:
                        response = await handler(request)
                    else:
                        self._admit()
                        admitted = True
                        async with asyncio.timeout(self.config.limits.timeout_s), self._slots:
                            response = await handler(request)
                    status = response.status
                    return response
                except RequestError as error:
                    refusal = error
                except TimeoutError:
                    refusal = RequestError(
                        408, f"the request took longer than {self.config.limits.timeout_s} s (--timeout)"
                    )
                except web.HTTPRequestEntityTooLarge:
                    limit = self.config.limits.max_body_bytes
                    refusal = RequestError(413, f"request body over {limit} bytes (--max-body-bytes)")
                except (BudgetExhausted, JudgeUnavailable) as error:
                    # The shared budget is spent or the judge is down: no verdict, never a silent pass.
                    retry = {"Retry-After": str(self.config.limits.retry_after_s)}
                    refusal = RequestError(503, f"no verdict: {error}", retry)
                status = refusal.status
                abort: Callable[[int, str], Awaitable[web.StreamResponse]] | None = request.get(ABORT_KEY)
                if abort is not None:
                    # The status is sent already: the refusal is the stream's last event.
                    return await abort(refusal.status, str(refusal))
                return error_response(refusal)
            finally:
                if admitted:
                    self.metrics.in_flight -= 1
                self.metrics.responses[(request.path, status)] += 1

        return run

    # --- /v1/verify --------------------------------------------------------------------------

    async def verify(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        if request.content_type == NDJSON:
            return await self._verify_ndjson(request, started)
        first, sample = self._verify_request(await read_json(request))
        if not sample.answer.strip():
            raise RequestError(422, "answer: give a non-empty answer (or stream it as NDJSON deltas)")
        if first.stream:
            response, audit = await self._open_ndjson(request, first, sample)
            return await self._stream_ndjson(request, response, audit, answer_deltas(sample.answer, None), started)
        sentences = split_sentences(sample.answer, language=sample.language or "en")
        if len(sentences) > self.config.limits.max_sentences:
            raise RequestError(
                413,
                f"the answer has {len(sentences)} sentences, over --max-sentences {self.config.limits.max_sentences}",
            )
        record = await self.audit(sample, latency_budget_ms=first.latency_budget_ms)
        decision = await self.conclude(record, started)
        return web.json_response({"decision": decision, "record": record.model_dump(mode="json")})

    def _verify_request(self, data: Any) -> tuple[VerifyRequest, Sample]:
        first = parse_body(VerifyRequest, data)
        self.config.check_request_budget("latency_budget_ms", first.latency_budget_ms)
        return first, first.sample(uuid.uuid4().hex if first.id is None else str(first.id))

    async def _verify_ndjson(self, request: web.Request, started: float) -> web.StreamResponse:
        lines = body_lines(request, self.config.limits.max_body_bytes)
        head = await anext(lines, None)
        if head is None:
            raise RequestError(422, "an NDJSON body starts with the request line (context, question, ...)")
        first, sample = self._verify_request(loads_line(head, 1))
        if sample.messages is not None:
            raise RequestError(422, "messages: a conversation's answer is its assistant message, it does not stream in")
        response, audit = await self._open_ndjson(request, first, sample)
        return await self._stream_ndjson(request, response, audit, answer_deltas(sample.answer, lines), started)

    async def _open_ndjson(
        self, request: web.Request, first: VerifyRequest, sample: Sample
    ) -> tuple[web.StreamResponse, StreamingAudit]:
        """Send the status of a streamed verify and start its audit, verdicts written as they come."""
        response = web.StreamResponse(headers={"Content-Type": NDJSON})
        await response.prepare(request)

        async def emit(verdict: SentenceVerdict) -> None:
            await write_event(response, verdict.event())

        audit = StreamingAudit(self, sample, emit, latency_budget_ms=first.latency_budget_ms)

        async def abort(status: int, message: str) -> web.StreamResponse:
            audit.cancel()
            await write_event(response, {"event": "error", "status": status, "error": message})
            await response.write_eof()
            return response

        request[ABORT_KEY] = abort
        return response, audit

    async def _stream_ndjson(
        self,
        request: web.Request,
        response: web.StreamResponse,
        audit: StreamingAudit,
        deltas: AsyncIterator[str],
        started: float,
    ) -> web.StreamResponse:
        """Feed the audit the rest of the answer, then write the answer's verdict last."""
        try:
            async for delta in deltas:
                audit.feed(delta)
            audit.finish()
            await audit.drain()
        except RequestError as error:
            # The status is sent already: the error is the stream's last event.
            abort: Callable[[int, str], Awaitable[web.StreamResponse]] = request[ABORT_KEY]
            return await abort(error.status, str(error))
        await write_event(response, await audit.answer_event(started))
        await response.write_eof()
        return response

    # --- /health, /metrics -------------------------------------------------------------------

    async def health(self, _request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {
                "status": "draining" if self.draining else "ok",
                "judge": self.pipeline.judge_name,
                "in_flight": self.metrics.in_flight,
            },
            status=503 if self.draining else 200,
        )

    async def prometheus(self, _request: web.Request) -> web.StreamResponse:
        return web.Response(text=self.metrics.render(self.usage()), content_type="text/plain", charset="utf-8")

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.limits.max_body_bytes)
        app.on_startup.append(self.start)
        app.on_cleanup.append(self.stop)
        app.router.add_post("/v1/verify", self.guarded(self.verify))
        app.router.add_get("/health", self.guarded(self.health, admit=False))
        app.router.add_get("/metrics", self.guarded(self.prometheus, admit=False))
        if self._proxy is not None:
            app.router.add_post("/v1/chat/completions", self.guarded(self._proxy.chat_completions))
        return app


@dataclass
class RunningGuard:
    """A started service: its address, and how to stop it (finishing the requests in flight)."""

    runner: web.AppRunner
    guard: Guard
    url: str

    async def stop(self) -> None:
        """Stop listening, let the requests in flight finish (streamed bodies included) within the
        grace period, then close. aiohttp's own shutdown stops reading request bodies at once, which
        would cut an answer still streaming in: the guard drains its requests before it."""
        self.guard.draining = True
        for site in list(self.runner.sites):
            await site.stop()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.guard.config.limits.shutdown_grace_s):
                while self.guard.metrics.in_flight:
                    await asyncio.sleep(0.05)
        await self.runner.cleanup()


async def start_guard(config: GuardConfig) -> RunningGuard:
    """Start the service in the running event loop (port 0: a free one) and return its address."""
    guard = Guard(config)
    runner = web.AppRunner(guard.app(), shutdown_timeout=config.limits.shutdown_grace_s, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    port = runner.addresses[0][1]
    host = f"[{config.host}]" if ":" in config.host else config.host
    return RunningGuard(runner, guard, f"http://{host}:{port}")


async def serve(config: GuardConfig, on_ready: Callable[[str], None]) -> None:
    """Run the service until SIGINT/SIGTERM, then stop accepting and finish the requests in flight."""
    import signal

    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    running = await start_guard(config)
    on_ready(running.url)
    await stopping.wait()
    await running.stop()
