"""Throughput of the embedded offline verifier through the real pipeline, in claims per second.

    python evals/bench/embedded_throughput.py --threads 2 --samples 200

Reads RAGTruth QA dev answers (or any rt4 input JSONL given with --input), decomposes them with the
rule-based decomposer, and verifies them with local + global verification (W=25, O=10), starting
from a cold embedding cache: every context sentence is embedded during the timed run. The model
load is timed separately. Prints the measured figures and the command that produced them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import sys
import time
from pathlib import Path

from rt4chart.backends.embedded import EmbeddedBackend
from rt4chart.io import InputLine, read_jsonl
from rt4chart.options import AuditOptions
from rt4chart.pipeline import Pipeline
from rt4chart.types import Sample

RAGTRUTH_DEV = Path("/work/shared/data/ragtruth-qa/dev.jsonl")


def ragtruth_lines(limit: int) -> list[InputLine]:
    lines = []
    with RAGTRUTH_DEV.open(encoding="utf-8") as handle:
        for number, text in enumerate(handle, start=1):
            if number > limit:
                break
            row = json.loads(text)
            sample = Sample(id=row["id"], context=row["d1"], question=row["query"], answer=row["d2"])
            lines.append(InputLine(number, sample))
    return lines


async def verify_all(pipeline: Pipeline, lines: list[InputLine]) -> tuple[int, int, float]:
    started = time.perf_counter()
    claims = calls = 0
    async for report in pipeline.run(lines):
        claims += len(report.claims)
        calls += report.usage.calls
    return claims, calls, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="torch threads (cores to use)")
    parser.add_argument("--samples", type=int, default=200, help="answers to verify")
    parser.add_argument("--input", type=Path, default=None, help="rt4 input JSONL instead of RAGTruth")
    args = parser.parse_args()
    if args.input:
        lines = [line for line in read_jsonl(args.input) if line.sample][: args.samples]
    else:
        lines = ragtruth_lines(args.samples)

    started = time.perf_counter()
    backend = EmbeddedBackend(threads=args.threads)
    load_s = time.perf_counter() - started
    pipeline = Pipeline(backend, AuditOptions(decomposer="rules"))
    claims, calls, elapsed = asyncio.run(verify_all(pipeline, lines))

    command = shlex.join([os.path.relpath(sys.executable), *sys.argv])
    print(f"command: {command}")
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"cpus available: {len(os.sched_getaffinity(0))}, torch threads: {args.threads}, load average: {load}")
    print(f"model load: {load_s:.2f} s")
    print(f"answers: {len(lines)}, claims: {claims}, judge calls: {calls}, time: {elapsed:.2f} s")
    print(f"throughput: {claims / elapsed:.1f} claims/s ({len(lines) / elapsed:.1f} answers/s)")


if __name__ == "__main__":
    main()
