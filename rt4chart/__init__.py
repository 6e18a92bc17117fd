"""rt4chart: audit RAG answers against their context with the RT4CHART method.

>>> import rt4chart
>>> report = rt4chart.verify({"id": "1", "context": "...", "answer": "..."}, judge="scripted:rules.json")

The public API is what this module exports (``__all__``); every other module is an implementation
detail that may change. Names are imported on first use, so ``import rt4chart`` (and the ``rt4``
command's start-up) does not pay for nltk, torch or litellm until an audit needs them.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast, overload

if TYPE_CHECKING:
    from rt4chart.backends.base import Backend, GenerationParams, JudgeRequest, JudgeResponse
    from rt4chart.budget import BudgetExhausted
    from rt4chart.cache import JudgeCache
    from rt4chart.judges import JudgeConfigError, JudgeStack, judge_stack, resolve_judge
    from rt4chart.options import AuditOptions
    from rt4chart.pipeline import Pipeline
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
        Verdict,
        Vote,
    )
    from rt4chart.verification import and_join, or_join

_EXPORTS = {
    "AuditOptions": "rt4chart.options",
    "Backend": "rt4chart.backends.base",
    "BudgetExhausted": "rt4chart.budget",
    "Chunk": "rt4chart.types",
    "Claim": "rt4chart.types",
    "ClaimVerdict": "rt4chart.types",
    "Evidence": "rt4chart.types",
    "GenerationParams": "rt4chart.backends.base",
    "Gold": "rt4chart.types",
    "JudgeCache": "rt4chart.cache",
    "JudgeConfigError": "rt4chart.judges",
    "JudgeRequest": "rt4chart.backends.base",
    "JudgeResponse": "rt4chart.backends.base",
    "JudgeStack": "rt4chart.judges",
    "Label": "rt4chart.types",
    "Pipeline": "rt4chart.pipeline",
    "Report": "rt4chart.types",
    "Sample": "rt4chart.types",
    "Sentence": "rt4chart.types",
    "Span": "rt4chart.types",
    "Usage": "rt4chart.types",
    "Verdict": "rt4chart.types",
    "Vote": "rt4chart.types",
    "and_join": "rt4chart.verification",
    "judge_stack": "rt4chart.judges",
    "or_join": "rt4chart.verification",
    "resolve_judge": "rt4chart.judges",
}

__all__ = [
    "AuditOptions",
    "Backend",
    "BudgetExhausted",
    "Chunk",
    "Claim",
    "ClaimVerdict",
    "Evidence",
    "GenerationParams",
    "Gold",
    "JudgeCache",
    "JudgeConfigError",
    "JudgeRequest",
    "JudgeResponse",
    "JudgeStack",
    "Label",
    "Pipeline",
    "Report",
    "Sample",
    "Sentence",
    "Span",
    "Usage",
    "Verdict",
    "Vote",
    "and_join",
    "averify",
    "judge_stack",
    "or_join",
    "resolve_judge",
    "verify",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rt4chart' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


@overload
async def averify(
    samples: Sample | Mapping[str, Any],
    judge: str | Backend | None = ...,
    *,
    cache_dir: Path | str | None = ...,
    budget: float | None = ...,
    **options: Any,
) -> Report: ...
@overload
async def averify(
    samples: Iterable[Sample | Mapping[str, Any]],
    judge: str | Backend | None = ...,
    *,
    cache_dir: Path | str | None = ...,
    budget: float | None = ...,
    **options: Any,
) -> list[Report]: ...


async def averify(
    samples: Sample | Mapping[str, Any] | Iterable[Sample | Mapping[str, Any]],
    judge: str | Backend | None = None,
    *,
    cache_dir: Path | str | None = None,
    budget: float | None = None,
    **options: Any,
) -> Report | list[Report]:
    """Audit one sample (returns a :class:`Report`) or many (returns a list, in input order).

    ``judge`` is a backend or anything ``rt4 verify --judge`` accepts (default: the embedded
    offline verifier). ``cache_dir`` caches judge calls there, as ``rt4 verify --cache-dir`` does
    (default here: no cache, so a library call writes nothing to disk unless asked), or on a Redis
    server when it is a ``redis://`` URL, as ``--cache-url`` does; ``budget``
    caps the spend in USD and raises :class:`BudgetExhausted` when a call would cross it.
    ``options`` are :class:`AuditOptions` fields (``window``, ``overlap``, ``batch_claims``, ...).
    Invalid samples yield a report with ``errors`` instead of raising.
    """
    from rt4chart.io import InputLine, parse_sample
    from rt4chart.judges import judge_stack
    from rt4chart.options import AuditOptions
    from rt4chart.pipeline import Pipeline
    from rt4chart.types import Sample

    def item(sample: Sample | Mapping[str, Any], position: int) -> InputLine:
        return InputLine(position, sample) if isinstance(sample, Sample) else parse_sample(dict(sample), position)

    single = isinstance(samples, (Sample, Mapping))
    batch = [samples] if single else list(cast("Iterable[Sample | Mapping[str, Any]]", samples))
    audit_options = AuditOptions(**options)
    stack = judge_stack(judge, cache=cache_dir, budget_usd=budget)
    try:
        pipeline = Pipeline(stack, audit_options)
        reports = [r async for r in pipeline.run(item(s, i) for i, s in enumerate(batch, 1))]  # type: ignore[arg-type]
    finally:
        await stack.aclose()  # closes what the stack opened; a backend passed in stays the caller's
    return reports[0] if single else reports


@overload
def verify(
    samples: Sample | Mapping[str, Any],
    judge: str | Backend | None = ...,
    *,
    cache_dir: Path | str | None = ...,
    budget: float | None = ...,
    **options: Any,
) -> Report: ...
@overload
def verify(
    samples: Iterable[Sample | Mapping[str, Any]],
    judge: str | Backend | None = ...,
    *,
    cache_dir: Path | str | None = ...,
    budget: float | None = ...,
    **options: Any,
) -> list[Report]: ...


def verify(
    samples: Sample | Mapping[str, Any] | Iterable[Sample | Mapping[str, Any]],
    judge: str | Backend | None = None,
    *,
    cache_dir: Path | str | None = None,
    budget: float | None = None,
    **options: Any,
) -> Report | list[Report]:
    """Synchronous :func:`averify`."""
    import asyncio  # here, not at the top: ``import rt4chart`` (and the CLI's start-up) stays light
    # mypy cannot pick an overload for the union argument; the implementation returns exactly this.
    return cast(
        "Report | list[Report]", asyncio.run(averify(samples, judge, cache_dir=cache_dir, budget=budget, **options))
    )
