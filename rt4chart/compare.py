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

from rt4chart.backends.base import Backend
from rt4chart.decompose import Decomposition, decompose_by_judge, rule_decomposition
from rt4chart.io import InputLine, error_report, write_reports_atomically
from rt4chart.options import AuditOptions
from rt4chart.pipeline import Pipeline
from rt4chart.session import JudgeSession
from rt4chart.tasks import load_prompts
from rt4chart.text import split_sentences
from rt4chart.types import Report, Sample


async def shared_claims(sample: Sample, decomposer: Backend | None, options: AuditOptions) -> Decomposition:
    """The sample's claims: from ``decomposer`` (as the audit would ask it), or by rules when ``None``."""
    sentences = split_sentences(sample.answer)
    if decomposer is None:
        return rule_decomposition(sentences)
    session = JudgeSession(decomposer, load_prompts(), options.params)
    question = sample.question if options.decompose_with_question else None
    return await decompose_by_judge(
        session, sentences, question, options.max_claims_per_sentence, options.decompose_per_sentence
    )


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
    """Verify every sample's shared claims with every pipeline; write one JSONL per judge.

    The judges (and the decomposer) stay open: the caller built them and closes them."""
    options = pipelines[0].options
    slots = asyncio.Semaphore(samples_in_flight)

    async def one(item: InputLine) -> list[Report]:
        if item.sample is None:
            return [error_report(item) for _ in pipelines]
        async with slots:
            shared = await shared_claims(item.sample, decomposer, options)
            reports = await asyncio.gather(
                *(pipeline.verify_sample(item.sample, item.line, shared.claims) for pipeline in pipelines)
            )
        if on_sample is not None:
            on_sample()
        return [
            report.model_copy(update={"errors": shared.errors + report.errors, "decomposition": shared.stats})
            for report in reports
        ]

    per_sample = await asyncio.gather(*(one(item) for item in items))
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for position, pipeline in enumerate(pipelines):
        path = out_dir / output_name(pipeline.backend.name)
        write_reports_atomically(path, [reports[position] for reports in per_sample])
        paths.append(path)
    return paths
