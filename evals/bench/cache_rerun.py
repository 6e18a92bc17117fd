"""Warm-cache rerun vs cold run of the same audit (target: >= 20x faster, 0 judge calls).

    python evals/bench/cache_rerun.py [--samples 40] [--judge JUDGE] [--api-base URL] [--latency-ms 300]

Without --judge the judge is the scripted one answering every call after --latency-ms
milliseconds, standing in for a remote API; with --judge any judge rt4 accepts is used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from results import record
from workload import bench_inputs

from rt4chart.judges.budget import Ledger
from rt4chart.judges.registry import judge_stack
from rt4chart.method.text import _split_cached
from rt4chart.records.io import InputLine
from rt4chart.runs.engine import Pipeline, run_audit
from rt4chart.types import AuditRecord


async def timed_audit(
    judge: str, api_base: str | None, cache_dir: Path, items: list[InputLine]
) -> tuple[float, Ledger, list[AuditRecord]]:
    # Each run starts as a new process would: no sentence segmentation memoised from the last one.
    _split_cached.cache_clear()
    stack = judge_stack(judge, api_base=api_base, cache=cache_dir)
    reports: list[AuditRecord] = []
    started = time.perf_counter()
    try:
        await run_audit(Pipeline(stack), items, None, reports.append)
    finally:
        await stack.aclose()
    return time.perf_counter() - started, stack.ledger, reports


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=40)
    parser.add_argument("--judge", default=None)
    parser.add_argument("--api-base", default=None)
    parser.add_argument("--latency-ms", type=float, default=300.0)
    args = parser.parse_args()
    items, source = bench_inputs(args.samples)
    with tempfile.TemporaryDirectory() as scratch:
        judge = args.judge
        if judge is None:
            rules = Path(scratch, "rules.json")
            rules.write_text(json.dumps({"latency_s": args.latency_ms / 1000}), encoding="utf-8")
            judge = f"scripted:{rules}"
        cache_dir = Path(scratch, "cache")
        cold_s, cold, cold_reports = await timed_audit(judge, args.api_base, cache_dir, items)
        warm_s, warm, warm_reports = await timed_audit(judge, args.api_base, cache_dir, items)
    # A cache hit changes only what was spent: calls and cost, of each sample and of each claim.
    spent = {"usage": True, "usage_by_judge": True, "claims": {"__all__": {"calls", "cost_usd"}}}
    same = [r.model_dump(exclude=spent) for r in cold_reports] == [r.model_dump(exclude=spent) for r in warm_reports]
    speedup = cold_s / warm_s
    described = args.judge or f"scripted judge answering after {args.latency_ms:g} ms per call"
    record(
        f"Warm-cache rerun vs cold run ({'scripted stand-in' if args.judge is None else args.judge})",
        [
            f"Input: {source}; judge: {described}.",
            "",
            "| run | seconds | judge calls | cache hits |",
            "|---|---|---|---|",
            f"| cold | {cold_s:.2f} | {cold.usage.calls} | {sum(r.usage.cache_hits for r in cold_reports)} |",
            f"| warm | {warm_s:.2f} | {warm.usage.calls} | {sum(r.usage.cache_hits for r in warm_reports)} |",
            "",
            f"**Warm rerun {speedup:.1f}x faster with {warm.usage.calls} judge calls** "
            f"(target >= 20x and 0 calls: {'met' if speedup >= 20 and warm.usage.calls == 0 else 'NOT met'}); "
            f"records identical apart from usage: {same}.",
        ],
    )


if __name__ == "__main__":
    asyncio.run(main())
