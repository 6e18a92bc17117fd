"""Compare a rebuilt embedded model file with another (the shipped one) field by field.

    python evals/embedded/compare_model.py /tmp/model.json rt4chart/judges/embedded/model.json

Prints whether the files are byte-identical, then the leaves (numbers, strings, ...) of both JSON
documents: how many there are, how many differ, and of the differing numbers the largest absolute
and relative difference, per top-level path (``heads.question.coef``); exits 1 when any leaf differs.
What the README's "rebuild" paragraph states comes from this script.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def leaves(value: Any, path: str = "") -> dict[str, Any]:
    """Every leaf of a JSON document under its path (``heads.question.mean[3]``)."""
    if isinstance(value, dict):
        return {p: v for key, item in value.items() for p, v in leaves(item, f"{path}.{key}" if path else key).items()}
    if isinstance(value, list):
        return {p: v for index, item in enumerate(value) for p, v in leaves(item, f"{path}[{index}]").items()}
    return {path: value}


def field_of(path: str) -> str:
    """The path without list indices: what differences are grouped by."""
    return path.split("[", 1)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rebuilt", type=Path)
    parser.add_argument("shipped", type=Path)
    args = parser.parse_args()
    print(f"byte-identical: {args.rebuilt.read_bytes() == args.shipped.read_bytes()}")
    rebuilt, shipped = leaves(json.loads(args.rebuilt.read_text())), leaves(json.loads(args.shipped.read_text()))
    only = sorted(set(rebuilt) ^ set(shipped))
    differing = [p for p in sorted(set(rebuilt) & set(shipped)) if rebuilt[p] != shipped[p]]
    print(f"leaves: {len(shipped)} shipped, {len(rebuilt)} rebuilt; {len(only)} in one file only; "
          f"{len(differing)} differ")
    by_field: dict[str, list[str]] = defaultdict(list)
    for path in differing:
        by_field[field_of(path)].append(path)
    for field, paths in sorted(by_field.items()):
        numbers = [(float(rebuilt[p]), float(shipped[p])) for p in paths
                   if isinstance(rebuilt[p], int | float) and isinstance(shipped[p], int | float)]
        absolute = max((abs(a - b) for a, b in numbers), default=0.0)
        relative = max((abs(a - b) / max(abs(b), 1e-300) for a, b in numbers), default=0.0)
        example = paths[0]
        print(f"  {field}: {len(paths)} differ (max |diff| {absolute:.3g}, max relative {relative:.3g}); "
              f"e.g. {example}: {rebuilt[example]!r} vs {shipped[example]!r}")
    for path in only[:10]:
        print(f"  only in one file: {path}")
    sys.exit(1 if differing or only else 0)


if __name__ == "__main__":
    main()
