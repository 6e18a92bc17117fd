"""Does the review loop's 95% interval cover the judge's true precision about 95% of the time?

A known population of audited claims: the judge's label (entailed / contradicted / baseless in
given shares), its confidence (a Beta draw per label), and the true label, which equals the
judge's with probability equal to its confidence (else one of the two others). Each draw plans
``--n`` reviews (``rt4 review-plan``'s rule, its own seed), answers them with the true labels, and
asks ``rt4 agree --reviews``'s estimator (Horvitz-Thompson weights, the package's bootstrap) for the
judge's precision and recall per label; a figure is covered when its interval holds the population's
true value. Prints the coverage per figure and the pooled rate over all draws.

    python evals/review/coverage.py --draws 1000 --n 60
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

import numpy as np

from rt4chart.analysis.agreement import THREE_WAY
from rt4chart.analysis.review import ClaimReview, run_key
from rt4chart.analysis.review_agreement import review_agreement
from rt4chart.report.audited import AuditedSample
from rt4chart.report.review_plan import plan_reviews
from rt4chart.types import AuditRecord, ClaimVerdict, Label

JUDGE_SHARES = {"entailed": 0.7, "contradicted": 0.1, "baseless": 0.2}
"""How often the simulated judge gives each label."""
CONFIDENCE_BETA = {"entailed": (8.0, 2.0), "contradicted": (3.0, 2.0), "baseless": (2.5, 2.5)}
"""Beta(a, b) of the judge's confidence per label: sure of entailment, less of its flags."""


@dataclass(frozen=True)
class Population:
    """An audit whose true labels are known."""

    audited: list[AuditedSample]
    truth: dict[tuple[str, int], str]
    """The true label of every claim, by (record id, claim index)."""

    def true_figures(self) -> dict[str, float]:
        """The judge's precision and recall per label on the whole population."""
        pairs = [(c.label.value, self.truth[(r.report.id or "", i)])  # type: ignore[union-attr]
                 for r in self.audited for i, c in enumerate(r.report.claims)]
        figures: dict[str, float] = {}
        for label in THREE_WAY:
            both = sum(judge == label and true == label for judge, true in pairs)
            figures[f"precision {label}"] = both / sum(judge == label for judge, _ in pairs)
            figures[f"recall {label}"] = both / sum(true == label for _, true in pairs)
        return figures


def population(records: int, claims_per_record: int, seed: int) -> Population:
    """A seeded population of ``records * claims_per_record`` claims (see the module's docstring)."""
    rng = np.random.default_rng(seed)
    audited: list[AuditedSample] = []
    truth: dict[tuple[str, int], str] = {}
    for number in range(records):
        claims = []
        for index in range(claims_per_record):
            judge = str(rng.choice(THREE_WAY, p=[JUDGE_SHARES[label] for label in THREE_WAY]))
            confidence = float(rng.beta(*CONFIDENCE_BETA[judge]))
            right = rng.random() < confidence
            others = [label for label in THREE_WAY if label != judge]
            truth[(f"r{number}", index)] = judge if right else str(rng.choice(others))
            claims.append(ClaimVerdict(index=index, text=f"claim {number}.{index}", sentence_index=0, answer_span=None,
                                       label=Label(judge), confidence=confidence))
        audited.append(AuditedSample(AuditRecord(id=f"r{number}", line=number + 1, claims=claims)))
    return Population(audited, truth)


def _reviews(known: Population, n: int, seed: int, design: str) -> list[ClaimReview]:
    """Truthful reviews of ``n`` claims drawn by the review plan (``stratified``) or by a simple
    random sample (``simple``: every claim pi = n / N), the baseline the plan must beat."""
    run = run_key([item.report for item in known.audited])
    picked: list[tuple[str, int, float, str | None]]
    if design == "stratified":
        picked = [(c.record_id, c.claim_index, c.inclusion_probability, c.stratum)
                  for c in plan_reviews(known.audited, n, seed).claims]
    else:
        every = [(item.report.id or "", index) for item in known.audited for index in range(len(item.report.claims))]
        chosen = np.random.default_rng(seed).choice(len(every), size=n, replace=False)
        picked = [(*every[int(i)], n / len(every), None) for i in chosen]
    by_id = {item.report.id: item.report for item in known.audited}
    return [
        ClaimReview(run=run, record_id=record, claim_index=index, claim=by_id[record].claims[index].text,
                    judge_label=by_id[record].claims[index].label.value,  # type: ignore[union-attr,arg-type]
                    label=known.truth[(record, index)], inclusion_probability=probability, stratum=stratum)  # type: ignore[arg-type]
        for record, index, probability, stratum in picked
    ]


def covered_in_one_draw(
    known: Population, n: int, resamples: int, seed: int, design: str = "stratified"
) -> dict[str, tuple[bool, float] | None]:
    """Draw ``n`` reviews with ``seed``, review them truthfully, and say for each true figure whether
    its interval holds it, and the interval's width (``None``: no interval, e.g. no review behind it)."""
    reviews = _reviews(known, n, seed, design)
    result = review_agreement([item.report for item in known.audited], reviews, resamples=resamples, seed=seed)
    true = known.true_figures()
    covered: dict[str, tuple[bool, float] | None] = {}
    for figures in result.labels:
        for name, statistic in (("precision", figures.precision), ("recall", figures.recall)):
            key = f"{name} {figures.label}"
            if statistic.ci_low is None or statistic.ci_high is None:
                covered[key] = None
            else:
                low, high = statistic.ci_low, statistic.ci_high
                covered[key] = (low <= true[key] <= high, high - low)
    return covered


def coverage(
    known: Population, draws: int, n: int, resamples: int, first_seed: int = 0, design: str = "stratified"
) -> dict[str, dict[str, float]]:
    """Coverage of every figure over ``draws`` draws: the covered share, the mean interval width and
    the draws with an interval."""
    hits: dict[str, list[tuple[bool, float]]] = {}
    for draw in range(draws):
        for key, covered in covered_in_one_draw(known, n, resamples, first_seed + draw, design).items():
            if covered is not None:
                hits.setdefault(key, []).append(covered)
    return {
        key: {"coverage": float(np.mean([hit for hit, _ in values])),
              "mean width": float(np.mean([width for _, width in values])), "draws": float(len(values))}
        for key, values in hits.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draws", type=int, default=1000)
    parser.add_argument("--n", type=int, default=60, help="reviews per plan")
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--records", type=int, default=400)
    parser.add_argument("--claims-per-record", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="the population's seed")
    parser.add_argument("--design", choices=["stratified", "simple"], default="stratified",
                        help="the review plan, or a simple random sample of claims (the baseline)")
    arguments = parser.parse_args()
    known = population(arguments.records, arguments.claims_per_record, arguments.seed)
    result = coverage(known, arguments.draws, arguments.n, arguments.resamples, design=arguments.design)
    precision = [v for k, v in result.items() if k.startswith("precision")]
    pooled = sum(v["coverage"] * v["draws"] for v in precision) / sum(v["draws"] for v in precision)
    print(json.dumps({"true": known.true_figures(), "coverage": result, "pooled precision coverage": pooled,
                      "draws": arguments.draws, "n": arguments.n, "resamples": arguments.resamples,
                      "design": arguments.design}, indent=1))


if __name__ == "__main__":
    main()
