"""Repair as a trade-off: residual hallucination against claim and text retention, per judge.

On the RAGTruth QA answers that the embedded verifier flags, four conditions — original (no
repair), remove, extract, rewrite — are re-judged by the embedded verifier and by a strict cascade
(the embedded verifier settles the claims it is at least 0.8 confident about; a scripted stage
marks every other claim baseless: no LLM judge is reachable offline). ``rewrite`` needs a judge
that writes text: the llama.cpp-served SmolLM2-135M (what ``rt4 serve`` runs), on a small subset,
as a plumbing check; the other conditions are also reported on that subset. Writes
``evals/results/repair/RESULTS.md`` and ``results.json``; the repaired answers quote benchmark text
and stay out of the repository (``--records DIR`` keeps them elsewhere).

    nice -n 10 python evals/repair/run.py --split test --rewrite-limit 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

from sklearn.metrics import cohen_kappa_score

from rt4chart import averify
from rt4chart.analysis.datasets import load_dataset
from rt4chart.judges.registry import resolve_judge
from rt4chart.method.repair import (
    Repairer,
    RepairRecord,
    RepairStrategy,
    claim_retention,
    is_supported,
    record_reaudit,
    repaired_samples,
    summarize,
)
from rt4chart.options import AuditOptions
from rt4chart.protocol import Backend, GenerationParams
from rt4chart.runs.run import RunSpec, aexecute
from rt4chart.types import AuditRecord, Sample

ROOT = Path(__file__).resolve().parents[2]
CASCADE = f"cascade:embedded@0.8,scripted:{ROOT / 'evals/sanity/flag_everything.rules.json'}"
AUDIT = {"decomposer": "rules"}
"""Every audit decomposes by rules, so that the judges (a cascade could decompose by itself)
judge the same claims and claim retention compares like with like."""


def unrepaired(report: AuditRecord, sample: Sample) -> RepairRecord:
    """The ``original`` condition: the answer as it was, no edits."""
    return RepairRecord(
        id=report.id, line=report.line, strategy="remove", original=sample.answer, repaired=sample.answer,
        claims=len(report.claims), unsupported_claims=sum(not is_supported(c) for c in report.claims),
        text_retention=1.0, gold=sample.gold,
        claim_retention=claim_retention(
            [c.text for c in report.claims if is_supported(c)], sample.answer
        ),
    )


async def rejudge(
    records: list[RepairRecord], samples: dict[int, Sample], judges: dict[str, Backend]
) -> dict[str, list[RepairRecord]]:
    """The records re-audited by each judge (a copy per judge)."""
    judged = {}
    for name, backend in judges.items():
        copies = [r.model_copy(deep=True) for r in records]
        todo = repaired_samples(copies, samples)
        outcome = await aexecute(RunSpec(judge=backend, options=AuditOptions(**AUDIT)), [s for _, s in todo])
        for (record, _), after in zip(todo, outcome.reports, strict=True):
            record_reaudit(record, after)
        judged[name] = copies
    return judged


def row(condition: str, judge: str, records: list[RepairRecord]) -> dict[str, Any]:
    summary = summarize("remove", records)
    return {
        "condition": condition, "judge": judge, "answers": summary.answers, "empty": summary.empty,
        "residual_rate": summary.residual_rate, "residual_rate_with_empty": summary.residual_rate_with_empty,
        "residual_claim_rate": summary.residual_claim_rate, "claim_retention": summary.claim_retention,
        "text_retention": summary.text_retention,
    }


def agreement(by_judge: dict[str, list[RepairRecord]]) -> dict[str, Any]:
    """Answer-level agreement of the two judges on the re-audited (non-empty) answers."""
    first, second = (
        [r.verified_after.hallucinated if r.verified_after else None for r in records] for records in by_judge.values()
    )
    pairs = [(a, b) for a, b in zip(first, second, strict=True) if a is not None and b is not None]
    if not pairs:
        return {"answers": 0, "agreement": None, "kappa": None}
    left, right = [a for a, _ in pairs], [b for _, b in pairs]
    same = sum(a == b for a, b in pairs) / len(pairs)
    kappa = float(cohen_kappa_score(left, right)) if len(set(left) | set(right)) > 1 else None
    return {"answers": len(pairs), "agreement": same, "kappa": kappa}


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def table(rows: list[dict[str, Any]], agreements: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| condition | judge | answers | empty | residual flagged | residual (empty = clean) | residual claims "
        "| claim retention | text retention |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['condition']} | {r['judge']} | {r['answers']} | {r['empty']} | {fmt(r['residual_rate'])} "
            f"| {fmt(r['residual_rate_with_empty'])} | {fmt(r['residual_claim_rate'])} "
            f"| {fmt(r['claim_retention'])} | {fmt(r['text_retention'])} |"
        )
    lines += ["", "| condition | answers judged by both | agreement | Cohen's kappa |", "|---|---|---|---|"]
    for condition, a in agreements.items():
        lines.append(f"| {condition} | {a['answers']} | {fmt(a['agreement'])} | {fmt(a['kappa'])} |")
    return "\n".join(lines)


async def conditions(
    pairs: list[tuple[AuditRecord, Sample]], rewriter: Backend | None, max_tokens: int
) -> dict[str, list[RepairRecord]]:
    """The repaired records of every condition, for ``pairs``."""
    result: dict[str, list[RepairRecord]] = {"original": [unrepaired(r, s) for r, s in pairs]}
    strategies: list[RepairStrategy] = ["remove", "extract"] + (["rewrite"] if rewriter else [])
    for strategy in strategies:
        judge = rewriter if strategy == "rewrite" else None
        repairer = Repairer(strategy, judge, GenerationParams(max_tokens=max_tokens))
        result[strategy] = [await repairer.repair(r, s) for r, s in pairs]
    return result


async def main(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    samples = load_dataset("ragtruth-qa", split=args.split, limit=args.limit)
    embedded = resolve_judge(None)
    judges = {"embedded": embedded, "cascade": resolve_judge(CASCADE)}
    reports = await averify(samples, embedded, **AUDIT)
    by_line = {r.line: s for r, s in zip(reports, samples, strict=True)}
    flagged = [(r, s) for r, s in zip(reports, samples, strict=True) if r.hallucinated]
    print(f"{len(flagged)} of {len(samples)} answers flagged by {embedded.name}", file=sys.stderr)

    # gold-clean answers that repair edits: every flagged answer gets edits, so over the whole split
    every = await conditions(list(zip(reports, samples, strict=True)), None, args.max_tokens)
    gold = summarize("remove", every["remove"])
    out: dict[str, Any] = {
        "command": COMMAND, "split": args.split, "samples": len(samples), "flagged": len(flagged),
        "audit_judge": embedded.name, "judges": {k: v.name for k, v in judges.items()},
        "gold_clean": gold.gold_clean, "gold_clean_edited": gold.gold_clean_edited,
        "gold_clean_edited_share": gold.gold_clean_edited_share,
    }
    flagged_lines = {r.line for r, _ in flagged}
    main_conditions = {k: [r for r in v if r.line in flagged_lines] for k, v in every.items()}
    rows, agreements = [], {}
    for condition, records in main_conditions.items():
        by_judge = await rejudge(records, by_line, judges)
        rows += [row(condition, judge, judged) for judge, judged in by_judge.items()]
        agreements[condition] = agreement(by_judge)
        print(f"{condition}: done at {time.perf_counter() - started:.0f}s", file=sys.stderr)
    out["flagged_rows"], out["flagged_agreement"] = rows, agreements

    if args.rewrite_limit:
        from rt4chart.judges.serve import start_server

        server = start_server(n_ctx_per_slot=args.ctx_per_slot, n_parallel=1, n_threads=args.threads)
        rewriter = resolve_judge("openai/smollm2", api_base=server.api_base, concurrency=1)
        try:
            subset = flagged[: args.rewrite_limit]
            small = await conditions(subset, rewriter, args.max_tokens)
        finally:
            await rewriter.aclose()
            server.stop()
        rewrite_errors = sum(bool(r.errors) for r in small["rewrite"])
        sub_rows, sub_agreements = [], {}
        for condition, records in small.items():
            by_judge = await rejudge(records, by_line, judges)
            sub_rows += [row(condition, judge, judged) for judge, judged in by_judge.items()]
            sub_agreements[condition] = agreement(by_judge)
        out.update(
            rewrite_judge=rewriter.name, rewrite_subset=len(subset), rewrite_failed=rewrite_errors,
            rewrite_generated_edits=sum(e.generated for r in small["rewrite"] for e in r.edits),
            subset_rows=sub_rows, subset_agreement=sub_agreements,
        )
        if args.records:
            args.records.mkdir(parents=True, exist_ok=True)
            with open(args.records / "rewrite.jsonl", "w", encoding="utf-8") as handle:
                handle.writelines(r.model_dump_json() + "\n" for r in small["rewrite"])
    out["seconds"] = round(time.perf_counter() - started)
    out["machine"] = f"{platform.processor() or platform.machine()}, {platform.system()}"
    if args.records:
        args.records.mkdir(parents=True, exist_ok=True)
        for condition, records in main_conditions.items():
            with open(args.records / f"{condition}.jsonl", "w", encoding="utf-8") as handle:
                handle.writelines(r.model_dump_json() + "\n" for r in records)
    write(out, args.results)


COMMAND = "nice -n 10 python evals/repair/run.py " + " ".join(sys.argv[1:])


def write(out: dict[str, Any], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    text = [
        "# Repair of flagged answers: residual hallucination vs retention",
        "",
        f"Command: `{out['command']}` ({out['seconds']} s on {out['machine']}), with "
        "`RT4_DATA_DIR` naming the data folder. Written by the script; nothing typed in.",
        "",
        f"RAGTruth QA {out['split']}: {out['flagged']} of {out['samples']} answers flagged by "
        f"`{out['audit_judge']}` (rule-based claims). Judges of the repaired answers: "
        + ", ".join(f"{k} = `{v}`" for k, v in out["judges"].items()) + ".",
        "",
        "Residual flagged: share of re-audited (non-empty) answers still flagged; residual (empty = clean) "
        "counts empty repairs as clean; residual claims: unsupported / all claims of the re-audited answers; "
        "claim retention: share of the original's supported claims still stated (rule clauses matched at "
        "0.8 character coverage); text retention: share of the original's characters kept, in order.",
        "",
        f"Gold-clean answers that repair edits (over all {out['samples']}): "
        f"{out['gold_clean_edited']} of {out['gold_clean']} = {fmt(out['gold_clean_edited_share'])} "
        "(every flagged answer is edited, so this is the verifier's false-positive rate on clean answers).",
        "",
        "## Flagged answers: original, remove, extract",
        "",
        table(out["flagged_rows"], out["flagged_agreement"]),
    ]
    if "subset_rows" in out:
        text += [
            "",
            f"## Rewrite by `{out['rewrite_judge']}` (plumbing): the first {out['rewrite_subset']} flagged answers",
            "",
            f"SmolLM2-135M is not a repair model: the rewrite call failed or gave no usable reply for "
            f"{out['rewrite_failed']} of {out['rewrite_subset']} answers (their flagged sentences were then deleted, "
            f"as documented); {out['rewrite_generated_edits']} edits carry text it wrote.",
            "",
            table(out["subset_rows"], out["subset_agreement"]),
        ]
    (folder / "RESULTS.md").write_text("\n".join(text) + "\n", encoding="utf-8")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--split", default="test")
    parser.add_argument("--limit", type=int, default=None, help="Only the first N samples of the split.")
    parser.add_argument("--rewrite-limit", type=int, default=8, help="Flagged answers rewritten by SmolLM2 (0: none).")
    parser.add_argument("--max-tokens", type=int, default=384, help="Completion cap of a rewrite call.")
    parser.add_argument("--ctx-per-slot", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--results", type=Path, default=ROOT / "evals" / "results" / "repair")
    parser.add_argument("--records", type=Path, default=None, help="Also write the repair records here (not in git).")
    asyncio.run(main(parser.parse_args()))
