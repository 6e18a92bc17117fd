"""Compare two files of ``rt4 verify`` records: are they the same audit?

A refactoring that must not change behaviour is checked by auditing the same input with the old
and the new tree and comparing the records. Fields that name the code rather than the verdicts
can be ignored (``--ignore judge,prompt_version``: a judge's name carries a hash of its module, the
prompt version a hash of the templates and their rendering code); key order never matters.

    python evals/bench/compare_records.py old.jsonl new.jsonl --ignore judge,prompt_version
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def without(value: Any, ignored: set[str]) -> Any:
    """``value`` with the ignored keys dropped at every depth."""
    if isinstance(value, dict):
        return {key: without(item, ignored) for key, item in value.items() if key not in ignored}
    if isinstance(value, list):
        return [without(item, ignored) for item in value]
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--ignore", default="", help="Comma-separated keys to ignore at any depth.")
    parser.add_argument("--only-old-keys", action="store_true", help="Ignore keys the old records do not have.")
    args = parser.parse_args()
    ignored = {key for key in args.ignore.split(",") if key}
    old = [json.loads(line) for line in args.old.read_text(encoding="utf-8").splitlines()]
    new = [json.loads(line) for line in args.new.read_text(encoding="utf-8").splitlines()]
    if args.only_old_keys:
        new = [{key: record.get(key) for key in before} for before, record in zip(old, new, strict=False)]
    different = [
        index for index, (a, b) in enumerate(zip(old, new, strict=False)) if without(a, ignored) != without(b, ignored)
    ]
    same = min(len(old), len(new)) - len(different)
    print(f"{len(old)} old records, {len(new)} new records: {same} identical, {len(different)} different"
          + (f" (ignoring {', '.join(sorted(ignored))})" if ignored else ""))
    for index in different[:5]:
        print(f"  first difference in record {index + 1} (line {old[index].get('line')})")
    return 0 if not different and len(old) == len(new) else 1


if __name__ == "__main__":
    sys.exit(main())
