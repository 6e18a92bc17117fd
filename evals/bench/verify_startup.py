"""``rt4 verify examples/answers.jsonl`` end to end, embedded judge vs scripted judge, paired.

Each run is a fresh process (start-up, imports and the model load included, as a CI job pays them)
with ``--no-cache``. The two commands alternate (embedded, scripted, embedded, ...) so a drift in the
machine's load hits both alike, and the ratio is taken pair by pair; the median is reported, beside
min and max. ``--compare TREE`` adds a third command: the embedded judge of another source tree
(e.g. a checkout of the torch encoder), in the same rotation.

    python evals/bench/verify_startup.py --pairs 9 [--compare /path/to/other/tree]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from results import record

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
JUDGES = {"embedded": "embedded", "scripted": f"scripted:{EXAMPLES / 'answers.rules.json'}"}


def timed(tree: Path, judge: str) -> tuple[float, float]:
    """Wall and CPU seconds (user + system, the child's own accounting) of one fresh ``rt4 verify``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "rt4chart", "verify", str(EXAMPLES / "answers.jsonl"), "--judge", judge, "--no-cache"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(tree)}, cwd=tree, check=False,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 1:  # the example answers are partly hallucinated: exit 1 is success here
        raise SystemExit(f"rt4 verify --judge {judge} exited {result.returncode}: {result.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def spread(values: list[float], unit: str = "s") -> str:
    return f"{statistics.median(values):.2f} {unit} (min {min(values):.2f}, max {max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=9)
    parser.add_argument("--compare", type=Path, help="another source tree whose embedded judge joins the rotation")
    args = parser.parse_args()
    commands = {"embedded": (ROOT, JUDGES["embedded"]), "scripted": (ROOT, JUDGES["scripted"])}
    if args.compare:
        commands["embedded, compared tree"] = (args.compare.resolve(), JUDGES["embedded"])
    for tree, judge in commands.values():
        timed(tree, judge)  # warm-up, not counted: the page cache holds the files afterwards
    load = os.getloadavg()[0]
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    for _ in range(args.pairs):
        for name, (tree, judge) in commands.items():
            figures[name].append(timed(tree, judge))
    lines = [
        f"{args.pairs} rounds of fresh processes, each `rt4 verify examples/answers.jsonl --no-cache` "
        f"(exit 1: three of four answers are hallucinated); load average at the start {load:.2f}.",
        "",
        "| judge | wall | CPU (user + system) | wall / scripted's, pair by pair |",
        "|---|---:|---:|---:|",
    ]
    scripted = [wall for wall, _ in figures["scripted"]]
    for name, runs in figures.items():
        walls, cpus = [wall for wall, _ in runs], [cpu for _, cpu in runs]
        ratios = [wall / base for wall, base in zip(walls, scripted, strict=True)]
        lines.append(f"| {name} | {spread(walls)} | {spread(cpus)} | {spread(ratios, 'x')} |")
    record("rt4 verify of the examples: embedded vs scripted judge", lines)


if __name__ == "__main__":
    main()
