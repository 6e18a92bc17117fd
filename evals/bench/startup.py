"""Start-up time of the quick commands (``rt4 --help``, ``rt4 judges``, ``rt4 cache stats``).

Each command runs as a fresh process ``--runs`` times; the median wall time is reported, beside
the same commands of another source tree (``--compare TREE``, e.g. a checkout of the commit before
the lazy imports) when given. The evidence for where the time goes is ``python -X importtime``:
the slowest imports (cumulative) of ``rt4 --help`` are listed for each tree.

    python evals/bench/startup.py --runs 9 --compare /path/to/older/checkout
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from results import record

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = (["--help"], ["judges"], ["cache", "stats", "--cache-dir", "{cache}"])


def run(tree: Path, args: list[str], extra: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return subprocess.run(
        [sys.executable, *(extra or []), "-m", "rt4chart", *args],
        capture_output=True, text=True, env=env, cwd=tree, check=False,
    )


def median_seconds(tree: Path, args: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        run(tree, args)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def slowest_imports(tree: Path, count: int = 6) -> list[tuple[str, float]]:
    """The top-level packages with the largest cumulative import time of ``rt4 --help``."""
    stderr = run(tree, ["--help"], ["-X", "importtime"]).stderr
    cumulative: dict[str, float] = {}
    for line in stderr.splitlines():
        match = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\s*)(\S+)", line)
        if match and not match.group(2):  # a module imported at the top of the chain
            cumulative[match.group(3)] = max(cumulative.get(match.group(3), 0.0), int(match.group(1)) / 1e6)
    return sorted(cumulative.items(), key=lambda item: -item[1])[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--compare", type=Path, help="Another source tree to time the same commands in.")
    args = parser.parse_args()
    trees = [("this tree", ROOT)] + ([("compared tree", args.compare.resolve())] if args.compare else [])
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as scratch:
        rows = []
        for command in COMMANDS:
            argv = [part.format(cache=Path(scratch, "cache")) for part in command]
            cells = [f"{median_seconds(tree, argv, args.runs):.3f}" for _, tree in trees]
            shown = " ".join(command).replace(" --cache-dir {cache}", "")
            rows.append(f"| `rt4 {shown}` | " + " | ".join(cells) + " |")
    lines = [
        f"Median wall seconds of {args.runs} fresh processes each; load average at the start {load:.2f} "
        "(other processes slow every figure alike). Target: under 0.5 s.",
        "",
        "| command | " + " | ".join(name for name, _ in trees) + " |",
        "|---|" + "---:|" * len(trees),
        *rows,
        "",
    ]
    for name, tree in trees:
        imports = ", ".join(f"{module} {seconds:.3f} s" for module, seconds in slowest_imports(tree))
        lines.append(f"- slowest imports of `rt4 --help` in {name} (`python -X importtime`, cumulative): {imports}")
    record("Start-up of the quick commands", lines)


if __name__ == "__main__":
    main()
