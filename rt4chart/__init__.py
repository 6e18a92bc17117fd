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
from typing import TYPE_CHECKING, Any, Unpack, cast, overload

if TYPE_CHECKING:
    # ``X as X``: an explicit re-export, for type checkers that do not read a computed ``__all__``.
    from rt4chart.judges.budget import RunLimits as RunLimits
    from rt4chart.judges.cache import JudgeCache as JudgeCache
    from rt4chart.judges.policy import CallSettings as CallSettings
    from rt4chart.judges.policy import EndpointSender as EndpointSender
    from rt4chart.judges.policy import EndpointSettings as EndpointSettings
    from rt4chart.judges.policy import PolicyBackend as PolicyBackend
    from rt4chart.judges.policy import Reply as Reply
    from rt4chart.judges.policy import Sender as Sender
    from rt4chart.judges.registry import JudgeConfigError as JudgeConfigError
    from rt4chart.judges.registry import JudgeStack as JudgeStack
    from rt4chart.judges.registry import judge_stack as judge_stack
    from rt4chart.judges.registry import resolve_judge as resolve_judge
    from rt4chart.judges.scripted import ScriptedBackend as ScriptedBackend
    from rt4chart.method.joins import and_join as and_join
    from rt4chart.method.joins import or_join as or_join
    from rt4chart.method.tasks import ClaimJudgement as ClaimJudgement
    from rt4chart.method.tasks import DecomposeInput as DecomposeInput
    from rt4chart.method.tasks import DecomposeOutput as DecomposeOutput
    from rt4chart.method.tasks import VerifyInput as VerifyInput
    from rt4chart.method.tasks import VerifyOutput as VerifyOutput
    from rt4chart.options import AuditOptionKeywords as AuditOptionKeywords
    from rt4chart.options import AuditOptions as AuditOptions
    from rt4chart.protocol import Backend as Backend
    from rt4chart.protocol import BackendWrapper as BackendWrapper
    from rt4chart.protocol import BudgetExhausted as BudgetExhausted
    from rt4chart.protocol import Capabilities as Capabilities
    from rt4chart.protocol import CostEstimator as CostEstimator
    from rt4chart.protocol import GenerationParams as GenerationParams
    from rt4chart.protocol import JudgeRequest as JudgeRequest
    from rt4chart.protocol import JudgeResponse as JudgeResponse
    from rt4chart.protocol import JudgeUnavailable as JudgeUnavailable
    from rt4chart.protocol import Message as Message
    from rt4chart.protocol import TokenCounter as TokenCounter
    from rt4chart.report.outputs import PublishOptions as PublishOptions
    from rt4chart.report.tables import to_dataframe as to_dataframe
    from rt4chart.runs.compare import Comparison as Comparison
    from rt4chart.runs.compare import acompare as acompare
    from rt4chart.runs.config import ProjectConfig as ProjectConfig
    from rt4chart.runs.config import load_config as load_config
    from rt4chart.runs.config_file import ConfigError as ConfigError
    from rt4chart.runs.engine import EngineOptions as EngineOptions
    from rt4chart.runs.engine import Pipeline as Pipeline
    from rt4chart.runs.evaluation import EvalConfig as EvalConfig
    from rt4chart.runs.evaluation import EvaluationResult as EvaluationResult
    from rt4chart.runs.evaluation import aevaluate as aevaluate
    from rt4chart.runs.repair import Repairs as Repairs
    from rt4chart.runs.repair import arepair as arepair
    from rt4chart.runs.run import RunOutcome as RunOutcome
    from rt4chart.runs.run import RunStatus as RunStatus
    from rt4chart.runs.run import aexecute as aexecute
    from rt4chart.runs.run import execute as execute
    from rt4chart.runs.run import exit_code as exit_code
    from rt4chart.runs.run import run_sync as run_sync
    from rt4chart.runs.spec import RunSpec as RunSpec
    from rt4chart.runs.spec import SignalSpec as SignalSpec
    from rt4chart.types import AuditRecord as AuditRecord
    from rt4chart.types import Chunk as Chunk
    from rt4chart.types import Claim as Claim
    from rt4chart.types import ClaimVerdict as ClaimVerdict
    from rt4chart.types import Evidence as Evidence
    from rt4chart.types import Gold as Gold
    from rt4chart.types import Label as Label
    from rt4chart.types import Report as Report  # deprecated alias of AuditRecord, for one release
    from rt4chart.types import Sample as Sample
    from rt4chart.types import Sentence as Sentence
    from rt4chart.types import Span as Span
    from rt4chart.types import Usage as Usage
    from rt4chart.types import Verdict as Verdict
    from rt4chart.types import Vote as Vote

# The names the package exports and the module each lives in: the one list (``__all__`` is made
# from it). The ``TYPE_CHECKING`` imports above say the same for type checkers; tests/test_api.py
# fails when the two differ or a public name is missing from ``__all__``.
_EXPORTS = {
    "RunLimits": "rt4chart.judges.budget",
    "EndpointSender": "rt4chart.judges.policy",
    "EndpointSettings": "rt4chart.judges.policy",
    "Capabilities": "rt4chart.protocol",
    "PublishOptions": "rt4chart.report.outputs",
    "EngineOptions": "rt4chart.runs.engine",
    "SignalSpec": "rt4chart.runs.spec",
    "AuditOptionKeywords": "rt4chart.options",
    "AuditOptions": "rt4chart.options",
    "Backend": "rt4chart.protocol",
    "BackendWrapper": "rt4chart.protocol",
    "BudgetExhausted": "rt4chart.protocol",
    "CallSettings": "rt4chart.judges.policy",
    "Chunk": "rt4chart.types",
    "Claim": "rt4chart.types",
    "ClaimJudgement": "rt4chart.method.tasks",
    "ClaimVerdict": "rt4chart.types",
    "CostEstimator": "rt4chart.protocol",
    "DecomposeInput": "rt4chart.method.tasks",
    "DecomposeOutput": "rt4chart.method.tasks",
    "Evidence": "rt4chart.types",
    "GenerationParams": "rt4chart.protocol",
    "Gold": "rt4chart.types",
    "JudgeCache": "rt4chart.judges.cache",
    "JudgeConfigError": "rt4chart.judges.registry",
    "JudgeRequest": "rt4chart.protocol",
    "JudgeResponse": "rt4chart.protocol",
    "JudgeStack": "rt4chart.judges.registry",
    "JudgeUnavailable": "rt4chart.protocol",
    "Label": "rt4chart.types",
    "Message": "rt4chart.protocol",
    "Pipeline": "rt4chart.runs.engine",
    "PolicyBackend": "rt4chart.judges.policy",
    "Reply": "rt4chart.judges.policy",
    "AuditRecord": "rt4chart.types",
    "Report": "rt4chart.types",  # deprecated alias of AuditRecord, for one release
    "RunOutcome": "rt4chart.runs.run",
    "RunSpec": "rt4chart.runs.spec",
    "RunStatus": "rt4chart.runs.run",
    "Sample": "rt4chart.types",
    "ScriptedBackend": "rt4chart.judges.scripted",
    "Sender": "rt4chart.judges.policy",
    "Sentence": "rt4chart.types",
    "Span": "rt4chart.types",
    "TokenCounter": "rt4chart.protocol",
    "Usage": "rt4chart.types",
    "Verdict": "rt4chart.types",
    "VerifyInput": "rt4chart.method.tasks",
    "VerifyOutput": "rt4chart.method.tasks",
    "Vote": "rt4chart.types",
    "Comparison": "rt4chart.runs.compare",
    "EvalConfig": "rt4chart.runs.evaluation",
    "EvaluationResult": "rt4chart.runs.evaluation",
    "Repairs": "rt4chart.runs.repair",
    "acompare": "rt4chart.runs.compare",
    "aevaluate": "rt4chart.runs.evaluation",
    "aexecute": "rt4chart.runs.run",
    "arepair": "rt4chart.runs.repair",
    "run_sync": "rt4chart.runs.run",
    "and_join": "rt4chart.method.joins",
    "execute": "rt4chart.runs.run",
    "exit_code": "rt4chart.runs.run",
    "judge_stack": "rt4chart.judges.registry",
    "or_join": "rt4chart.method.joins",
    "resolve_judge": "rt4chart.judges.registry",
    "to_dataframe": "rt4chart.report.tables",
    "ConfigError": "rt4chart.runs.config_file",
    "ProjectConfig": "rt4chart.runs.config",
    "load_config": "rt4chart.runs.config",
}

__all__ = sorted([*_EXPORTS, "averify", "verify"])


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
    **options: Unpack[AuditOptionKeywords],
) -> AuditRecord: ...
@overload
async def averify(
    samples: Iterable[Sample | Mapping[str, Any]],
    judge: str | Backend | None = ...,
    *,
    cache_dir: Path | str | None = ...,
    budget: float | None = ...,
    **options: Unpack[AuditOptionKeywords],
) -> list[AuditRecord]: ...


async def averify(
    samples: Sample | Mapping[str, Any] | Iterable[Sample | Mapping[str, Any]],
    judge: str | Backend | None = None,
    *,
    cache_dir: Path | str | None = None,
    budget: float | None = None,
    **options: Unpack[AuditOptionKeywords],
) -> AuditRecord | list[AuditRecord]:
    """Audit one sample (returns a :class:`AuditRecord`) or many (returns a list, in input order).

    ``judge`` is a backend or anything ``rt4 verify --judge`` accepts (default: the embedded
    offline verifier). ``cache_dir`` caches judge calls there, as ``rt4 verify --cache-dir`` does
    (default here: no cache, so a library call writes nothing to disk unless asked), or on a Redis
    server when it is a ``redis://`` URL, as ``--cache-url`` does; ``budget``
    caps the spend in USD and raises :class:`BudgetExhausted` when a call would cross it.
    ``options`` are :class:`AuditOptions` fields (``window``, ``overlap``, ``batch_claims``, ...),
    typed for checkers and IDEs by :class:`AuditOptionKeywords`.
    Invalid samples yield a report with ``errors`` instead of raising. The audit is a run of the run
    layer: :func:`rt4chart.execute` with a :class:`RunSpec` does what ``rt4 verify`` does (``--out``,
    ``--resume``, the published outputs) and returns the outcome instead of raising on a stop.
    """
    from rt4chart.judges.budget import RunLimits
    from rt4chart.options import AuditOptions
    from rt4chart.runs.run import RunUsageError, aexecute, raise_stop
    from rt4chart.runs.spec import RunSpec
    from rt4chart.types import Sample

    single = isinstance(samples, (Sample, Mapping))
    batch = [samples] if single else list(cast("Iterable[Sample | Mapping[str, Any]]", samples))
    spec = RunSpec(judge=judge, cache=cache_dir, limits=RunLimits(budget_usd=budget), options=AuditOptions(**options))
    try:
        outcome = await aexecute(spec, cast("list[Sample | Mapping[str, Any]]", batch))
    except RunUsageError as error:
        # The library raises what it documents (JudgeConfigError, a cache error), not the CLI's wrapper.
        raise (error.__cause__ if isinstance(error.__cause__, Exception) else error) from None
    raise_stop(outcome)  # a budget stop raises BudgetExhausted, an unreachable judge JudgeUnavailable
    reports = outcome.reports
    return reports[0] if single else reports


@overload
def verify(
    samples: Sample | Mapping[str, Any],
    judge: str | Backend | None = ...,
    *,
    cache_dir: Path | str | None = ...,
    budget: float | None = ...,
    **options: Unpack[AuditOptionKeywords],
) -> AuditRecord: ...
@overload
def verify(
    samples: Iterable[Sample | Mapping[str, Any]],
    judge: str | Backend | None = ...,
    *,
    cache_dir: Path | str | None = ...,
    budget: float | None = ...,
    **options: Unpack[AuditOptionKeywords],
) -> list[AuditRecord]: ...


def verify(
    samples: Sample | Mapping[str, Any] | Iterable[Sample | Mapping[str, Any]],
    judge: str | Backend | None = None,
    *,
    cache_dir: Path | str | None = None,
    budget: float | None = None,
    **options: Unpack[AuditOptionKeywords],
) -> AuditRecord | list[AuditRecord]:
    """Synchronous :func:`averify`."""
    import asyncio  # here, not at the top: ``import rt4chart`` (and the CLI's start-up) stays light
    # mypy cannot pick an overload for the union argument; the implementation returns exactly this.
    return cast(
        "AuditRecord | list[AuditRecord]",
        asyncio.run(averify(samples, judge, cache_dir=cache_dir, budget=budget, **options)),
    )
