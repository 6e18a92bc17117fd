"""``rt4 diff BASE NEW``: what changed between two audits, whether it is real, and the regression gate.

Answers are matched by id (several records with one id pair up in input order) and compared by
their text (``answer_sha256`` of the records; records made before it fall back to their claims'
text). Each matched answer falls in one category: newly hallucinated, fixed, still hallucinated,
changed label (both hallucinated, e.g. baseless -> contradicted) or still faithful; answers of only
one run are added or removed, and an answer without a verdict in either run is unjudged.

Claims are matched within an answer only when they state the same thing: first by identical text
and answer span, then by identical text, then by the same :func:`statement` (the same words and
numbers in the same order, ignoring case, punctuation, thousands separators and articles), then (an
edited answer, or another decomposer) by overlapping answer spans with the same words in a nearly
unchanged order (difflib ratio of the two statements at least
:data:`CLAIM_SIMILARITY`). Claims that say different things are never paired, however alike their
text ("Parking is free on Mondays" is not an edit of "Parking is free on Sundays"): the rest are
added or removed claims.

The gate's *new* is defined at claim level (:func:`brings_hallucination`): an answer hallucinated
now brings a new hallucination when it holds an unsupported claim (contradicted or baseless) with no
unsupported match in the baseline (unmatched, or matched to a claim the baseline did not find
unsupported).

Whether the change of the hallucination rate is real: an exact McNemar test on the matched answers
that both runs judged (the two-sided binomial test of the discordant pairs, scipy's ``binomtest``)
and a paired percentile bootstrap CI of the rate difference (seeded numpy), the same at claim level
over matched claims (claims resampled as pairs, ignoring that claims of one answer are correlated:
read the claim-level CI as optimistic).

What the two runs' configurations say decides what the user is looking at: another judge, prompt
version or options over the same answers is a *judge comparison*; other answers under the same
configuration is a *system comparison*; both at once is *mixed* (the difference cannot be
attributed to either).
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterable
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field
from scipy.stats import binomtest

from rt4chart.method.text import words_of
from rt4chart.options import AuditOptions, FailOn
from rt4chart.records.io import PredictionsError, read_predictions
from rt4chart.records.manifest import ManifestError, RunManifest, describes, read_manifest
from rt4chart.types import AuditRecord, ClaimVerdict, Evidence, Label, Span

CLAIM_SIMILARITY = 0.8
"""Least difflib ratio between two claims' statements (the same words, over overlapping answer
spans) to pair them: a few words moved, never a word changed."""
_ARTICLES = frozenset({"a", "an", "the"})
"""Words whose presence changes how a claim reads, not what it states (every other word stays:
negations, prepositions, quantifiers and tenses all change what a claim states)."""
CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
_BOOTSTRAP_BATCH = 1_000
"""Resamples drawn per batch, which bounds memory (a batch holds resamples x pairs indices)."""


class DiffError(ValueError):
    """A records file or manifest that cannot be compared."""


class AnswerCategory(StrEnum):
    NEW = "new"
    """Hallucinated now, faithful in the baseline."""
    FIXED = "fixed"
    """Faithful now, hallucinated in the baseline."""
    CHANGED_LABEL = "changed_label"
    """Hallucinated in both, with another label (baseless -> contradicted)."""
    STILL_HALLUCINATED = "still_hallucinated"
    """Hallucinated in both, with the same label."""
    STILL_FAITHFUL = "still_faithful"
    """Faithful in both."""
    ADDED = "added"
    """Only in the new run."""
    REMOVED = "removed"
    """Only in the baseline."""
    UNJUDGED = "unjudged"
    """No verdict in one of the runs (invalid input, judge errors)."""


class ClaimSide(BaseModel):
    """One run's verdict on a claim."""

    index: int
    text: str
    label: Label | None
    answer_span: Span | None
    evidence: list[Evidence]
    rationale: str
    grounded: bool
    judge: str | None

    @classmethod
    def of(cls, claim: ClaimVerdict) -> ClaimSide:
        return cls(
            index=claim.index, text=claim.text, label=claim.label, answer_span=claim.answer_span,
            evidence=claim.evidence, rationale=claim.rationale, grounded=claim.grounded, judge=claim.judge,
        )


ClaimChangeKind = Literal["flip", "added", "removed"]


class ClaimChange(BaseModel):
    """A claim whose label flipped between the runs, or that only one run has."""

    kind: ClaimChangeKind
    base: ClaimSide | None
    new: ClaimSide | None


class AnswerDiff(BaseModel):
    """One answer in the two runs."""

    id: str | None
    category: AnswerCategory
    base_line: int | None
    new_line: int | None
    base_label: Label | None
    new_label: Label | None
    answer_changed: bool
    """The answer's text differs between the runs."""
    gate_new: bool
    """A hallucination this run brings (:func:`brings_hallucination`): the answer holds an
    unsupported claim with no unsupported match in the baseline."""
    claims: list[ClaimChange] = Field(default_factory=list)
    """Claims that flipped, were added or were removed (claims unchanged are left out)."""


class PairedTest(BaseModel):
    """Whether the hallucination rate changed, over pairs both runs judged."""

    pairs: int
    base_rate: float | None
    new_rate: float | None
    difference: float | None
    """new rate - base rate."""
    discordant: int
    """Pairs judged differently (fixed + new)."""
    base_only: int
    """Hallucinated in the baseline only (fixed)."""
    new_only: int
    """Hallucinated in the new run only."""
    p_value: float
    """Exact McNemar test, two-sided (1.0 when no pair is discordant)."""
    ci_low: float | None
    ci_high: float | None
    confidence: float
    resamples: int
    seed: int

    @property
    def worse(self) -> bool:
        """The rate rose beyond the CI: its lower bound is above zero."""
        return self.ci_low is not None and self.ci_low > 0

    @property
    def better(self) -> bool:
        return self.ci_high is not None and self.ci_high < 0

    @property
    def significantly_worse(self) -> bool:
        """The rate rose (more new than fixed) and the exact McNemar test rejects "no change" at
        ``1 - confidence``: what ``--fail-on worse`` decides by, the test it prints."""
        return self.new_only > self.base_only and self.p_value < 1 - self.confidence


ComparisonKind = Literal["judge comparison", "system comparison", "mixed", "rerun"]


class RunConfig(BaseModel):
    """What one run says about how it was made."""

    path: str
    judges: list[str]
    prompt_versions: list[str]
    options: dict[str, Any] | None
    """From the manifest; ``None`` without one."""
    input_sha256: str | None
    manifest: bool
    """A manifest describes this records file."""


class ConfigDiff(BaseModel):
    """How the two runs' configurations differ, and what that makes the comparison."""

    base: RunConfig
    new: RunConfig
    judge_changed: bool
    prompt_changed: bool
    options_changed: dict[str, list[Any]]
    """Option -> [baseline value, new value], for options that differ (known only with both manifests)."""
    answers_changed: int
    """Matched answers whose text differs, plus answers of one run only."""
    changes: list[str]
    """What differs in the configuration, one phrase each (``judge A -> B``)."""
    kind: ComparisonKind
    explanation: str


class RunDiff(BaseModel):
    """Everything ``rt4 diff`` reports."""

    config: ConfigDiff
    counts: dict[str, int]
    """Answers per category, plus ``answer_changed`` (matched answers whose text differs)."""
    claim_counts: dict[str, int]
    """Claims: matched, flips, added, removed."""
    answer_test: PairedTest
    claim_test: PairedTest
    answers: list[AnswerDiff]
    """Every answer that is not still faithful and unchanged, in the new run's order."""
    warnings: list[str]

    @property
    def gate_new(self) -> list[AnswerDiff]:
        return [answer for answer in self.answers if answer.gate_new]


def _hallucinated(label: Label | None) -> bool:
    return label in (Label.CONTRADICTED, Label.BASELESS)


def _span_overlap(first: Span | None, second: Span | None) -> bool:
    if first is None or second is None:
        return first is None and second is None
    return first.start < second.end and second.start < first.end


_THOUSANDS = re.compile(r",(?=\d{3}(?!\d))")


def statement(text: str) -> tuple[str, ...]:
    """What a claim states, for matching it across runs: its words and numbers in order, lower-cased,
    numbers without thousands separators ("5,000" is "5000"), articles left out."""
    return tuple(
        _THOUSANDS.sub("", word) if word[0].isdigit() else word
        for word in words_of(unicodedata.normalize("NFKC", text))
        if word not in _ARTICLES
    )


def match_claims(
    base: list[ClaimVerdict], new: list[ClaimVerdict]
) -> tuple[list[tuple[ClaimVerdict, ClaimVerdict]], list[ClaimVerdict], list[ClaimVerdict]]:
    """Pair the claims of one answer in two runs: (pairs, removed, added); see the module's rules."""
    left, right = list(base), list(new)
    pairs: list[tuple[ClaimVerdict, ClaimVerdict]] = []

    def take(accept: Any) -> None:
        for claim in list(left):
            match = next((other for other in right if accept(claim, other)), None)
            if match is not None:
                pairs.append((claim, match))
                left.remove(claim)
                right.remove(match)

    take(lambda one, other: one.text == other.text and one.answer_span == other.answer_span)
    take(lambda one, other: one.text == other.text)
    take(lambda one, other: statement(one.text) == statement(other.text))
    similar = sorted(
        (
            (difflib.SequenceMatcher(None, statement(one.text), statement(other.text)).ratio(), i, j)
            for i, one in enumerate(left)
            for j, other in enumerate(right)
            if _span_overlap(one.answer_span, other.answer_span)
            and Counter(statement(one.text)) == Counter(statement(other.text))
        ),
        reverse=True,
    )
    used_left: set[int] = set()
    used_right: set[int] = set()
    for ratio, i, j in similar:
        if ratio >= CLAIM_SIMILARITY and i not in used_left and j not in used_right:
            pairs.append((left[i], right[j]))
            used_left.add(i)
            used_right.add(j)
    removed = [claim for i, claim in enumerate(left) if i not in used_left]
    added = [claim for j, claim in enumerate(right) if j not in used_right]
    pairs.sort(key=lambda pair: pair[1].index)
    return pairs, removed, added


def paired_test(
    base: Iterable[bool], new: Iterable[bool], *, resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED, confidence: float = CONFIDENCE,
) -> PairedTest:
    """Exact McNemar p-value and paired percentile bootstrap CI of ``mean(new) - mean(base)``."""
    base_values = np.fromiter(base, dtype=float)
    new_values = np.fromiter(new, dtype=float)
    pairs = len(base_values)
    base_only = int(np.sum((base_values == 1) & (new_values == 0)))
    new_only = int(np.sum((base_values == 0) & (new_values == 1)))
    discordant = base_only + new_only
    p_value = float(binomtest(min(base_only, new_only), discordant, 0.5).pvalue) if discordant else 1.0
    ci_low = ci_high = None
    if pairs:
        rng = np.random.default_rng(seed)
        differences = []
        for start in range(0, resamples, _BOOTSTRAP_BATCH):
            indices = rng.integers(0, pairs, (min(_BOOTSTRAP_BATCH, resamples - start), pairs))
            differences.append(new_values[indices].mean(axis=1) - base_values[indices].mean(axis=1))
        tail = (1 - confidence) / 2 * 100
        ci_low, ci_high = (float(bound) for bound in np.percentile(np.concatenate(differences), [tail, 100 - tail]))
    return PairedTest(
        pairs=pairs,
        base_rate=float(base_values.mean()) if pairs else None,
        new_rate=float(new_values.mean()) if pairs else None,
        difference=float(new_values.mean() - base_values.mean()) if pairs else None,
        discordant=discordant, base_only=base_only, new_only=new_only, p_value=p_value,
        ci_low=ci_low, ci_high=ci_high, confidence=confidence, resamples=resamples, seed=seed,
    )


def _invalid(report: AuditRecord) -> bool:
    return report.label is None and not report.incomplete


def _answer_changed(base: AuditRecord, new: AuditRecord) -> bool:
    if base.answer_sha256 is not None and new.answer_sha256 is not None:
        return base.answer_sha256 != new.answer_sha256
    # Records made before answer_sha256: the claims' text stands in for the answer's.
    return [claim.text for claim in base.claims] != [claim.text for claim in new.claims]


def _category(base: AuditRecord | None, new: AuditRecord | None) -> AnswerCategory:
    if base is None:
        return AnswerCategory.ADDED
    if new is None:
        return AnswerCategory.REMOVED
    if base.hallucinated is None or new.hallucinated is None or base.label is None or new.label is None:
        return AnswerCategory.UNJUDGED
    before, after = _hallucinated(base.label), _hallucinated(new.label)
    if after and not before:
        return AnswerCategory.NEW
    if before and not after:
        return AnswerCategory.FIXED
    if before:
        return AnswerCategory.STILL_HALLUCINATED if base.label == new.label else AnswerCategory.CHANGED_LABEL
    return AnswerCategory.STILL_FAITHFUL


def pair_answers(
    base: list[AuditRecord], new: list[AuditRecord]
) -> list[tuple[AuditRecord | None, AuditRecord | None]]:
    """Match records by id, in the new run's order; several records of one id pair up in order;
    the baseline's unmatched records come last."""
    by_id: dict[str, list[AuditRecord]] = defaultdict(list)
    for report in base:
        by_id[_key(report)].append(report)
    pairs: list[tuple[AuditRecord | None, AuditRecord | None]] = []
    for report in new:
        candidates = by_id.get(_key(report))
        pairs.append((candidates.pop(0) if candidates else None, report))
    pairs.extend((report, None) for reports in by_id.values() for report in reports)
    return pairs


def _key(report: AuditRecord) -> str:
    # An unreadable line has no id: it can only be matched by its position.
    return f"id:{report.id}" if report.id is not None else f"line:{report.line}"


def _claim_changes(
    base: AuditRecord, new: AuditRecord
) -> tuple[list[ClaimChange], list[tuple[ClaimVerdict, ClaimVerdict]]]:
    pairs, removed, added = match_claims(base.claims, new.claims)
    changes = [
        ClaimChange(kind="flip", base=ClaimSide.of(old), new=ClaimSide.of(now))
        for old, now in pairs
        if old.label != now.label
    ]
    changes += [ClaimChange(kind="removed", base=ClaimSide.of(claim), new=None) for claim in removed]
    changes += [ClaimChange(kind="added", base=None, new=ClaimSide.of(claim)) for claim in added]
    return changes, pairs


def brings_hallucination(
    base: AuditRecord | None, new: AuditRecord | None, matched: list[tuple[ClaimVerdict, ClaimVerdict]]
) -> bool:
    """The gate's *new*, at claim level: ``new`` is hallucinated and holds an unsupported claim with
    no unsupported match in the baseline (no match at all, or a match the baseline did not find
    unsupported); ``matched`` are the claim pairs of :func:`match_claims`. A hallucinated answer
    with no unsupported claim (a verdict on the answer as a whole, such as an answer with nothing to
    check) is new when the baseline's answer was not hallucinated."""
    if new is None or not _hallucinated(new.label):
        return False
    unsupported = [claim.index for claim in new.claims if _hallucinated(claim.label)]
    if not unsupported:
        return base is None or not _hallucinated(base.label)
    known = {now.index for old, now in matched if _hallucinated(old.label)}
    return any(index not in known for index in unsupported)


def _run_config(path: Path, reports: list[AuditRecord], manifest: RunManifest | None) -> RunConfig:
    return RunConfig(
        path=str(path),
        judges=sorted({report.judge for report in reports if report.judge}),
        prompt_versions=sorted({report.prompt_version for report in reports if report.prompt_version}),
        options=None if manifest is None else manifest.options,
        input_sha256=None if manifest is None else manifest.input.sha256,
        manifest=manifest is not None,
    )


def this_run_config(reports: list[AuditRecord], options: AuditOptions | None, input_file: str | None) -> RunConfig:
    """The configuration of the run being published (no manifest yet: the options are given)."""
    config = _run_config(Path(input_file or "this run"), reports, None)
    if options is not None:
        config.options = options.model_dump(mode="json")
    return config


def compare_configs(base: RunConfig, new: RunConfig, answers_changed: int) -> ConfigDiff:
    """What differs between the two runs' configurations, and what kind of comparison that makes."""
    judge_changed = base.judges != new.judges
    prompt_changed = base.prompt_versions != new.prompt_versions
    options_changed: dict[str, list[Any]] = {}
    if base.options is not None and new.options is not None:
        for name in sorted(set(base.options) | set(new.options)):
            if base.options.get(name) != new.options.get(name):
                options_changed[name] = [base.options.get(name), new.options.get(name)]
    def change(name: str, before: list[str], after: list[str]) -> str:
        return f"{name} {', '.join(before) or '?'} -> {', '.join(after) or '?'}"

    what = [text for changed, text in (
        (judge_changed, change("judge", base.judges, new.judges)),
        (prompt_changed, change("prompt version", base.prompt_versions, new.prompt_versions)),
        (bool(options_changed),
         "options " + ", ".join(f"{name} {old!r} -> {now!r}" for name, (old, now) in options_changed.items())),
    ) if changed]
    config_changed = bool(what)
    kind: ComparisonKind
    if config_changed and answers_changed:
        kind = "mixed"
        explanation = (f"both the audit configuration ({'; '.join(what)}) and {answers_changed} answers changed: "
                       "a difference cannot be attributed to the judge or to the system")
    elif config_changed:
        kind = "judge comparison"
        explanation = f"the same answers audited under another configuration ({'; '.join(what)})"
    elif answers_changed:
        kind = "system comparison"
        explanation = f"{answers_changed} answers changed under the same judge, prompt version and options"
    else:
        kind = "rerun"
        explanation = "the same answers under the same configuration: differences are the judge's own variation"
    if base.options is None or new.options is None:
        explanation += " (options unknown: no manifest beside " + " and ".join(
            config.path for config in (base, new) if config.options is None) + ")"
    return ConfigDiff(base=base, new=new, judge_changed=judge_changed, prompt_changed=prompt_changed,
                      options_changed=options_changed, answers_changed=answers_changed, changes=what, kind=kind,
                      explanation=explanation)


def diff_reports(
    base: list[AuditRecord], new: list[AuditRecord], base_config: RunConfig, new_config: RunConfig, *,
    resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED,
) -> RunDiff:
    """Compare two runs' records (see the module's rules)."""
    counts: Counter[str] = Counter({category.value: 0 for category in AnswerCategory})
    claim_counts: Counter[str] = Counter({"matched": 0, "flip": 0, "added": 0, "removed": 0})
    answers: list[AnswerDiff] = []
    answer_pairs: list[tuple[bool, bool]] = []
    claim_pairs: list[tuple[bool, bool]] = []
    changed_answers = 0
    for old, now in pair_answers(base, new):
        category = _category(old, now)
        counts[category] += 1
        changes: list[ClaimChange] = []
        matched: list[tuple[ClaimVerdict, ClaimVerdict]] = []
        answer_changed = False
        if old is not None and now is not None:
            answer_changed = _answer_changed(old, now)
            # An unreadable input line has no claims to compare (its claims are not "removed").
            comparable = not (_invalid(old) or _invalid(now))
            changes, matched = _claim_changes(old, now) if comparable else ([], [])
            claim_counts["matched"] += len(matched)
            claim_counts.update(change.kind for change in changes)
            claim_pairs += [(_hallucinated(a.label), _hallucinated(b.label))
                            for a, b in matched if a.label is not None and b.label is not None]
            if category is not AnswerCategory.UNJUDGED:
                answer_pairs.append((_hallucinated(old.label), _hallucinated(now.label)))
        counts["answer_changed"] += answer_changed
        changed_answers += answer_changed or old is None or now is None
        if category is AnswerCategory.STILL_FAITHFUL and not answer_changed and not changes:
            continue
        answers.append(AnswerDiff(
            id=now.id if now is not None else old.id if old is not None else None,
            category=category,
            base_line=old.line if old else None, new_line=now.line if now else None,
            base_label=old.label if old else None, new_label=now.label if now else None,
            answer_changed=answer_changed,
            gate_new=brings_hallucination(old, now, matched),
            claims=changes,
        ))
    config = compare_configs(base_config, new_config, changed_answers)
    warnings = []
    if config.judge_changed or config.prompt_changed:
        warnings.append(f"the two audits differ in judge or prompt version ({'; '.join(config.changes)}): "
                        "a difference may be the judge's, not the answers'")
    return RunDiff(
        config=config,
        counts=dict(counts),
        claim_counts=dict(claim_counts),
        answer_test=paired_test(*_columns(answer_pairs), resamples=resamples, seed=seed),
        claim_test=paired_test(*_columns(claim_pairs), resamples=resamples, seed=seed),
        answers=answers,
        warnings=warnings,
    )


def _columns(pairs: list[tuple[bool, bool]]) -> tuple[list[bool], list[bool]]:
    return [first for first, _ in pairs], [second for _, second in pairs]


def load_run(path: Path) -> tuple[list[AuditRecord], RunConfig, list[str]]:
    """A records file with what its manifest (if any) says; raises :class:`DiffError`."""
    try:
        reports = read_predictions(path)
        manifest = read_manifest(path)
    except (PredictionsError, ManifestError) as error:
        raise DiffError(str(error)) from None
    warnings = []
    if manifest is not None and not describes(manifest, path):
        warnings.append(f"{path}: its manifest describes another version of the file (edited since); options ignored")
        manifest = None
    return reports, _run_config(path, reports, manifest), warnings


def diff_files(base: Path, new: Path, *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> RunDiff:
    """``rt4 diff BASE NEW``."""
    base_reports, base_config, base_warnings = load_run(base)
    new_reports, new_config, new_warnings = load_run(new)
    result = diff_reports(base_reports, new_reports, base_config, new_config, resamples=resamples, seed=seed)
    result.warnings = base_warnings + new_warnings + result.warnings
    return result


class GateOutcome(BaseModel):
    """The baseline gate's decision (``rt4 verify --baseline B --fail-on new|worse``)."""

    fails: bool
    reason: str
    new_lines: list[int]
    """Input lines (of this run) of the hallucinations this run brings."""
    pre_existing_lines: list[int]
    """Input lines of answers hallucinated now that were hallucinated in the baseline too."""
    warnings: list[str]
    diff: RunDiff


GATE_POLICIES = (FailOn.NEW, FailOn.WORSE)


def baseline_gate(reports: list[AuditRecord], new_config: RunConfig, baseline: Path, fail_on: FailOn) -> GateOutcome:
    """The regression gate: ``new`` fails on any hallucination this run brings (see
    :attr:`AnswerDiff.gate_new`); ``worse`` only when the rate rose and the exact McNemar test
    says so (:attr:`PairedTest.significantly_worse`)."""
    base_reports, base_config, warnings = load_run(baseline)
    result = diff_reports(base_reports, reports, base_config, new_config)
    new_lines = [answer.new_line for answer in result.answers if answer.gate_new and answer.new_line is not None]
    pre_existing = [
        answer.new_line for answer in result.answers
        if not answer.gate_new and answer.new_line is not None and _hallucinated(answer.new_label)
    ]
    test = result.answer_test
    rate = "no answer judged in both runs"
    known = (test.base_rate, test.new_rate, test.ci_low, test.ci_high)
    if test.base_rate is not None and test.new_rate is not None and None not in known:
        rate = (f"hallucination rate {test.base_rate:.3f} -> {test.new_rate:.3f}, difference CI "
                f"[{test.ci_low:+.3f}, {test.ci_high:+.3f}], McNemar p={test.p_value:.3g}")
    reason = (f"{len(new_lines)} answers with an unsupported claim that has no unsupported match in the baseline, "
              f"{len(pre_existing)} hallucinated with the baseline's unsupported claims only; {rate}")
    worse = test.significantly_worse
    fails = bool(new_lines) if fail_on is FailOn.NEW else worse if fail_on is FailOn.WORSE else False
    if fail_on is FailOn.WORSE:
        level = f"{1 - test.confidence:.2g}"
        reason = (f"worse by the exact McNemar test (p < {level}): " if worse
                  else f"not worse by the exact McNemar test at {level}: ") + reason
    return GateOutcome(fails=fails, reason=reason, new_lines=new_lines, pre_existing_lines=pre_existing,
                       warnings=warnings + result.warnings, diff=result)
