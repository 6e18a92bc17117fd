"""Grounding assertions for test suites: a failing test says which claim is unsupported and where
the context says otherwise.

>>> from rt4chart.testing.asserts import assert_grounded
>>> assert_grounded(answer, context, question, judge="scripted:rules.json")

:func:`assert_grounded` / :func:`aassert_grounded` raise :class:`GroundingError` (an
``AssertionError``) listing each failing claim with its label, the judge's rationale, the evidence
quote and where it sits in the context (the terminal view of ``rt4 show``, as plain text); they
return the record when the answer passes. :func:`check_grounded` / :func:`acheck_grounded` return
the record without judging it. A judge that cannot be reached or refuses is not a finding: it
raises :class:`~rt4chart.protocol.JudgeUnavailable`, or :class:`JudgeFailed` when its
failures left the verdict open; a budget stop raises :class:`~rt4chart.protocol.BudgetExhausted`
(:class:`SessionBudgetStop` for the test session's budget).
The pytest plugin (:mod:`rt4chart.testing.pytest_plugin`) reports the first two as test errors and skips
on the third.

Event loops: the sync functions work inside a running loop (a pytest-asyncio test, a Jupyter
cell): the audit then runs on a worker thread with an event loop of its own, and the calling
thread waits for it; no ``nest_asyncio``. Inside a pytest session the plugin's judge lives on one
event loop of its own, on a thread of its own (:class:`AuditSession`), for the whole session, so a
judge's HTTP clients are never shared between loops and are closed on the loop that opened them:
the sync and async functions both hand their audit to that loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import io
import json
import threading
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console, RenderableType
from rich.padding import Padding
from rich.text import Text

import rt4chart
from rt4chart.judges.budget import Ledger
from rt4chart.judges.registry import JudgeStack, judge_stack
from rt4chart.options import FailOn
from rt4chart.protocol import Backend, BudgetExhausted
from rt4chart.report.audited import AuditedSample
from rt4chart.report.tables import support_score
from rt4chart.report.terminal_view import claim_lines
from rt4chart.types import AuditRecord, ClaimVerdict, Label, Sample, Usage

T = TypeVar("T")

MESSAGE_WIDTH = 120
"""Columns of the failure message (the terminal view wraps to them)."""

_FAILING_LABELS: dict[FailOn, frozenset[Label]] = {
    FailOn.HALLUCINATED: frozenset({Label.CONTRADICTED, Label.BASELESS}),
    FailOn.CONTRADICTED: frozenset({Label.CONTRADICTED}),
}
"""Which final claim labels fail an assertion under each policy."""


class GroundingError(AssertionError):
    """An answer's claims are not grounded in its context (the assertion's failure)."""

    def __init__(self, message: str, report: AuditRecord, failing: list[ClaimVerdict]) -> None:
        super().__init__(message)
        self.report = report
        """The audit's record."""
        self.failing = failing
        """The claims that fail the assertion's policy."""


class SessionBudgetStop(BudgetExhausted):
    """The test session's budget (``--rt4-budget``) refused an audit: the plugin skips the test.
    A budget of a test's own (``rt4chart.verify(..., budget=)``) raises plain
    :class:`BudgetExhausted`, which fails the test like any other exception."""


class JudgeFailed(RuntimeError):
    """The judge's failures (errors, unparseable replies) left the verdict open: not a finding."""

    def __init__(self, report: AuditRecord) -> None:
        errors = "; ".join([*report.errors, *(e for claim in report.claims for e in claim.errors)][:5])
        super().__init__(f"judge {report.judge or '(unknown)'} left the verdict open: {errors or 'no verdict'}")
        self.report = report


def failing_labels(fail_on: FailOn | str) -> frozenset[Label]:
    """The final claim labels that fail an assertion under ``fail_on`` (ValueError for a policy
    an assertion cannot have, such as ``never``)."""
    labels = _FAILING_LABELS.get(FailOn(fail_on)) if fail_on in set(FailOn) else None
    if labels is None:
        raise ValueError(f"fail_on must be one of {', '.join(sorted(_FAILING_LABELS))} (got {fail_on!r})")
    return labels


def failing_claims(report: AuditRecord, fail_on: FailOn | str = FailOn.HALLUCINATED) -> list[ClaimVerdict]:
    """The claims of ``report`` whose final label fails the ``fail_on`` policy."""
    labels = failing_labels(fail_on)
    return [claim for claim in report.claims if claim.label in labels]


def _marked(text: Text) -> Text:
    """``text`` with each reverse-video span (the evidence quote) between « and », unless the view
    marks it so already: plain text would otherwise lose where the quote starts and ends."""
    plain = text.plain
    quotes = sorted((span.start, span.end) for span in text.spans if "reverse" in str(span.style))
    pieces, position = [], 0
    for start, end in quotes:
        if plain[start - 1 : start] == "«" and plain[end : end + 1] == "»":
            continue
        pieces += [plain[position:start], "«", plain[start:end], "»"]
        position = end
    return Text("".join([*pieces, plain[position:]]))


def _plain(lines: list[RenderableType]) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, width=MESSAGE_WIDTH, color_system=None, highlight=False, emoji=False)
    for line in lines:
        if isinstance(line, Padding) and isinstance(line.renderable, Text):
            line = Padding(_marked(line.renderable), (0, 0, 0, line.left), expand=False)
        elif isinstance(line, Text):
            line = _marked(line)
        console.print(line)
    return "\n".join(row.rstrip() for row in buffer.getvalue().splitlines())


class Thresholds(BaseModel):
    """How much an assertion tolerates: the defaults fail on any failing claim."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    allowed_unsupported: int = Field(default=0, ge=0)
    """Claims that may fail the ``fail_on`` policy before the assertion fails."""
    min_support: float = Field(default=0.0, ge=0.0, le=1.0)
    """The least :func:`support_score` (share of entailed claims) that passes."""

    def missed(self, report: AuditRecord, failing: list[ClaimVerdict]) -> str | None:
        """Why ``report`` fails these thresholds (``None``: it passes them)."""
        if len(failing) > self.allowed_unsupported:
            allowed = f"; {self.allowed_unsupported} allowed" if self.allowed_unsupported else ""
            return f"{len(failing)} of {len(report.claims)} claims not grounded in the context{allowed}"
        score = support_score(report)
        if score < self.min_support:
            return f"support {score:.3g} below min_support={self.min_support:g} ({len(report.claims)} claims)"
        return None


def grounding_message(
    report: AuditRecord, sample: Sample, failing: list[ClaimVerdict], fail_on: FailOn | str, why: str | None = None
) -> str:
    """The failure message: a heading (``why`` the assertion failed, by default the count of failing
    claims), then each failing claim as the terminal view shows it."""
    item = AuditedSample(report, sample)
    reason = why or f"{len(failing)} of {len(report.claims)} claims not grounded in the context"
    heading = f"{reason} (verdict: {report.label}; fail_on={FailOn(fail_on)}; judge {report.judge})"
    lines: list[RenderableType] = [Text(heading), Text(f"answer: {sample.answer}")]
    for claim in failing:
        lines.extend(claim_lines(item, claim))
    return _plain(lines)


class SessionAudit(BaseModel):
    """One audit made in a test session: what the summary, the HTML report and ``--rt4-out`` show."""

    model_config = ConfigDict(frozen=True)

    test: str
    """The test that made it (pytest node id; empty outside a test)."""
    report: AuditRecord
    """The audit's record."""
    sample: Sample
    """The audited answer, context and question."""
    failing_claims: int
    """Claims contradicted or baseless."""


class SharedLedger(Ledger):
    """A ledger whose cap is shared by every process that opens the same file (pytest-xdist
    workers): each reservation and settlement reads and writes the file's totals under a file lock
    (``filelock``), so the reservations of all processes together never cross the budget."""

    def __init__(self, path: Path, limit_usd: float | None) -> None:
        super().__init__(limit_usd=limit_usd)
        from filelock import FileLock  # only a distributed session with a budget needs it

        self.path = path
        self._lock = FileLock(f"{path}.lock")

    def _totals(self) -> dict[str, float]:
        if not self.path.exists():
            return {"spent": 0.0, "reserved": 0.0}
        totals: dict[str, float] = json.loads(self.path.read_text(encoding="utf-8"))
        return totals

    def _write(self, totals: dict[str, float]) -> None:
        self.path.write_text(json.dumps(totals), encoding="utf-8")

    def reserve(self, amount: float) -> bool:
        with self._lock:
            totals = self._totals()
            if self.limit_usd is not None and totals["spent"] + totals["reserved"] + amount > self.limit_usd:
                self.refused += 1
                return False
            totals["reserved"] += amount
            self._write(totals)
        self.reserved_usd += amount
        return True

    def settle(self, reserved: float, usage: Usage) -> float:
        overrun = super().settle(reserved, usage)
        with self._lock:
            totals = self._totals()
            totals["reserved"] -= reserved
            totals["spent"] += usage.cost_usd - overrun
            self._write(totals)
        return overrun

    def shared_spent_usd(self) -> float:
        """What every process sharing the file has spent."""
        with self._lock:
            return self._totals()["spent"]

    @classmethod
    def read_spent_usd(cls, path: Path) -> float:
        """What the processes sharing the file at ``path`` have spent (0 before any call)."""
        return cls(path, None).shared_spent_usd()


class SessionSettings(BaseModel):
    """How a test session audits (the plugin's ``--rt4-*`` options)."""

    model_config = ConfigDict(frozen=True)

    judge: str | None = None
    """A ``--judge`` spec; ``None``: the embedded offline verifier."""
    api_base: str | None = None
    """Base URL for a litellm judge."""
    cache: str | None = None
    """A cache directory or ``redis://`` URL; ``None``: no cache."""
    budget_usd: float | None = None
    """One cap for the whole session (every worker together); ``None``: no cap."""
    ledger_file: Path | None = None
    """The file that shares the budget between processes (set for distributed sessions)."""


class _JudgeLoop:
    """An event loop on a daemon thread for the lifetime of a session: where its judge is built,
    called and closed. ``asyncio.run`` on that thread cancels what is left and shuts the loop down
    cleanly when :meth:`close` ends it."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=asyncio.run, args=(self._serve(),), name="rt4chart-judge", daemon=True)
        self._thread.start()
        self._ready.wait()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._ready.set()
        await self._stop.wait()

    def submit(self, work: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(work, self._loop)

    def close(self) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join()


class AuditSession:
    """The audits of one test session: one judge stack (built on first use, on its own event loop),
    one budget, and the records of every audit made through it.

    A budget stop ends the session's audits: every later one raises :class:`BudgetExhausted` with
    the first stop's reason, without calling the judge.
    """

    def __init__(self, settings: SessionSettings) -> None:
        self.settings = settings
        self.records: list[SessionAudit] = []
        """Every audit made (or, for the controller of a distributed session, merged from workers)."""
        self.stopped: str | None = None
        """The budget's reason, once it stopped the session."""
        self.skipped = 0
        """Audits refused after the stop."""
        self.current_test = ""
        """The node id of the test being run (set by the plugin)."""
        self._loop: _JudgeLoop | None = None
        self._stack: JudgeStack | None = None
        self._ledger: Ledger | None = None
        self._guard = threading.Lock()

    @property
    def started(self) -> bool:
        """Whether a judge was built (the session is inert until an audit or the fixture asks)."""
        return self._stack is not None

    def _build(self) -> JudgeStack:
        settings = self.settings
        self._ledger = (
            SharedLedger(settings.ledger_file, settings.budget_usd)
            if settings.ledger_file is not None
            else Ledger(limit_usd=settings.budget_usd)
        )
        return judge_stack(settings.judge, api_base=settings.api_base, cache=settings.cache, ledger=self._ledger)

    def judge(self) -> JudgeStack:
        """The session's judge stack, built on its own loop on first use."""
        return self._running()[1]

    def _running(self) -> tuple[_JudgeLoop, JudgeStack]:
        with self._guard:
            if self._loop is None or self._stack is None:
                loop = _JudgeLoop()

                async def build() -> JudgeStack:
                    return self._build()

                try:
                    self._stack = loop.submit(build()).result()
                except BaseException:  # an unknown judge, an unusable cache: no loop left behind
                    loop.close()
                    raise
                self._loop = loop
            return self._loop, self._stack

    async def _audit(self, stack: JudgeStack, sample: Sample, options: Mapping[str, Any], test: str) -> AuditRecord:
        if self.stopped is not None:
            self.skipped += 1
            raise SessionBudgetStop(f"the session's budget stopped its audits: {self.stopped}")
        try:
            report = await rt4chart.averify(sample, stack, **options)
        except BudgetExhausted as error:
            self.stopped = str(error)
            raise SessionBudgetStop(self.stopped) from error
        self.records.append(SessionAudit(test=test, report=report, sample=sample,
                                        failing_claims=len(failing_claims(report))))
        return report

    def audit(self, sample: Sample, options: Mapping[str, Any]) -> AuditRecord:
        """Audit ``sample`` on the session's loop; the calling thread waits (any thread, any loop)."""
        loop, stack = self._running()
        return loop.submit(self._audit(stack, sample, options, self.current_test)).result()

    async def aaudit(self, sample: Sample, options: Mapping[str, Any]) -> AuditRecord:
        """Audit ``sample`` on the session's loop; the calling loop keeps running meanwhile."""
        loop, stack = self._running()
        return await asyncio.wrap_future(loop.submit(self._audit(stack, sample, options, self.current_test)))

    def spent_usd(self) -> float:
        """What the session spent, audits stopped half-way included: every process of a
        distributed session (their shared ledger file), else this process's ledger; a session
        that built no judge (a controller without a budget) sums its workers' records."""
        if self.settings.ledger_file is not None:
            return SharedLedger.read_spent_usd(self.settings.ledger_file)
        if self._ledger is not None:
            return self._ledger.spent_usd
        return sum(record.report.usage.cost_usd for record in self.records)

    def close(self) -> None:
        """Close the judge stack on its loop, then the loop (idempotent; the records stay)."""
        with self._guard:
            if self._stack is not None and self._loop is not None:
                self._loop.submit(self._stack.aclose()).result()
                self._loop.close()
            self._stack, self._loop = None, None


_active: AuditSession | None = None
"""The session of the running test suite (set by the pytest plugin), if any."""


def activate(session: AuditSession | None) -> None:
    """Make ``session`` the one audits with no judge of their own go through (``None``: none)."""
    global _active
    _active = session


def active_session() -> AuditSession | None:
    """The session set by :func:`activate`, if any."""
    return _active


def _session_for(judge: str | Backend | None) -> AuditSession | None:
    session = _active
    if session is None:
        return None
    if judge is None or (session.started and judge is session.judge()):
        return session
    return None


def _sample(answer: str, context: str | list[str], question: str | None, sample_id: str | None) -> Sample:
    return Sample(id=sample_id or (_active.current_test if _active else "") or "answer",
                  answer=answer, context=context, question=question)


def _run_blocking(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` to its end from sync code: on this thread when no loop runs here, else on a
    worker thread with a loop of its own (a loop that is running cannot be re-entered)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(work)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rt4chart-audit") as worker:
        return worker.submit(asyncio.run, work).result()


def _checked(report: AuditRecord) -> AuditRecord:
    """``report``, unless it holds no verdict: :class:`JudgeFailed` when the judge's failures left
    it open, ``ValueError`` when the input cannot be audited (an answer with no sentence)."""
    __tracebackhide__ = True  # a failing test shows the test's line, not rt4chart's frames
    if report.label is None and report.incomplete:
        raise JudgeFailed(report)
    if report.label is None:
        raise ValueError(f"the answer cannot be audited: {'; '.join(report.errors)}")
    return report


async def acheck_grounded(
    answer: str,
    context: str | list[str],
    question: str | None = None,
    *,
    judge: str | Backend | None = None,
    sample_id: str | None = None,
    **options: Any,
) -> AuditRecord:
    """Audit ``answer`` against ``context`` and return the record, whatever its verdict.

    ``judge``: a backend or a ``--judge`` spec; ``None``: the test session's judge (the plugin's
    ``--rt4-judge``) inside pytest, else the embedded offline verifier. ``options`` are
    :class:`~rt4chart.options.AuditOptions` fields. Raises :class:`JudgeUnavailable` /
    :class:`JudgeFailed` when the judge fails, :class:`BudgetExhausted` on a budget stop.
    """
    __tracebackhide__ = True
    sample = _sample(answer, context, question, sample_id)
    session = _session_for(judge)
    if session is not None:
        return _checked(await session.aaudit(sample, options))
    return _checked(await rt4chart.averify(sample, judge, **options))


def check_grounded(
    answer: str,
    context: str | list[str],
    question: str | None = None,
    *,
    judge: str | Backend | None = None,
    sample_id: str | None = None,
    **options: Any,
) -> AuditRecord:
    """Synchronous :func:`acheck_grounded` (also inside a running event loop)."""
    __tracebackhide__ = True
    sample = _sample(answer, context, question, sample_id)
    session = _session_for(judge)
    if session is not None:
        return _checked(session.audit(sample, options))
    return _checked(_run_blocking(rt4chart.averify(sample, judge, **options)))


def _asserted(report: AuditRecord, answer: str, context: str | list[str], question: str | None,
              fail_on: FailOn | str, thresholds: Thresholds) -> AuditRecord:
    __tracebackhide__ = True
    failing = failing_claims(report, fail_on)
    over_count = len(failing) > thresholds.allowed_unsupported
    # Known failing claims past the allowance are a finding even when other claims were left open;
    # otherwise the open ones might tip either threshold: the judge decided nothing.
    if report.incomplete and not over_count:
        raise JudgeFailed(report)
    why = thresholds.missed(report, failing)
    if why is not None:
        sample = Sample(id=report.id or "answer", answer=answer, context=context, question=question)
        raise GroundingError(grounding_message(report, sample, failing, fail_on, why), report, failing)
    return report


def _thresholds(fail_on: FailOn | str, allowed_unsupported: int, min_support: float) -> Thresholds:
    """The assertion's thresholds, validated with its policy before any call (``ValueError``)."""
    failing_labels(fail_on)
    return Thresholds(allowed_unsupported=allowed_unsupported, min_support=min_support)


async def aassert_grounded(
    answer: str,
    context: str | list[str],
    question: str | None = None,
    *,
    judge: str | Backend | None = None,
    fail_on: FailOn | str = FailOn.HALLUCINATED,
    allowed_unsupported: int = 0,
    min_support: float = 0.0,
    sample_id: str | None = None,
    **options: Any,
) -> AuditRecord:
    """Fail (:class:`GroundingError`) when more than ``allowed_unsupported`` claims of ``answer``
    (default: any) are not grounded in ``context`` (contradicted or baseless under
    ``fail_on="hallucinated"``, contradicted under ``"contradicted"``), or when the share of its claims
    the context entails (:func:`support_score`) is below ``min_support`` (default 0: no minimum).
    Returns the record when the answer passes. See :func:`acheck_grounded`."""
    __tracebackhide__ = True
    thresholds = _thresholds(fail_on, allowed_unsupported, min_support)  # refused before any call
    report = await acheck_grounded(answer, context, question, judge=judge, sample_id=sample_id, **options)
    return _asserted(report, answer, context, question, fail_on, thresholds)


def assert_grounded(
    answer: str,
    context: str | list[str],
    question: str | None = None,
    *,
    judge: str | Backend | None = None,
    fail_on: FailOn | str = FailOn.HALLUCINATED,
    allowed_unsupported: int = 0,
    min_support: float = 0.0,
    sample_id: str | None = None,
    **options: Any,
) -> AuditRecord:
    """Synchronous :func:`aassert_grounded` (also inside a running event loop)."""
    __tracebackhide__ = True
    thresholds = _thresholds(fail_on, allowed_unsupported, min_support)
    report = check_grounded(answer, context, question, judge=judge, sample_id=sample_id, **options)
    return _asserted(report, answer, context, question, fail_on, thresholds)
