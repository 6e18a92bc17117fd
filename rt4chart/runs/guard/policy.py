"""What ``rt4 guard`` is started with and what it allows: the configuration, the policy (labels to
pass / flag / block), the per-request limits, and the refusal a request meets (:class:`RequestError`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rt4chart.options import AuditOptions
from rt4chart.types import AuditRecord, Label

Decision = Literal["pass", "flag", "block"]
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
TOKEN_ENV = "RT4_GUARD_TOKEN"
UPSTREAM_KEY_ENV = "RT4_UPSTREAM_API_KEY"


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
    def audit_options(self) -> AuditOptions:
        """The options every request is audited with: ``options``, but under a latency budget an ``auto``
        decomposer decomposes by rules. The budget bounds a cascade's later stages, not decomposition, and
        ``auto`` hands decomposition to the cascade's first stage that writes text, which behind a local
        judge that writes none (the embedded one) is the slow remote stage the budget is there to bound."""
        if self.limits.latency_budget_ms is not None and self.options.decomposer == "auto":
            return self.options.model_copy(update={"decomposer": "rules"})
        return self.options

    def check_request_budget(self, field: str, latency_budget_ms: float | None) -> None:
        """Refuse (422) a latency budget a request asks for in ``field`` when the judge is no cascade."""
        if latency_budget_ms is not None and not self.cascades:
            raise RequestError(422, f"{field}: bounds a cascade's later stages, and this judge is no cascade")

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
