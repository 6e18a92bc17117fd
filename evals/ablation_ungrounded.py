"""Ablation of ``--ungrounded downgrade`` against ``--ungrounded keep`` on one dataset split.

A verdict whose evidence quote is not found in the context (after one re-ask) is *ungrounded*.
``downgrade`` turns an ungrounded entailed or contradicted verdict into baseless; ``keep`` lets it
stand, marked ungrounded. This script audits the split both ways with each judge and prints, per
judge: the claims left ungrounded, the labels that differ between the two policies (claim level
and answer level, counts), and answer F1, contradiction F1 and baseless F1 under each policy.

Judges:

- ``embedded``: the shipped verifier (``--judge embedded``). Its evidence is always whole context
  sentences, so it is expected to leave nothing ungrounded; measured, not assumed.
- ``loose-quoting``: a local stand-in for an LLM judge that quotes loosely (:class:`LooseQuotingJudge`).
  It takes the embedded verifier's verdicts unchanged and rewrites the evidence quotes of a fixed
  share of claims the way LLM judges misquote: the middle of a long quote elided with " ... ", the
  articles of a short one dropped, or its last two words swapped (:func:`loosen`). None of these
  is found in the context, so those verdicts fail the retromorphic check. Asked again (the
  verifier re-asks once), it copies the quote exactly for half of those claims and repeats the
  loose quote for the rest. Which claims are
  misquoted, and which are fixed on the re-ask, is decided by a sha256 of the claim text, so every
  run is the same. The misquoting is independent of whether the verdict is right: this stand-in
  measures what each policy does to verdicts that are as good as the embedded verifier's, only
  misquoted.
- ``loose-quoting-unsure``: the same stand-in, but it misquotes where the embedded verifier is
  least sure (its ``p_unsupported`` within a factor of two of its threshold) instead of on a
  share drawn from the claim text: a judge that misquotes when it is unsure, where its verdicts
  are wrong more often. This is the case downgrading is meant for.

Neither stand-in is an LLM: a real LLM judge's unfound quotes may come with wrong verdicts more or
less often than either models; measuring that needs an LLM judge run the same way.

Every variant's full result goes to ``evals/results/ablations/`` (as ``rt4 eval`` writes them),
and so do the table, ``ablation_ungrounded_<dataset>_<split>.md``, and its figures, the ``.json``
beside it (not in ``evals/results/`` itself, where ``evals/summary.py`` reads every ``.json`` as
an ``rt4 eval`` result). All runs share one judge cache (``--cache``, a temporary folder by default),
so each embedded verdict is computed once and the other runs replay it.

    RT4_DATA_DIR=/work/shared/data python evals/ablation_ungrounded.py ragtruth-qa --split test
    python evals/ablation_ungrounded.py ragtruth-qa --split dev --limit 20 --judge embedded
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import shlex
import sys
import tempfile
from pathlib import Path

from pydantic import BaseModel

from rt4chart.analysis.metrics import format_estimate
from rt4chart.judges.registry import judge_stack
from rt4chart.method.tasks import VerifyOutput
from rt4chart.options import UngroundedPolicy
from rt4chart.protocol import Backend, BackendWrapper, JudgeRequest, JudgeResponse
from rt4chart.runs.evaluation import EvalConfig, EvaluationResult, evaluate, load_samples, write_result
from rt4chart.types import AuditRecord, Label, Sample

RESULTS = Path(__file__).resolve().parent / "results"

POLICIES: tuple[UngroundedPolicy, ...] = ("downgrade", "keep")
"""The two values of ``--ungrounded``."""

METRICS = ("answer_f1", "contradiction_f1", "baseless_f1")
"""Headline metrics compared between the policies."""

JUDGES = ("embedded", "loose-quoting", "loose-quoting-unsure")
"""The judges this script can ablate (see the module docstring)."""

_ARTICLES = frozenset({"a", "an", "the"})


def _share(text: str, salt: str) -> float:
    """A number in [0, 1) fixed by ``text`` and ``salt``: the stand-in's only source of variation."""
    digest = hashlib.sha256(f"{salt}\0{text}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def loosen(quote: str) -> str:
    """The quote as a loosely quoting judge writes it: a long quote with its middle elided, a
    short one with its articles after the first word dropped or, with none, its last two words
    swapped. Each stays close to the source; none is a substring of it (dropping only a leading
    article would be)."""
    words = quote.split()
    if len(words) >= 12:
        return " ".join(words[:4]) + " ... " + " ".join(words[-4:])
    kept = words[:1] + [word for word in words[1:] if word.lower() not in _ARTICLES]
    if len(kept) < len(words):
        return " ".join(kept)
    return " ".join(words[:-2] + words[-1:] + words[-2:-1])


class LooseQuotingJudge(BackendWrapper):
    """The inner judge's verdicts with the evidence of a fixed share of claims quoted loosely.

    A claim is misquoted when ``_share(claim, "misquote") < misquoted`` or, with ``unsure``,
    when the inner judge's score is within a factor of two of its threshold; on a re-ask (a request
    that carries the judge's earlier reply), a misquoted claim is quoted exactly when
    ``_share(claim, "reask") < fixed_on_reask``. Baseless verdicts carry no evidence and are left
    as they are.
    """

    def __init__(
        self, inner: Backend, misquoted: float = 0.3, fixed_on_reask: float = 0.5, unsure: bool = False
    ) -> None:
        super().__init__(inner)
        self.misquoted = misquoted
        self.fixed_on_reask = fixed_on_reask
        self.unsure = unsure

    @property
    def name(self) -> str:
        chosen = "unsure" if self.unsure else f"{self.misquoted:g}"
        return f"loose-quoting-{chosen}-{self.fixed_on_reask:g}({self.inner.name})"

    async def complete(self, request: JudgeRequest) -> JudgeResponse:
        response = await self.inner.complete(request)
        payload = request.payload
        if not isinstance(response.parsed, VerifyOutput) or not hasattr(payload, "claims"):
            return response
        claims: list[str] = payload.claims
        reask = any(message.role == "assistant" for message in request.messages)
        judgements = []
        for judgement in response.parsed.judgements:
            claim = claims[judgement.claim]
            if self.unsure:
                score = judgement.score
                misquote = score is not None and score.threshold / 2 <= score.p_unsupported <= score.threshold * 2
            else:
                misquote = _share(claim, "misquote") < self.misquoted
            if reask and _share(claim, "reask") < self.fixed_on_reask:
                misquote = False
            if misquote and judgement.label != Label.BASELESS:
                judgement = judgement.model_copy(update={"evidence": [loosen(q) for q in judgement.evidence]})
            judgements.append(judgement)
        parsed = VerifyOutput(judgements=judgements)
        return response.model_copy(update={"parsed": parsed, "raw": parsed.model_dump_json(), "judge": self.name})


class PolicyComparison(BaseModel):
    """How the two policies differ for one judge."""

    judge: str
    """Name of the judge that ran."""
    claims: int
    """Claims audited (the same claims under both policies)."""
    answers: int
    """Answers audited."""
    ungrounded_claims: dict[str, int]
    """Per policy: claims whose final verdict or any local vote stayed ungrounded after the re-ask."""
    claim_labels_changed: int
    """Claims whose final label differs between the policies."""
    claim_label_changes: dict[str, int]
    """Those changes by kind, ``"<downgrade label> <- <keep label>"``."""
    answer_labels_changed: int
    """Answers whose AND-joined label differs between the policies."""
    answer_verdicts_changed: int
    """Answers whose hallucinated yes/no differs between the policies."""
    metrics: dict[str, dict[str, str]]
    """Per policy: each of :data:`METRICS` as ``value [95% CI]``."""
    values: dict[str, dict[str, float | None]]
    """Per policy: each of :data:`METRICS` as a number."""
    result_files: dict[str, str]
    """Per policy: the full result's file stem under ``evals/results/ablations/``."""


def _ungrounded(record: AuditRecord) -> int:
    return sum(not claim.grounded or any(not vote.grounded for vote in claim.votes) for claim in record.claims)


def compare(results: dict[UngroundedPolicy, tuple[EvaluationResult, list[AuditRecord]]]) -> PolicyComparison:
    """The differences between the ``downgrade`` and ``keep`` runs of one judge."""
    (down, down_records), keep_records = results["downgrade"], results["keep"][1]
    changes: dict[str, int] = {}
    answers_changed = verdicts_changed = 0
    for before, after in zip(down_records, keep_records, strict=True):
        if before.id != after.id or [c.text for c in before.claims] != [c.text for c in after.claims]:
            raise ValueError(f"the two runs decomposed sample {before.id!r} differently: claims cannot be paired")
        answers_changed += before.label != after.label
        verdicts_changed += before.hallucinated != after.hallucinated
        for first, second in zip(before.claims, after.claims, strict=True):
            if first.label != second.label:
                kind = f"{first.label} <- {second.label}"
                changes[kind] = changes.get(kind, 0) + 1
    return PolicyComparison(
        judge=down.judge,
        claims=sum(len(r.claims) for r in down_records),
        answers=len(down_records),
        ungrounded_claims={policy: sum(map(_ungrounded, records)) for policy, (_, records) in results.items()},
        claim_labels_changed=sum(changes.values()),
        claim_label_changes=dict(sorted(changes.items())),
        answer_labels_changed=answers_changed,
        answer_verdicts_changed=verdicts_changed,
        metrics={
            policy: {key: format_estimate(result.metrics.headline.get(key)) for key in METRICS}
            for policy, (result, _) in results.items()
        },
        values={
            policy: {key: result.metrics.headline[key].value for key in METRICS}
            for policy, (result, _) in results.items()
        },
        result_files={policy: result.stem for policy, (result, _) in results.items()},
    )


def run_judge(judge: str, base: EvalConfig, samples: list[Sample], cache: Path) -> PolicyComparison:
    """Audit ``samples`` under both policies with one judge, through the shared cache."""
    stack = judge_stack("embedded", cache=cache)
    backend: Backend = stack if judge == "embedded" else LooseQuotingJudge(stack, unsure=judge.endswith("unsure"))
    results = {}
    try:
        for policy in POLICIES:
            config = base.model_copy(
                update={"judge": judge, "options": base.options.model_copy(update={"ungrounded": policy})}
            )
            result, records = evaluate(config, samples, backend=backend)
            write_result(result, RESULTS / "ablations")
            print(f"  {judge} --ungrounded {policy}: {result.wall_seconds:.1f} s", file=sys.stderr)
            results[policy] = (result, records)
    finally:
        asyncio.run(stack.aclose())
    return compare(results)


def table(comparisons: list[PolicyComparison], base: EvalConfig, command: str) -> str:
    """The Markdown table of the ablation."""
    lines = [
        f"### `--ungrounded downgrade` vs `keep`: {base.dataset} {base.split or 'all'}",
        "",
        f"- command: `{command}`",
        "- cells: value [95% bootstrap CI, "
        f"{base.resamples} resamples, seed {base.seed}]; labels changed are counts between the two runs",
        "- loose-quoting: the embedded verifier's verdicts with 30% of claims' evidence misquoted (chosen by "
        "a hash of the claim text), half of those quoted exactly on the re-ask; loose-quoting-unsure: "
        "misquoted where the embedded verifier's P(not entailed) is within a factor of two of its threshold "
        "(see `evals/ablation_ungrounded.py`)",
        "",
        "| judge | policy | ungrounded claims | answer F1 | contradiction F1 | baseless F1 |",
        "|---|---|---:|---|---|---|",
    ]
    for comparison in comparisons:
        for policy in POLICIES:
            cells = " | ".join(comparison.metrics[policy][key] for key in METRICS)
            lines.append(
                f"| {comparison.judge} | {policy} | {comparison.ungrounded_claims[policy]} / {comparison.claims} "
                f"| {cells} |"
            )
    lines += [
        "",
        "| judge | claim labels changed | by kind (downgrade <- keep) | answer labels changed "
        "| answer hallucinated yes/no changed |",
        "|---|---:|---|---:|---:|",
    ]
    for comparison in comparisons:
        kinds = ", ".join(f"{kind}: {count}" for kind, count in comparison.claim_label_changes.items()) or "none"
        lines.append(
            f"| {comparison.judge} | {comparison.claim_labels_changed} / {comparison.claims} | {kinds} "
            f"| {comparison.answer_labels_changed} / {comparison.answers} "
            f"| {comparison.answer_verdicts_changed} / {comparison.answers} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset")
    parser.add_argument("--split")
    parser.add_argument("--path")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--judge", action="append", choices=JUDGES, help="repeatable (default: all)")
    parser.add_argument("--cache", type=Path, help="judge cache shared by the runs (default: a temporary folder)")
    parser.add_argument("--resamples", type=int, default=1000)
    args = parser.parse_args()
    command = "python evals/ablation_ungrounded.py " + shlex.join(sys.argv[1:])
    base = EvalConfig(dataset=args.dataset, path=args.path, split=args.split, limit=args.limit,
                      resamples=args.resamples)
    samples = load_samples(base)
    with tempfile.TemporaryDirectory(prefix="rt4-ungrounded-") as scratch:
        cache = args.cache or Path(scratch)
        comparisons = [run_judge(judge, base, samples, cache) for judge in args.judge or JUDGES]
    markdown = table(comparisons, base, command)
    stem = RESULTS / "ablations" / f"ablation_ungrounded_{base.dataset}_{base.split or 'all'}"
    if base.limit is not None:
        stem = stem.with_name(f"{stem.name}_n{base.limit}")
    stem.with_suffix(".md").write_text(markdown, encoding="utf-8")
    figures = {"command": command, "comparisons": [c.model_dump() for c in comparisons]}
    stem.with_suffix(".json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    print(markdown)
    print(f"wrote {stem}.md and .json", file=sys.stderr)


if __name__ == "__main__":
    main()
