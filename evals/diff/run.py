"""Two real audits of one dataset split and their `rt4 diff`: the README's measured example.

    python evals/diff/run.py                      # RAGTruth QA test, embedded judge, default vs --ungrounded keep
    python evals/diff/run.py --new-args "--ungrounded keep" --new-args "--window 8 --overlap 2"

One baseline audit, then one audit and one diff per --new-args.

Both audits go through the real CLI with --no-cache (each verdict is the judge's, not a cached
one), into --work (records and diffs hold the dataset's text: they stay out of the repository).
What is written into the repository is evals/results/diff/<name>.json: the diff's counts, both
tests (p-value, CI, discordant pairs) and the two configurations, without any text of the data.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results" / "diff"


def rt4(*args: str) -> None:
    command = [sys.executable, "-m", "rt4chart", *args]
    print("$ rt4 " + shlex.join(args), file=sys.stderr)
    subprocess.run(command, check=True)


def audit(input_file: Path, out: Path, extra: list[str]) -> float:
    started = time.perf_counter()
    rt4("verify", str(input_file), "--out", str(out), "--no-cache", "-q", "--fail-on", "never", *extra)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="ragtruth-qa")
    parser.add_argument("--split", default="test")
    parser.add_argument("--path", help="dataset folder (default: rt4 convert's lookup)")
    parser.add_argument("--judge", help="--judge of both audits (default: the embedded verifier)")
    parser.add_argument("--base-args", default="", help="extra rt4 verify flags of the baseline audit")
    parser.add_argument("--new-args", action="append", help="extra rt4 verify flags of a new audit (repeatable; "
                        "default: --ungrounded keep)")
    parser.add_argument("--work", type=Path, help="where records and diffs go (default: a temporary folder)")
    options = parser.parse_args()

    work = options.work or Path(tempfile.mkdtemp(prefix="rt4-diff-"))
    work.mkdir(parents=True, exist_ok=True)
    input_file = work / f"{options.dataset}-{options.split}.jsonl"
    convert = ["convert", options.dataset, "--split", options.split, "--out", str(input_file)]
    rt4(*convert, *(["--path", options.path] if options.path else []))
    judge = ["--judge", options.judge] if options.judge else []
    base_args = shlex.split(options.base_args)
    base = work / "base.jsonl"
    base_seconds = audit(input_file, base, judge + base_args)
    for variant, flags in enumerate(options.new_args or ["--ungrounded keep"]):
        new_args = shlex.split(flags)
        new = work / f"new-{variant}.jsonl"
        seconds = {"base": base_seconds, "new": audit(input_file, new, judge + new_args)}
        compare(options, work / f"diff-{variant}", base, new, base_args, new_args, seconds)


def compare(options: argparse.Namespace, prefix: Path, base: Path, new: Path, base_args: list[str],
            new_args: list[str], seconds: dict[str, float]) -> None:
    diff_json = prefix.with_suffix(".json")
    with open(diff_json, "w", encoding="utf-8") as handle:
        subprocess.run([sys.executable, "-m", "rt4chart", "diff", str(base), str(new), "--json",
                        "--markdown", str(prefix.with_suffix(".md")), "--html", str(prefix.with_suffix(".html"))],
                       check=True, stdout=handle)
    diff = json.loads(diff_json.read_text(encoding="utf-8"))
    summary = {
        "dataset": options.dataset,
        "split": options.split,
        "base_args": base_args,
        "new_args": new_args,
        "judges": {"base": diff["config"]["base"]["judges"], "new": diff["config"]["new"]["judges"]},
        "kind": diff["config"]["kind"],
        "options_changed": diff["config"]["options_changed"],
        "counts": diff["counts"],
        "claim_counts": diff["claim_counts"],
        "answer_test": diff["answer_test"],
        "claim_test": diff["claim_test"],
        "audit_seconds": {key: round(value, 1) for key, value in seconds.items()},
        "command": "python evals/diff/run.py " + shlex.join(sys.argv[1:]),
    }
    name = "-".join(["embedded" if not options.judge else options.judge.replace(":", "_"),
                                     options.dataset, options.split, *(arg.lstrip("-") for arg in new_args)])
    RESULTS.mkdir(parents=True, exist_ok=True)
    result_file = RESULTS / f"{name}.json"
    result_file.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {result_file}; records, Markdown and HTML diff in {prefix.parent}", file=sys.stderr)
    print(json.dumps({key: summary[key] for key in ("kind", "counts", "answer_test", "claim_test")}, indent=2))


if __name__ == "__main__":
    main()
