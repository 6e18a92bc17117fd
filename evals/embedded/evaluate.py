"""Evaluate (and tune) the embedded offline verifier on the benchmark data in ../shared/data.

Thresholds are tuned on dev splits only (RAGTruth QA dev, FaithBench non-test part); test figures
are reported, never tuned on. Figures come from the real pipeline:
``Pipeline(EmbeddedBackend(thresholds), PipelineOptions(decomposer="rules"))`` over the samples,
scored as ``Report.hallucinated`` against gold.

    python evals/embedded/evaluate.py --split dev --tune    # tune, then evaluate dev
    python evals/embedded/evaluate.py --split test          # evaluate test with the tuned constants

Every run rewrites its section of evals/embedded/RESULTS.md (command line and date included).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import hashlib
import itertools
import json
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from rt4chart.backends.base import VerifyInput
from rt4chart.backends.embedded import TUNED, ClaimAnalysis, EmbeddedBackend, Thresholds, decide
from rt4chart.decompose import decompose_by_rules
from rt4chart.io import InputLine
from rt4chart.pipeline import Pipeline, PipelineOptions
from rt4chart.text import segment_context, split_sentences
from rt4chart.types import Gold, Label, Report, Sample

DATA = Path("/work/shared/data")
RESULTS = Path(__file__).with_name("RESULTS.md")

# Reference points given with the issue / in ../shared/data/README.md (not measured here).
REFERENCES = {
    "ragtruth-qa test answer F1": {"lexical baseline (issue 3)": 0.54},
    "faithbench test balanced accuracy": {
        "lexical baseline (issue 3)": 0.56,
        "GPT-4o stored outputs (issue 3)": 0.564,
        "HHEM-2.1-Open (issue 3)": 0.513,
    },
}

GRID = {
    "support": [round(0.02 * i, 2) for i in range(50)],
    "coverage_weight": [0.0, 0.2, 0.4, 0.6, 0.8, 1.0],
    "contradiction_overlap": [0.5, 0.6, 0.7, 0.8, 0.9, 1.0],
    "min_content_words": [0, 1, 2, 3, 4, 5],
    "max_missing": [0, 1, 2, 3, 4, 5, 6, 99],
    "question_covers": [False, True],
}
"""Values searched by --tune."""


# ---------------------------------------------------------------------------------------------
# Data


def faithbench_is_test(batch: int, sample_id: int) -> bool:
    """The split rule of ../shared/data/README.md."""
    return int(hashlib.sha256(f"{batch}:{sample_id}".encode()).hexdigest(), 16) % 3 == 0


def load_samples(name: str, split: str) -> list[Sample]:
    """Samples with gold labels (private loader; rt4chart.datasets takes over when it lands)."""
    try:
        from rt4chart.datasets import load_dataset  # type: ignore[import-not-found]
    except ImportError:
        pass
    else:
        return list(load_dataset(name, split=split))
    if name == "ragtruth-qa":
        rows = [json.loads(line) for line in (DATA / "ragtruth-qa" / f"{split}.jsonl").open()]
        return [
            Sample(
                id=row["id"],
                context=row["d1"],
                question=row["query"],
                answer=row["d2"],
                gold=Gold(hallucinated=bool(row["labels"]), task_type="QA"),
            )
            for row in rows
        ]
    samples = []
    for path in sorted((DATA / "faithbench" / "data_for_release").glob("batch_*.json")):
        batch = int(path.stem.split("_")[1])
        for item in json.loads(path.read_text())["samples"]:
            if faithbench_is_test(batch, item["sample_id"]) != (split == "test"):
                continue
            unwanted = any(a["label"] and a["label"][0] == "Unwanted" for a in item["annotations"])
            samples.append(
                Sample(
                    id=f"{batch}:{item['sample_id']}",
                    context=item["source"],
                    answer=item["summary"],
                    gold=Gold(hallucinated=unwanted, task_type="Summary"),
                )
            )
    return samples


# ---------------------------------------------------------------------------------------------
# Metrics


@dataclass
class Scores:
    precision: float
    recall: float
    f1: float
    balanced_accuracy: float
    flagged: int
    n: int


def score(predicted: list[bool] | np.ndarray, gold: list[bool] | np.ndarray) -> Scores:
    said, truth = np.asarray(predicted, dtype=bool), np.asarray(gold, dtype=bool)
    tp = int((said & truth).sum())
    fp = int((said & ~truth).sum())
    fn = int((~said & truth).sum())
    tn = len(truth) - tp - fp - fn
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    specificity = tn / (tn + fp) if tn + fp else 0.0
    return Scores(precision, recall, f1, (recall + specificity) / 2, int(said.sum()), len(truth))


# ---------------------------------------------------------------------------------------------
# Tuning: the global-stage analysis of every claim, then a grid search over the decision


def global_analyses(
    backend: EmbeddedBackend, samples: list[Sample]
) -> list[list[ClaimAnalysis]]:
    """Per sample, the analysis of each rule-based claim against the full context.

    With global verification on, a claim's final label is the global verdict, which is
    ``decide(analysis)`` of exactly this analysis; the grid search therefore reproduces the
    pipeline's answer-level decision without re-running it per grid point.
    """
    analysed = []
    for sample in samples:
        _, sentences = segment_context(sample.context)
        claims = decompose_by_rules(split_sentences(sample.answer))
        if not sentences or not claims:
            analysed.append([])
            continue
        payload = VerifyInput(
            stage="global",
            claims=[c.text for c in claims],
            sentences=sentences,
            question=sample.question,
        )
        analysed.append(backend.analyse(payload))
    return analysed


def flags(analyses: list[list[ClaimAnalysis]], thresholds: Thresholds) -> list[bool]:
    """Answer-level flags the pipeline would raise: any claim not entailed (an answer without
    claims is baseless, hence flagged)."""
    return [
        any(decide(a, thresholds)[0] != Label.ENTAILED for a in claims) if claims else True
        for claims in analyses
    ]


@dataclass
class ClaimTable:
    """The analyses of a dataset as columns, for a vectorised copy of ``decide``."""

    owner: np.ndarray
    meta: np.ndarray
    cue: np.ndarray
    cue_overlap: np.ndarray
    absent: np.ndarray
    content_words: np.ndarray
    missing: np.ndarray
    coverage: np.ndarray
    similarity: np.ndarray
    n_samples: int

    @classmethod
    def of(cls, analyses: list[list[ClaimAnalysis]]) -> ClaimTable:
        claims = [(i, a) for i, sample in enumerate(analyses) for a in sample]
        column = lambda get: np.array([get(a) for _, a in claims], dtype=float)  # noqa: E731
        return cls(
            owner=np.array([i for i, _ in claims], dtype=int),
            meta=column(lambda a: a.meta) > 0,
            cue=column(lambda a: a.cue is not None) > 0,
            cue_overlap=column(lambda a: a.cue_overlap),
            absent=column(lambda a: bool(a.absent_numbers)) > 0,
            content_words=column(lambda a: a.content_words),
            missing=column(lambda a: a.missing),
            coverage=column(lambda a: a.coverage),
            similarity=np.maximum(column(lambda a: a.similarity), 0.0),
            n_samples=len(analyses),
        )

    def flags(self, t: Thresholds) -> np.ndarray:
        """Same answer flags as :func:`flags`, for all claims at once (checked after tuning)."""
        contradicted = ~self.meta & self.cue & (self.cue_overlap >= t.contradiction_overlap)
        undecided = ~self.meta & ~contradicted & ~self.absent
        short = undecided & (self.content_words < t.min_content_words)
        score = t.coverage_weight * self.coverage + (1 - t.coverage_weight) * self.similarity
        supported = (
            undecided & ~short & (self.missing <= t.max_missing) & (score >= t.support)
        )
        entailed = self.meta | short | supported
        not_entailed = np.bincount(self.owner, weights=~entailed, minlength=self.n_samples)
        claims = np.bincount(self.owner, minlength=self.n_samples)
        return (not_entailed > 0) | (claims == 0)


def tune(
    sets: dict[str, tuple[dict[bool, list[list[ClaimAnalysis]]], list[bool]]],
) -> tuple[Thresholds, dict[str, Scores]]:
    """Grid search maximising the mean of RAGTruth QA dev F1 and FaithBench dev balanced accuracy."""
    tables = {
        name: ({covers: ClaimTable.of(a) for covers, a in by_question.items()}, np.array(gold))
        for name, (by_question, gold) in sets.items()
    }
    best: tuple[float, Thresholds] | None = None
    keys = list(GRID)
    for values in itertools.product(*(GRID[k] for k in keys)):
        thresholds = Thresholds(**dict(zip(keys, values, strict=True)))
        results = {
            name: score(by_question[thresholds.question_covers].flags(thresholds), gold)
            for name, (by_question, gold) in tables.items()
        }
        objective = (results["ragtruth-qa"].f1 + results["faithbench"].balanced_accuracy) / 2
        if best is None or objective > best[0] + 1e-12:
            best = (objective, thresholds)
    assert best is not None
    chosen = best[1]
    checked = {}
    for name, (by_question, gold) in sets.items():
        analyses = by_question[chosen.question_covers]
        exact = flags(analyses, chosen)
        if exact != list(tables[name][0][chosen.question_covers].flags(chosen)):
            raise AssertionError("the vectorised decision drifted from embedded.decide")
        checked[name] = score(exact, gold)
    return chosen, checked


# ---------------------------------------------------------------------------------------------
# The real pipeline


async def run_pipeline(backend: EmbeddedBackend, samples: list[Sample]) -> list[Report]:
    """The reports of the real pipeline, in sample order."""
    pipeline = Pipeline(backend, PipelineOptions(decomposer="rules"))
    reports = [r async for r in pipeline.run(InputLine(i, s) for i, s in enumerate(samples, 1))]
    failed = [r.id for r in reports if r.hallucinated is None]
    if failed:
        raise RuntimeError(f"pipeline failed on samples {failed[:5]}")
    return reports


STATE = Path(__file__).with_name("results.json")
"""Figures of the latest run of each split, from which RESULTS.md is regenerated."""


def write_results(split: str, section: dict[str, object]) -> None:
    """Record this run's section and rewrite RESULTS.md from all recorded sections."""
    state = json.loads(STATE.read_text()) if STATE.exists() else {}
    state[split] = section
    STATE.write_text(json.dumps(state, indent=2) + "\n")
    lines = [
        "# Embedded offline verifier: evaluation",
        "",
        "Written by `evals/embedded/evaluate.py`; do not edit by hand. Real pipeline:",
        "`Pipeline(EmbeddedBackend(thresholds), PipelineOptions(decomposer=\"rules\"))` (W=25, O=10,",
        "local + global verification), answer flagged when any claim is not entailed, scored against",
        "gold (RAGTruth QA: any labelled span; FaithBench: any annotation whose first label is",
        "`Unwanted`). Thresholds are tuned on dev only: RAGTruth QA `dev.jsonl` and the FaithBench",
        "non-test part (split rule of ../shared/data/README.md); the objective is the mean of RAGTruth",
        "QA dev answer F1 and FaithBench dev balanced accuracy.",
        "",
    ]
    for name in ("dev", "test"):
        if name not in state:
            continue
        run = state[name]
        lines += [f"## {name}", "", f"- command: `{run['command']}`", f"- date: {run['date']}"]
        lines.append(f"- thresholds: `{json.dumps(run['thresholds'])}`")
        lines += ["", "| dataset | n | flagged | precision | recall | answer F1 | balanced accuracy | claims/s |",
                  "|---|---|---|---|---|---|---|---|"]
        for dataset, figures in run["datasets"].items():  # type: ignore[union-attr]
            lines.append(
                f"| {dataset} {name} | {figures['n']} | {figures['flagged']} | {figures['precision']:.3f} "
                f"| {figures['recall']:.3f} | {figures['f1']:.3f} | {figures['balanced_accuracy']:.3f} "
                f"| {figures['claims_per_s']:.1f} |"
            )
        lines.append("")
    lines += ["## Reference points (given, not measured here)", ""]
    for metric, references in REFERENCES.items():
        lines.append(f"- {metric}: " + ", ".join(f"{who} {value}" for who, value in references.items()))
    lines += ["- targets (issue 3): answer F1 >= 0.65 on RAGTruth QA test, balanced accuracy >= 0.60 on "
              "FaithBench test", ""]
    RESULTS.write_text("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=["dev", "test"], required=True)
    parser.add_argument("--tune", action="store_true", help="grid-search thresholds (dev only)")
    parser.add_argument("--limit", type=int, default=None, help="first N samples per dataset (no record)")
    args = parser.parse_args()
    if args.tune and args.split != "dev":
        parser.error("thresholds are tuned on dev only")
    data = {name: load_samples(name, args.split)[: args.limit] for name in ("ragtruth-qa", "faithbench")}
    thresholds = TUNED
    if args.tune:
        started = time.perf_counter()
        sets = {}
        for name, samples in data.items():
            by_question = {
                covers: global_analyses(
                    EmbeddedBackend(thresholds.model_copy(update={"question_covers": covers})), samples
                )
                for covers in (False, True)
            }
            sets[name] = (by_question, [bool(s.gold and s.gold.hallucinated) for s in samples])
        thresholds, tuned_scores = tune(sets)
        print(f"tuned in {time.perf_counter() - started:.0f}s: {thresholds!r}")
        for name, result in tuned_scores.items():
            print(f"  grid search {name} dev: {result}")
    backend = EmbeddedBackend(thresholds)
    figures: dict[str, dict[str, float]] = {}
    for name, samples in data.items():
        started = time.perf_counter()
        reports = asyncio.run(run_pipeline(backend, samples))
        elapsed = time.perf_counter() - started
        result = score(
            [bool(r.hallucinated) for r in reports], [bool(s.gold and s.gold.hallucinated) for s in samples]
        )
        claims = sum(len(r.claims) for r in reports)
        print(f"pipeline {name} {args.split}: {result} ({claims / elapsed:.1f} claims/s)")
        figures[name] = {**asdict(result), "claims_per_s": claims / elapsed}
    if args.limit is None:
        write_results(
            args.split,
            {
                "command": shlex.join(["python", "evals/embedded/evaluate.py", *sys.argv[1:]]),
                "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                "thresholds": thresholds.model_dump(),
                "datasets": figures,
            },
        )


if __name__ == "__main__":
    main()
