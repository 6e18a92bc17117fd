"""rt4chart: audit RAG answers against their context with the RT4CHART method.

>>> import rt4chart
>>> report = rt4chart.verify({"id": "1", "context": "...", "answer": "..."}, judge="scripted:rules.json")
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any, cast, overload

from rt4chart.backends.base import Backend, GenerationParams, JudgeRequest, JudgeResponse
from rt4chart.io import InputLine, parse_sample
from rt4chart.judges import JudgeConfigError, resolve_judge
from rt4chart.pipeline import Pipeline, PipelineOptions
from rt4chart.types import (
    Chunk,
    Claim,
    ClaimVerdict,
    Evidence,
    Gold,
    Label,
    Report,
    Sample,
    Sentence,
    Span,
    Usage,
    Vote,
)
from rt4chart.verify import and_join, or_join

__all__ = [
    "Backend",
    "Chunk",
    "Claim",
    "ClaimVerdict",
    "Evidence",
    "GenerationParams",
    "Gold",
    "JudgeConfigError",
    "JudgeRequest",
    "JudgeResponse",
    "Label",
    "Pipeline",
    "PipelineOptions",
    "Report",
    "Sample",
    "Sentence",
    "Span",
    "Usage",
    "Vote",
    "and_join",
    "averify",
    "or_join",
    "resolve_judge",
    "verify",
]

SampleLike = Sample | Mapping[str, Any]


def _input_line(sample: SampleLike, position: int) -> InputLine:
    if isinstance(sample, Sample):
        return InputLine(position, sample)
    return parse_sample(dict(sample), position)


@overload
async def averify(samples: SampleLike, judge: str | Backend | None = ..., **options: Any) -> Report: ...
@overload
async def averify(samples: Iterable[SampleLike], judge: str | Backend | None = ..., **options: Any) -> list[Report]: ...


async def averify(
    samples: SampleLike | Iterable[SampleLike], judge: str | Backend | None = None, **options: Any
) -> Report | list[Report]:
    """Audit one sample (returns a :class:`Report`) or many (returns a list, in input order).

    ``judge`` is a backend or anything ``rt4 verify --judge`` accepts (default: the embedded
    offline verifier); ``options`` are
    :class:`PipelineOptions` fields (``window``, ``overlap``, ``batch_claims``, ...). Invalid
    samples yield a report with ``errors`` instead of raising.
    """
    single = isinstance(samples, (Sample, Mapping))
    batch: list[SampleLike] = [samples] if isinstance(samples, (Sample, Mapping)) else list(samples)
    backend = judge if isinstance(judge, Backend) else resolve_judge(judge)
    pipeline = Pipeline(backend, PipelineOptions(**options))
    try:
        reports = [r async for r in pipeline.run(_input_line(s, i) for i, s in enumerate(batch, 1))]
    finally:
        if backend is not judge:
            await backend.aclose()
    return reports[0] if single else reports


@overload
def verify(samples: SampleLike, judge: str | Backend | None = ..., **options: Any) -> Report: ...
@overload
def verify(samples: Iterable[SampleLike], judge: str | Backend | None = ..., **options: Any) -> list[Report]: ...


def verify(
    samples: SampleLike | Iterable[SampleLike], judge: str | Backend | None = None, **options: Any
) -> Report | list[Report]:
    """Synchronous :func:`averify`."""
    # mypy cannot pick an overload for the union argument; the implementation returns exactly this.
    return cast("Report | list[Report]", asyncio.run(averify(samples, judge, **options)))
