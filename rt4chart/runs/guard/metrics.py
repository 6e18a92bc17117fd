"""``rt4 guard``'s counters, written by hand in Prometheus' text format (``GET /metrics``)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rt4chart.types import Usage

LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


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
