"""Train the embedded verifier's learned head on dev data and write the model file to ``--out``.

    nice -n 10 python evals/embedded/train.py --out rt4chart/judges/embedded/model.json   # minutes (RESULTS.md)

Data: the dev splits only (RAGTruth QA ``dev.jsonl`` for the ``question`` head, the FaithBench
non-test part for the ``no_question`` head; split rule in ../shared/data/README.md). Test splits
are never read.

Claims: each answer is split into sentences and claims by the rule-based decomposer (what the
pipeline does with the embedded judge), and each claim is measured against the full context (the
global stage, whose verdict is the final label) by ``rt4chart.judges.embedded.verifier.analyse_request``.
The MiniLM embeddings (the whole cost) are cached under evals/results/tmp/ (git-ignored), keyed
by the encoder's code and the data, so changing the lexical analysis or the head costs no forward
pass.

Synthetic claims (``evals/embedded/synthetic.py``, seed ``SEED``): rewrites of dev context
sentences whose label is known by construction (changed numbers, negation flips, antonyms, swapped
names, dropped qualifiers, sentences of other sources, and the unchanged copies). They join the
training folds only, with the weight chosen below; the scored folds hold real dev claims only.

Labels: a claim is *unsupported* when its answer span (its sentence) overlaps a gold hallucination
span, as ``rt4chart.analysis.metrics.claim_gold_unsupported`` aligns them; claims of a gold-hallucinated
answer without span offsets have no label and are left out of the claim model (they still count
in the answer-level figures). An answer is hallucinated as gold says (``gold.hallucinated``).

Model selection (per head), all inside dev with 5 folds grouped by source (RAGTruth and FaithBench
have several answers per source: grouping by answer would let a fold see its own context):
0. the synthetic claims' weight in the regression (``SYNTHETIC_WEIGHTS``, 0 = none) by the
   out-of-fold answer-level target;
1. the logistic regression's C by out-of-fold log loss (inputs: standardised features and their
   pairwise products, standardised again; see rt4chart/judges/embedded/model.py);
2. a Platt map of the out-of-fold logits -> calibrated P(claim unsupported);
3. the claim threshold maximising the answer-level target on out-of-fold probabilities (answer F1
   for QA, balanced accuracy for summaries): an answer is flagged when any claim reaches it;
4. a Platt map of the logit of the out-of-fold answer score 1 - prod(1 - p) -> P(answer hallucinated);
5. the negation/antonym guard (a cue on a sentence holding at least ``overlap`` of the claim's
   content words, at least ``similarity`` alike -> contradicted, whatever the regression says):
   the setting of ``GUARD_GRID`` that catches most synthetic negation flips and antonyms while
   costing at most ``GUARD_COST`` of the out-of-fold answer-level target on real dev claims;
   none when every setting costs more.
The final regression is refitted on all dev claims (and the synthetic claims, at the chosen
weight). The figures printed are out-of-fold (held-out sources) with the threshold and calibration
chosen on those same folds, so they are a little optimistic; the test figures come from
``rt4 eval`` (see RESULTS.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import log_loss, roc_auc_score
from sklearn.model_selection import GroupKFold
from sklearn.pipeline import Pipeline

from rt4chart.analysis.datasets import load_dataset, source_key
from rt4chart.analysis.metrics import balanced_accuracy, binary_prf
from rt4chart.judges.embedded.fit import C_GRID, feature_names, fitted_head, platt, regression
from rt4chart.judges.embedded.model import FEATURES, Guard, Head, HeadName, ModelArtefact, Platt, features
from rt4chart.judges.embedded.verifier import ClaimAnalysis, SentenceEncoder, analyse_request, load_encoder, model_dir
from rt4chart.method.decompose import decompose_by_rules
from rt4chart.method.tasks import VerifyInput
from rt4chart.method.text import segment_context, split_sentences
from rt4chart.types import Sample

sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic import SyntheticClaim, generate  # a script beside this one

CACHE = Path(__file__).resolve().parents[1] / "results" / "tmp"
HEADS: dict[HeadName, tuple[str, str]] = {
    "question": ("ragtruth-qa", "f1"),
    "no_question": ("faithbench", "balanced_accuracy"),
}
"""Head -> (dev dataset, answer-level target metric)."""
SYNTHETIC_WEIGHTS = (0.0, 0.1, 0.3)
"""Weight of a synthetic claim relative to a real one in the regression's loss."""
GUARD_GRID = ((0.8, 0.7), (0.8, 0.8), (0.9, 0.7), (0.9, 0.8), (1.0, 0.7), (1.0, 0.8))
"""(content-word overlap, similarity) settings of the negation/antonym guard tried, loosest first."""
GUARD_COST = 0.005
"""Largest drop of the out-of-fold answer-level target a guard may cost on dev."""
FOLDS = 5
SEED = 0
ECE_BINS = 10
CASCADE_GRID = (0.6, 0.65, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
CASCADE_AGREEMENT = 0.92
"""Out-of-fold agreement a cascade threshold must reach on dev: 0.90 (the issue's bar on test) plus
a margin for the dev-to-test shift."""


@dataclass
class AnsweredClaims:
    """One dev answer: its claims' measurements, their gold labels (None: unaligned), gold and source."""

    analyses: list[ClaimAnalysis]
    labels: list[bool | None]
    hallucinated: bool
    source: str
    """Cross-validation group (the answer's source context)."""


def claim_labels(sample: Sample, spans: list[tuple[int, int]]) -> list[bool | None]:
    """Gold label per claim: its answer span overlaps a gold span (None when it cannot align)."""
    gold = sample.gold
    assert gold is not None and gold.hallucinated is not None
    if gold.hallucinated and not gold.spans:
        return [None] * len(spans)
    return [any(g.start < end and start < g.end for g in gold.spans) for start, end in spans]


class CachedEncoder:
    """The sentence encoder with its embeddings kept on disk (keyed by the encoder's code)."""

    def __init__(self, encoder: SentenceEncoder, name: str) -> None:
        # The forward pass is BertModel's (tests/backends/test_minilm.py): the weights decide.
        weights = hashlib.sha256((model_dir() / "model.safetensors").read_bytes()).hexdigest()[:12]
        self.path = CACHE / f"embedded-train-{name}-embeddings-{weights}.pt"
        self.encoder = encoder
        self.known: dict[str, torch.Tensor] = torch.load(self.path) if self.path.is_file() else {}
        self.added = 0

    def encode(self, texts: list[str]) -> np.ndarray:
        unseen = sorted({t for t in texts if t not in self.known})
        if unseen:
            self.known.update(zip(unseen, torch.from_numpy(self.encoder.encode(unseen)), strict=True))
            self.added += len(unseen)
        if not texts:
            return np.zeros((0, self.encoder.model.width), dtype=np.float32)
        return torch.stack([self.known[t] for t in texts]).numpy()

    def save(self) -> None:
        if self.added:
            CACHE.mkdir(parents=True, exist_ok=True)
            torch.save(self.known, self.path)


def measure(samples: list[Sample], encoder: CachedEncoder) -> list[AnsweredClaims]:
    """Decompose and analyse every sample against its full context (the global stage)."""
    answered = []
    for sample in samples:
        _, sentences = segment_context(sample.context)
        claims = decompose_by_rules(split_sentences(sample.answer))
        spans = [(c.answer_span.start, c.answer_span.end) if c.answer_span else (0, 0) for c in claims]
        analyses: list[ClaimAnalysis] = []
        if sentences and claims:
            payload = VerifyInput(
                stage="global", claims=[c.text for c in claims], sentences=sentences, question=sample.question
            )
            analyses = analyse_request(encoder, payload)
        assert sample.gold is not None
        labels = claim_labels(sample, spans[: len(analyses)])
        answered.append(AnsweredClaims(analyses, labels, bool(sample.gold.hallucinated), source_key(sample)))
    return answered


def measure_synthetic(
    samples: list[Sample], claims: list[SyntheticClaim], encoder: CachedEncoder
) -> list[ClaimAnalysis]:
    """Analyse each synthetic claim against the full context of the sample it was made from."""
    by_sample: dict[int, list[int]] = {}
    for position, claim in enumerate(claims):
        by_sample.setdefault(claim.sample, []).append(position)
    analyses: list[ClaimAnalysis | None] = [None] * len(claims)
    for index, positions in by_sample.items():
        sample = samples[index]
        _, sentences = segment_context(sample.context)
        payload = VerifyInput(
            stage="global", claims=[claims[p].claim for p in positions], sentences=sentences, question=sample.question
        )
        for position, analysis in zip(positions, analyse_request(encoder, payload), strict=True):
            analyses[position] = analysis
    return [a for a in analyses if a is not None]


def measured(
    name: str, samples: list[Sample]
) -> tuple[list[AnsweredClaims], list[SyntheticClaim], list[ClaimAnalysis]]:
    """Dev answers and synthetic claims of one dataset, measured (embeddings cached on disk)."""
    encoder = CachedEncoder(load_encoder(), name)
    started = time.perf_counter()
    answered = measure(samples, encoder)
    synthetic = generate(samples, SEED)
    synthetic_analyses = measure_synthetic(samples, synthetic, encoder)
    encoder.save()
    print(f"measured {name} dev ({encoder.added} new embeddings) in {time.perf_counter() - started:.0f}s", flush=True)
    return answered, synthetic, synthetic_analyses


def expected_calibration_error(probabilities: np.ndarray, outcomes: np.ndarray, bins: int = ECE_BINS) -> float:
    """ECE with equal-width bins: sum over bins of (bin share) * |mean outcome - mean probability|."""
    which = np.minimum((probabilities * bins).astype(int), bins - 1)
    total = 0.0
    for bin_index in range(bins):
        members = which == bin_index
        if members.any():
            total += members.mean() * abs(outcomes[members].mean() - probabilities[members].mean())
    return float(total)


def logit(p: np.ndarray) -> np.ndarray:
    clipped = np.clip(p, 1e-6, 1 - 1e-6)
    result: np.ndarray = np.log(clipped / (1 - clipped))
    return result


def answer_objective(flags: np.ndarray, gold: np.ndarray, metric: str) -> float:
    if metric == "f1":
        return binary_prf(gold.tolist(), flags.tolist()).f1
    return balanced_accuracy(gold.tolist(), flags.tolist()) or 0.0


@dataclass
class Candidate:
    """One configuration scored by cross-validation inside dev."""

    name: str
    synthetic_weight: float
    c: float = 0.0
    objective: float = 0.0
    logits: np.ndarray | None = None


def choose_guard(
    analyses: list[ClaimAnalysis], synthetic: list[SyntheticClaim], synthetic_analyses: list[ClaimAnalysis],
    probabilities: np.ndarray, objective: float, scored: Callable[[np.ndarray], float], metric: str,
) -> Guard | None:
    """Step 5 of the module docstring: the guard setting, or None."""
    flips = [a for c, a in zip(synthetic, synthetic_analyses, strict=True) if c.kind in ("negation", "antonym")]
    copies = [a for c, a in zip(synthetic, synthetic_analyses, strict=True) if c.kind == "copy"]
    best: tuple[float, Guard] | None = None
    for overlap, similarity in GUARD_GRID:
        guard = Guard(overlap=overlap, similarity=similarity)
        fires = np.array([guard.fires(a) for a in analyses])
        cost = objective - scored(np.where(fires, 1.0, probabilities))
        caught = float(np.mean([guard.fires(a) for a in flips])) if flips else 0.0
        copies_flagged = float(np.mean([guard.fires(a) for a in copies])) if copies else 0.0
        print(f"  guard overlap>={overlap} similarity>={similarity}: fires on {int(fires.sum())} dev claims, "
              f"{metric} cost {cost:+.4f}; catches {caught:.2f} of synthetic flips, {copies_flagged:.2f} of copies")
        if cost <= GUARD_COST and (best is None or caught > best[0]):
            best = (caught, guard)
    return best[1] if best else None


def train_head(
    answered: list[AnsweredClaims], synthetic: list[SyntheticClaim], synthetic_analyses: list[ClaimAnalysis],
    dataset: str, metric: str,
) -> Head:
    """Model selection and fit of one head (see the module docstring); prints held-out figures."""
    rows = [(i, a, label) for i, r in enumerate(answered) for a, label in zip(r.analyses, r.labels, strict=True)]
    matrix = np.array([features(a) for _, a, _ in rows])
    owner = np.array([i for i, _, _ in rows])
    labelled = np.array([label is not None for _, _, label in rows])
    target = np.array([bool(label) for _, _, label in rows])
    gold = np.array([r.hallucinated for r in answered])
    sources = sorted({r.source for r in answered})
    group = np.array([sources.index(answered[i].source) for i in owner])
    folds = list(GroupKFold(n_splits=FOLDS, shuffle=True, random_state=SEED).split(matrix, groups=group))
    extra = np.array([features(a) for a in synthetic_analyses])
    extra_target = np.array([c.unsupported for c in synthetic])
    extra_group = np.array([sources.index(c.source) if c.source in sources else -1 for c in synthetic])

    def fit(candidate: Candidate, c: float, real: np.ndarray, extra_rows: np.ndarray) -> Pipeline:
        inputs = np.vstack([matrix[real], extra[extra_rows]])
        outcomes = np.concatenate([target[real], extra_target[extra_rows]])
        weights = np.concatenate([np.ones(len(real)), np.full(len(extra_rows), candidate.synthetic_weight)])
        return regression(c).fit(inputs, outcomes, logisticregression__sample_weight=weights)

    def out_of_fold_logits(candidate: Candidate, c: float) -> np.ndarray:
        logits = np.zeros(len(rows))
        for train, held in folds:
            train = train[labelled[train]]
            train_groups = np.unique(group[train])
            extra_rows = (
                np.flatnonzero(np.isin(extra_group, train_groups)) if candidate.synthetic_weight else np.array([], int)
            )
            logits[held] = fit(candidate, c, train, extra_rows).decision_function(matrix[held])
        return logits

    def answer_max(p: np.ndarray) -> np.ndarray:
        # An answer without claims is flagged by the pipeline (baseless): it scores 1.
        highest = np.ones(len(answered))
        has_claims = np.bincount(owner, minlength=len(answered)) > 0
        highest[has_claims] = 0.0
        np.maximum.at(highest, owner, p)
        return highest

    def calibrated(logits: np.ndarray) -> tuple[Platt, np.ndarray]:
        claim_map = platt(logits[labelled], target[labelled])
        return claim_map, 1 / (1 + np.exp(-(claim_map.slope * logits + claim_map.intercept)))

    def best_threshold(probabilities: np.ndarray) -> tuple[float, float]:
        highest = answer_max(probabilities)
        candidates = np.unique(np.round(probabilities, 3))
        objective, _, threshold = max((answer_objective(highest >= t, gold, metric), -t, t) for t in candidates)
        return float(objective), float(threshold)

    candidates = [Candidate(f"synthetic weight {w:g}", w) for w in SYNTHETIC_WEIGHTS]
    for candidate in candidates:
        losses = {}
        for c in C_GRID:
            logits = out_of_fold_logits(candidate, c)
            losses[c] = (log_loss(target[labelled], 1 / (1 + np.exp(-logits[labelled]))), logits)
        candidate.c = min(losses, key=lambda c: losses[c][0])
        candidate.logits = losses[candidate.c][1]
        _, probabilities = calibrated(candidate.logits)
        candidate.objective = best_threshold(probabilities)[0]
        auroc = roc_auc_score(target[labelled], probabilities[labelled])
        print(f"  CV {candidate.name}: C={candidate.c}, log loss {losses[candidate.c][0]:.4f}, "
              f"claim AUROC {auroc:.4f}, answer {metric} {candidate.objective:.4f}", flush=True)
    chosen = max(candidates, key=lambda candidate: candidate.objective)
    assert chosen.logits is not None
    claim_map, probabilities = calibrated(chosen.logits)
    objective, threshold = best_threshold(probabilities)
    highest = answer_max(probabilities)
    supported = np.ones(len(answered))
    np.multiply.at(supported, owner, 1 - probabilities)
    answer_score = 1 - supported
    answer_map = platt(logit(answer_score), gold)
    answer_probability = 1 / (1 + np.exp(-(answer_map.slope * logit(answer_score) + answer_map.intercept)))
    guard = choose_guard(
        [a for _, a, _ in rows], synthetic, synthetic_analyses, probabilities, objective,
        lambda p: best_threshold(p)[0], metric,
    )
    flags = highest >= threshold
    prf = binary_prf(gold.tolist(), flags.tolist())
    figures: dict[str, float | int | str] = {
        "dataset": f"{dataset} dev",
        "answers": len(answered),
        "sources": len(sources),
        "claims": len(rows),
        "labelled_claims": int(labelled.sum()),
        "unsupported_claims": int(target[labelled].sum()),
        "synthetic_claims": len(synthetic),
        "synthetic_weight": chosen.synthetic_weight,
        "C": chosen.c,
        "cv_claim_auroc": round(float(roc_auc_score(target[labelled], probabilities[labelled])), 4),
        "cv_claim_ece": round(expected_calibration_error(probabilities[labelled], target[labelled].astype(float)), 4),
        "cv_answer_f1": round(prf.f1, 4),
        "cv_answer_balanced_accuracy": round(balanced_accuracy(gold.tolist(), flags.tolist()) or 0.0, 4),
        "cv_answer_auroc": round(float(roc_auc_score(gold, answer_score)), 4),
        "cv_answer_ece": round(expected_calibration_error(answer_probability, gold.astype(float)), 4),
    }
    # Cascade: a claim settles locally when the probability of its chosen label reaches p.
    chosen_label = np.where(probabilities >= threshold, probabilities, 1 - probabilities)
    agree = (probabilities >= threshold) == target
    for p in CASCADE_GRID:
        settled = labelled & (chosen_label >= p)
        share, accuracy = settled.sum() / labelled.sum(), agree[settled].mean() if settled.any() else 0.0
        print(f"  cascade p={p:.2f}: settles {share:.3f} of labelled claims, agreement {accuracy:.3f}")
        if "cascade_p" not in figures and accuracy >= CASCADE_AGREEMENT:
            figures.update(cascade_p=p, cv_cascade_settled=round(float(share), 4),
                           cv_cascade_agreement=round(float(accuracy), 4))
    print(f"{dataset} dev, chosen: {chosen.name} ({metric} target {objective:.3f} at threshold {threshold:.3f}): "
          f"{json.dumps(figures)}")
    everything = np.flatnonzero(labelled)
    extra_rows = np.arange(len(extra)) if chosen.synthetic_weight else np.array([], int)
    final = fit(chosen, chosen.c, everything, extra_rows)
    weights = final.steps[-1][1].coef_[0]
    for name, weight in sorted(zip(feature_names(final), weights, strict=True), key=lambda x: -abs(x[1]))[:8]:
        print(f"  {name:>40}: {weight:+.3f}")
    return fitted_head(final, claim_map, float(threshold), answer_map, guard, figures,
                       matrix[:: max(1, len(matrix) // 50)])


SHIPPED_IN_CHECKOUT = "rt4chart/judges/embedded/model.json"


def installed_package_path(path: Path) -> bool:
    """Whether ``path`` lies under this interpreter's site-packages (an installed package)."""
    target = path.resolve()
    installed = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}
    return any(target.is_relative_to(folder) for folder in installed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, required=True,
        help=f"where to write the model file (the shipped one, from a checkout: {SHIPPED_IN_CHECKOUT})",
    )
    args = parser.parse_args()
    if installed_package_path(args.out):
        # A rebuild written into site-packages silently replaces the judge every later audit runs as.
        parser.error(f"--out {args.out} is inside an installed package; give a path outside site-packages")
    # Its folder is made now, not after minutes of fitting.
    args.out.parent.mkdir(parents=True, exist_ok=True)
    heads = {}
    for head, (dataset, metric) in HEADS.items():
        samples = load_dataset(dataset, split="dev")
        heads[head] = train_head(*measured(dataset, samples), dataset, metric)
    # --out only says where the file goes, so it is left out: rebuilds anywhere compare byte for byte.
    artefact = ModelArtefact(features=list(FEATURES), heads=heads, command="python evals/embedded/train.py")
    args.out.write_text(artefact.model_dump_json(indent=1) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
