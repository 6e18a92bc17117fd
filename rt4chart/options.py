"""Every option that shapes an audit, declared once.

:class:`AuditOptions` is the one home of an option: its default, its bounds and its documentation
(the field docstring, which is also the ``--help`` text of its CLI flag). The CLI, the Python API,
the evaluation harness and the benchmarks all build this model; validation happens here only.

Adding an option: add a field here (with a docstring and bounds), read it where the method needs
it; ``rt4 verify``, ``estimate``, ``eval``, ``compare`` and ``repair`` get the flag
``--<field-name>`` from :func:`rt4chart.cli.audit_options` automatically, and an evaluation
records it in its result.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from rt4chart.backends.base import DEFAULT_MAX_TOKENS, GenerationParams

DecomposerKind = Literal["judge", "rules", "auto", "holistic"]
"""How answers become claims."""

Method = Literal["rt4chart", "direct"]
"""The full method, or the one-call baseline of the paper's ablations."""

UngroundedPolicy = Literal["downgrade", "keep"]
"""What an entailed or contradicted verdict whose evidence is not in the context becomes."""


class FailOn(StrEnum):
    """Which answers fail a run (exit code 1, JUnit failures): a policy of what a finished run
    reports, declared here beside the audit's options so the CLI needs no reporting module to
    offer it."""

    CONTRADICTED = "contradicted"
    HALLUCINATED = "hallucinated"
    NEVER = "never"
    NEW = "new"
    """Only hallucinations the ``--baseline`` audit did not have (and hallucinated answers new to the input)."""
    WORSE = "worse"
    """Only a hallucination rate above the ``--baseline``'s beyond the paired bootstrap CI."""


class ShowOnly(StrEnum):
    """Which samples ``rt4 show --only`` keeps: the :class:`FailOn` policies that select answers
    by their own label (``never``, ``new`` and ``worse`` select none, or need a baseline)."""

    CONTRADICTED = FailOn.CONTRADICTED.value
    HALLUCINATED = FailOn.HALLUCINATED.value


_JUDGE, _METHOD, _OUTPUTS, _RESUME, _SCALE, _SIGNALS = (
    "Judge and cost", "Method", "Outputs and CI", "Resume", "Scale-out", "Signals",
)
HELP_PANELS: dict[str, str] = {
    **dict.fromkeys(
        ["judge", "api_base", "concurrency", "budget", "cache_dir", "no_cache", "cache_url", "timeout",
         "max_tokens", "temperature", "sampling_seed"], _JUDGE),
    **dict.fromkeys(
        ["method", "decomposer", "decompose_per_sentence", "decompose_with_question", "max_claims_per_sentence",
         "window", "overlap", "batch_claims", "global_verification", "global_auto", "ungrounded", "skip_decided"],
        _METHOD),
    **dict.fromkeys(
        ["out", "quiet", "output_format", "html_report", "junit", "github", "fail_on", "max_rate", "baseline"],
        _OUTPUTS),
    "resume": _RESUME,
    **dict.fromkeys(["engine", "address", "workers", "worker_cpus", "samples_in_flight"], _SCALE),
    **dict.fromkeys(["signals", "signal_model", "signal_probe", "signal_server", "signal_delta"], _SIGNALS),
}
"""The ``--help`` panel of each option (by parameter name), declared once for every command that
offers it: ``rt4 verify --help`` reads as six short groups instead of one wall."""


class OutputFormat(StrEnum):
    """What ``rt4 verify`` writes to stdout when no ``--out`` is given."""

    AUTO = "auto"
    """The readable view on a terminal, JSONL anywhere else (pipes, files, CI logs)."""
    JSONL = "jsonl"
    """One JSON record per line, always."""
    TEXT = "text"
    """The readable view, always."""


class AuditOptions(BaseModel):
    """Everything that shapes an audit besides the judge."""

    # A misspelt option (``windw=5``) must fail loudly rather than silently audit with defaults.
    # Field docstrings become descriptions: the CLI shows them as --help text.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    method: Method = "rt4chart"
    """rt4chart (the full method) or direct (one call per answer, the paper's baseline)."""
    decomposer: DecomposerKind = "auto"
    """judge, rules, auto (the judge when it can decompose, else rules), or holistic (an ablation: no answer spans)."""
    decompose_per_sentence: bool = False
    """A judge decomposer gets one call per answer sentence (the paper's reference; the rest of the
    answer is shown read-only for pronouns) instead of one call per answer."""
    decompose_with_question: bool = False
    """Show the question to the decomposer (the paper's decomposer sees only the answer)."""
    max_claims_per_sentence: int = Field(default=8, ge=1)
    """Most claims a judge decomposer may draw from one answer sentence (more are dropped with an error:
    a runaway reply cannot multiply an audit's cost)."""
    window: int = Field(default=25, ge=1)
    """Context sentences per chunk (W)."""
    overlap: int = Field(default=10, ge=0)
    """Sentences shared by consecutive chunks (O < W)."""
    batch_claims: int = Field(default=8, ge=1)
    """Claims judged per call; 1 = reference algorithm."""
    global_verification: bool = Field(default=True, json_schema_extra={"flag": "--global/--no-global"})
    """Re-judge claims against the full context (adaptive by local label)."""
    global_auto: bool = False
    """Skip the global call when the whole context fits one chunk (the local verdict stands: the
    global stage would re-read the same text); off by default, as in the paper."""
    ungrounded: UngroundedPolicy = "downgrade"
    """downgrade (the paper's rule: a verdict whose evidence is not in the context, even after a
    re-ask, becomes baseless, the judge's text kept) or keep."""
    skip_decided: bool = True
    """Ask no further chunk about a claim already contradicted (its OR-join is settled)."""
    max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, ge=1)
    """Most completion tokens per judge call (what a budget reserves for each)."""
    temperature: float = Field(default=0.0, ge=0.0)
    """Sampling temperature of judge calls; 0 for reproducible verdicts."""
    sampling_seed: int | None = 42
    """Sampling seed of judge calls, for providers that honour one (the paper's 42)."""
    samples_in_flight: int = Field(default=16, ge=1)
    """Samples audited at once (fewer finish sooner under a budget)."""

    @field_validator("overlap")
    @classmethod
    def _overlap_below_window(cls, overlap: int, info: ValidationInfo) -> int:
        window = info.data.get("window")
        if window is None or overlap >= window:
            # Also when the window itself is invalid: the pair is wrong, and both flags are named.
            raise ValueError(f"overlap must be smaller than a valid window (got overlap={overlap})")
        return overlap

    @property
    def params(self) -> GenerationParams:
        """Sampling parameters of every judge call."""
        return GenerationParams(temperature=self.temperature, seed=self.sampling_seed, max_tokens=self.max_tokens)

    def changed(self) -> dict[str, object]:
        """The options that differ from their defaults, in declaration order (for names of results)."""
        defaults = AuditOptions()
        return {name: value for name, value in self if value != getattr(defaults, name)}



class AuditOptionKeywords(TypedDict, total=False):
    """:class:`AuditOptions` as keyword arguments (``rt4chart.verify(..., **options)``), so type
    checkers and IDEs know them; ``tests/test_api.py`` keeps the two in step. Values are validated
    by :class:`AuditOptions`."""

    method: Method
    decomposer: DecomposerKind
    decompose_per_sentence: bool
    decompose_with_question: bool
    max_claims_per_sentence: int
    window: int
    overlap: int
    batch_claims: int
    global_verification: bool
    global_auto: bool
    ungrounded: UngroundedPolicy
    skip_decided: bool
    max_tokens: int
    temperature: float
    sampling_seed: int | None
    samples_in_flight: int

Engine = Literal["local", "ray"]
"""Where an audit runs: this process, or a Ray cluster's workers."""


class EngineOptions(BaseModel):
    """Where ``rt4 verify`` runs its audit (``--engine``, ``--address``, ``--workers``, ``--worker-cpus``):
    options of the run, not of the audit, so they change no record and no ``--resume`` binding."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    engine: Engine = "local"
    """local (this process) or ray (a Ray Data pipeline over worker actors; the ray extra)."""
    address: str | None = None
    """Ray cluster to join (auto: the one started on this machine with `ray start`); default: a local one."""
    workers: int = Field(default=2, ge=1)
    """Ray workers, each with its own judge stack and --concurrency calls in flight."""
    worker_cpus: float = Field(default=1.0, gt=0.0)
    """CPUs Ray reserves per worker (a judge worker mostly waits on HTTP; litellm costs a few ms of CPU per call)."""
