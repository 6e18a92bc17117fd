"""Build a reproducible long-context variant of a dev split (issue 11, item 9).

    python evals/long_context/build.py --dataset ragtruth-qa --split dev --samples 100 --seed 42 \
        --sizes 50 100 200 --out /tmp/long_context

For every sample of a seeded subset of the split, and every target size T, the context becomes the
sample's own passages, kept intact and contiguous, surrounded by passages of *other* samples
(distractors, drawn with the seed from samples that have a different question and share no
passage) until it holds at least T sentences (rt4chart's own sentence splitter counts them). The
original block goes at a seeded position among the distractors, recorded with its character range
in the joined context, so a verdict's evidence can be told apart from text that was added.

The answer and its gold are copied unchanged (gold offsets point into the answer, not the
context). Output: one rt4chart input JSONL per size (``size-<T>.jsonl``, readable by
``rt4 eval generic --path``) plus ``size-0.jsonl`` with the original contexts, each record carrying
a ``long_context`` object: target, sentences, the original's passage index and character range,
and the ids of the samples the distractors came from. The data is never written into the
repository (the benchmarks' licences), only the commands and the measured results.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path

from rt4chart.analysis.datasets import load_dataset
from rt4chart.method.text import join_passages, segment_context
from rt4chart.types import Sample

PASSAGE_SEPARATOR = "\n\n"
"""How rt4chart joins a list of passages (``rt4chart.method.text.join_passages``)."""


@dataclass(frozen=True)
class Passage:
    """One passage of some sample's context, with its sentence count."""

    sample_id: str
    question: str | None
    text: str
    sentences: int


def passages_of(sample: Sample) -> list[str]:
    """A sample's context as passages: the list it came as, or its blank-line-separated blocks."""
    if isinstance(sample.context, list):
        return [p for p in sample.context if p.strip()]
    return [p for p in sample.context.split(PASSAGE_SEPARATOR) if p.strip()]


def sentence_count(passages: list[str]) -> int:
    return len(segment_context(passages)[1]) if passages else 0


def pad(sample: Sample, pool: list[Passage], target: int, rng: random.Random) -> dict[str, object]:
    """The sample as an input record whose context is padded with distractors to ``target`` sentences."""
    own = passages_of(sample)
    own_texts = set(own)
    candidates = [p for p in pool if p.question != sample.question and p.sample_id != sample.id
                  and p.text not in own_texts]
    rng.shuffle(candidates)
    distractors: list[Passage] = []
    total = sentence_count(own)
    used: set[str] = set()
    for candidate in candidates:
        if total >= target:
            break
        if candidate.text in used:
            continue
        used.add(candidate.text)
        distractors.append(candidate)
        total += candidate.sentences
    position = rng.randint(0, len(distractors))
    passages = [d.text for d in distractors[:position]] + own + [d.text for d in distractors[position:]]
    joined, _ = join_passages(passages)
    prefix, _ = join_passages([d.text for d in distractors[:position]]) if position else ("", [])
    original_start = len(prefix) + (len(PASSAGE_SEPARATOR) if position else 0)
    original_end = original_start + len(join_passages(own)[0])
    assert joined[original_start:original_end] == join_passages(own)[0]
    record = sample.model_dump(exclude_none=True)
    record["context"] = passages
    record["long_context"] = {
        "target": target,
        "sentences": len(segment_context(passages)[1]),
        "original_passage_index": position,
        "original_passages": len(own),
        "original_start": original_start,
        "original_end": original_end,
        "distractor_sources": [d.sample_id for d in distractors],
    }
    return record


def build(
    dataset: str, split: str, samples: int | None, seed: int, sizes: list[int], out: Path, path: Path | None = None
) -> list[Path]:
    """Write ``size-0.jsonl`` (originals) and one ``size-<T>.jsonl`` per target size."""
    every = load_dataset(dataset, path, split)
    chosen = sorted(random.Random(seed).sample(range(len(every)), samples)) if samples else range(len(every))
    subset = [every[i] for i in chosen]
    pool = [
        Passage(s.id, s.question, text, sentence_count([text]))
        for s in every for text in passages_of(s)
    ]
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for target in [0, *sizes]:
        # One generator per size, seeded by (seed, size): each file is reproducible on its own.
        rng = random.Random(f"{seed}:{target}")
        path = out / f"size-{target}.jsonl"
        with open(path, "w", encoding="utf-8") as handle:
            for sample in subset:
                handle.write(json.dumps(pad(sample, pool, target, rng), ensure_ascii=False) + "\n")
        written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="ragtruth-qa")
    parser.add_argument("--split", default="dev")
    parser.add_argument("--samples", type=int, default=None, help="seeded subset size (default: all)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--sizes", type=int, nargs="+", default=[50, 100, 200])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--path", type=Path, default=None, help="dataset location (default: the shared data)")
    arguments = parser.parse_args()
    if arguments.split == "test":
        parser.error("long-context variants are built from dev splits only")
    for written in build(arguments.dataset, arguments.split, arguments.samples, arguments.seed, arguments.sizes,
                         arguments.out, arguments.path):
        print(written)


if __name__ == "__main__":
    main()
