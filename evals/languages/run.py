"""Per-language sentence segmentation on Mu-SHROOM (issue 32).

    python evals/languages/run.py [--split test] [--out evals/languages/results.json]

Mu-SHROOM (SemEval-2025 Task 3) holds closed-book answers in 14 languages with character spans of
hallucinated text. It has no retrieved context, so it cannot score rt4chart's verdicts (every claim
would be baseless); what it can check is the answer side of the method in each language:

- the language detector on the bare answer (Mu-SHROOM answers are short: one to five sentences);
- sentences per answer, split by the answer's language and, as before issue 32, by English Punkt;
- that every sentence's offsets hold its text (``answer[start:end] == text``);
- the span IoU a sentence-level detector can reach at best: the gold spans projected onto the
  sentences that hold them (a sentence is flagged when it overlaps a gold span), scored against
  the gold spans with Mu-SHROOM's IoU (characters, 1 when both are empty), for both splitters and
  for the whole answer as one span.

The answers are audited as the file's language (the adapter reads its ``lang``). Writes a JSON
result and ``RESULTS.md`` beside this script.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from rt4chart.analysis.datasets import load_dataset
from rt4chart.analysis.metrics import iou
from rt4chart.languages import detect_language, language_name
from rt4chart.method.text import split_sentences
from rt4chart.types import Sample, Sentence, Span

HERE = Path(__file__).resolve().parent


def sentence_projection(gold: list[Span], sentences: list[Sentence]) -> list[Span]:
    """The sentences that overlap a gold span: what a sentence-level detector flags at best."""
    return [
        Span(start=s.start, end=s.end) for s in sentences if any(g.start < s.end and s.start < g.end for g in gold)
    ]


def measure(samples: list[Sample]) -> dict[str, dict[str, float | int | str]]:
    by_language: dict[str, list[Sample]] = defaultdict(list)
    for sample in samples:
        by_language[sample.language or "?"].append(sample)
    rows: dict[str, dict[str, float | int | str]] = {}
    for language, group in sorted(by_language.items()):
        own, english, detected, exact = [], [], 0, True
        iou_own, iou_english, iou_whole = [], [], []
        for sample in group:
            gold = sample.gold.spans if sample.gold else []
            split = split_sentences(sample.answer, language=language)
            before = split_sentences(sample.answer, language="en")
            exact &= all(sample.answer[s.start : s.end] == s.text and s.text.strip() for s in split)
            own.append(len(split))
            english.append(len(before))
            detected += detect_language(sample.answer) == language
            iou_own.append(iou(gold, sentence_projection(gold, split)))
            iou_english.append(iou(gold, sentence_projection(gold, before)))
            iou_whole.append(iou(gold, [Span(start=0, end=len(sample.answer))] if gold else []))
        rows[language] = {
            "name": language_name(language),
            "answers": len(group),
            "detected": round(detected / len(group), 3),
            "sentences_mean": round(statistics.fmean(own), 2),
            "sentences_mean_english_punkt": round(statistics.fmean(english), 2),
            "multi_sentence_share": round(sum(n > 1 for n in own) / len(group), 3),
            "multi_sentence_share_english_punkt": round(sum(n > 1 for n in english) / len(group), 3),
            "offsets_exact": exact,
            "iou_sentences": round(statistics.fmean(iou_own), 3),
            "iou_sentences_english_punkt": round(statistics.fmean(iou_english), 3),
            "iou_whole_answer": round(statistics.fmean(iou_whole), 3),
        }
    return rows


TABLE_HEAD = (
    "| language | answers | detected from the answer | sentences / answer (English Punkt) "
    "| answers of 2+ sentences (English Punkt) | offsets exact | IoU: sentence-level oracle "
    "(English Punkt) | IoU: whole answer |\n|---|---|---|---|---|---|---|---|\n"
)


def markdown(rows: dict[str, dict[str, float | int | str]], split: str, command: str) -> str:
    lines = [
        f"# Per-language segmentation on Mu-SHROOM ({split})\n\n",
        "Written by `" + command + "` (figures measured, not typed). Mu-SHROOM has no retrieved context: "
        "these are checks of the answer side (detection, sentences, span offsets), not of verdicts. "
        "IoU is Mu-SHROOM's character IoU of the gold spans against the sentences that overlap them, "
        "the best a sentence-level detector can score; a finer split raises it unless it leaves gold characters "
        "outside every sentence (the spaces between sentences, a list marker).\n\n",
        TABLE_HEAD,
    ]
    for language, row in rows.items():
        lines.append(
            f"| {row['name']} ({language}) | {row['answers']} | {row['detected']:.1%} "
            f"| {row['sentences_mean']} ({row['sentences_mean_english_punkt']}) "
            f"| {row['multi_sentence_share']:.1%} ({row['multi_sentence_share_english_punkt']:.1%}) "
            f"| {'yes' if row['offsets_exact'] else 'NO'} "
            f"| {row['iou_sentences']:.3f} ({row['iou_sentences_english_punkt']:.3f}) "
            f"| {row['iou_whole_answer']:.3f} |\n"
        )
    lines.append(
        "\nThe signals path (CSR token offsets over Han, Devanagari, Arabic and Latin answers): "
        "[SIGNALS.md](SIGNALS.md).\n"
    )
    return "".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", default="test", choices=["dev", "test"])
    parser.add_argument("--out", type=Path, default=HERE / "results.json")
    args = parser.parse_args()
    rows = measure(load_dataset("mu-shroom", split=args.split))
    args.out.write_text(json.dumps({"split": args.split, "languages": rows}, indent=2) + "\n", encoding="utf-8")
    command = f"python evals/languages/run.py --split {args.split}"
    (HERE / "RESULTS.md").write_text(markdown(rows, args.split, command), encoding="utf-8")
    print(markdown(rows, args.split, command))


if __name__ == "__main__":
    main()
