"""Benchmark inputs: real RAGTruth QA dev samples when the shared data is there, else the examples."""

from __future__ import annotations

from pathlib import Path

from rt4chart.analysis.datasets import load_dataset
from rt4chart.records.io import InputLine, read_jsonl

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "answers.jsonl"


def bench_inputs(limit: int) -> tuple[list[InputLine], str]:
    """Up to ``limit`` input lines and a description of where they came from."""
    try:
        samples = load_dataset("ragtruth-qa", split="dev", limit=limit)
    except FileNotFoundError:
        items = [item for item in read_jsonl(EXAMPLES) if item.sample is not None]
        items = (items * (limit // len(items) + 1))[:limit]
        return items, f"{limit} lines cycled from examples/answers.jsonl (no shared data found)"
    items = [InputLine(line, sample) for line, sample in enumerate(samples, start=1)]
    return items, f"the first {len(items)} samples of RAGTruth QA dev"
