"""Ablations of the RT4CHART method on one dataset split with one judge, recorded as a table.

Variants: the full pipeline; ``--no-global``; the ``direct`` one-call baseline; holistic
decomposition (claims from the whole answer at once, no span mapping); the (W, O) grid
{(10,3), (15,5), (25,10), (35,15)}; and repeated runs of the full pipeline (no cache between runs)
to measure run-to-run variance as mean +- sd.

Every variant's full result is written to ``evals/results/ablations/`` by the same code as
``rt4 eval``; the table goes to ``evals/results/ablations_<dataset>_<split>_<judge>.md``.

    python evals/ablations.py ragtruth-qa --split dev --judge scripted:evals/sanity/flag_everything.rules.json
    python evals/ablations.py ragtruth-qa --split dev --judge embedded --limit 100
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

from rt4chart.analysis.metrics import format_estimate
from rt4chart.runs.evaluation import EvalConfig, EvaluationResult, evaluate, load_samples, write_result
from rt4chart.types import AuditRecord, Sample

GRID = ((10, 3), (15, 5), (25, 10), (35, 15))
"""(W, O) pairs of the grid; (25, 10) is the default and is the full pipeline's row."""

COLUMNS = ("answer_f1", "balanced_accuracy", "auroc", "span_f1", "mean_iou", "contradiction_f1", "baseless_f1")
"""Headline metrics shown per variant."""

RESULTS = Path(__file__).resolve().parent / "results"


_LABELS: dict[str, list[list[str | None]]] = {}
"""Claim labels per sample of each variant run, to tell which variants this judge ignores."""


def _labels(reports: list[AuditRecord]) -> list[list[str | None]]:
    return [[c.label.value if c.label else None for c in r.claims] for r in reports]


def _shown(result: EvaluationResult) -> str:
    """What this judge cannot show about a variant: it cannot run the step, or the step does not
    change a single claim label (so only calls and time move)."""
    metrics = result.metrics
    if metrics.invalid == metrics.samples:
        return "not shown: the judge cannot run this step"
    if result.samples_with_errors == metrics.samples:
        return "not shown: the judge failed this step on every sample"
    full = _LABELS.get("run-1")
    if full is not None and result.config.tag != "run-1" and _LABELS.get(_key(result)) == full:
        return "not shown: claim labels identical to the full run"
    return "shown"


def _key(result: EvaluationResult) -> str:
    return result.config.tag or result.config.variant


def _run(base: EvalConfig, samples: list[Sample], tag: str | None = None, **changes: object) -> EvaluationResult:
    config = base.model_copy(update={"tag": tag, "options": base.options.model_copy(update=changes)})
    result, reports = evaluate(config, samples)
    _LABELS[_key(result)] = _labels(reports)
    write_result(result, RESULTS / "ablations")
    print(f"  {config.variant}{' ' + config.tag if config.tag else ''}: done in {result.wall_seconds:.1f} s",
          file=sys.stderr)
    return result


def _row(name: str, result: EvaluationResult) -> str:
    cells = [format_estimate(result.metrics.headline.get(key)) for key in COLUMNS]
    metrics = result.metrics
    health = f"{metrics.invalid} / {result.samples_with_errors}"
    return (f"| {name} | " + " | ".join(cells)
            + f" | {health} | {result.usage.calls} | {result.wall_seconds:.1f} | {_shown(result)} |")


def ablation_table(base: EvalConfig, samples: list[Sample], repeats: int) -> str:
    """Run every variant and return the Markdown table (figures measured by this run)."""
    rows: list[str] = []
    full = _run(base, samples, tag="run-1")
    rows.append(_row("full (W=25, O=10)", full))
    rows.append(_row("no global verification", _run(base, samples, global_verification=False)))
    rows.append(_row("direct baseline (one call)", _run(base, samples, method="direct")))
    rows.append(_row("holistic decomposition", _run(base, samples, decomposer="holistic")))
    for window, overlap in GRID:
        if (window, overlap) != (25, 10):
            rows.append(_row(f"W={window}, O={overlap}", _run(base, samples, window=window, overlap=overlap)))
    runs = [full] + [_run(base, samples, tag=f"run-{n}") for n in range(2, repeats + 1)]
    spread = []
    for key in COLUMNS:
        values = [v for r in runs if (v := r.metrics.headline[key].value) is not None]
        if len(values) == len(runs) and len(values) > 1:
            spread.append(f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}")
        else:
            spread.append("n/a")
    judge = full.judge
    header = [
        f"### Ablations: {base.dataset} {base.split or 'all'}, judge {judge}",
        "",
        f"- samples: {full.metrics.samples} (limit {base.limit if base.limit is not None else 'none'}); "
        f"dataset sha256 {full.files[0].sha256[:16]}; prompt version {full.prompt_version}; date {full.date}",
        f"- cells: value [95% bootstrap CI, {base.resamples} resamples, seed {base.seed}]; "
        "wall time is measured on this machine; a judge that cannot do a step (e.g. the embedded "
        "verifier cannot decompose or answer the direct prompt) shows up as invalid samples or samples "
        "with errors (a failed decomposition falls back to one claim per sentence)",
        f"- command: `python evals/ablations.py {_command_args(base, repeats)}`",
        "",
        "- last column: what this judge cannot show. A variant is \"not shown\" when the judge cannot run "
        "the step, fails it on every sample, or gives every claim the label it gives in the full run "
        "(the embedded verifier scores each claim alone against its best-matching sentences, so "
        "windows and the global pass do not reach its labels; an LLM judge is needed to measure them)",
        "",
        "| variant | answer F1 | balanced accuracy | AUROC | span F1 (chars) | mean IoU | contradiction F1 "
        "| baseless F1 | invalid / with errors | judge calls | wall s | what it shows |",
        "|---|---|---|---|---|---|---|---|---:|---:|---:|---|",
    ]
    footer = [
        f"| full, {len(runs)} runs (mean ± sd) | " + " | ".join(spread) + " | | | | |",
        "",
    ]
    return "\n".join(header + rows + footer)


def _command_args(base: EvalConfig, repeats: int) -> str:
    parts = [base.dataset]
    if base.split:
        parts += ["--split", base.split]
    if base.judge:
        parts += ["--judge", base.judge]
    if base.api_base:
        parts += ["--api-base", base.api_base]
    if base.limit is not None:
        parts += ["--limit", str(base.limit)]
    if base.path:
        parts += ["--path", base.path]
    if repeats != 3:
        parts += ["--repeats", str(repeats)]
    return " ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dataset")
    parser.add_argument("--split")
    parser.add_argument("--judge")
    parser.add_argument("--api-base")
    parser.add_argument("--path")
    parser.add_argument("--limit", type=int)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--resamples", type=int, default=1000)
    args = parser.parse_args()
    base = EvalConfig(
        dataset=args.dataset, path=args.path, split=args.split, limit=args.limit, judge=args.judge,
        api_base=args.api_base, resamples=args.resamples,
    )
    samples = load_samples(base)
    table = ablation_table(base, samples, args.repeats)
    out = RESULTS / f"ablations_{base.dataset}_{base.split or 'all'}_{_slug(base.judge or 'default')}.md"
    out.write_text(table, encoding="utf-8")
    print(table)
    print(f"wrote {out}", file=sys.stderr)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")


if __name__ == "__main__":
    main()
