"""``rt4 guard``: the audit as an HTTP service, called inline while answers are served.

Endpoints (JSON in, JSON out; errors are ``{"error": "..."}`` with a 4xx status):

- ``POST /v1/verify``: ``{"context", "question"?, "answer", "id"?, "language"?}`` -> ``{"decision",
  "record"}``, the record ``rt4 verify`` writes. With ``"stream": true`` the verdicts stream back
  as NDJSON events, one per answer sentence then the answer's. With ``Content-Type:
  application/x-ndjson`` the answer itself streams in: the first line is the request without the
  answer, each later line ``{"delta": "text"}``; a sentence is audited as soon as the next one has
  started (or the body ended).
- ``POST /v1/chat/completions`` (with an upstream): an OpenAI-compatible proxy that audits the reply.
- ``GET /health``; ``GET /metrics`` (Prometheus text format).

One judge stack (one cache, one budget) serves every request. The policy turns a record's labels
into ``pass``, ``flag`` or ``block``; a record the judge could not finish is never a silent pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import aiohttp
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rt4chart.judges.cascade import LatencyBudget, latency_budget
from rt4chart.judges.registry import JudgeStack, judge_stack
from rt4chart.method.joins import and_join, answer_hallucinated
from rt4chart.method.text import split_sentences
from rt4chart.options import AuditOptions
from rt4chart.protocol import BudgetExhausted, JudgeUnavailable
from rt4chart.records.io import dump_report
from rt4chart.runs.engine import Pipeline
from rt4chart.types import AuditRecord, ClaimVerdict, Label, Sample, Span, Usage, answer_sha256

Decision = Literal["pass", "flag", "block"]
ModelT = TypeVar("ModelT", bound=BaseModel)
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
TOKEN_ENV = "RT4_GUARD_TOKEN"
UPSTREAM_KEY_ENV = "RT4_UPSTREAM_API_KEY"
NDJSON = "application/x-ndjson"
ABORT_KEY: web.RequestKey[Callable[[int, str], Awaitable[web.StreamResponse]]] = web.RequestKey(
    "rt4chart.abort"
)  # ends a request's stream (status sent already) with an error event
LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class GuardConfigError(ValueError):
    """The service cannot start as configured (e.g. a public address without a token)."""


class GuardPolicy(BaseModel):
    """How a record becomes a decision: the worst rule that matches wins (block > flag > pass)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    block_on: frozenset[Label] = frozenset({Label.CONTRADICTED})
    """Labels that block the answer when the answer or any of its claims carries one."""
    flag_on: frozenset[Label] = frozenset({Label.BASELESS})
    """Labels that flag the answer (served, marked for review) when present and nothing blocks."""
    on_incomplete: Literal["flag", "block"] = "flag"
    """Decision for a record the judge could not finish (errors, open verdicts): never a pass."""
    block_message: str = "This answer was withheld: it contradicts its sources."
    """What the proxy serves instead of a blocked reply."""

    def decide(self, record: AuditRecord) -> Decision:
        labels = {record.label, *(claim.label for claim in record.claims)}
        if labels & self.block_on:
            return "block"
        if record.errors or record.incomplete or record.label is None:
            return self.on_incomplete
        return "flag" if labels & self.flag_on else "pass"


class GuardLimits(BaseModel):
    """What one request may ask of the service, and how many may wait."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    max_body_bytes: int = Field(default=1_000_000, ge=1)
    """Largest request body (HTTP 413 beyond it)."""
    max_sentences: int = Field(default=50, ge=1)
    """Answer sentences one request may have audited (HTTP 413 beyond it)."""
    max_claims: int = Field(default=200, ge=1)
    """Claims one request may have verified (HTTP 413 beyond it): counted once the answer is decomposed,
    before any claim is verified; a streamed answer's sentences count together."""
    latency_budget_ms: float | None = Field(default=None, gt=0)
    """Milliseconds a cascade judge's later stages may take per audited text (a whole answer, or one
    streamed sentence), counted from when the text reaches the judge; a request may ask for its own.
    Claims left open when it runs out keep an earlier stage's judgement, marked in the record, and the
    decision is at least ``on_incomplete``. ``None``: no bound. Cascade judges only."""
    timeout_s: float = Field(default=30.0, gt=0)
    """Seconds one request may take, streamed body included (HTTP 408 beyond it)."""
    max_in_flight: int = Field(default=4, ge=1)
    """Requests audited at once."""
    max_queued: int = Field(default=16, ge=0)
    """Requests waiting for an audit slot; one more is refused with 429 and Retry-After."""
    retry_after_s: int = Field(default=1, ge=1)
    """Seconds a refused client is told to wait."""
    shutdown_grace_s: float = Field(default=60.0, ge=0)
    """Seconds a shutdown waits for the requests in flight to finish."""


class GuardConfig(BaseModel):
    """Everything ``rt4 guard`` is started with."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    host: str = "127.0.0.1"
    """Address to bind; beyond loopback a token is required."""
    port: int = Field(default=8404, ge=0, le=65535)
    """Port to bind (0: any free one)."""
    judge: str | None = None
    """Judge spec as --judge takes it (default: the embedded judge)."""
    api_base: str | None = None
    """Base URL of the judge's OpenAI-compatible server, as rt4 verify --api-base takes it."""
    cache: str | None = None
    """Judge cache directory or redis:// URL shared by all requests (None: no cache)."""
    budget_usd: float | None = Field(default=None, ge=0)
    """Spend cap shared by all requests (None: none); a request past it gets a 503."""
    token: str | None = None
    """Bearer token every request but /health must carry."""
    upstream: str | None = None
    """OpenAI-compatible base URL (…/v1) that /v1/chat/completions forwards to."""
    upstream_key: str | None = None
    """Bearer key sent upstream (None: the client's Authorization header when the guard has no token)."""
    audit_log: Path | None = None
    """JSONL file every record is appended to (what rt4 diff and rt4 report read)."""
    policy: GuardPolicy = Field(default_factory=GuardPolicy)
    """Labels to decision."""
    limits: GuardLimits = Field(default_factory=GuardLimits)
    """Request limits and backpressure."""
    options: AuditOptions = Field(default_factory=AuditOptions)
    """The audit's options, as rt4 verify takes them."""

    def check(self) -> None:
        if self.host not in LOOPBACK_HOSTS and not self.token:
            raise GuardConfigError(f"binding {self.host} (beyond 127.0.0.1) needs a token: --token or {TOKEN_ENV}")
        if self.limits.latency_budget_ms is not None and not self.cascades:
            raise GuardConfigError("--latency-budget-ms bounds a cascade's later stages: it needs --judge cascade:...")

    @property
    def cascades(self) -> bool:
        """Whether the judge is a cascade (what a latency budget acts on)."""
        return (self.judge or "").startswith("cascade:")


class RequestError(Exception):
    """A request the service refuses: its HTTP status and a message for the client."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.headers = headers or {}


class VerifyRequest(BaseModel):
    """The body of ``POST /v1/verify`` (the first line of a streamed body, without ``answer``)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    id: str | None = None
    """Caller's id, copied to the record (default: a fresh one)."""
    context: str | list[str] = Field(min_length=1)
    """The retrieved context: one string or a list of passages."""
    question: str | None = None
    """The user question, if any."""
    answer: str = ""
    """The answer to audit (required unless the answer streams in)."""
    language: str | None = None
    """ISO 639-1 code of the answer (default: detected)."""
    stream: bool = False
    """Stream the verdicts back as NDJSON events."""
    latency_budget_ms: float | None = Field(default=None, gt=0)
    """This request's cascade latency budget (default: the service's ``--latency-budget-ms``)."""


class Delta(BaseModel):
    """A later line of a streamed body: the next piece of the answer."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    delta: str
    """Text appended to the answer."""


@dataclass
class Histogram:
    """A Prometheus histogram with fixed buckets."""

    buckets: tuple[float, ...] = LATENCY_BUCKETS_S
    counts: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS_S))
    total: float = 0.0
    observations: int = 0

    def observe(self, value: float) -> None:
        for position, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[position] += 1
        self.total += value
        self.observations += 1

    def lines(self, name: str) -> list[str]:
        out = [f'{name}_bucket{{le="{bound}"}} {count}' for bound, count in zip(self.buckets, self.counts, strict=True)]
        return [
            *out,
            f'{name}_bucket{{le="+Inf"}} {self.observations}',
            f"{name}_sum {self.total}",
            f"{name}_count {self.observations}",
        ]


@dataclass
class Metrics:
    """The service's counters, written by hand in Prometheus' text format."""

    latency: Histogram = field(default_factory=Histogram)
    decisions: Counter[str] = field(default_factory=Counter)
    responses: Counter[tuple[str, int]] = field(default_factory=Counter)
    in_flight: int = 0
    budget_cuts: int = 0

    def render(self, usage: Usage) -> str:
        lines = [
            "# HELP rt4_guard_audit_seconds Seconds from request to answer verdict.",
            "# TYPE rt4_guard_audit_seconds histogram",
            *self.latency.lines("rt4_guard_audit_seconds"),
            "# HELP rt4_guard_decisions_total Answer decisions by kind.",
            "# TYPE rt4_guard_decisions_total counter",
            *(
                f'rt4_guard_decisions_total{{decision="{kind}"}} {self.decisions[kind]}'
                for kind in ("pass", "flag", "block")
            ),
            "# HELP rt4_guard_responses_total Responses by endpoint and HTTP status.",
            "# TYPE rt4_guard_responses_total counter",
            *(
                f'rt4_guard_responses_total{{path="{path}",status="{status}"}} {n}'
                for (path, status), n in sorted(self.responses.items())
            ),
            "# HELP rt4_guard_in_flight Requests admitted (audited or queued).",
            "# TYPE rt4_guard_in_flight gauge",
            f"rt4_guard_in_flight {self.in_flight}",
            "# HELP rt4_guard_latency_budget_cuts_total Audits whose cascade latency budget ran out.",
            "# TYPE rt4_guard_latency_budget_cuts_total counter",
            f"rt4_guard_latency_budget_cuts_total {self.budget_cuts}",
            "# HELP rt4_guard_judge_calls_total Judge calls made (cache hits included).",
            "# TYPE rt4_guard_judge_calls_total counter",
            f"rt4_guard_judge_calls_total {usage.calls}",
            "# HELP rt4_guard_judge_cache_hits_total Judge calls answered by the cache.",
            "# TYPE rt4_guard_judge_cache_hits_total counter",
            f"rt4_guard_judge_cache_hits_total {usage.cache_hits}",
            "# HELP rt4_guard_judge_cost_usd_total Judge spend in USD.",
            "# TYPE rt4_guard_judge_cost_usd_total counter",
            f"rt4_guard_judge_cost_usd_total {usage.cost_usd}",
        ]
        return "\n".join(lines) + "\n"


def merge_sentence_records(request_id: str, answer: str, parts: list[tuple[int, AuditRecord]]) -> AuditRecord:
    """One answer record from the records of its sentences audited one by one (``parts``: each
    sentence's start offset in ``answer`` and its record): claims renumbered, spans moved to the
    answer's offsets, the answer label joined over every claim as the pipeline joins them."""
    claims: list[ClaimVerdict] = []
    spans: list[Span] = []
    usage = Usage()
    usage_by_judge: dict[str, Usage] = {}
    errors: list[str] = []
    for sentence_index, (start, record) in enumerate(parts):
        for claim in record.claims:
            span = (
                Span(start=start + claim.answer_span.start, end=start + claim.answer_span.end)
                if claim.answer_span
                else None
            )
            claims.append(
                claim.model_copy(update={"index": len(claims), "sentence_index": sentence_index, "answer_span": span})
            )
        spans.extend(Span(start=start + span.start, end=start + span.end) for span in record.spans)
        usage = usage + record.usage
        for judge, spent in record.usage_by_judge.items():
            usage_by_judge[judge] = usage_by_judge.get(judge, Usage()) + spent
        errors.extend(record.errors)
    labels = [claim.label for claim in claims] if claims else [record.label for _, record in parts]
    first = parts[0][1] if parts else AuditRecord(id=request_id, line=1)
    return first.model_copy(
        update={
            "id": request_id,
            "label": and_join(labels) if parts else None,
            "hallucinated": answer_hallucinated(labels) if parts else None,
            "claims": claims,
            "spans": spans,
            "usage": usage,
            "usage_by_judge": usage_by_judge,
            "errors": errors if parts else ["the answer has no sentence to verify"],
            "incomplete": any(record.incomplete for _, record in parts),
            "decomposition": None,
            "answer_sha256": answer_sha256(answer),
        }
    )


@dataclass
class ClaimAllowance:
    """The claims one request may have verified; the sentences of a streamed answer share it."""

    limit: int
    drawn: int = 0

    def admit(self, claims: int) -> None:
        """Count ``claims`` more, refusing the request (413) once they pass the limit."""
        self.drawn += claims
        if self.drawn > self.limit:
            raise RequestError(413, f"the answer has {self.drawn} claims or more, over --max-claims {self.limit}")


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


@dataclass
class SentenceVerdict:
    """One answer sentence and its audit, as a stream event."""

    index: int
    start: int
    end: int
    text: str
    record: AuditRecord
    decision: Decision

    def event(self) -> dict[str, Any]:
        return {
            "event": "sentence",
            "index": self.index,
            "start": self.start,
            "end": self.end,
            "text": self.text,
            "label": self.record.label,
            "decision": self.decision,
            "record": self.record.model_dump(mode="json"),
        }


class StreamingAudit:
    """Audits an answer while it arrives: ``feed`` text, each sentence is handed to the judge as soon
    as the next one has started (or ``finish`` ends the answer), the sentences are audited
    concurrently, and ``emit`` gets each verdict in answer order as soon as it and those before it
    are in. With ``stop_on_block``, nothing is emitted after a blocked sentence."""

    def __init__(
        self,
        guard: Guard,
        request_id: str,
        context: str | list[str],
        question: str | None,
        language: str | None,
        emit: Callable[[SentenceVerdict], Awaitable[None]],
        *,
        stop_on_block: bool = False,
        latency_budget_ms: float | None = None,
    ) -> None:
        self.guard = guard
        self.latency_budget_ms = latency_budget_ms
        self.allowance = ClaimAllowance(guard.config.limits.max_claims)
        self.request_id = request_id
        self.context = context
        self.question = question
        self.language = language
        self.answer = ""
        self.verdicts: list[SentenceVerdict] = []
        """The verdicts emitted, in answer order."""
        self.blocked = asyncio.Event()
        """Set once a sentence is blocked."""
        self._settled = 0  # answer offset up to which sentences were handed to the judge
        self._tasks: list[asyncio.Task[AuditRecord]] = []
        self._queue: asyncio.Queue[tuple[int, str, asyncio.Task[AuditRecord]] | None] = asyncio.Queue()
        self._emitter = asyncio.create_task(self._emit_in_order(emit, stop_on_block))

    def feed(self, text: str) -> None:
        self.answer += text
        self._split(final=False)

    def finish(self) -> None:
        self._split(final=True)
        self._queue.put_nowait(None)

    async def drain(self) -> None:
        """Wait until every verdict is emitted (after :meth:`finish`, or a block)."""
        await self._emitter

    def cancel(self) -> None:
        for task in [*self._tasks, self._emitter]:
            task.cancel()

    def _split(self, *, final: bool) -> None:
        limit = self.guard.config.limits.max_sentences
        sentences = split_sentences(self.answer[self._settled :], language=self.language or "en")
        complete = sentences if final else sentences[:-1]
        for sentence in complete:
            if len(self._tasks) >= limit:
                raise RequestError(413, f"the answer has more than {limit} sentences (--max-sentences)")
            sample = Sample(
                id=f"{self.request_id}#{len(self._tasks)}",
                context=self.context,
                question=self.question,
                answer=sentence.text,
                language=self.language,
            )
            task = asyncio.create_task(self.guard.audit(sample, self.allowance, self.latency_budget_ms))
            self._tasks.append(task)
            self._queue.put_nowait((self._settled + sentence.start, sentence.text, task))
        if complete:
            self._settled += complete[-1].end if final else sentences[-1].start

    async def _emit_in_order(self, emit: Callable[[SentenceVerdict], Awaitable[None]], stop_on_block: bool) -> None:
        while (pending := await self._queue.get()) is not None:
            start, text, task = pending
            record = await task
            decision = self.guard.config.policy.decide(record)
            verdict = SentenceVerdict(len(self.verdicts), start, start + len(text), text, record, decision)
            self.verdicts.append(verdict)
            await emit(verdict)
            if decision == "block":
                self.blocked.set()
                if stop_on_block:
                    return

    async def answer_event(self, started: float) -> dict[str, Any]:
        """The answer's verdict over the sentences emitted: logged, counted, as a stream event."""
        record = merge_sentence_records(self.request_id, self.answer, [(v.start, v.record) for v in self.verdicts])
        decision = await self.guard.conclude(record, started)
        return {
            "event": "answer",
            "label": record.label,
            "decision": decision,
            "record": record.model_dump(mode="json"),
        }


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
        self._http: aiohttp.ClientSession | None = None
        self.draining = False
        """Set when shutting down: new requests get 503, the ones in flight finish."""

    @property
    def pipeline(self) -> Pipeline:
        if self._pipeline is None:
            raise RuntimeError("the guard is not started")
        return self._pipeline

    async def start(self, _app: web.Application) -> None:
        self._stack = judge_stack(
            self.config.judge, api_base=self.config.api_base, cache=self.config.cache, budget_usd=self.config.budget_usd
        )
        self._pipeline = Pipeline(self._stack, self.config.options)
        if self.config.upstream:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.config.limits.timeout_s))

    async def stop(self, _app: web.Application) -> None:
        if self._http is not None:
            await self._http.close()
        if self._stack is not None:
            await self._stack.aclose()

    async def audit(
        self, sample: Sample, allowance: ClaimAllowance | None = None, latency_budget_ms: float | None = None
    ) -> AuditRecord:
        """Audit one text under the request's claim allowance and latency budget (default: the service's)."""
        limits = self.config.limits
        allowance = allowance or ClaimAllowance(limits.max_claims)
        budget_ms = latency_budget_ms or limits.latency_budget_ms
        with latency_budget(None if budget_ms is None else budget_ms / 1000) as budget:
            record = await self.pipeline.verify_sample(sample, admit_claims=allowance.admit)
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
                return _error_response(refusal)
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
        first = self._verify_request(await _read_json(request))
        if not first.answer.strip():
            raise RequestError(422, "answer: give a non-empty answer (or stream it as NDJSON deltas)")
        request_id = first.id or uuid.uuid4().hex
        if first.stream:
            response, audit = await self._open_ndjson(request, first)
            return await self._stream_ndjson(request, response, audit, _deltas(first.answer, None), started)
        sentences = split_sentences(first.answer, language=first.language or "en")
        if len(sentences) > self.config.limits.max_sentences:
            raise RequestError(
                413,
                f"the answer has {len(sentences)} sentences, over --max-sentences {self.config.limits.max_sentences}",
            )
        sample = Sample(
            id=request_id, context=first.context, question=first.question, answer=first.answer, language=first.language
        )
        record = await self.audit(sample, latency_budget_ms=first.latency_budget_ms)
        decision = await self.conclude(record, started)
        return web.json_response({"decision": decision, "record": record.model_dump(mode="json")})

    def _verify_request(self, data: Any) -> VerifyRequest:
        first = _parse(VerifyRequest, data)
        if first.latency_budget_ms is not None and not self.config.cascades:
            raise RequestError(422, "latency_budget_ms: bounds a cascade's later stages, and this judge is no cascade")
        return first

    async def _verify_ndjson(self, request: web.Request, started: float) -> web.StreamResponse:
        lines = _body_lines(request, self.config.limits.max_body_bytes)
        head = await anext(lines, None)
        if head is None:
            raise RequestError(422, "an NDJSON body starts with the request line (context, question, ...)")
        first = self._verify_request(_loads(head, 1))
        response, audit = await self._open_ndjson(request, first)
        return await self._stream_ndjson(request, response, audit, _deltas(first.answer, lines), started)

    async def _open_ndjson(
        self, request: web.Request, first: VerifyRequest
    ) -> tuple[web.StreamResponse, StreamingAudit]:
        """Send the status of a streamed verify and start its audit, verdicts written as they come."""
        response = web.StreamResponse(headers={"Content-Type": NDJSON})
        await response.prepare(request)

        async def emit(verdict: SentenceVerdict) -> None:
            await _write_event(response, verdict.event())

        request_id = first.id or uuid.uuid4().hex
        audit = StreamingAudit(
            self, request_id, first.context, first.question, first.language, emit,
            latency_budget_ms=first.latency_budget_ms,
        )

        async def abort(status: int, message: str) -> web.StreamResponse:
            audit.cancel()
            await _write_event(response, {"event": "error", "status": status, "error": message})
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
        await _write_event(response, await audit.answer_event(started))
        await response.write_eof()
        return response

    # --- /v1/chat/completions ----------------------------------------------------------------

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        body = await _read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            raise RequestError(422, "messages: a chat completion request needs a list of messages")
        context = chat_context(body)
        question = last_user_message(body["messages"])
        forwarded = {key: value for key, value in body.items() if key != "rt4_context"}
        headers = {"Content-Type": "application/json"}
        key = self.config.upstream_key
        if key is None and self.config.token is None and "Authorization" in request.headers:
            headers["Authorization"] = request.headers["Authorization"]
        elif key is not None:
            headers["Authorization"] = f"Bearer {key}"
        assert self._http is not None and self.config.upstream is not None
        url = self.config.upstream.rstrip("/") + "/chat/completions"
        try:
            upstream = await self._http.post(url, json=forwarded, headers=headers)
        except aiohttp.ClientError as error:
            raise RequestError(502, f"the upstream {self.config.upstream} did not answer: {error}") from None
        try:
            if upstream.status != 200:
                return web.Response(
                    status=upstream.status, body=await upstream.read(), content_type=upstream.content_type
                )
            if forwarded.get("stream"):
                return await self._proxy_stream(request, upstream, context, question, started)
            reply = await upstream.json()
        finally:
            upstream.release()
        answer = reply["choices"][0]["message"].get("content") or ""
        sample = Sample(id=str(reply.get("id") or uuid.uuid4().hex), context=context, question=question, answer=answer)
        record = await self.audit(sample)
        decision = await self.conclude(record, started)
        if decision == "block":
            reply["choices"][0]["message"]["content"] = self.config.policy.block_message
            reply["choices"][0]["finish_reason"] = "content_filter"
        reply["rt4chart"] = {"decision": decision, "label": record.label, "record": record.model_dump(mode="json")}
        return web.json_response(
            reply, headers={"X-Rt4chart-Decision": decision, "X-Rt4chart-Label": str(record.label)}
        )

    async def _proxy_stream(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        context: str | list[str],
        question: str | None,
        started: float,
    ) -> web.StreamResponse:
        """Pass the upstream's events through byte for byte; a verdict event follows each sentence as
        soon as it is judged; a blocked sentence ends the reply (finish_reason content_filter)."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        envelope: dict[str, Any] = {"object": "chat.completion.chunk", "choices": []}
        writing = asyncio.Lock()  # an upstream event and a verdict event never interleave

        async def emit(verdict: SentenceVerdict) -> None:
            async with writing:
                await response.write(_sse({**envelope, "rt4chart": verdict.event()}))

        audit = StreamingAudit(self, uuid.uuid4().hex, context, question, None, emit, stop_on_block=True)

        async def abort(status: int, message: str) -> web.StreamResponse:
            audit.cancel()
            await response.write(_sse({**envelope, "rt4chart": {"event": "error", "status": status, "error": message}}))
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response

        request[ABORT_KEY] = abort

        async def pass_through() -> None:
            async for event in _sse_events(upstream.content):
                data = _sse_data(event)
                if data == "[DONE]":
                    break
                async with writing:
                    await response.write(event)  # the upstream's bytes, unchanged
                if data is not None:
                    chunk = json.loads(data)
                    envelope.update({key: chunk[key] for key in ("id", "created", "model") if key in chunk})
                    for choice in chunk.get("choices") or []:
                        audit.feed((choice.get("delta") or {}).get("content") or "")
            audit.finish()

        passing = asyncio.create_task(pass_through())
        blocking = asyncio.create_task(audit.blocked.wait())
        try:
            # A blocked sentence stops the pass-through at once, even while the upstream is silent.
            await asyncio.wait({passing, blocking}, return_when=asyncio.FIRST_COMPLETED)
            if passing.done():
                passing.result()  # a RequestError (too many sentences) ends the stream below
                await audit.drain()
        except RequestError as error:
            return await abort(error.status, str(error))
        finally:
            passing.cancel()
            blocking.cancel()
        if audit.blocked.is_set():
            upstream.close()  # the rest of the reply is not wanted
            audit.cancel()
            stop = {**envelope, "choices": [{"index": 0, "delta": {}, "finish_reason": "content_filter"}]}
            async with writing:
                await response.write(_sse(stop))
        answer = await audit.answer_event(started)
        await response.write(_sse({**envelope, "rt4chart": answer}))
        await response.write(b"data: [DONE]\n\n")
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
        if self.config.upstream:
            app.router.add_post("/v1/chat/completions", self.guarded(self.chat_completions))
        return app


def chat_context(body: dict[str, Any]) -> list[str]:
    """The context of a chat request: its ``rt4_context`` (a string or a list of passages) when it
    has one, else the content of its system and tool messages, one passage each."""
    explicit = body.get("rt4_context")
    if explicit is not None:
        if isinstance(explicit, str) and explicit.strip():
            return [explicit]
        if isinstance(explicit, list) and explicit and all(isinstance(p, str) for p in explicit):
            return list(explicit)
        raise RequestError(422, "rt4_context: a non-empty string or list of strings")
    passages = [
        _text(m.get("content")) for m in body["messages"] if isinstance(m, dict) and m.get("role") in {"system", "tool"}
    ]
    passages = [p for p in passages if p.strip()]
    if not passages:
        raise RequestError(422, "no context to audit against: give rt4_context or system/tool messages")
    return passages


def last_user_message(messages: list[Any]) -> str | None:
    users = [_text(m.get("content")) for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    return users[-1] if users else None


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            part.get("text", "") for part in content if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


async def _sse_events(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """An event stream's events as they arrive, each with its lines and the blank line ending it."""
    event = b""
    async for line in content:
        event += line
        if not line.strip():
            if event.strip():
                yield event
            event = b""
    if event.strip():
        yield event


def _sse_data(event: bytes) -> str | None:
    """The data of an event (its ``data:`` lines joined), ``None`` without any."""
    lines = [line[5:].strip() for line in event.decode("utf-8").splitlines() if line.startswith("data:")]
    return "\n".join(lines) if lines else None


def _error_response(error: RequestError) -> web.Response:
    """A refused request as JSON, in the OpenAI API's error shape (its SDK shows the message)."""
    body = {"error": {"message": str(error), "type": "rt4chart_guard", "code": error.status}}
    return web.json_response(body, status=error.status, headers=error.headers)


def _sse(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


async def _deltas(first: str, lines: AsyncIterator[str] | None) -> AsyncIterator[str]:
    """The pieces of a streamed answer: the request's own ``answer``, then each NDJSON delta line."""
    yield first
    if lines is None:
        return
    number = 1
    async for line in lines:
        number += 1
        yield _parse(Delta, _loads(line, number)).delta


async def _write_event(response: web.StreamResponse, event: dict[str, Any]) -> None:
    await response.write(json.dumps(event, default=str).encode() + b"\n")


async def _body_lines(request: web.Request, max_bytes: int) -> AsyncIterator[str]:
    """The non-blank lines of a streamed body as they arrive, refusing a body over ``max_bytes``."""
    read = 0
    async for raw in request.content:
        read += len(raw)
        if read > max_bytes:
            raise RequestError(413, f"request body over {max_bytes} bytes (--max-body-bytes)")
        if raw.strip():
            yield raw.decode("utf-8")


async def _read_json(request: web.Request) -> Any:
    try:
        return await request.json()
    except json.JSONDecodeError as error:
        raise RequestError(400, f"the body is not JSON: {error}") from None


def _loads(line: str, number: int) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as error:
        raise RequestError(400, f"NDJSON line {number} is not JSON: {error}") from None


def _parse(model: type[ModelT], data: Any) -> ModelT:
    try:
        return model.model_validate(data)
    except ValidationError as error:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in error.errors())
        raise RequestError(422, problems) from None


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
