"""Where an embedded verdict's CPU goes: the MiniLM encoder against everything else of the audit.

    python evals/bench/embedded_cpu.py --answers 20

Audits RAGTruth QA test answers in process with the embedded judge (one warm-up first, the
language detector loaded before), one at a time, and measures per answer the process CPU time of
the whole audit and the CPU time spent inside ``MiniLM.encode`` (the encoder's forward pass; the
threads that call it: an audit runs several passes at once, so the process's CPU time around one
would count the others too; a lone pass's helper threads are not in it, so the encoder figure is a
floor and "the rest" a ceiling). CPU time, unlike wall time,
hardly depends on what else the machine runs: it says what an answer costs before any waiting.
Records the figures in RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from guard import answers
from results import record

from rt4chart.judges.embedded import minilm
from rt4chart.judges.registry import judge_stack
from rt4chart.languages import load_detector
from rt4chart.options import AuditOptions
from rt4chart.runs.engine import Pipeline
from rt4chart.types import Sample

encoder_cpu_s = 0.0
"""CPU seconds spent in MiniLM.encode since last reset (the calling threads')."""


def timed_encode() -> None:
    """Count the CPU time of every ``MiniLM.encode`` call (the judge's maths is left as it is)."""
    original = minilm.MiniLM.encode

    def encode(self: minilm.MiniLM, texts: list[str], *args: Any, **kwargs: Any) -> Any:
        global encoder_cpu_s
        started = time.thread_time()
        try:
            return original(self, texts, *args, **kwargs)
        finally:
            encoder_cpu_s += time.thread_time() - started

    minilm.MiniLM.encode = encode  # type: ignore[method-assign]


async def main(arguments: argparse.Namespace) -> None:
    global encoder_cpu_s
    timed_encode()
    load_detector()
    stack = judge_stack(None)
    pipeline = Pipeline(stack, AuditOptions())
    rows = [Sample(**row) for row in answers(1 + arguments.answers)]
    await pipeline.verify_sample(rows[0])  # warm-up: the model loads
    audit_cpu: list[float] = []
    encoder_cpu: list[float] = []
    walls: list[float] = []
    claims: list[int] = []
    for sample in rows[1:]:
        encoder_cpu_s = 0.0
        cpu, wall = time.process_time(), time.perf_counter()
        report = await pipeline.verify_sample(sample)
        walls.append(time.perf_counter() - wall)
        audit_cpu.append(time.process_time() - cpu)
        encoder_cpu.append(encoder_cpu_s)
        claims.append(len(report.claims))
    await stack.aclose()
    rest = [audit - encoder for audit, encoder in zip(audit_cpu, encoder_cpu, strict=True)]
    load = " / ".join(f"{value:.1f}" for value in os.getloadavg())

    def ms(values: list[float]) -> str:
        return f"{1000 * statistics.median(values):.0f} ms"

    record(
        "Embedded verdict: where the CPU goes",
        [
            f"Input: RAGTruth QA test answers 2 to {1 + arguments.answers} (the first is the warm-up), audited one at "
            f"a time in process with the embedded judge; {statistics.median(claims):.0f} claims per answer (p50).",
            "",
            "| what (p50 per answer) | figure |",
            "|---|---|",
            f"| wall time of the audit | {ms(walls)} |",
            f"| CPU time of the audit (process) | {ms(audit_cpu)} |",
            f"| of it in the MiniLM encoder (floor) | {ms(encoder_cpu)} |",
            f"| the rest: pipeline, grounding, head, records (ceiling) | {ms(rest)} |",
            f"| encoder CPU per claim (all answers) | {1000 * sum(encoder_cpu) / max(1, sum(claims)):.1f} ms |",
            "",
            f"Encoder share of the audit's CPU: {100 * sum(encoder_cpu) / sum(audit_cpu):.0f}%. Machine load when "
            f"done (1/5/15 min): {load}. The audit's CPU time per answer (p50) is "
            f"{'above' if statistics.median(audit_cpu) > 0.1 else 'within'} the verdict p50 target of issue 43 "
            "(100 ms per answer).",
        ],
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--answers", type=int, default=20)
    asyncio.run(main(parser.parse_args()))
