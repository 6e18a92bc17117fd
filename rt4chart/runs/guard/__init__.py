"""``rt4 guard``: the audit as an HTTP service, called inline while answers are served.

Endpoints (JSON in, JSON out; errors are ``{"error": "..."}`` with a 4xx status):

- ``POST /v1/verify``: an ``rt4 verify`` input line (``context`` or ``documents`` or ``messages``,
  ``question``?, ``answer``, ``id``?, ``language``?, ...; validated as ``rt4 verify`` validates a line) and
  ``latency_budget_ms``? -> ``{"decision", "record"}``, the record ``rt4 verify`` writes. With
  ``"stream": true`` the verdicts stream back as NDJSON events, one per answer sentence then the
  answer's. With ``Content-Type: application/x-ndjson`` the answer itself streams in: the first line
  is the request without the answer, each later line ``{"delta": "text"}``; a sentence is audited as
  soon as the next one has started (or the body ended).
- ``POST /v1/chat/completions`` (with an upstream): an OpenAI-compatible proxy that audits the reply
  (against the request's tool results, read as a conversation, when it carries any).
- ``GET /health``; ``GET /metrics`` (Prometheus text format).

One judge stack (one cache, one budget) serves every request. The policy turns a record's labels
into ``pass``, ``flag`` or ``block``; a record the judge could not finish is never a silent pass.

Modules: :mod:`.policy` (configuration, policy, limits, refusals), :mod:`.messages` (request bodies
and their parsing, error replies, NDJSON framing), :mod:`.metrics` (Prometheus counters),
:mod:`.streaming` (auditing an answer sentence by sentence as it arrives), :mod:`.proxy` (the
OpenAI-compatible proxy), :mod:`.service` (the service: admission, /v1/verify, /health, /metrics,
start and stop).
"""

from rt4chart.runs.guard.policy import (
    TOKEN_ENV,
    UPSTREAM_KEY_ENV,
    GuardConfig,
    GuardConfigError,
    GuardLimits,
    GuardPolicy,
)
from rt4chart.runs.guard.service import Guard, RunningGuard, serve, start_guard

__all__ = [
    "TOKEN_ENV",
    "UPSTREAM_KEY_ENV",
    "Guard",
    "GuardConfig",
    "GuardConfigError",
    "GuardLimits",
    "GuardPolicy",
    "RunningGuard",
    "serve",
    "start_guard",
]
