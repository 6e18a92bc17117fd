"""Compare two runs' records field by field: what a refactoring must leave unchanged.

    python evals/sanity/records_equal.py BEFORE.jsonl AFTER.jsonl [--ignore FIELD ...] [--rename OLD=NEW ...]

Reads both JSONL files, pairs records by line, and walks each pair: every leaf that differs is
counted under its field path (list indices folded to ``[]``), except the fields named with
``--ignore`` (matched against the last key of the path, anywhere in the record); ``--rename OLD=NEW``
replaces a string in BEFORE's lines first (a judge renamed on purpose, which also names usage keys).
Prints one line per
differing path with its count and one example, and exits 1 when any field differs or the files hold
different numbers of records; 0 when every record is identical apart from the ignored fields.

The folder restructure (issue 38) changed two fields on purpose: ``prompt_version`` (the prompt
version hashes the rendering module, rt4chart/method/tasks.py, whose imports moved) and the embedded
judge's name ``embedded#...`` (it hashes its module's bytes, rt4chart/judges/embedded/verifier.py);
``input_hash`` follows from both (it hashes the line with the judge and the prompt version)::

    python evals/sanity/records_equal.py BEFORE AFTER --ignore prompt_version --ignore input_hash \
        --rename embedded#de03d87a=embedded#NEW
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any


def differences(before: Any, after: Any, path: str, ignored: set[str], found: dict[str, str]) -> None:
    """Record in ``found`` each leaf path where ``before`` and ``after`` differ (first example kept)."""
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(set(before) | set(after)):
            if key in ignored:
                continue
            differences(before.get(key), after.get(key), f"{path}.{key}", ignored, found)
    elif isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for old, new in zip(before, after, strict=True):
            differences(old, new, f"{path}[]", ignored, found)
    elif before != after:
        found.setdefault(path or ".", f"{json.dumps(before)[:80]} -> {json.dumps(after)[:80]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--ignore", action="append", default=[], help="a field name to leave out (repeatable)")
    parser.add_argument("--rename", action="append", default=[], help="OLD=NEW: a string renamed on purpose")
    args = parser.parse_args()
    before_text = args.before.read_text(encoding="utf-8")
    for renaming in args.rename:
        old_name, _, new_name = renaming.partition("=")
        before_text = before_text.replace(old_name, new_name)
    old = before_text.splitlines()
    new = args.after.read_text(encoding="utf-8").splitlines()
    counts: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for line_old, line_new in zip(old, new, strict=False):
        found: dict[str, str] = {}
        differences(json.loads(line_old), json.loads(line_new), "", set(args.ignore), found)
        counts.update(found.keys())
        for key, example in found.items():
            examples.setdefault(key, example)
    print(f"$ python evals/sanity/records_equal.py {' '.join(sys.argv[1:])}")
    print(f"records: {len(old)} before, {len(new)} after; ignored fields: {', '.join(args.ignore) or 'none'}")
    for key, count in sorted(counts.items()):
        print(f"  {key}: {count} records differ, e.g. {examples[key]}")
    same = not counts and len(old) == len(new)
    print("identical" if same else "DIFFERENT")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
