"""Inputs and scripted judges for the audit tests (cache, budget, resume)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_samples(path: Path, count: int) -> list[dict[str, Any]]:
    """``count`` distinct samples, each with two answer sentences (so two claims)."""
    samples = [
        {
            "id": f"s{i}",
            "context": f"Store {i} opens daily at {i % 12 + 1} am. It sells {i * 3} kinds of bread.",
            "answer": f"Store {i} opens at {i % 12 + 1} am. It also sells cakes.",
        }
        for i in range(count)
    ]
    path.write_text("".join(json.dumps(s) + "\n" for s in samples), encoding="utf-8")
    return samples


def write_rules(path: Path, *, cost_per_call: float = 0.0, latency_s: float = 0.0) -> Path:
    """A judge that entails the opening hours (with evidence) and finds the cakes baseless."""
    rules = {
        # Evidence needs substance: a whole sentence or two content words (rt4chart.method.grounding).
        "verify": [{"claim": "opens at", "label": "entailed", "evidence": ["opens daily"]}],
        "default": "baseless",
        "cost_per_call": cost_per_call,
        "latency_s": latency_s,
    }
    path.write_text(json.dumps(rules), encoding="utf-8")
    return path


def read_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def without_usage(record: dict[str, Any]) -> dict[str, Any]:
    """A record less what depends on how it was produced (calls made or cache hits), not on what it says."""
    kept = {key: value for key, value in record.items() if key not in ("usage", "usage_by_judge")}
    kept["claims"] = [{k: v for k, v in claim.items() if k != "calls"} for claim in record.get("claims", [])]
    return kept
