"""How many judge calls are in flight: the one place a judge's concurrency is decided.

A fixed ``--concurrency`` against a provider's rate limit either idles below it or storms into 429s.
:class:`Pacer` rides the limit instead (additive increase, multiplicative decrease, as TCP's
congestion control and the adaptive limiters of inspect_ai and Phoenix do), with ``--concurrency``
as its ceiling:

- it starts at :data:`INITIAL_IN_FLIGHT` calls (or the ceiling, if lower);
- each answered call adds one slot until the first sign of the limit, then one slot per round of
  calls (``1 / limit`` per answer);
- a 429 or a timeout halves it, once per round: refusals of calls sent before the last decrease
  are the same storm, not a new one;
- a ``Retry-After`` (``retry-after-ms`` first) holds every new call until it has passed, not only
  the refused one;
- ``x-ratelimit-remaining-requests`` / ``-tokens`` and their ``-reset-`` times (OpenAI's headers,
  also sent by Azure, Groq, Together and vLLM's proxies) hold new calls until the reset once the
  calls already sent would use up what is left.

``adaptive=False`` keeps the old behaviour, exactly ``ceiling`` calls in flight (a local server
with a fixed number of slots, or a measurement of the difference).
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

INITIAL_IN_FLIGHT = 4
"""Calls in flight before anything is known of the server's limit."""

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration_s(value: str | None) -> float | None:
    """Seconds in a rate-limit reset header: a number of seconds (``"1.5"``) or OpenAI's duration
    form (``"6m0s"``, ``"20ms"``, ``"1h2m3.5s"``); ``None`` when absent or unreadable."""
    if not value:
        return None
    text = value.strip()
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(number + unit for number, unit in parts) != text:
        return None
    return sum(float(number) * _UNIT_S[unit] for number, unit in parts)


def _count(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


@dataclass(frozen=True)
class RateSignal:
    """What one answer's headers say about the server's rate limit (every field may be unknown)."""

    retry_after_s: float | None = None
    """Seconds the server asked the client to wait (``retry-after-ms``, else ``Retry-After`` as seconds
    or an HTTP date)."""
    remaining_requests: int | None = None
    """Requests left in the current window (``x-ratelimit-remaining-requests``)."""
    remaining_tokens: int | None = None
    """Tokens left in the current window (``x-ratelimit-remaining-tokens``)."""
    requests_reset_s: float | None = None
    """Seconds until the request count refills (``x-ratelimit-reset-requests``)."""
    tokens_reset_s: float | None = None
    """Seconds until the token count refills (``x-ratelimit-reset-tokens``)."""


_NO_SIGNAL = RateSignal()


_NO_SIGNAL_NAMES = ("retry-after-ms", "retry-after", "x-ratelimit-remaining-requests", "x-ratelimit-remaining-tokens")


def rate_signal(headers: Mapping[str, object] | None) -> RateSignal:
    """The rate-limit headers of an answer. The mapping is read as HTTP clients give it (aiohttp's
    and httpx's headers ignore case; litellm's are lower case, also copied with an ``llm_provider-``
    prefix)."""
    if not headers:
        return _NO_SIGNAL

    def header(name: str) -> str | None:
        value = headers.get(name)
        if value is None:
            value = headers.get(f"llm_provider-{name}")
        return None if value is None else str(value)

    if all(header(name) is None for name in _NO_SIGNAL_NAMES):
        return _NO_SIGNAL  # most answers of a server without limits: nothing more to read
    return RateSignal(
        retry_after_s=_retry_after_s(header("retry-after-ms"), header("retry-after")),
        remaining_requests=_count(header("x-ratelimit-remaining-requests")),
        remaining_tokens=_count(header("x-ratelimit-remaining-tokens")),
        requests_reset_s=duration_s(header("x-ratelimit-reset-requests")),
        tokens_reset_s=duration_s(header("x-ratelimit-reset-tokens")),
    )


def _retry_after_s(milliseconds: str | None, value: str | None) -> float | None:
    if milliseconds:
        try:
            return max(0.0, float(milliseconds) / 1000)
        except ValueError:
            pass
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


@dataclass(frozen=True)
class Slot:
    """One call's place in flight: when it was sent, and how many calls had been sent before it."""

    started: float
    """The event loop's time when the call took its slot."""
    sequence: int
    """Calls sent before this one on this pacer."""


class Pacer:
    """The calls in flight of one backend in one event loop; see the module docstring.

    A call takes a :class:`Slot` (:meth:`acquire`, in arrival order), sends, reports what came back
    (:meth:`answered` or :meth:`refused`), and gives the slot back (:meth:`release`)."""

    def __init__(self, ceiling: int, *, adaptive: bool) -> None:
        self.ceiling = ceiling
        self.adaptive = adaptive
        self.limit = float(min(ceiling, INITIAL_IN_FLIGHT) if adaptive else ceiling)
        """Calls allowed in flight now (its whole part): the ceiling when not adaptive."""
        self.in_flight = 0
        self._sent = 0
        self._probing = adaptive
        """Before the first sign of the limit: one more slot per answer, not per round."""
        self._last_decrease = -math.inf
        self._held_until = 0.0
        """No call is sent before this loop time (Retry-After, or a window used up)."""
        self._waiting: deque[asyncio.Future[Slot]] = deque()
        self._wakeup: asyncio.TimerHandle | None = None

    def _free(self, now: float) -> bool:
        return now >= self._held_until and self.in_flight < max(1, int(self.limit))

    def _take(self, now: float) -> Slot:
        self.in_flight += 1
        self._sent += 1
        return Slot(started=now, sequence=self._sent - 1)

    async def acquire(self) -> Slot:
        """Wait for a slot (behind the calls already waiting) and take it."""
        loop = asyncio.get_running_loop()
        if not self._waiting and self._free(loop.time()):
            return self._take(loop.time())
        ticket: asyncio.Future[Slot] = loop.create_future()
        self._waiting.append(ticket)
        self._wake()
        try:
            return await ticket
        except asyncio.CancelledError:
            if ticket.done() and not ticket.cancelled():
                self.release()  # the slot was handed over as the waiter was cancelled
            else:
                self._waiting.remove(ticket)
            raise

    def release(self) -> None:
        """Give a slot back."""
        self.in_flight -= 1
        self._wake()

    def _wake(self) -> None:
        """Hand free slots to the calls waiting, in order; when the pacer is held, look again when it ends."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        while self._waiting and self._free(now):
            ticket = self._waiting.popleft()
            if not ticket.done():
                ticket.set_result(self._take(now))
        if self._waiting and now < self._held_until and self._wakeup is None:
            self._wakeup = loop.call_at(self._held_until, self._held_over)

    def _held_over(self) -> None:
        self._wakeup = None
        self._wake()

    def _hold(self, seconds: float | None) -> None:
        if seconds is None or seconds <= 0:
            return
        until = asyncio.get_running_loop().time() + seconds
        if until > self._held_until:
            self._held_until = until
            if self._wakeup is not None:
                self._wakeup.cancel()
                self._wakeup = None

    def answered(self, slot: Slot, signal: RateSignal, tokens: int) -> None:
        """A call sent in ``slot`` got an answer of ``tokens`` (prompt and completion) with ``signal``."""
        if not self.adaptive:
            return
        sent_since = self._sent - slot.sequence - 1
        # What the calls sent after this one will use of what its answer says is left.
        out_of_requests = signal.remaining_requests is not None and signal.remaining_requests <= sent_since
        out_of_tokens = signal.remaining_tokens is not None and signal.remaining_tokens < tokens * (sent_since + 1)
        if out_of_requests:
            self._hold(signal.requests_reset_s)
        if out_of_tokens:
            self._hold(signal.tokens_reset_s)
        if out_of_requests or out_of_tokens:
            self._probing = False
            return
        self.limit = min(float(self.ceiling), self.limit + (1.0 if self._probing else 1.0 / self.limit))

    def refused(self, slot: Slot, signal: RateSignal) -> None:
        """A call sent in ``slot`` was refused for the rate (429) or got no answer in time."""
        if not self.adaptive:
            return
        self._probing = False
        if slot.started >= self._last_decrease:
            self.limit = max(1.0, self.limit / 2)
            self._last_decrease = asyncio.get_running_loop().time()
        resets = [signal.requests_reset_s if signal.remaining_requests == 0 else None,
                  signal.tokens_reset_s if signal.remaining_tokens == 0 else None]
        self._hold(signal.retry_after_s if signal.retry_after_s is not None else max(
            (reset for reset in resets if reset is not None), default=None))
