"""FaithBench's stored detector predictions as rt4chart output records, for ``rt4 agree``.

FaithBench keeps, in each sample's ``metadata``, what other detectors said about the summary:
HHEM v1 / 2.1 / 2.1-english (consistency probabilities), TrueTeacher and TRUE-NLI (0/1), and
GPT-3.5-Turbo, GPT-4-Turbo and GPT-4o as judges (0/1). As in the FaithBench paper and in
``/work/shared/data/README.md``, a detector flags a summary (hallucinated) when its score is
below 0.5. One JSONL per detector is written, one record per sample of the split, in the order
and with the ids and line numbers of ``rt4 convert faithbench`` / ``rt4 eval faithbench`` (so the
files align with rt4chart's own outputs), each carrying the sample's gold.

A detector says only consistent or not, so its records carry ``hallucinated`` and a placeholder
label (``baseless`` when flagged); compare them on the hallucinated scale (``rt4 agree``'s default),
not with ``--labels label``. A sample without a score (TRUE-NLI has some) gets an error record
with no label, which ``rt4 agree`` counts as missing.

    python evals/agreement/faithbench_detectors.py --split test --out-dir /tmp/faithbench-agree
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from rt4chart.analysis.datasets import dataset_files, faithbench_split, load_dataset
from rt4chart.records.io import write_reports_atomically
from rt4chart.types import AuditRecord, Label

DETECTORS = {
    "hhemv1": "HHEM-1.0",
    "hhem-2.1": "HHEM-2.1",
    "hhem-2.1-english": "HHEM-2.1-English",
    "trueteacher": "TrueTeacher",
    "true_nli": "TRUE-NLI",
    "gpt-3.5-turbo": "GPT-3.5-Turbo",
    "gpt-4-turbo": "GPT-4-Turbo",
    "gpt_4o": "GPT-4o",
}
"""metadata key -> the detector's name in the records (``faithbench:<name>``)."""

FLAG_BELOW = 0.5
"""A score below this is a "hallucinated" verdict (the benchmark's own convention)."""


def detector_scores(path: Path | None, split: str | None) -> dict[str, dict[str, float | None]]:
    """Sample id (``faithbench-<batch>-<sample_id>``) -> metadata key -> score."""
    scores: dict[str, dict[str, float | None]] = {}
    for file in dataset_files("faithbench", path):
        match = re.search(r"batch_(\d+)\.json$", file.name)
        if match is None:
            continue
        batch = int(match.group(1))
        for record in json.loads(file.read_text(encoding="utf-8"))["samples"]:
            if split is not None and faithbench_split(batch, record["sample_id"]) != split:
                continue
            metadata = record.get("metadata") or {}
            scores[f"faithbench-{batch}-{record['sample_id']}"] = {key: metadata.get(key) for key in DETECTORS}
    return scores


def detector_records(
    key: str, scores: dict[str, dict[str, float | None]], path: Path | None, split: str | None
) -> list[AuditRecord]:
    """One record per sample of the split, as the detector ``key`` judged it."""
    judge = f"faithbench:{DETECTORS[key]}"
    records = []
    for line, sample in enumerate(load_dataset("faithbench", path, split), start=1):
        score = scores[sample.id][key]
        if score is None:
            records.append(AuditRecord(id=sample.id, line=line, judge=judge, gold=sample.gold,
                                  errors=[f"{DETECTORS[key]} has no score for this sample"]))
            continue
        flagged = float(score) < FLAG_BELOW
        records.append(
            AuditRecord(
                id=sample.id,
                line=line,
                label=Label.BASELESS if flagged else Label.ENTAILED,
                hallucinated=flagged,
                judge=judge,
                gold=sample.gold,
            )
        )
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", type=Path, default=None, help="FaithBench folder (default: as rt4 eval finds it)")
    parser.add_argument("--split", default="test", help="dev, test or all (default: test)")
    parser.add_argument("--out-dir", type=Path, required=True, help="where the detector JSONL files go")
    arguments = parser.parse_args()
    arguments.out_dir.mkdir(parents=True, exist_ok=True)
    split = None if arguments.split == "all" else arguments.split
    scores = detector_scores(arguments.path, split)
    for key, name in DETECTORS.items():
        out = arguments.out_dir / f"{name}.jsonl"
        records = detector_records(key, scores, arguments.path, split)
        write_reports_atomically(out, records)
        missing = sum(r.label is None for r in records)
        print(f"wrote {out}: {len(records)} records, {missing} without a score")


if __name__ == "__main__":
    main()
