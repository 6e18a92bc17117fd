"""Fail fast when a judge's endpoint cannot be reached or refuses every call.

A refused connection, a host name that does not resolve, a rejected key (401/403) or a model the
server does not know (404) will not go away by waiting, nor will a server that accepts requests and
never answers them (every attempt of a request timed out): retrying them with backoff only makes an
audit that cannot succeed slow to say so. A backend counts such failures per request; after
:data:`CIRCUIT_THRESHOLD` requests in a row end in one, its circuit opens and every further call
raises :class:`JudgeUnavailable`, which stops the run (like a budget stop: records finished before
it are kept, the interrupted samples are left for ``--resume``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rt4chart.protocol import JudgeUnavailable

CIRCUIT_THRESHOLD = 3
"""Consecutive requests ending in a non-transient failure that open a backend's circuit."""

NON_TRANSIENT_ATTEMPTS = 2
"""Attempts a request gets when its failure is non-transient: the first and at most one retry (a
server that is just starting may refuse one connection)."""


NON_TRANSIENT_WAIT_S = 0.5
"""Longest wait before that one retry: enough for a server that is just starting, and a dead
endpoint costs at most this per request."""

TIMEOUT_ATTEMPTS = 2
"""Attempts a request gets when each one times out: a server that accepts and never answers costs
a full timeout per attempt. Such a request counts toward the circuit like a refused one, so a hung
judge stops the run after :data:`CIRCUIT_THRESHOLD` requests of two attempts each."""


@dataclass
class CircuitBreaker:
    """Consecutive non-transient failures of one backend; open at ``threshold``."""

    endpoint: str
    """The judge and where it is called, for the error message."""
    threshold: int = CIRCUIT_THRESHOLD
    """Consecutive non-transient failures that open the circuit."""
    consecutive: int = 0
    """Requests in a row that ended in a non-transient failure."""
    last_error: str = ""
    """The last of those failures, already free of secrets."""

    @property
    def is_open(self) -> bool:
        return self.consecutive >= self.threshold

    @property
    def another_endpoint_left(self) -> bool:
        """Whether a request that was refused can be retried on another endpoint (one endpoint: never)."""
        return False

    def check(self) -> None:
        """Raise :class:`JudgeUnavailable` when the circuit is open."""
        if self.is_open:
            raise JudgeUnavailable(self.endpoint, self.consecutive, self.last_error)

    def record_success(self) -> None:
        """A request reached a server that answered (even with a transient error or a bad reply)."""
        self.consecutive = 0

    def record_failure(self, error: str) -> None:
        """A request ended in a non-transient failure; raises once that opens the circuit."""
        self.consecutive += 1
        self.last_error = error
        self.check()


@dataclass
class FleetCircuit(CircuitBreaker):
    """The breaker of a judge fleet: one deployment refusing is not the judge refusing.

    Attempts are tracked per deployment. While some deployment still answers (or has not been
    tried), a refusing one is the router's to cool down and the request's retry goes elsewhere;
    the circuit opens only when ``threshold`` requests in a row failed non-transiently *and* every
    deployment's latest attempt was refused.
    """

    deployments: tuple[str, ...] = ()
    """Every deployment of the fleet, by label (model and base URL, never a key)."""
    refusing: dict[str, str] = field(default_factory=dict)
    """Deployments whose latest attempt failed non-transiently, with why (free of secrets)."""

    @property
    def all_refusing(self) -> bool:
        """Every deployment's latest attempt failed non-transiently: no replica left to try."""
        return bool(self.deployments) and all(label in self.refusing for label in self.deployments)

    @property
    def another_endpoint_left(self) -> bool:
        return not self.all_refusing

    @property
    def is_open(self) -> bool:
        return self.consecutive >= self.threshold and self.all_refusing

    def attempt_answered(self, deployment: str) -> None:
        """``deployment`` answered an attempt (even with a transient error or a bad reply)."""
        self.refusing.pop(deployment, None)

    def attempt_refused(self, deployment: str, reason: str) -> None:
        """``deployment`` failed an attempt non-transiently, for ``reason``."""
        self.refusing[deployment] = reason

    def record_failure(self, error: str) -> None:
        refusals = "; ".join(f"{label}: {reason}" for label, reason in self.refusing.items())
        super().record_failure(f"{error} (deployments refusing: {refusals})" if refusals else error)
