"""Each hub verifier alone, as its authors evaluate it, and inside rt4chart's method, on RAGTruth QA.

For every verifier profile (``kind = "verifier"``: MiniCheck, HHEM, LettuceDetect) whose weights are
pulled, two rows on the split (answer level, positive = hallucinated, against RAGTruth's gold):

- ``alone``: one request per answer, the whole answer as the one claim against the whole context in
  view, as the authors score a (document, response) pair: the pair classifiers cut the context into
  their windows between sentences and take the max over them (MiniCheck's chunking), LettuceDetect reads
  the answer as given (its span the whole answer) and flags it when any token is flagged.
- ``method``: ``rt4 eval``'s audit with the same judge (``--decomposer rules``: the answer's sentences as
  claims, the method's windows, its global stage).

Each row prints answer F1 and balanced accuracy with the command that reproduces it. A verifier
whose weights are not pulled prints ``weights not present: rt4 models pull NAME`` and runs nothing
(exit 0: nothing is faked). Chat verifiers (Lynx, Bespoke-MiniCheck, Granite Guardian) need a server
of your own and are not run here: ``rt4 eval ragtruth-qa --judge NAME`` with its base URL set.
LLM-AggreFact is not among this project's datasets (RT4_DATA_DIR holds ragtruth-qa, faithbench and
mu-shroom), so the LLM-AggreFact figures the authors publish are not reproduced here.

    RT4_DATA_DIR=/work/shared/data python evals/verifiers/published.py --split test
    python evals/verifiers/published.py --split dev --limit 20 --profile lettucedetect-base
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
from collections.abc import Sequence

from pydantic import BaseModel

from rt4chart.analysis.datasets import DatasetError
from rt4chart.analysis.metrics import balanced_accuracy, binary_prf
from rt4chart.judges.hub import pull_command, pulled
from rt4chart.judges.registry import judge_stack, load_profiles
from rt4chart.method.tasks import AnswerSpans, VerifyInput, VerifyOutput
from rt4chart.method.text import split_sentences
from rt4chart.options import AuditOptions
from rt4chart.protocol import Backend, JudgeRequest
from rt4chart.runs.evaluation import EvalConfig, evaluate, load_samples
from rt4chart.types import Label, Sample, Span

AGGREFACT_NOTE = ("LLM-AggreFact: not in RT4_DATA_DIR (this project holds ragtruth-qa, faithbench, mu-shroom); "
                  "its published figures are not reproduced here")


class Row(BaseModel):
    """One verifier's answer-level figures in one setting."""

    profile: str
    """The verifier profile."""
    setting: str
    """``alone`` (one request per answer) or ``method`` (rt4chart's audit)."""
    answer_f1: float
    """F1 of flagging hallucinated answers."""
    balanced_accuracy: float | None
    """Mean of sensitivity and specificity (``None`` when the split lacks one class)."""
    scored: int
    """Answers with a gold label and a prediction."""


def whole_answer_request(sample: Sample) -> JudgeRequest:
    """The verifier alone: the whole answer against the whole context, one request."""
    context = sample.context if isinstance(sample.context, str) else "\n\n".join(sample.context)
    payload = VerifyInput(
        # The context's sentences, so that the verifier's own windows cut it between sentences.
        stage="global", claims=[sample.answer], question=sample.question, sentences=split_sentences(context),
        answer=AnswerSpans(text=sample.answer, spans=[Span(start=0, end=len(sample.answer))]),
    )
    return JudgeRequest(task="verify", payload=payload, output_schema=VerifyOutput, messages=[],
                        prompt_version="whole-answer")


async def _alone(backend: Backend, samples: Sequence[Sample]) -> list[bool | None]:
    flagged: list[bool | None] = []
    for sample in samples:
        response = await backend.complete(whole_answer_request(sample))
        judged = response.parsed.judgements if isinstance(response.parsed, VerifyOutput) else []
        flagged.append(judged[0].label != Label.ENTAILED if judged else None)
    return flagged


def _row(profile: str, setting: str, gold: Sequence[bool | None], predicted: Sequence[bool | None]) -> Row:
    pairs = [(g, p) for g, p in zip(gold, predicted, strict=True) if g is not None and p is not None]
    truth, guess = [g for g, _ in pairs], [p for _, p in pairs]
    return Row(profile=profile, setting=setting, answer_f1=binary_prf(truth, guess).f1,
               balanced_accuracy=balanced_accuracy(truth, guess), scored=len(pairs))


def run_profile(profile: str, samples: Sequence[Sample], split: str | None) -> list[Row]:
    """Both rows of one pulled verifier."""
    gold = [sample.gold.hallucinated if sample.gold is not None else None for sample in samples]
    backend = judge_stack(profile)
    try:
        alone = asyncio.run(_alone(backend, samples))
    finally:
        asyncio.run(backend.aclose())
    config = EvalConfig(dataset="ragtruth-qa", split=split, judge=profile, options=AuditOptions(decomposer="rules"),
                        resamples=0)
    _, reports = evaluate(config, samples)
    method = [report.hallucinated for report in reports]
    return [_row(profile, "alone", gold, alone), _row(profile, "method", gold, method)]


def verifier_profiles() -> list[str]:
    """The hub verifier profiles, by name."""
    return sorted(name for name, profile in load_profiles().items() if profile.verifier is not None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", default="test", help="RAGTruth QA split (test: the published figures')")
    parser.add_argument("--limit", type=int, default=None, help="only the first N answers")
    parser.add_argument("--profile", action="append", help="a verifier profile (default: every one)")
    args = parser.parse_args(argv)
    profiles = args.profile or verifier_profiles()
    try:
        samples = load_samples(EvalConfig(dataset="ragtruth-qa", split=args.split, limit=args.limit))
    except DatasetError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    command = shlex.join(["python", "evals/verifiers/published.py", "--split", args.split,
                          *(["--limit", str(args.limit)] if args.limit is not None else [])])
    print(f"RAGTruth QA {args.split}, {len(samples)} answers; answer level, positive = hallucinated")
    for profile in profiles:
        if pulled(profile) is None:
            print(f"{profile}: weights not present: {pull_command(profile)}")
            continue
        for row in run_profile(profile, samples, args.split):
            accuracy = "n/a" if row.balanced_accuracy is None else f"{row.balanced_accuracy:.3f}"
            print(f"{row.profile} {row.setting}: answer F1 {row.answer_f1:.3f}, BA {accuracy} "
                  f"({row.scored} answers; {command} --profile {row.profile})")
    print(AGGREFACT_NOTE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
