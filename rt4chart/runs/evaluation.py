"""Run rt4chart (or the direct baseline) over a labelled dataset, score it, and record the result.

A result names everything needed to compare it with another run: the judge, the prompt version,
the sha256 of every dataset file read and of the samples evaluated, the split, the limit, every
option, the date, and the metrics with bootstrap confidence intervals.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, model_validator

from rt4chart.analysis.datasets import (
    UNLABELLED_DATASETS,
    DatasetError,
    dataset_files,
    dataset_path,
    load_dataset,
    samples_sha256,
)
from rt4chart.analysis.metrics import EvaluationMetrics, metrics_markdown, score_reports
from rt4chart.analysis.settlement import StageSettlement, settlement_by_judge
from rt4chart.judges.registry import judge_stack
from rt4chart.options import AuditOptions
from rt4chart.protocol import DEFAULT_MAX_TOKENS, Backend
from rt4chart.records.io import InputLine, PredictionsError, file_sha256, read_predictions
from rt4chart.runs.engine import AuditResult, Pipeline, run_audit
from rt4chart.runs.run import RunObserver, RunOutcome, aexecute
from rt4chart.runs.spec import RunSpec
from rt4chart.types import AuditRecord, Gold, Sample, Usage


class EvalConfig(BaseModel):
    """What to evaluate and how."""

    dataset: str
    """Dataset adapter name (see :mod:`rt4chart.analysis.datasets`)."""
    path: str | None = None
    """Dataset location; ``None`` for the adapter's default."""
    split: str | None = None
    """Dataset split (``dev`` / ``test``)."""
    limit: int | None = Field(default=None, ge=0)
    """Evaluate only the first N samples of the split."""
    judge: str | None = None
    """Judge spec as ``--judge`` takes it; ``None`` for the default judge."""
    api_base: str | None = None
    """Base URL of an OpenAI-compatible server, when the judge needs one."""
    options: AuditOptions = Field(default_factory=AuditOptions)
    """Every option of the audit (method, decomposer, W, O, batching, ...)."""
    resamples: int = Field(default=1000, ge=0)
    """Bootstrap resamples for the confidence intervals."""
    seed: int = 0
    """Bootstrap seed."""
    tag: str | None = None
    """Free label appended to the result's file name (e.g. ``run-2`` of repeated runs)."""

    @model_validator(mode="before")
    @classmethod
    def _group_flat_options(cls, data: Any) -> Any:
        # Result files written before the options were grouped carry them at the top level.
        if isinstance(data, dict) and "options" not in data:
            flat = {name: data[name] for name in AuditOptions.model_fields if name in data}
            if flat:
                data = {key: value for key, value in data.items() if key not in flat} | {"options": flat}
        return data

    @property
    def variant(self) -> str:
        """Short name of the method variant: ``rt4chart``, ``rt4chart-no-global-W10-O3``, ``direct``."""
        options = self.options
        if options.method == "direct":
            return "direct"
        parts = ["rt4chart"]
        if options.decomposer != "auto":
            parts.append(options.decomposer)
        if not options.global_verification:
            parts.append("no-global")
        changed = options.changed()
        if "window" in changed or "overlap" in changed:
            parts.append(f"W{options.window}-O{options.overlap}")
        return "-".join(parts)


class DatasetFile(BaseModel):
    """One file the dataset was read from."""

    path: str
    """Where it was read."""
    sha256: str
    """sha256 of its bytes."""


class EvaluationResult(BaseModel):
    """One evaluation run, as written to ``evals/results``."""

    config: EvalConfig
    """The request."""
    judge: str
    """Name of the judge that ran."""
    prompt_version: str
    """Hash of the prompt templates."""
    files: list[DatasetFile]
    """Dataset files read, with their sha256."""
    samples_sha256: str
    """sha256 of the samples evaluated (after split and limit)."""
    date: str
    """UTC time the run finished, ISO 8601."""
    rt4chart_version: str
    """Version of the installed package."""
    wall_seconds: float
    """Wall time of the audit (measured, machine dependent)."""
    usage: Usage
    """Judge usage summed over samples."""
    samples_with_errors: int
    """Samples whose record carries any error (judge failures are data, not crashes)."""
    metrics: EvaluationMetrics
    """Every metric with confidence intervals."""
    settled_by_judge: dict[str, StageSettlement] = Field(default_factory=dict)
    """Per judge, the claims whose final label it gave and their agreement with gold (cascade stages)."""

    @property
    def configuration_digest(self) -> str:
        """Short sha256 of everything that shapes the figures: dataset, split, limit, the judge that
        ran, every audit option, resamples and seed (not where the data was read, nor the tag)."""
        shaping = self.config.model_dump(mode="json", exclude={"path", "api_base", "tag"}) | {"judge": self.judge}
        return hashlib.sha256(json.dumps(shaping, sort_keys=True).encode("utf-8")).hexdigest()[:8]

    @property
    def stem(self) -> str:
        """File name stem: dataset, split, judge, variant, a non-default max_tokens, limit and tag to
        read, then :attr:`configuration_digest`, so two configurations never share a file (options
        the readable part leaves out, such as ``batch_claims`` or ``ungrounded``, included)."""
        parts = [self.config.dataset, self.config.split or "all", self.judge, self.config.variant]
        if self.config.options.max_tokens != DEFAULT_MAX_TOKENS:
            parts.append(f"max-tokens-{self.config.options.max_tokens}")
        if self.config.limit is not None:
            parts.append(f"n{self.config.limit}")
        if self.config.tag:
            parts.append(self.config.tag)
        return _slug("_".join([*parts, self.configuration_digest]))


class ScoreResult(BaseModel):
    """Scores of an existing predictions file (``rt4 score``)."""

    predictions: DatasetFile
    """The predictions file."""
    gold: DatasetFile | None
    """The gold file; ``None`` when the gold came inside the prediction records."""
    judges: list[str]
    """Judges named by the prediction records."""
    prompt_versions: list[str]
    """Prompt versions named by the prediction records."""
    date: str
    """UTC time of scoring, ISO 8601."""
    metrics: EvaluationMetrics
    """Every metric with confidence intervals."""


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _package_version() -> str:
    try:
        return version("rt4chart")
    except PackageNotFoundError:
        return "unknown"


def load_samples(config: EvalConfig) -> list[Sample]:
    """The samples ``config`` evaluates; raises :class:`rt4chart.analysis.datasets.DatasetError`."""
    if config.dataset in UNLABELLED_DATASETS:
        raise DatasetError(f"{config.dataset} has no gold labels to score against: rt4 convert it, then rt4 verify")
    return load_dataset(config.dataset, _path(config), config.split, config.limit)


def _path(config: EvalConfig) -> Path | None:
    return Path(config.path) if config.path else None


def evaluate(
    config: EvalConfig,
    samples: Sequence[Sample] | None = None,
    backend: Backend | None = None,
    on_report: Callable[[AuditRecord], None] | None = None,
) -> tuple[EvaluationResult, list[AuditRecord]]:
    """Audit every sample of the configured dataset and score the reports.

    ``samples`` are what :func:`load_samples` returns for ``config`` (loaded here when omitted);
    ``backend`` overrides ``config.judge`` (the caller builds and closes it, e.g. a
    :func:`rt4chart.judges.registry.judge_stack` with a cache); otherwise a stack without cache is built
    and closed here. Raises
    :class:`rt4chart.analysis.datasets.DatasetError` or :class:`rt4chart.judges.registry.JudgeConfigError` before
    any judge call when the data or the judge cannot be used, and the stop's exception
    (:class:`~rt4chart.protocol.BudgetExhausted`, :class:`~rt4chart.protocol.JudgeUnavailable`)
    when the audit stops. ``rt4 eval`` runs through :func:`aevaluate` instead, which reports a stop
    as its status.
    """
    if samples is None:
        samples = load_samples(config)
    judge = backend or judge_stack(config.judge, api_base=config.api_base)
    pipeline = Pipeline(judge, config.options)
    items = [InputLine(position, sample) for position, sample in enumerate(samples, start=1)]
    reports: list[AuditRecord] = []

    def collect(report: AuditRecord) -> None:
        reports.append(report)
        if on_report is not None:
            on_report(report)

    async def audit() -> AuditResult:
        try:
            return await run_audit(pipeline, items, None, collect)
        finally:
            if backend is None:
                await judge.aclose()

    started = time.perf_counter()
    stopped = asyncio.run(audit()).stop
    if stopped is not None:  # an incomplete evaluation is not a result
        raise stopped.exception()
    return evaluation_result(config, samples, reports, judge.name, pipeline.prompt_version,
                             time.perf_counter() - started), reports


def evaluation_result(
    config: EvalConfig, samples: Sequence[Sample], reports: list[AuditRecord], judge: str, prompt_version: str,
    wall: float,
) -> EvaluationResult:
    """The scored result of ``reports``, the records of an audit of ``samples`` (what ``rt4 eval``
    writes), with the provenance of its data, judge, prompts and code."""
    path = _path(config)
    files = [DatasetFile(path=str(f), sha256=file_sha256(f)) for f in dataset_files(config.dataset, path, config.split)]
    return EvaluationResult(
        config=config.model_copy(update={"path": str(dataset_path(config.dataset, path))}),
        judge=judge,
        prompt_version=prompt_version,
        files=files,
        samples_sha256=samples_sha256(samples),
        date=_now(),
        rt4chart_version=_package_version(),
        wall_seconds=round(wall, 3),
        usage=sum((r.usage for r in reports), Usage()),
        samples_with_errors=sum(bool(r.errors) or any(c.errors for c in r.claims) for r in reports),
        metrics=score_reports(
            reports, resamples=config.resamples, seed=config.seed, spans=config.options.decomposer != "holistic"
        ),
        settled_by_judge=settlement_by_judge((r, r.gold) for r in reports if r.hallucinated is not None),
    )


def result_details(result: EvaluationResult) -> dict[str, str]:
    """The provenance lines shown above a result's metrics table."""
    config = result.config
    return {
        "dataset": f"{config.dataset} ({config.path})",
        "split": config.split or "all",
        "limit": str(config.limit) if config.limit is not None else "none",
        "judge": result.judge,
        "method": config.variant,
        "options": ", ".join(f"{name}={value}" for name, value in config.options),
        "prompt version": result.prompt_version,
        "dataset sha256": ", ".join(f"{Path(f.path).name} {f.sha256[:16]}" for f in result.files[:4])
        + (f" (+{len(result.files) - 4} files)" if len(result.files) > 4 else ""),
        "samples sha256": result.samples_sha256[:16],
        "date": result.date,
        "wall time": f"{result.wall_seconds:.1f} s",
        "judge calls": f"{result.usage.calls} ({result.usage.cache_hits} from cache), ${result.usage.cost_usd:.4f}",
        "samples with errors": str(result.samples_with_errors),
        "claims settled by judge": "; ".join(
            f"{judge}: {stage.describe()}" for judge, stage in result.settled_by_judge.items()
        ) or "none",
    }


def write_result(
    result: EvaluationResult, directory: Path, reports: list[AuditRecord] | None = None
) -> list[Path]:
    """Write ``<stem>.json`` and ``<stem>.md`` (and ``<stem>.predictions.jsonl`` when ``reports``)."""
    directory.mkdir(parents=True, exist_ok=True)
    json_path = directory / f"{result.stem}.json"
    markdown_path = directory / f"{result.stem}.md"
    json_path.write_text(result.model_dump_json(indent=2) + "\n", encoding="utf-8")
    title = f"{result.config.dataset} {result.config.split or 'all'}: {result.judge}, {result.config.variant}"
    markdown_path.write_text(
        metrics_markdown(result.metrics, title, result_details(result)), encoding="utf-8"
    )
    written = [json_path, markdown_path]
    if reports is not None:
        predictions = directory / f"{result.stem}.predictions.jsonl"
        predictions.write_text("".join(r.model_dump_json() + "\n" for r in reports), encoding="utf-8")
        written.append(predictions)
    return written


def score_predictions(
    predictions: Path, gold: Path | None = None, *, resamples: int = 1000, seed: int = 0
) -> ScoreResult:
    """Score an existing predictions file against ``gold`` (generic JSONL) or the gold inside it."""
    reports = read_predictions(predictions)
    gold_by_id: dict[str, Gold] | None = None
    if gold is not None:
        gold_by_id = {s.id: s.gold for s in load_dataset("generic", gold) if s.gold is not None}
    elif not any(r.gold is not None for r in reports):
        raise PredictionsError(f"{predictions} carries no gold labels; pass --gold GOLD.jsonl")
    return ScoreResult(
        predictions=DatasetFile(path=str(predictions), sha256=file_sha256(predictions)),
        gold=DatasetFile(path=str(gold), sha256=file_sha256(gold)) if gold else None,
        judges=sorted({r.judge for r in reports if r.judge}),
        prompt_versions=sorted({r.prompt_version for r in reports if r.prompt_version}),
        date=_now(),
        metrics=score_reports(reports, gold_by_id, resamples=resamples, seed=seed),
    )


def score_details(result: ScoreResult) -> dict[str, str]:
    """The provenance lines shown above a score's metrics table."""
    return {
        "predictions": f"{result.predictions.path} ({result.predictions.sha256[:16]})",
        "gold": f"{result.gold.path} ({result.gold.sha256[:16]})" if result.gold else "inside the predictions",
        "judges": ", ".join(result.judges) or "unknown",
        "prompt versions": ", ".join(result.prompt_versions) or "unknown",
        "date": result.date,
    }


def write_converted(samples: Sequence[Sample], out: Path) -> None:
    """Write samples as rt4chart input JSONL with gold (what ``rt4 convert`` produces)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(s.model_dump_json(exclude_none=True) + "\n" for s in samples), encoding="utf-8")


async def aevaluate(
    spec: RunSpec, config: EvalConfig, samples: Sequence[Sample], *, observer: RunObserver | None = None
) -> RunOutcome[EvaluationResult | None]:
    """``rt4 eval``: audit ``samples`` (what :func:`load_samples` gives for ``config``) as a run of
    ``spec``, then score the records against their gold labels: the payload, ``None`` when the
    audit stopped (an incomplete evaluation is not a result)."""
    started = time.perf_counter()
    run = await aexecute(spec, samples, observer=observer, command="eval")
    result = None
    if run.stop is None:
        wall = time.perf_counter() - started
        result = evaluation_result(config, samples, run.reports, run.judge, run.prompt_version, wall)
    # An evaluation measures: failing answers, verdicts left open and answers that could not be
    # audited are its data (its metrics count them), so only a stop decides its status.
    decided = run.counts.model_copy(update={"incomplete": 0, "invalid": 0}) if result is not None else run.counts
    return RunOutcome(
        payload=result, counts=decided, fails=False, stop=run.stop, judge=run.judge,
        prompt_version=run.prompt_version, spent_usd=run.spent_usd, budget_usd=run.budget_usd,
        reports=run.reports, summary=run.summary,
        reason=run.reason if result is None else (
            f"passed: {result.metrics.samples} answers scored against their gold labels (its verdicts, open "
            "verdicts and invalid answers are the evaluation's data, not a failure)"
        ),
    )
