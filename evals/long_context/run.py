"""How verdicts, evidence and calls change as a context grows with irrelevant text (issue 11, item 9).

    python evals/long_context/build.py --samples 100 --seed 42 --out /tmp/long_context
    python evals/long_context/run.py /tmp/long_context --judge embedded

Runs the pipeline and the ``direct`` baseline over every ``size-<T>.jsonl`` that ``build.py``
wrote (``size-0`` holds the original contexts) and reports per size and method: answer-level
figures against gold, how many answer verdicts (and claim labels) differ from the same sample's
verdict on its original context, where the evidence comes from (inside the original passages or
from the distractors), and judge calls / chunks per sample. The padding is irrelevant by
construction, so every changed verdict is a verdict the added text changed.

Writes ``evals/results/long_context/summary.{md,json}`` (with this command line) and the full
``rt4 eval``-style result of every run beside them.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from rt4chart.judges.registry import resolve_judge
from rt4chart.report.progress import format_estimate
from rt4chart.runs.evaluation import EvalConfig, evaluate, write_result
from rt4chart.types import AuditRecord

RESULTS = Path(__file__).resolve().parents[1] / "results" / "long_context"
METHODS = ("rt4chart", "direct")


def _size(path: Path) -> int:
    return int(path.stem.removeprefix("size-"))


def _layouts(path: Path) -> dict[str, dict[str, Any]]:
    """The ``long_context`` record of every sample of a size file, by sample id."""
    with open(path, encoding="utf-8") as handle:
        return {str(r["id"]): r["long_context"] for r in map(json.loads, handle)}


def _claim_labels(report: AuditRecord) -> dict[tuple[int, str], str | None]:
    return {(c.index, c.text): c.label.value if c.label else None for c in report.claims}


def compare(
    reports: list[AuditRecord], baseline: dict[str, AuditRecord], layouts: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """Verdict changes against the original contexts, evidence provenance, calls and chunks."""
    valid = [r for r in reports if r.label is not None]
    changed = sum(1 for r in valid if r.id in baseline and baseline[r.id].label != r.label)
    flagged_now = sum(1 for r in valid if r.id in baseline and r.hallucinated and not baseline[r.id].hallucinated)
    cleared_now = sum(1 for r in valid if r.id in baseline and not r.hallucinated and baseline[r.id].hallucinated)
    claims = claim_changes = 0
    inside = outside = 0
    for report in valid:
        before = _claim_labels(baseline[report.id]) if report.id in baseline else {}
        layout = layouts[str(report.id)]
        for key, label in _claim_labels(report).items():
            if key in before:
                claims += 1
                claim_changes += before[key] != label
        for claim in report.claims:
            for evidence in claim.evidence:
                within = layout["original_start"] <= evidence.start and evidence.end <= layout["original_end"]
                inside += within
                outside += not within
    count = max(len(reports), 1)
    return {
        "samples": len(reports),
        "valid": len(valid),
        "mean_context_sentences": sum(r.context_sentences for r in reports) / count,
        "mean_chunks": sum(r.chunks for r in reports) / count,
        "calls_per_sample": sum(r.usage.calls for r in reports) / count,
        "answer_verdicts_changed": changed,
        "newly_flagged": flagged_now,
        "newly_cleared": cleared_now,
        "claims_compared": claims,
        "claim_labels_changed": claim_changes,
        "evidence_in_original": inside,
        "evidence_in_distractors": outside,
    }


def run(folder: Path, judge: str | None, resamples: int) -> dict[str, Any]:
    files = sorted(folder.glob("size-*.jsonl"), key=_size)
    if not files or _size(files[0]) != 0:
        raise SystemExit(f"{folder} holds no size-0.jsonl; run build.py first")
    rows: list[dict[str, Any]] = []
    for method in METHODS:
        baseline: dict[str, AuditRecord] = {}
        for path in files:
            config = EvalConfig(dataset="generic", path=str(path), judge=judge, method=method,
                                resamples=resamples, tag=f"long-{_size(path)}")
            result, reports = evaluate(config, backend=resolve_judge(judge))
            write_result(result, RESULTS)
            if _size(path) == 0:
                baseline = {str(r.id): r for r in reports}
            headline = result.metrics.headline
            row = {
                "method": method,
                "size": _size(path),
                "judge": result.judge,
                "answer_f1": format_estimate(headline.get("answer_f1")),
                "contradiction_f1": format_estimate(headline.get("contradiction_f1")),
                "baseless_f1": format_estimate(headline.get("baseless_f1")),
                "wall_seconds": result.wall_seconds,
                **compare(reports, baseline, _layouts(path)),
            }
            rows.append(row)
            print(f"  {method} size {row['size']}: {row['valid']}/{row['samples']} valid, "
                  f"{row['answer_verdicts_changed']} verdicts changed", file=sys.stderr)
    return {"command": "python " + shlex.join(sys.argv), "rows": rows}


def markdown(summary: dict[str, Any]) -> str:
    lines = [
        "# Long contexts: verdicts, evidence and calls as irrelevant passages are added",
        "",
        f"Command: `{summary['command']}` (after `build.py`, see evals/README.md).",
        "",
        "| method | target sentences | n (valid) | mean sentences | chunks | calls / sample | answer F1 | "
        "contradiction F1 | baseless F1 | answer verdicts changed | newly flagged / cleared | "
        "claim labels changed | evidence in original / distractors |",
        "|---|---:|---|---:|---:|---:|---|---|---|---:|---|---|---|",
    ]
    for r in summary["rows"]:
        target = "original" if r["size"] == 0 else str(r["size"])
        lines.append(
            f"| {r['method']} | {target} | {r['samples']} ({r['valid']}) | {r['mean_context_sentences']:.1f} | "
            f"{r['mean_chunks']:.2f} | {r['calls_per_sample']:.2f} | {r['answer_f1']} | {r['contradiction_f1']} | "
            f"{r['baseless_f1']} | {r['answer_verdicts_changed']} | {r['newly_flagged']} / {r['newly_cleared']} | "
            f"{r['claim_labels_changed']} of {r['claims_compared']} | "
            f"{r['evidence_in_original']} / {r['evidence_in_distractors']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="the --out folder of build.py")
    parser.add_argument("--judge", default=None)
    parser.add_argument("--resamples", type=int, default=200)
    arguments = parser.parse_args()
    summary = run(arguments.folder, arguments.judge, arguments.resamples)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    (RESULTS / "summary.md").write_text(markdown(summary), encoding="utf-8")
    print(markdown(summary))


if __name__ == "__main__":
    main()
