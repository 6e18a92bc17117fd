"""``rt4 repair`` as an engine of the one run path.

Each verify record is an input line of the repair run (:func:`repair_items`: its position in the
verify file, the sample it audits, a digest of both), and :class:`RepairEngine` repairs them
through the repairing judge, ``samples_in_flight`` at a time, in input order, its stop (the budget,
the judge unavailable) a value. The run layer (:func:`rt4chart.runs.run.arepair`) drives it with
:func:`rt4chart.runs.engine.run_audit`, as it drives the audit engines: records streamed to the
output under its lock, one per verify record, ``--resume`` keeping the finished ones.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from rt4chart.judges.budget import Ledger, SampleAdmission
from rt4chart.method.repair import Repairer, RepairRecord, RepairStrategy
from rt4chart.method.tasks import load_prompts, prompt_set_version
from rt4chart.protocol import BudgetExhausted, GenerationParams, JudgeUnavailable
from rt4chart.records.io import InputLine, RecordKind
from rt4chart.runs.engine import BudgetStop, UnavailableStop, in_input_order, stop_of
from rt4chart.types import AuditRecord


class RepairSettings(BaseModel):
    """What a repair record is bound to for ``--resume``, besides the repairing judge and its prompts."""

    model_config = ConfigDict(frozen=True)

    strategy: RepairStrategy
    """remove, extract or rewrite."""
    params: GenerationParams
    """The repairing judge's generation parameters."""


def repair_items(
    records: Sequence[AuditRecord | str], samples: Iterable[InputLine], input_name: str
) -> tuple[list[InputLine], dict[int, AuditRecord]]:
    """The input lines of a repair run, one per verify record (numbered by its position in the
    verify file), and the verify record of each line that has its sample. A record that is not one,
    or whose sample is missing, is an invalid line (its repair record says why). A line's digest
    binds the verify record and the sample's input line together (``--resume``)."""
    by_line = {item.line: item for item in samples}
    items: list[InputLine] = []
    verified: dict[int, AuditRecord] = {}
    for position, record in enumerate(records, start=1):
        if isinstance(record, str):
            items.append(InputLine(position, None, record))
            continue
        item = by_line.get(record.line)
        if item is None or item.sample is None or item.sample.id != record.id:
            problem = f"no valid sample with id {record.id!r} on line {record.line} of {input_name}"
            items.append(InputLine(position, None, problem, raw_id=record.id))
            continue
        digest = None
        if item.digest is not None:
            digest = hashlib.sha256(f"{record.model_dump_json()}:{item.digest}".encode()).hexdigest()
        items.append(InputLine(position, item.sample, raw_id=record.id, digest=digest))
        verified[position] = record
    return items, verified


def repair_records(strategy: RepairStrategy) -> RecordKind[RepairRecord]:
    """How the batch runner reads repair records: finished when repaired without an error."""

    def unrepaired(item: InputLine, stop: str) -> RepairRecord:
        record_id = item.sample.id if item.sample is not None else item.raw_id
        return RepairRecord(id=record_id, line=item.line, strategy=strategy, original=None, repaired=None,
                            errors=[f"not repaired: {stop}"])

    return RecordKind(
        RepairRecord.model_validate, lambda record: record.repaired is not None and not record.errors, unrepaired
    )


@dataclass
class RepairEngine:
    """An :class:`~rt4chart.runs.engine.AuditEngine` of repair records: each verify record's answer
    repaired by ``repairer``, ``samples_in_flight`` at a time (fewer when the budget says so), in
    input order."""

    repairer: Repairer
    """The strategy and its repairing judge (which stays the caller's)."""
    verified: Mapping[int, AuditRecord]
    """The verify record of each valid input line (:func:`repair_items`)."""
    samples_in_flight: int
    """Answers repaired at once."""
    ledger: Ledger | None = None
    """The repairing judge's ledger (its budget admits samples); ``None`` without a judge."""

    @property
    def judge_name(self) -> str:
        return self.repairer.backend.name if self.repairer.backend is not None else ""

    @property
    def prompt_version(self) -> str:
        return prompt_set_version(load_prompts()) if self.repairer.backend is not None else ""

    @property
    def options(self) -> RepairSettings:
        return RepairSettings(strategy=self.repairer.strategy, params=self.repairer.params)

    @property
    def records(self) -> RecordKind[RepairRecord]:
        return repair_records(self.repairer.strategy)

    async def audit(self, items: Iterable[InputLine]) -> AsyncIterator[RepairRecord | BudgetStop | UnavailableStop]:
        try:
            admission = SampleAdmission(self.ledger)
            async for record in in_input_order(items, self._repair, self.samples_in_flight, admission):
                yield record
        except (BudgetExhausted, JudgeUnavailable) as error:
            yield stop_of(error)

    async def _repair(self, item: InputLine) -> RepairRecord:
        if item.sample is None:
            return RepairRecord(id=item.raw_id, line=item.line, strategy=self.repairer.strategy, original=None,
                                repaired=None, errors=[item.error or "invalid input"])
        record = await self.repairer.repair(self.verified[item.line], item.sample)
        record.line = item.line  # the verify record's position in its file
        return record
