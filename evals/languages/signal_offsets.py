"""The signals path on Mu-SHROOM answers in other scripts: do token offsets land on the answer?

    python evals/languages/signal_offsets.py --make-input mush.jsonl --per-language 2
    rt4 signals csr mush.jsonl --model "$GGUF" --out csr.jsonl     # GGUF: rt4chart.judges.serve.smollm2_gguf()
    python evals/languages/signal_offsets.py --input mush.jsonl --signals csr.jsonl

The first step writes the first ``--per-language`` answers per language of Mu-SHROOM's dev split
(context empty: the data is closed-book, so the CSR values themselves mean nothing here); the last
checks, per language, that every token's ``[start, end)`` lies inside its answer, that the tokens
cover every non-space character of the answer, and that the flagged spans lie inside it (a
byte-level tokenizer splits one Han or Devanagari character into several tokens; each must map
back to that character). Writes its table to ``SIGNALS.md``.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from rt4chart.analysis.datasets import load_dataset

HERE = Path(__file__).resolve().parent
LANGUAGES = ("zh", "hi", "ar", "de", "fi")


def make_input(path: Path, per_language: int) -> None:
    samples = load_dataset("mu-shroom", split="dev")
    lines = []
    for language in LANGUAGES:
        for sample in [s for s in samples if s.language == language][:per_language]:
            line = {"id": sample.id, "context": "", "question": sample.question, "answer": sample.answer}
            lines.append(json.dumps({**line, "language": language}, ensure_ascii=False) + "\n")
    path.write_text("".join(lines), encoding="utf-8")


def check(inputs: Path, signals: Path) -> str:
    answers = {}
    for line in inputs.read_text(encoding="utf-8").splitlines():
        sample = json.loads(line)
        answers[sample["id"]] = (sample["language"], sample["answer"])
    rows: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for line in signals.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        language, answer = answers[record["id"]]
        report = record["signals"]
        tokens, spans = report["tokens"], report["spans"]
        tokens_inside = all(0 <= t["start"] < t["end"] <= len(answer) for t in tokens)
        covered = {i for t in tokens for i in range(t["start"], t["end"])}
        uncovered = sum(1 for i, char in enumerate(answer) if not char.isspace() and i not in covered)
        row = rows[language]
        row[0] += 1
        row[1] += len(tokens)
        row[2] += tokens_inside
        row[3] += uncovered
        row[4] += all(0 <= s["start"] < s["end"] <= len(answer) for s in spans)
    table = [
        "# The signals path (CSR token offsets) on other scripts\n\n",
        "Written by the commands in `evals/languages/signal_offsets.py` (SmolLM2-135M, Mu-SHROOM dev, no context).\n\n",
        "| language | answers | tokens | answers with every token inside | non-space characters no token covers "
        "| answers with spans inside |\n|---|---|---|---|---|---|\n",
    ]
    for language, (n, n_tokens, inside, uncovered, spans_inside) in sorted(rows.items()):
        table.append(f"| {language} | {n} | {n_tokens} | {inside}/{n} | {uncovered} | {spans_inside}/{n} |\n")
    return "".join(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--make-input", type=Path)
    parser.add_argument("--per-language", type=int, default=2)
    parser.add_argument("--input", type=Path)
    parser.add_argument("--signals", type=Path)
    args = parser.parse_args()
    if args.make_input:
        make_input(args.make_input, args.per_language)
        return
    if not (args.input and args.signals):
        parser.error("give --make-input, or --input and --signals")
    table = check(args.input, args.signals)
    (HERE / "SIGNALS.md").write_text(table, encoding="utf-8")
    print(table)


if __name__ == "__main__":
    main()
