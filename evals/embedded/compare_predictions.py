"""Compare two ``--save-predictions`` files of the same ``rt4 eval``, record by record, leaving out
the judge's name (``embedded#<hash>``) and ``input_hash`` (which hashes the configuration, the judge's
name included): what differs is then what the judges decided.

    python evals/embedded/compare_predictions.py OLD.predictions.jsonl NEW.predictions.jsonl
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

JUDGE = re.compile(r"embedded#[0-9a-f]{8}")


def comparable(line: str) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(JUDGE.sub("embedded#X", line))
    record.pop("input_hash", None)
    return record


def main() -> None:
    old, new = (
        [comparable(line) for line in Path(name).read_text(encoding="utf-8").splitlines()] for name in sys.argv[1:3]
    )
    if len(old) != len(new):
        raise SystemExit(f"{len(old)} records against {len(new)}")
    differing: dict[str, int] = {}
    records = 0
    for before, after in zip(old, new, strict=True):
        fields = [key for key in before.keys() | after.keys() if before.get(key) != after.get(key)]
        records += bool(fields)
        for key in fields:
            differing[key] = differing.get(key, 0) + 1
    print(f"{len(old)} records, {records} differ (judge name and input_hash left out); fields differing: {differing}")


if __name__ == "__main__":
    main()
