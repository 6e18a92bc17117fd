"""Every option that shapes an audit, declared once.

:class:`AuditOptions` is the one home of an option: its default, its bounds and its documentation
(the field docstring, which is also the ``--help`` text of its CLI flag). The CLI, the Python API,
the evaluation harness and the benchmarks all build this model; validation happens here only.

Adding an option: add a field here (with a docstring, bounds and its ``--help`` panel,
``json_schema_extra={"panel": HelpPanel...}``), read it where the method needs it; ``rt4 verify``,
``estimate``, ``eval``, ``compare`` and ``repair`` get the flag ``--<field-name>`` from
:data:`rt4chart.cli.flags.AUDIT_FLAGS` automatically, and an evaluation records it in its result.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Literal, TypedDict

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from rt4chart.languages import normalize_language
from rt4chart.protocol import DEFAULT_MAX_TOKENS, GenerationParams
from rt4chart.types import Label

DecomposerKind = Literal["judge", "rules", "auto", "holistic"]
"""How answers become claims."""

Method = Literal["rt4chart", "direct"]
"""The full method, or the one-call baseline of the paper's ablations."""

UngroundedPolicy = Literal["downgrade", "keep"]
"""What an entailed or contradicted verdict whose evidence is not in the context becomes."""


class HelpPanel(StrEnum):
    """The ``--help`` panel of a flag, declared on the field it is built from
    (``json_schema_extra={"panel": HelpPanel.METHOD}``; :mod:`rt4chart.cli.flags` reads it): ``rt4 verify
    --help`` reads as six short groups instead of one wall, and ``tests/test_cli.py`` fails for a flag
    whose field declares none."""

    JUDGE = "Judge and cost"
    METHOD = "Method"
    OUTPUTS = "Outputs and CI"
    RESUME = "Resume"
    SCALE = "Scale-out"
    SIGNALS = "Signals"


class AuditOptions(BaseModel):
    """Everything that shapes an audit besides the judge."""

    # A misspelt option (``windw=5``) must fail loudly rather than silently audit with defaults.
    # Field docstrings become descriptions: the CLI shows them as --help text.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    method: Method = Field(default="rt4chart", json_schema_extra={"panel": HelpPanel.METHOD})
    """rt4chart (the full method) or direct (one call per answer, the paper's baseline)."""
    decomposer: DecomposerKind = Field(default="auto", json_schema_extra={"panel": HelpPanel.METHOD})
    """judge, rules, auto (the judge when it can decompose, else rules), or holistic (an ablation: no answer spans)."""
    decompose_per_sentence: bool = Field(default=False, json_schema_extra={"panel": HelpPanel.METHOD})
    """A judge decomposer gets one call per answer sentence (the paper's reference; the rest of the
    answer is shown read-only for pronouns) instead of one call per answer."""
    decompose_with_question: bool = Field(default=False, json_schema_extra={"panel": HelpPanel.METHOD})
    """Show the question to the decomposer (the paper's decomposer sees only the answer)."""
    max_claims_per_sentence: int = Field(default=8, ge=1, json_schema_extra={"panel": HelpPanel.METHOD})
    """Most claims a judge decomposer may draw from one answer sentence (more are dropped with an error:
    a runaway reply cannot multiply an audit's cost)."""
    window: int = Field(default=25, ge=1, json_schema_extra={"panel": HelpPanel.METHOD})
    """Context sentences per chunk (W)."""
    overlap: int = Field(default=10, ge=0, json_schema_extra={"panel": HelpPanel.METHOD})
    """Sentences shared by consecutive chunks (O < W)."""
    batch_claims: int = Field(default=8, ge=1, json_schema_extra={"panel": HelpPanel.METHOD})
    """Claims judged per call; 1 = reference algorithm."""
    global_verification: bool = Field(
        default=True, json_schema_extra={"flag": "--global/--no-global", "panel": HelpPanel.METHOD}
    )
    """Re-judge claims against the full context (adaptive by local label)."""
    global_auto: bool = Field(default=False, json_schema_extra={"panel": HelpPanel.METHOD})
    """Skip the global call when the whole context fits one chunk (the local verdict stands: the
    global stage would re-read the same text); off by default, as in the paper."""
    ungrounded: UngroundedPolicy = Field(default="downgrade", json_schema_extra={"panel": HelpPanel.METHOD})
    """downgrade (a verdict whose evidence is not in the context, even after a re-ask, becomes
    baseless, the judge's text kept) or keep (it stands, marked ungrounded, as the paper's check
    leaves it); README, "Ungrounded verdicts", has the measured difference."""
    skip_decided: bool = Field(default=True, json_schema_extra={"panel": HelpPanel.METHOD})
    """Ask no further chunk about a claim already contradicted (its OR-join is settled)."""
    max_tokens: int = Field(default=DEFAULT_MAX_TOKENS, ge=1, json_schema_extra={"panel": HelpPanel.JUDGE})
    """Most completion tokens per judge call (what a budget reserves for each)."""
    temperature: float = Field(default=0.0, ge=0.0, json_schema_extra={"panel": HelpPanel.JUDGE})
    """Sampling temperature of judge calls; 0 for reproducible verdicts."""
    sampling_seed: int | None = Field(default=42, json_schema_extra={"panel": HelpPanel.JUDGE})
    """Sampling seed of judge calls, for providers that honour one (the paper's 42)."""
    samples_in_flight: int = Field(default=16, ge=1, json_schema_extra={"panel": HelpPanel.SCALE})
    """Samples audited at once (fewer finish sooner under a budget)."""
    citation_pattern: str | None = Field(
        default=None, exclude_if=lambda pattern: pattern is None, json_schema_extra={"panel": HelpPanel.METHOD}
    )
    """A regular expression for the citation markers of your answers, in place of the built-in forms
    ([1], [1, 3], [1][2], [^1], (Source 2)); its group `refs` (else its first group) holds what a
    marker cites, refs separated by commas: a 1-based passage number or a passage id. Left out of
    the audit's fingerprint when unset, so records written before this option resume."""

    language: str | None = Field(
        default=None, exclude_if=lambda language: language is None, json_schema_extra={"panel": HelpPanel.METHOD}
    )
    """The language of the answers (an ISO 639-1 code: de, ja, zh...) for lines that give none in
    their "language" field; default: detected per answer. English runs leave it out of the audit's
    fingerprint, so their --resume bindings are those of before."""

    @field_validator("language")
    @classmethod
    def _a_language_code(cls, language: str | None) -> str | None:
        return None if language is None else normalize_language(language)

    @field_validator("citation_pattern")
    @classmethod
    def _a_pattern_with_refs(cls, pattern: str | None) -> str | None:
        if pattern is None:
            return None
        try:
            compiled = re.compile(pattern)
        except re.error as error:
            raise ValueError(f"citation_pattern is not a regular expression: {error}") from None
        if compiled.groups == 0:
            raise ValueError("citation_pattern needs a group that holds the refs, e.g. <cite (?P<refs>[^>]+)>")
        if compiled.search("") is not None:
            raise ValueError("citation_pattern matches the empty string: it would find a marker everywhere")
        return pattern

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
    citation_pattern: str | None
    language: str | None


class FailOn(StrEnum):
    """Which answers fail a run (exit code 1, JUnit failures): a policy of what a finished run
    reports, applied to joined records by :mod:`rt4chart.report.audited` (:func:`failing_labels`)
    and by the ``--baseline`` gate (:mod:`rt4chart.analysis.diff`)."""

    CONTRADICTED = "contradicted"
    HALLUCINATED = "hallucinated"
    NEVER = "never"
    NEW = "new"
    """Only hallucinations the ``--baseline`` audit did not have (and hallucinated answers new to the input)."""
    WORSE = "worse"
    """A hallucination rate above the ``--baseline``'s by the exact McNemar test (p < 0.05, more new than fixed)."""
    MISATTRIBUTED = "misattributed"
    """Answers with a claim supported only by passages it does not cite (:mod:`rt4chart.method.citations`)."""
    MISCITED = "miscited"
    """Answers with a claim whose citation does not hold: misattributed, unsupported (cited but not
    entailed) or uncited (entailed, in an answer that cites elsewhere)."""


class ShowOnly(StrEnum):
    """Which samples ``rt4 show --only`` keeps: the :class:`FailOn` policies that select answers
    by their own label or their claims' citation verdicts (``never``, ``new`` and ``worse`` select
    none, or need a baseline)."""

    CONTRADICTED = FailOn.CONTRADICTED.value
    HALLUCINATED = FailOn.HALLUCINATED.value
    MISATTRIBUTED = FailOn.MISATTRIBUTED.value
    MISCITED = FailOn.MISCITED.value


CITATION_POLICIES: dict[FailOn, frozenset[str]] = {
    FailOn.MISATTRIBUTED: frozenset({"misattributed"}),
    FailOn.MISCITED: frozenset({"misattributed", "unsupported", "uncited"}),
}
"""The ``--fail-on`` policies decided by claims' citation verdicts, and the verdicts that fail each."""


def failing_labels(fail_on: FailOn) -> frozenset[Label]:
    """The answer labels that count against a run under ``fail_on`` (none for ``never``)."""
    if fail_on is FailOn.CONTRADICTED:
        return frozenset({Label.CONTRADICTED})
    if fail_on in (FailOn.HALLUCINATED, FailOn.NEW, FailOn.WORSE):
        # Against a baseline, which of these are new is the gate's business (rt4chart.analysis.diff).
        return frozenset({Label.CONTRADICTED, Label.BASELESS})
    return frozenset()
