"""Round 3 of the embedded verifier: what else was tried on dev, and did not beat the shipped head.

    python evals/embedded/round3.py aggregation  ragtruth-qa   # answer-level rules, nested thresholds
    python evals/embedded/round3.py tokens       faithbench    # token-level alignment features
    python evals/embedded/round3.py pair         ragtruth-qa   # SBERT-style pair head, stacked
    python evals/embedded/round3.py cross-encoder ragtruth-qa  # MiniLM fine-tuned on claim pairs

Dev splits only, through ``train.py``'s measurements and folds (5 folds grouped by source; its
embedding cache under evals/results/tmp makes a rerun cheap). Every figure printed is out-of-fold;
findings are in RESULTS.md ("Round 3").
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import log_loss, roc_auc_score
from sklearn.model_selection import GroupKFold
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from rt4chart.analysis.datasets import load_dataset
from rt4chart.judges.embedded.fit import platt, regression
from rt4chart.judges.embedded.minilm_torch import TorchMiniLM
from rt4chart.judges.embedded.model import features
from rt4chart.judges.embedded.verifier import load_encoder, model_dir
from rt4chart.method.decompose import decompose_by_rules
from rt4chart.method.text import segment_context, split_sentences
from rt4chart.types import Sample

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train  # a script beside this one

SETTINGS = {"ragtruth-qa": ("f1", 0.01), "faithbench": ("balanced_accuracy", 0.003)}
"""Dataset -> (answer-level target, the shipped head's C)."""
SPECIAL_TOKENS = {0, 100, 101, 102}
"""[PAD], [UNK], [CLS], [SEP] of MiniLM's vocabulary: left out of token alignment."""


@dataclass
class Dev:
    """One dev split measured as train.py measures it, flattened to claims."""

    dataset: str
    samples: list[Sample]
    answered: list[train.AnsweredClaims]
    matrix: np.ndarray
    owner: np.ndarray
    labelled: np.ndarray
    target: np.ndarray
    gold: np.ndarray
    group: np.ndarray
    folds: list[tuple[np.ndarray, np.ndarray]]
    metric: str
    c: float

    def texts(self, index: int) -> tuple[list[str], list[str]]:
        """Claim texts and context sentence texts of sample ``index``."""
        sample = self.samples[index]
        _, sentences = segment_context(sample.context)
        claims = decompose_by_rules(split_sentences(sample.answer))
        return [c.text for c in claims], [s.text for s in sentences]

    def answer_max(self, probabilities: np.ndarray) -> np.ndarray:
        highest = np.zeros(len(self.answered))
        np.maximum.at(highest, self.owner, probabilities)
        highest[np.bincount(self.owner, minlength=len(self.answered)) == 0] = 1.0
        return highest

    def report(self, logits: np.ndarray, name: str) -> None:
        """Calibrate out-of-fold logits as train.py does and print claim and answer figures."""
        labelled, target = self.labelled, self.target
        mapping = platt(logits[labelled], target[labelled])
        p = 1 / (1 + np.exp(-(mapping.slope * logits + mapping.intercept)))
        highest = self.answer_max(p)
        best = max(train.answer_objective(highest >= t, self.gold, self.metric) for t in np.unique(np.round(p, 3)))
        claim_auroc = roc_auc_score(target[labelled], p[labelled])
        print(f"{name:36s} log loss {log_loss(target[labelled], p[labelled]):.4f} | claim AUROC {claim_auroc:.4f}"
              f" | answer AUROC {roc_auc_score(self.gold, highest):.4f} | same-fold {self.metric} {best:.4f}",
              flush=True)

    def out_of_fold(self, matrix: np.ndarray, c: float) -> np.ndarray:
        logits = np.zeros(len(matrix))
        for train_rows, held in self.folds:
            train_rows = train_rows[self.labelled[train_rows]]
            fitted = regression(c).fit(matrix[train_rows], self.target[train_rows])
            logits[held] = fitted.decision_function(matrix[held])
        return logits


def measure_dev(dataset: str) -> Dev:
    samples = load_dataset(dataset, split="dev")
    answered, _, _ = train.measured(dataset, samples)
    rows = [(i, a, label) for i, r in enumerate(answered) for a, label in zip(r.analyses, r.labels, strict=True)]
    sources = sorted({r.source for r in answered})
    owner = np.array([i for i, _, _ in rows])
    group = np.array([sources.index(answered[i].source) for i in owner])
    matrix = np.array([features(a) for _, a, _ in rows])
    folds = list(GroupKFold(n_splits=train.FOLDS, shuffle=True, random_state=train.SEED).split(matrix, groups=group))
    metric, c = SETTINGS[dataset]
    return Dev(
        dataset=dataset, samples=samples, answered=answered, matrix=matrix, owner=owner,
        labelled=np.array([label is not None for _, _, label in rows]),
        target=np.array([bool(label) for _, _, label in rows]),
        gold=np.array([r.hallucinated for r in answered]), group=group, folds=folds, metric=metric, c=c,
    )


def calibrated(dev: Dev, logits: np.ndarray) -> np.ndarray:
    mapping = platt(logits[dev.labelled], dev.target[dev.labelled])
    probabilities: np.ndarray = 1 / (1 + np.exp(-(mapping.slope * logits + mapping.intercept)))
    return probabilities


def aggregation(dev: Dev) -> None:
    """Answer-level rules with thresholds chosen on four folds of answers and scored on the fifth."""
    p = calibrated(dev, dev.out_of_fold(dev.matrix, dev.c))
    answers = len(dev.answered)
    highest = dev.answer_max(p)
    supported = np.ones(answers)
    np.multiply.at(supported, dev.owner, 1 - p)
    noisy_or = 1 - supported
    counts = np.bincount(dev.owner, minlength=answers)
    mean = np.bincount(dev.owner, weights=p, minlength=answers) / np.maximum(counts, 1)
    novelty = np.zeros(answers)
    for i, r in enumerate(dev.answered):
        words = sum(a.content_words for a in r.analyses)
        novelty[i] = sum(a.missing for a in r.analyses) / words if words else 0.0
    answer_groups = np.array([sorted({r.source for r in dev.answered}).index(r.source) for r in dev.answered])
    outer = list(GroupKFold(n_splits=5, shuffle=True, random_state=1).split(np.zeros(answers), groups=answer_groups))

    def best_threshold(score: np.ndarray, gold: np.ndarray) -> float:
        objective = [(train.answer_objective(score >= t, gold, dev.metric), -t) for t in np.unique(np.round(score, 3))]
        return -max(objective)[1]

    def bootstrap_threshold(score: np.ndarray, gold: np.ndarray, replicates: int = 200) -> float:
        rng = np.random.default_rng(0)
        candidates = np.unique(np.round(score, 3))
        total = np.zeros(len(candidates))
        for _ in range(replicates):
            pick = rng.integers(0, len(gold), len(gold))
            total += [train.answer_objective(score[pick] >= t, gold[pick], dev.metric) for t in candidates]
        return float(candidates[int(np.argmax(total))])

    def nested(name: str, scores: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]],
               choose: Callable[[np.ndarray, np.ndarray], float]) -> None:
        flags, ranking, thresholds = np.zeros(answers, bool), np.zeros(answers), []
        for fit_rows, held in outer:
            fitted, scored = scores(fit_rows, held)
            thresholds.append(choose(fitted, dev.gold[fit_rows]))
            flags[held], ranking[held] = scored >= thresholds[-1], scored
        print(f"{name:44s} nested {dev.metric} {train.answer_objective(flags, dev.gold, dev.metric):.4f} | "
              f"answer AUROC {roc_auc_score(dev.gold, ranking):.4f} | thresholds {np.round(thresholds, 3)}")

    def fixed(score: np.ndarray) -> Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        return lambda fit_rows, held: (score[fit_rows], score[held])

    stack = np.column_stack([train.logit(highest), train.logit(noisy_or), mean, np.log1p(counts), novelty])

    def stacked(columns: list[int]) -> Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        def scores(fit_rows: np.ndarray, held: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            model = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
            model.fit(stack[fit_rows][:, columns], dev.gold[fit_rows])
            fitted, scored = (model.predict_proba(stack[rows][:, columns])[:, 1] for rows in (fit_rows, held))
            return fitted, scored
        return scores

    nested("any claim (shipped), best threshold", fixed(highest), best_threshold)
    nested("any claim (shipped), bootstrap-mean threshold", fixed(highest), bootstrap_threshold)
    nested("noisy-OR, best threshold", fixed(noisy_or), best_threshold)
    nested("stack: max + content-word novelty", stacked([0, 4]), best_threshold)
    nested("stack: max, noisy-OR, mean, claims, novelty", stacked([0, 1, 2, 3, 4]), best_threshold)


def token_states(model: TorchMiniLM, texts: list[str]) -> dict[str, torch.Tensor]:
    """Unit-length last-layer states of each text's tokens (special tokens left out)."""
    states: dict[str, torch.Tensor] = {}
    ordered = sorted(set(texts), key=len)
    for start in range(0, len(ordered), 32):
        batch = ordered[start : start + 32]
        encodings = model.tokenizer.encode_batch(batch)
        ids = torch.tensor([e.ids for e in encodings])
        attention = torch.tensor([e.attention_mask for e in encodings])
        with torch.inference_mode():
            hidden = model.embedding_norm(model.words(ids) + model.positions.weight[: ids.shape[1]]
                                          + model.token_types.weight[0])
            additive = (1.0 - attention[:, None, None, :].float()) * torch.finfo(hidden.dtype).min
            for layer in model.layers:
                hidden = layer(hidden, additive)
            hidden = torch.nn.functional.normalize(hidden, dim=-1)
        for text, encoding, row in zip(batch, encodings, hidden, strict=True):
            keep = [i for i, (t, a) in enumerate(zip(encoding.ids, encoding.attention_mask, strict=True))
                    if a and t not in SPECIAL_TOKENS]
            states[text] = row[keep]
    return states


def tokens(dev: Dev) -> None:
    """BERTScore-style recall of the claim's tokens in the whole context and in its best sentences."""
    texts = [dev.texts(i) for i in range(len(dev.samples))]
    started = time.perf_counter()
    states = token_states(TorchMiniLM(model_dir()), [t for claims, sentences in texts for t in claims + sentences])
    print(f"token states of {len(states)} texts in {time.perf_counter() - started:.0f}s", flush=True)
    extra = []
    for i, answered in enumerate(dev.answered):
        claims, sentences = texts[i]
        context = torch.cat([states[s] for s in sentences])
        for j, analysis in enumerate(answered.analyses):
            claim = states[claims[j]]
            if not len(claim):
                extra.append([1.0, 1.0, 1.0, 1.0])
                continue
            best = torch.cat([states[sentences[k]] for k in analysis.evidence[:3]]) if analysis.evidence else context
            everywhere = (claim @ context.T).max(dim=1).values
            extra.append([float(everywhere.mean()), float(everywhere.min()), float(torch.quantile(everywhere, 0.1)),
                          float((claim @ best.T).max(dim=1).values.mean())])
    table = np.array(extra)
    dev.report(dev.out_of_fold(dev.matrix, dev.c), "shipped features")
    for columns, name in (([0], "+ recall in context"), ([1, 2], "+ min, 10th percentile"),
                          ([3], "+ recall in best sentences"), ([0, 1, 2, 3], "+ all four")):
        for c in (dev.c / 3, dev.c, dev.c * 3):
            dev.report(dev.out_of_fold(np.hstack([dev.matrix, table[:, columns]]), c), f"{name}, C={c:.4f}")


def pair(dev: Dev) -> None:
    """Logistic regression on [u*v, |u-v|] of the claim's and its best sentence's embeddings, alone and stacked."""
    encoder = train.CachedEncoder(load_encoder(), dev.dataset)
    vectors = []
    for i, answered in enumerate(dev.answered):
        claims, sentences = dev.texts(i)
        for j, analysis in enumerate(answered.analyses):
            u, v = encoder.encode([claims[j], sentences[(analysis.evidence or [0])[0]]])
            vectors.append(np.concatenate([u * v, np.abs(u - v)]))
    pairs = np.array(vectors)
    dev.report(dev.out_of_fold(dev.matrix, dev.c), "shipped features")
    for c in (0.01, 0.03, 0.1):
        alone, stacked = np.zeros(len(pairs)), np.zeros(len(pairs))
        for train_rows, held in dev.folds:
            head = LogisticRegression(C=c, max_iter=3000).fit(pairs[train_rows], dev.target[train_rows])
            alone[held] = head.decision_function(pairs[held])
            inner = np.zeros(len(train_rows))  # out-of-fold pair logits for the rows the stack learns from
            for fit_rows, scored in GroupKFold(n_splits=4, shuffle=True, random_state=1).split(
                train_rows, groups=dev.group[train_rows]
            ):
                inner[scored] = LogisticRegression(C=c, max_iter=3000).fit(
                    pairs[train_rows][fit_rows], dev.target[train_rows][fit_rows]
                ).decision_function(pairs[train_rows][scored])
            model = regression(dev.c)
            model.fit(np.column_stack([dev.matrix[train_rows], inner]), dev.target[train_rows])
            stacked[held] = model.decision_function(np.column_stack([dev.matrix[held], alone[held]]))
        dev.report(alone, f"pair head alone, C={c}")
        dev.report(stacked, f"features + pair logit, C={c}")


def cross_encoder(dev: Dev, epochs: int) -> None:
    """Fine-tune MiniLM on (claim, its two best sentences) over the first fold's training sources."""
    torch.manual_seed(train.SEED)
    pairs = []
    for i, answered in enumerate(dev.answered):
        claims, sentences = dev.texts(i)
        pairs += [(claims[j], " ".join(sentences[k] for k in a.evidence[:2])) for j, a in enumerate(answered.analyses)]
    train_rows, held = dev.folds[0]
    model = TorchMiniLM(model_dir())
    model.tokenizer.enable_truncation(128)
    model.train()
    head = torch.nn.Linear(model.width, 1)
    optimiser = torch.optim.AdamW([*model.parameters(), *head.parameters()], lr=3e-5, weight_decay=0.01)
    share = dev.target[train_rows].mean()
    loss_of = torch.nn.BCEWithLogitsLoss(pos_weight=torch.tensor((1 - share) / share))

    def logits(rows: np.ndarray) -> torch.Tensor:
        encodings = model.tokenizer.encode_batch([pairs[r] for r in rows])
        ids = torch.tensor([e.ids for e in encodings])
        attention = torch.tensor([e.attention_mask for e in encodings])
        # The pooled embedding is unit length; a fixed scale gives the linear head room.
        result: torch.Tensor = head(model(ids, attention) * 10).squeeze(-1)
        return result

    started = time.perf_counter()
    for epoch in range(epochs):
        order = np.random.default_rng(epoch).permutation(train_rows)
        for start in range(0, len(order), 16):
            rows = order[start : start + 16]
            loss = loss_of(logits(rows), torch.tensor(dev.target[rows], dtype=torch.float))
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
        print(f"epoch {epoch + 1} done at {time.perf_counter() - started:.0f}s", flush=True)
    model.eval()
    with torch.inference_mode():
        scores = np.concatenate([logits(held[s : s + 64]).numpy() for s in range(0, len(held), 64)])
    fitted = regression(dev.c).fit(dev.matrix[train_rows], dev.target[train_rows])
    shipped = fitted.decision_function(dev.matrix[held])
    gold = dev.target[held]

    def ranks(values: np.ndarray) -> np.ndarray:
        return np.argsort(np.argsort(values))

    print(f"held-out fold: {len(held)} claims, {int(gold.sum())} unsupported; claim AUROC: cross-encoder "
          f"{roc_auc_score(gold, scores):.4f}, shipped features head {roc_auc_score(gold, shipped):.4f}, "
          f"mean of their ranks {roc_auc_score(gold, ranks(scores) + ranks(shipped)):.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", choices=("aggregation", "tokens", "pair", "cross-encoder"))
    parser.add_argument("dataset", choices=tuple(SETTINGS))
    parser.add_argument("--epochs", type=int, default=2, help="cross-encoder fine-tuning epochs")
    args = parser.parse_args()
    dev = measure_dev(args.dataset)
    torch.set_num_threads(2)  # after the sentence encoder, which sets one thread for its own passes
    if args.experiment == "aggregation":
        aggregation(dev)
    elif args.experiment == "tokens":
        tokens(dev)
    elif args.experiment == "pair":
        pair(dev)
    else:
        cross_encoder(dev, args.epochs)


if __name__ == "__main__":
    main()
