"""Pipeline overhead: the full pipeline on a zero-latency scripted judge vs a bare asyncio.gather
of exactly the judge calls it made (target: <= 1.5x).

    python evals/bench/pipeline_overhead.py [--samples 200]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from results import record
from workload import bench_inputs

from rt4chart.judges.scripted import ScriptedBackend, ScriptedRules
from rt4chart.method.text import _split_cached, segment_context, split_sentences
from rt4chart.protocol import JudgeRequest, JudgeResponse
from rt4chart.records.io import InputLine
from rt4chart.runs.engine import Pipeline


class RecordingBackend(ScriptedBackend):
    """The scripted judge, keeping every request it answers."""

    def __init__(self) -> None:
        super().__init__(ScriptedRules())
        self.requests: list[JudgeRequest] = []

    async def complete(self, request: JudgeRequest) -> JudgeResponse:
        self.requests.append(request)
        return await super().complete(request)


async def time_pipeline(items: list[InputLine], warm_segmentation: bool = False) -> float:
    # Start cold unless asked: segmentations memoised by an earlier repeat would flatter this one.
    if not warm_segmentation:
        _split_cached.cache_clear()
    pipeline = Pipeline(ScriptedBackend(ScriptedRules()))
    started = time.perf_counter()
    async for _ in pipeline.run(items):
        pass
    return time.perf_counter() - started


def time_segmentation(items: list[InputLine]) -> float:
    """Sentence splitting of every context and answer alone, cold, as the pipeline does it."""
    _split_cached.cache_clear()
    started = time.perf_counter()
    for item in items:
        assert item.sample is not None
        segment_context(item.sample.context)
        split_sentences(item.sample.answer)
    return time.perf_counter() - started


async def time_gather(requests: list[JudgeRequest]) -> float:
    backend = ScriptedBackend(ScriptedRules())
    started = time.perf_counter()
    await asyncio.gather(*(backend.complete(request) for request in requests))
    return time.perf_counter() - started


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    items, source = bench_inputs(args.samples)
    recorder = RecordingBackend()
    async for _ in Pipeline(recorder).run(items):
        pass
    pipeline_s = min([await time_pipeline(items) for _ in range(args.repeats)])
    orchestration_s = min([await time_pipeline(items, warm_segmentation=True) for _ in range(args.repeats)])
    gather_s = min([await time_gather(recorder.requests) for _ in range(args.repeats)])
    segmentation_s = min(time_segmentation(items) for _ in range(args.repeats))
    ratio, orchestration_ratio = pipeline_s / gather_s, orchestration_s / gather_s
    per_sample_ms = (pipeline_s - gather_s) / len(items) * 1000
    record(
        "Pipeline overhead (zero-latency scripted judge)",
        [
            f"Input: {source}; {len(recorder.requests)} judge calls; best of {args.repeats} runs each.",
            "",
            "| what | seconds |",
            "|---|---|",
            f"| full pipeline (segment, chunk, decompose, verify, ground, join) | {pipeline_s:.3f} |",
            f"| the same pipeline with sentence segmentation already memoised | {orchestration_s:.3f} |",
            f"| bare `asyncio.gather` of the same {len(recorder.requests)} calls | {gather_s:.3f} |",
            f"| Punkt sentence splitting of the same contexts and answers, alone | {segmentation_s:.3f} |",
            "",
            f"**Overhead ratio, end to end: {ratio:.2f}x** (target <= 1.5x: {'met' if ratio <= 1.5 else 'NOT met'}); "
            f"without segmentation: {orchestration_ratio:.2f}x.",
            "",
            f"The pipeline adds {per_sample_ms:.2f} ms of CPU per sample over the bare calls. Sentence "
            f"splitting alone takes {segmentation_s / gather_s:.2f}x the time of all the judge calls, so "
            f"no pipeline that splits sentences with Punkt (as the method requires) can get below "
            f"{1 + segmentation_s / gather_s:.2f}x against a judge this fast; the rest is building prompts, "
            "validating replies into pydantic models, grounding quotes and joining votes. Against a judge "
            "that answers in 100 ms "
            "or more this is under a few percent of an audit's wall time; against one that answers in "
            "0.1 ms it dominates.",
        ],
    )


if __name__ == "__main__":
    asyncio.run(main())
