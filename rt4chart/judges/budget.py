"""Run-level cost accounting and the hard budget cap.

Before each call that can cost money, its worst case (from the backend's ``max_cost_usd``: a
prompt bound the server cannot exceed plus the maximum output, for every attempt the call may
make, at the judge's prices) is reserved; a call whose reservation would cross the budget is never
started. After the call the reservation is replaced by what the call really cost, booked at most
at the reservation: a server that reports more than the worst case (a wrong price, a server that
over-counts) stops the run with :class:`BudgetExhausted` instead of letting spend run past the cap.
Spend therefore never exceeds the budget, whatever the concurrency: reservations happen on the
event loop's single thread.

Usage a server reports is not trusted blindly: negative token counts or cost, or a cost that is not
a finite number, make that call an error (booked at its worst case, never a credit to the ledger),
and what a call reported beyond its worst case is kept as the run's overrun, which the summary
shows. A judge whose calls go out in rounds (a Batch API's, :class:`BudgetedByRound`) is admitted
round by round instead: the round reserves the worst case of every line it holds before anything
of it is sent, or none of it is sent; each call settles the lines it received first
(:class:`CallAccount`). Under a budget, :class:`SampleAdmission` starts a new sample only when the free budget
covers it, so a small budget finishes whole samples instead of spending itself on many half-done
ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from rt4chart.options import HelpPanel
from rt4chart.protocol import (
    Backend,
    BackendWrapper,
    BudgetExhausted,
    JudgeRequest,
    JudgeResponse,
    cut_call_usage,
)
from rt4chart.types import Usage

_ROUNDING = 1e-9
"""Relative slack for float rounding between a reservation and the same cost computed elsewhere."""


class RunLimits(BaseModel):
    """The limits of one run a user sets (``--budget``, ``--concurrency``, ``--timeout``),
    validated before any work: NaN, infinities, negative budgets and fewer than one call in flight
    are refused rather than silently disabling the cap or failing every call."""

    model_config = ConfigDict(allow_inf_nan=False, frozen=True, use_attribute_docstrings=True)

    # The docstrings are the --help text of the flags (rt4chart.runs.spec), the panels their --help panel.
    budget_usd: float | None = Field(
        default=None, ge=0.0, json_schema_extra={"flag": "--budget", "panel": HelpPanel.JUDGE}
    )
    """Hard cap on judge spend in USD; exit 3 when reached."""
    concurrency: int | None = Field(default=None, ge=1, json_schema_extra={"panel": HelpPanel.JUDGE})
    """Most judge calls in flight, fewer while the provider's rate limit says so (default: the judge profile's)."""
    timeout_s: float | None = Field(
        default=None, gt=0.0, json_schema_extra={"flag": "--timeout", "panel": HelpPanel.JUDGE}
    )
    """Seconds one judge HTTP attempt may take (default: the judge profile's)."""
    batch: bool = Field(default=False, json_schema_extra={"panel": HelpPanel.JUDGE})
    """Send the judge's calls through its provider's Batch API at batch prices (half the online rate;
    OpenAI, or an OpenAI-compatible server with /v1/batches): the calls of all samples in flight go
    out together, stage by stage; submitted requests are journaled beside --out (--resume polls them,
    never resubmits them)."""
    batch_poll_s: float | None = Field(
        default=None, gt=0.0, json_schema_extra={"flag": "--batch-poll", "panel": HelpPanel.JUDGE}
    )
    """Seconds between two polls of a submitted batch (default: $RT4_BATCH_POLL_S, else 30)."""


@dataclass
class Ledger:
    """Everything spent by one run, with the budget it may not cross (``None``: no cap)."""

    limit_usd: float | None = None
    spent_usd: float = 0.0
    reserved_usd: float = 0.0
    in_flight: int = 0
    """Calls made and not yet answered: :attr:`queued` and those holding a concurrency slot (on the wire)."""
    queued: int = 0
    """Of :attr:`in_flight`, the calls waiting for a concurrency slot or between retries (:func:`queued_call`)."""
    usage: Usage = field(default_factory=Usage)
    refused: int = 0
    overrun_usd: float = 0.0
    """What calls reported beyond their reservation (not booked against the cap; it stops the run)."""

    def __post_init__(self) -> None:
        if self.limit_usd is not None and not (math.isfinite(self.limit_usd) and self.limit_usd >= 0):
            raise ValueError(f"a budget must be a finite amount of at least 0 USD (got {self.limit_usd})")

    def free_usd(self) -> float | None:
        """What is neither spent nor reserved; ``None`` without a cap."""
        if self.limit_usd is None:
            return None
        return self.limit_usd - self.spent_usd - self.reserved_usd

    def reserve(self, amount: float) -> bool:
        """Reserve ``amount`` if the budget allows it."""
        if self.limit_usd is not None and self.spent_usd + self.reserved_usd + amount > self.limit_usd:
            self.refused += 1
            return False
        self.reserved_usd += amount
        return True

    def settle(self, reserved: float, usage: Usage) -> float:
        """Replace a reservation with the real cost of the call, booked at most at the reservation;
        returns what the call reported beyond it (0.0 when it stayed within)."""
        self.reserved_usd -= reserved
        overrun = usage.cost_usd - reserved
        if overrun <= _ROUNDING * max(1.0, reserved):
            overrun = 0.0
        self.spent_usd += usage.cost_usd - overrun
        self.overrun_usd += overrun
        self.usage = self.usage + usage
        return overrun


def implausible_usage(usage: Usage) -> str | None:
    """Why reported usage cannot be booked (negative counts or cost, a cost that is not a finite
    number), or ``None``."""
    if not math.isfinite(usage.cost_usd):
        return f"a cost of {usage.cost_usd} USD"
    negative = [
        f"{name} {value}"
        for name, value in (("prompt tokens", usage.prompt_tokens), ("completion tokens", usage.completion_tokens),
                            ("cost USD", usage.cost_usd))
        if value < 0
    ]
    return "negative usage (" + ", ".join(negative) + ")" if negative else None


class SampleAdmission:
    """Whether another sample may start while ``in_flight`` are being audited, under a budget.

    Without a budget: always. With one: a sample always starts when none is in flight (a run makes
    progress); until one sample has finished, samples run one at a time; after that, a new one starts
    only when the free budget (not spent, not reserved) covers the costliest finished sample for it
    and for every sample in flight. A budget too small for the samples still in flight therefore
    stops the run after whole samples, not in the middle of sixteen.
    """

    def __init__(self, ledger: Ledger | None) -> None:
        self.ledger = ledger
        self.costliest_usd = 0.0
        self.finished = 0

    def may_start(self, in_flight: int) -> bool:
        if self.ledger is None or in_flight == 0:
            return True
        free = self.ledger.free_usd()
        if free is None:
            return True
        return self.finished > 0 and free >= self.costliest_usd * (in_flight + 1)

    def sample_finished(self, cost_usd: float) -> None:
        self.finished += 1
        self.costliest_usd = max(self.costliest_usd, cost_usd)


@dataclass
class CallAccount:
    """One metered call's share of its run's :class:`Ledger`: what is reserved for it, settled
    against what it cost when it ends. A backend budgeted by round (:class:`BudgetedByRound`) moves
    into it the reservation of each line the call is the first to receive (:meth:`take`)."""

    ledger: Ledger
    """The run's ledger."""
    reserved_usd: float = 0.0
    """What the call holds reserved: its worst case, or the lines it received (by round)."""

    def take(self, amount: float) -> None:
        """Make ``amount``, reserved in the ledger by a round, this call's to settle."""
        self.reserved_usd += amount


_CALL_ACCOUNT: ContextVar[CallAccount | None] = ContextVar("rt4chart_call_account", default=None)
"""The account of the metered call the running task makes (set by :class:`MeteredBackend`): where the
transport below it says whether the call waits (:func:`queued_call`) and books what a round reserved."""


def call_account() -> CallAccount | None:
    """The running task's metered call's account; ``None`` outside a metered stack."""
    return _CALL_ACCOUNT.get()


@runtime_checkable
class BudgetedByRound(Protocol):
    """Optional backend capability: its calls are sent in rounds (a Batch API's), and the budget
    admits a round whole, before it is sent, at the worst case of every request it holds. The meter
    reserves nothing before such a call; the round reserves, and the call settles what the rounds
    moved into its :class:`CallAccount`."""

    @property
    def budgeted_by_round(self) -> bool:
        """Whether this backend's calls are admitted by round."""
        ...


@contextlib.contextmanager
def queued_call(waiting: bool = True) -> Iterator[None]:
    """Count the running task's call as queued in its run's ledger while the block runs
    (``waiting=False``: as not queued, for the part of a queued block that holds a concurrency slot).
    A call made outside a metered stack counts nowhere."""
    account = _CALL_ACCOUNT.get()
    step = 1 if waiting else -1
    if account is not None:
        account.ledger.queued += step
    try:
        yield
    finally:
        if account is not None:
            account.ledger.queued -= step


class MeteredBackend(BackendWrapper):
    """Accounts every call of a backend in a :class:`Ledger` and enforces its budget."""

    def __init__(self, inner: Backend, ledger: Ledger) -> None:
        super().__init__(inner)
        self.ledger = ledger

    async def complete(self, request: JudgeRequest) -> JudgeResponse:
        by_round = isinstance(self.inner, BudgetedByRound) and self.inner.budgeted_by_round
        account = CallAccount(self.ledger)
        if not by_round:
            account.reserved_usd = self.max_cost_usd(request)
            if not self.ledger.reserve(account.reserved_usd):
                raise BudgetExhausted(
                    f"a {self.name} call needing up to ${account.reserved_usd:.6f} would cross the budget "
                    f"(${self.ledger.spent_usd:.6f} spent of ${self.ledger.limit_usd})"
                )
        self.ledger.in_flight += 1
        usage = Usage()
        call = _CALL_ACCOUNT.set(account)
        try:
            response = await self.inner.complete(request)
            usage = response.usage
            if problem := implausible_usage(usage):
                # Booked at the worst case, never credited: the call happened, what it cost is unknown.
                usage = Usage(calls=max(usage.calls, 1), cost_usd=account.reserved_usd)
                response = response.model_copy(update={
                    "parsed": None, "usage": usage,
                    "error": f"the judge reported {problem}; the call is booked at its worst case "
                             f"(${account.reserved_usd:.6f})",
                })
        except asyncio.CancelledError:
            # Cut before its reply (a cascade's latency budget, a shutdown): the prompt was sent, and
            # is paid. A line of a round the call left is not its to book (its round's reservation holds it).
            if not by_round:
                usage = cut_call_usage(self.inner, request)
            raise
        finally:
            _CALL_ACCOUNT.reset(call)
            self.ledger.in_flight -= 1
            overrun = self.ledger.settle(account.reserved_usd, usage)
        if overrun and self.ledger.limit_usd is not None:
            raise BudgetExhausted(
                f"a {self.name} call reported ${usage.cost_usd:.6f}, more than its worst case of "
                f"${account.reserved_usd:.6f}; stopped rather than spend past the budget"
            )
        return response
