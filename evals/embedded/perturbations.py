"""A perturbation suite for the embedded judge: the families of errors a guard should catch, made
from RAGTruth QA dev contexts (dev only), audited through the real CLI, reported per family.

    RT4_DATA_DIR=../shared/data python evals/embedded/perturbations.py --per-family 200 \
        --out evals/embedded/results/perturbations.json          # then RESULTS_perturbations.md beside it

Each case is one answer of one sentence against the whole context of its source (the question
kept), so the method runs as for a user: rules decomposition, windows, the global stage, joins.
Families (every rewrite of a context sentence whose label is known by construction):

- ``copy``: the sentence itself (faithful: its flag rate is the suite's false-alarm rate);
- ``entity``: a name replaced by another name of the same context (a name: a capitalised word
  inside a sentence that the context never writes in lower case);
- ``unit``: a unit after a number replaced by another of the same dimension (km -> miles);
- ``date``: a month or weekday name replaced by another, or a year moved by 1-3 years;
- ``direction``: a verb or comparative of direction reversed (rose -> fell, before -> after);
- ``hedge``: a hedge turned into certainty (may -> will, some -> all, often -> always);
- ``clause``: the faithful sentence with an unsupported clause appended (a sentence of another
  source joined by ", and").

The training rewrites of ``evals/embedded/synthetic.py`` (seed 0) overlap three families in kind
(``entity``, ``direction`` through its antonyms, ``hedge`` through its dropped qualifiers); this suite
draws with its own seed and its own tables, and says so beside the figures. A case counts as caught
when the answer's label is not ``entailed``; for ``copy`` that is a false alarm.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from rt4chart.analysis.datasets import load_dataset, source_key
from rt4chart.method.text import segment_context
from rt4chart.types import Sample

SEED = 1
"""The suite's seed (the training rewrites use 0)."""
FAMILIES = ("copy", "entity", "unit", "date", "direction", "hedge", "clause")
MIN_WORDS, MAX_WORDS = 6, 40
_PASSAGE_LABEL = re.compile(r"^passage \d+:\s*", re.IGNORECASE)
_NAME = re.compile(r"(?<=\s)[A-Z][a-z]{2,}\b")

_UNIT_GROUPS = (
    ("kilometers", "miles", "meters", "feet"), ("km", "mi"), ("kilograms", "pounds", "grams", "ounces"),
    ("kg", "lb"), ("hours", "minutes", "days", "weeks"), ("months", "years", "weeks"),
    ("million", "billion", "thousand"), ("percent", "times"), ("dollars", "euros", "pounds"),
    ("degrees", "percent"), ("liters", "gallons"), ("acres", "hectares"), ("inches", "centimeters"),
)
_UNIT_AFTER_NUMBER = re.compile(r"(?<=\d)(\s+)(" + "|".join(
    sorted({unit for group in _UNIT_GROUPS for unit in group}, key=len, reverse=True)) + r")\b")
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December"]
_WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
_NON_NAMES = frozenset([*_MONTHS, *_WEEKDAYS, "The", "This", "That", "These", "Those", "However"])
_DATE_WORD = re.compile(r"\b(" + "|".join(_MONTHS + _WEEKDAYS) + r"|1[89]\d\d|20[0-2]\d)\b")
_DIRECTION_PAIRS = (
    ("increased", "decreased"), ("increases", "decreases"), ("increase", "decrease"), ("rose", "fell"),
    ("rises", "falls"), ("rising", "falling"), ("grew", "shrank"), ("higher", "lower"), ("more", "less"),
    ("before", "after"), ("above", "below"), ("gained", "lost"), ("larger", "smaller"), ("earlier", "later"),
    ("north", "south"), ("east", "west"), ("import", "export"), ("imports", "exports"), ("won", "lost"),
)
_DIRECTION = {one: other for pair in _DIRECTION_PAIRS for one, other in (pair, pair[::-1])}
_DIRECTION_WORD = re.compile(r"\b(" + "|".join(sorted(_DIRECTION, key=len, reverse=True)) + r")\b")
_CERTAINTY = {
    "may": "will", "might": "will", "could": "will", "possibly": "certainly", "probably": "certainly",
    "likely": "certain", "some": "all", "often": "always", "sometimes": "always", "usually": "always",
    "suggests": "proves", "suggest": "prove", "many": "all", "most": "all",
}
_HEDGE_WORD = re.compile(r"\b(" + "|".join(sorted(_CERTAINTY, key=len, reverse=True)) + r")\b")


def _replace(sentence: str, match: re.Match[str], new: str) -> str:
    return sentence[: match.start()] + new + sentence[match.end() :]


def _unit(sentence: str, rng: random.Random) -> str | None:
    matches = list(_UNIT_AFTER_NUMBER.finditer(sentence))
    if not matches:
        return None
    match = rng.choice(matches)
    unit = match.group(2)
    group = next(group for group in _UNIT_GROUPS if unit in group)
    return sentence[: match.start(2)] + rng.choice([u for u in group if u != unit]) + sentence[match.end(2) :]


def _date(sentence: str, rng: random.Random) -> str | None:
    matches = list(_DATE_WORD.finditer(sentence))
    if not matches:
        return None
    match = rng.choice(matches)
    if match.group().isdigit():
        return _replace(sentence, match, str(int(match.group()) + rng.choice([-3, -2, -1, 1, 2, 3])))
    names = _MONTHS if match.group() in _MONTHS else _WEEKDAYS
    return _replace(sentence, match, rng.choice([name for name in names if name != match.group()]))


def _direction(sentence: str, rng: random.Random) -> str | None:
    matches = list(_DIRECTION_WORD.finditer(sentence))
    return _replace(sentence, match, _DIRECTION[match.group()]) if (match := rng.choice(matches or [None])) else None


def _hedge(sentence: str, rng: random.Random) -> str | None:
    matches = list(_HEDGE_WORD.finditer(sentence))
    return _replace(sentence, match, _CERTAINTY[match.group()]) if (match := rng.choice(matches or [None])) else None


def cases(samples: list[Sample], per_family: int, seed: int = SEED) -> list[dict[str, object]]:
    """Up to ``per_family`` answers per family, one per context sentence, sources in sorted order."""
    by_source: dict[str, Sample] = {}
    for sample in samples:
        by_source.setdefault(source_key(sample), sample)
    sentences: dict[str, list[str]] = {}
    for key, sample in by_source.items():
        _, segmented = segment_context(sample.context)
        texts = [_PASSAGE_LABEL.sub("", s.text).strip() for s in segmented]
        sentences[key] = [t for t in texts if MIN_WORDS <= len(t.split()) <= MAX_WORDS and t.endswith(".")]
    keys = sorted(k for k in sentences if sentences[k])
    rng = random.Random(seed)
    pool = [(key, text) for key in keys for text in sentences[key]]
    rng.shuffle(pool)

    def entity(key: str) -> Callable[[str, random.Random], str | None]:
        lower = set(re.findall(r"\b[a-z]+\b", by_source[key].context))
        names = sorted({m.group() for t in sentences[key] for m in _NAME.finditer(t)
                        if m.group() not in _NON_NAMES and m.group().lower() not in lower})

        def swap(sentence: str, generator: random.Random) -> str | None:
            present = [m for m in _NAME.finditer(sentence) if m.group() in names]
            others = [name for name in names if name not in sentence]
            if not present or not others:
                return None
            return _replace(sentence, generator.choice(present), generator.choice(others))

        return swap

    def clause(key: str) -> Callable[[str, random.Random], str | None]:
        def append(sentence: str, generator: random.Random) -> str | None:
            other = generator.choice([k for k in keys if k != key])
            extra = generator.choice(sentences[other]).rstrip(".")
            return f"{sentence.rstrip('.')}, and {extra[:1].lower()}{extra[1:]}."

        return append

    makers: dict[str, Callable[[str], Callable[[str, random.Random], str | None]]] = {
        "copy": lambda _key: lambda text, _rng: text, "entity": entity, "unit": lambda _key: _unit,
        "date": lambda _key: _date, "direction": lambda _key: _direction, "hedge": lambda _key: _hedge,
        "clause": clause,
    }
    made: list[dict[str, object]] = []
    for family in FAMILIES:
        family_rng = random.Random(f"{seed}:{family}")
        count = 0
        for key, text in pool:
            if count == per_family:
                break
            answer = makers[family](key)(text, family_rng)
            if answer is None or (family != "copy" and answer == text):
                continue
            sample = by_source[key]
            made.append({"id": f"{family}-{count}", "family": family, "original": text, "answer": answer,
                         "context": sample.context, "question": sample.question})
            count += 1
    return made


def audit(made: list[dict[str, object]], judge: str) -> dict[str, dict[str, object]]:
    """Each case's record from ``rt4 verify`` (the real CLI, no cache; English, as RAGTruth QA is: the
    language detector calls a few one-sentence answers something else), by id."""
    with tempfile.TemporaryDirectory() as directory:
        answers, out = Path(directory) / "answers.jsonl", Path(directory) / "audit.jsonl"
        answers.write_text("".join(json.dumps({key: case[key] for key in ("id", "context", "question", "answer")})
                                   + "\n" for case in made), encoding="utf-8")
        command = [sys.executable, "-m", "rt4chart", "verify", str(answers), "--judge", judge, "--no-cache",
                   "--language", "en", "--out", str(out)]
        finished = subprocess.run(command, capture_output=True, text=True, env=os.environ.copy(), check=False)
        if finished.returncode not in (0, 1):
            raise SystemExit(f"rt4 verify exited {finished.returncode}: {finished.stderr[-2000:]}")
        records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    return {record["id"]: record for record in records}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-family", type=int, default=200)
    parser.add_argument("--judge", default="embedded")
    parser.add_argument("--out", type=Path, required=True, help="JSON results; a Markdown table is written beside it")
    args = parser.parse_args()
    made = cases(load_dataset("ragtruth-qa", split="dev"), args.per_family)
    records = audit(made, args.judge)
    judge_name = next(iter(records.values()))["judge"]
    rows = []
    for family in FAMILIES:
        labels = Counter(str(records[str(case["id"])]["label"]) for case in made if case["family"] == family)
        total = sum(labels.values())
        caught = total - labels.get("entailed", 0)
        rows.append({"family": family, "cases": total, "not_entailed": caught, "rate": caught / total if total else 0.0,
                     "contradicted": labels.get("contradicted", 0), "baseless": labels.get("baseless", 0)})
    command = (f"python evals/embedded/perturbations.py --per-family {args.per_family} --judge {args.judge} "
               f"--out {args.out}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"judge": judge_name, "seed": SEED, "command": command, "rows": rows,
                                    "cases": [{**{k: v for k, v in case.items() if k != "context"},
                                               "label": records[str(case["id"])]["label"]} for case in made]},
                                   indent=1) + "\n", encoding="utf-8")
    lines = [f"Judge `{judge_name}`, RAGTruth QA dev contexts, seed {SEED}: `{command}`", "",
             "| family | cases | flagged (not entailed) | rate | contradicted | baseless |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['family']} | {r['cases']} | {r['not_entailed']} | {r['rate']:.3f} | {r['contradicted']} | "
              f"{r['baseless']} |" for r in rows]
    lines.append("")
    lines.append("`copy` rows are faithful sentences: their rate is the false-alarm rate.")
    markdown = args.out.with_suffix(".md")
    markdown.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    print(f"wrote {args.out}, {markdown}")


if __name__ == "__main__":
    main()
