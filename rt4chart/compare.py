"""``rt4 compare``: several judges verify one claim set, so their claim verdicts are comparable.

Each answer is decomposed once (by a chosen judge, or by the rule decomposer), and every judge
verifies exactly those claims through its own pipeline, all judges of a sample at once; judges
built by the caller share its cache. One output file per judge is written, in input order, one
record per input line, ready for ``rt4 agree --level claim`` (which then aligns claims one to one).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path

from rt4chart.backends.base import Backend, GenerationParams
from rt4chart.decompose import decompose_by_judge, decompose_by_rules
from rt4chart.io import InputLine, error_report, write_reports_atomically
from rt4chart.pipeline import Pipeline
from rt4chart.prompts import load_prompts
from rt4chart.session import JudgeSession
from rt4chart.text import split_sentences
from rt4chart.types import Claim, Report, Sample


async def shared_claims(
    sample: Sample, decomposer: Backend | None, params: GenerationParams
) -> tuple[list[Claim], list[str]]:
    """The sample's claims: from ``decomposer`` (one call), or the rule decomposer when ``None``."""
    sentences = split_sentences(sample.answer)
    if decomposer is None:
        return decompose_by_rules(sentences), []
    session = JudgeSession(decomposer, load_prompts(), params)
    return await decompose_by_judge(session, sentences, sample.question)


def output_name(judge: str) -> str:
    """A file name for a judge's outputs (its name with path-hostile characters replaced)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", judge).strip("-") + ".jsonl"


async def compare_judges(
    items: list[InputLine],
    pipelines: list[Pipeline],
    decomposer: Backend | None,
    out_dir: Path,
    on_sample: Callable[[], None] | None = None,
    samples_in_flight: int = 4,
) -> list[Path]:
    """Verify every sample's shared claims with every pipeline; write one JSONL per judge."""
    params = pipelines[0].options.params
    slots = asyncio.Semaphore(samples_in_flight)

    async def one(item: InputLine) -> list[Report]:
        if item.sample is None:
            return [error_report(item) for _ in pipelines]
        async with slots:
            claims, errors = await shared_claims(item.sample, decomposer, params)
            reports = await asyncio.gather(
                *(pipeline.verify_claims_of(item.sample, item.line, claims) for pipeline in pipelines)
            )
        if on_sample is not None:
            on_sample()
        return [report.model_copy(update={"errors": errors + report.errors}) for report in reports]

    try:
        per_sample = await asyncio.gather(*(one(item) for item in items))
    finally:
        for pipeline in pipelines:
            await pipeline.backend.aclose()
        if decomposer is not None:
            await decomposer.aclose()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for position, pipeline in enumerate(pipelines):
        path = out_dir / output_name(pipeline.backend.name)
        write_reports_atomically(path, [reports[position] for reports in per_sample])
        paths.append(path)
    return paths
