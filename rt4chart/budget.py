"""Run-level cost accounting and the hard budget cap.

Before each call that can cost money, its worst case (from the backend's ``max_cost_usd``:
prompt tokens counted with the model's tokenizer plus the maximum output at the judge's prices)
is reserved; a call whose reservation would cross the budget is never started. After the call
the reservation is replaced by what the call really cost. Spend therefore never exceeds the
budget, whatever the concurrency: reservations happen on the event loop's single thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rt4chart.backends.base import Backend, BackendWrapper, JudgeRequest, JudgeResponse
from rt4chart.types import Usage


class BudgetExhausted(Exception):
    """A call was refused because its worst-case cost would cross the budget."""


@dataclass
class Ledger:
    """Everything spent by one run, with the budget it may not cross (``None``: no cap)."""

    limit_usd: float | None = None
    spent_usd: float = 0.0
    reserved_usd: float = 0.0
    in_flight: int = 0
    usage: Usage = field(default_factory=Usage)
    refused: int = 0

    def reserve(self, amount: float) -> bool:
        """Reserve ``amount`` if the budget allows it."""
        if self.limit_usd is not None and self.spent_usd + self.reserved_usd + amount > self.limit_usd:
            self.refused += 1
            return False
        self.reserved_usd += amount
        return True

    def settle(self, reserved: float, usage: Usage) -> None:
        """Replace a reservation with the real cost of the call."""
        self.reserved_usd -= reserved
        self.spent_usd += usage.cost_usd
        self.usage = self.usage + usage


class MeteredBackend(BackendWrapper):
    """Accounts every call of a backend in a :class:`Ledger` and enforces its budget."""

    def __init__(self, inner: Backend, ledger: Ledger) -> None:
        super().__init__(inner)
        self.ledger = ledger

    async def complete(self, request: JudgeRequest) -> JudgeResponse:
        reservation = self.max_cost_usd(request)
        if not self.ledger.reserve(reservation):
            raise BudgetExhausted(
                f"a {self.name} call needing up to ${reservation:.6f} would cross the budget "
                f"(${self.ledger.spent_usd:.6f} spent of ${self.ledger.limit_usd})"
            )
        self.ledger.in_flight += 1
        usage = Usage()
        try:
            response = await self.inner.complete(request)
            usage = response.usage
            return response
        finally:
            self.ledger.in_flight -= 1
            self.ledger.settle(reservation, usage)
