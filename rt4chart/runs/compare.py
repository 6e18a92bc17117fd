"""``rt4 compare``: several judges verify one claim set, so their claim verdicts are comparable.

Each answer is decomposed once (:func:`decompose_once`, through the pipeline's own decomposition
front: by the ``--decompose-with`` judge as ``--decomposer`` says, else by the rule decomposer),
and every judge verifies exactly those claims through its own :class:`SharedClaimsEngine`, which
the run layer (:func:`rt4chart.runs.run.acompare`) drives like any other engine: one output file
per judge, in input order, one record per input line, the same stop policy as ``rt4 verify``;
ready for ``rt4 agree --level claim`` (which then aligns claims one to one).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass

from rt4chart.method.decompose import Decomposition
from rt4chart.protocol import BudgetExhausted, JudgeUnavailable
from rt4chart.records.io import InputLine, error_report
from rt4chart.runs.engine import BudgetStop, Pipeline, PipelineBound, UnavailableStop, in_input_order, stop_of
from rt4chart.types import AuditRecord, Sample


def output_name(judge: str) -> str:
    """A file name for a judge's outputs (its name with path-hostile characters replaced)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", judge).strip("-") + ".jsonl"


async def decompose_once(items: list[InputLine], decomposer: Pipeline) -> dict[int, Decomposition]:
    """Every valid sample's claims, by input line, drawn once by ``decomposer``'s front
    (:meth:`~rt4chart.runs.engine.Pipeline.draw_claims`, ``samples_in_flight`` at a time); raises the
    decomposer's stop (:class:`~rt4chart.protocol.BudgetExhausted`,
    :class:`~rt4chart.protocol.JudgeUnavailable`)."""
    slots = asyncio.Semaphore(decomposer.options.samples_in_flight)
    valid = [item for item in items if item.sample is not None]

    async def one(sample: Sample) -> Decomposition:
        async with slots:
            return await decomposer.draw_claims(sample)

    drawn = await asyncio.gather(*(one(item.sample) for item in valid if item.sample is not None))
    return {item.line: decomposition for item, decomposition in zip(valid, drawn, strict=True)}


@dataclass
class SharedClaimsEngine(PipelineBound):
    """An :class:`~rt4chart.runs.engine.AuditEngine` that verifies the claims drawn once per answer
    (:func:`decompose_once`) with one judge's pipeline: every judge of a comparison judges the same
    claims, so their claim verdicts align one to one."""

    pipeline: Pipeline
    """The judge's pipeline (its judge stays the caller's)."""
    shared: Mapping[int, Decomposition]
    """The claims of each valid input line."""
    stop: BudgetStop | UnavailableStop | None = None
    """Why the claims could not be drawn (the decomposer stopped): the engine stops at once."""

    async def audit(self, items: Iterable[InputLine]) -> AsyncIterator[AuditRecord | BudgetStop | UnavailableStop]:
        if self.stop is not None:
            yield self.stop
            return
        try:
            async for report in in_input_order(items, self._report, self.options.samples_in_flight):
                yield report
        except (BudgetExhausted, JudgeUnavailable) as error:
            yield stop_of(error)

    async def _report(self, item: InputLine) -> AuditRecord:
        if item.sample is None:
            return error_report(item)
        return await self.pipeline.verify_sample(item.sample, item.line, self.shared[item.line])
