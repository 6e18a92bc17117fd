"""The trivial rows beside every F1 the harness prints, and one printed name per AUROC definition,
checked against scikit-learn on records written here.

Forty answers of two task types with typed gold (contradiction / baseless, as FaithBench and RAGTruth
type them), three claims each, some decided by a guard of the embedded verifier (a recorded score
that disagrees with the verdict). Flag-all F1 of each label, of each task type and of the claims is
sklearn's ``f1_score`` of an all-ones prediction; the claim AUROC of ``rt4 eval`` is the AUROC of
the judge's score, the one of ``rt4 calibrate`` the AUROC of the score as thresholded (guard-decided
claims at 0 / 1): two definitions, two printed names.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from sklearn.metrics import f1_score, roc_auc_score
from typer.testing import CliRunner

from rt4chart.analysis.agreement import runs_report
from rt4chart.analysis.metrics import metric_rows, score_reports
from rt4chart.cli.app import app
from rt4chart.report.agreement_view import print_runs
from rt4chart.types import AuditRecord, ClaimVerdict, Gold, GoldAnnotation, GoldKind, JudgeScore, Label, Span

CLAIM_LENGTH = 20
KINDS: list[GoldKind | None] = [None, None, "contradiction", "baseless"]


def records(seed: int = 5) -> list[AuditRecord]:
    rng = np.random.default_rng(seed)
    made = []
    for n in range(40):
        claims, annotations = [], []
        for index in range(3):
            span = Span(start=index * (CLAIM_LENGTH + 1), end=index * (CLAIM_LENGTH + 1) + CLAIM_LENGTH)
            kind = KINDS[int(rng.integers(len(KINDS)))]
            if kind is not None:
                annotations.append(GoldAnnotation(span=span, label=kind, kind=kind))
            p = float(np.clip((0.6 if kind is not None else 0.3) + rng.normal(0, 0.25), 0.01, 0.99))
            guard = rng.random() < 0.2
            label = (Label.CONTRADICTED if rng.random() < 0.5 else Label.BASELESS) if (p >= 0.5) != guard \
                else Label.ENTAILED
            claims.append(ClaimVerdict(
                index=index, text=f"claim {index}", sentence_index=index, answer_span=span, label=label,
                score=JudgeScore(p_unsupported=round(p, 3), threshold=0.5,
                                 decided_by="number_guard" if guard else "head"),
            ))
        hallucinated = any(c.label != Label.ENTAILED for c in claims)
        made.append(AuditRecord(
            id=f"r{n}", line=n + 1, claims=claims, hallucinated=hallucinated,
            label=Label.BASELESS if hallucinated else Label.ENTAILED, judge="embedded#test",
            gold=Gold(hallucinated=bool(annotations), spans=[a.span for a in annotations if a.span], typed=True,
                      annotations=annotations, task_type="QA" if n % 2 else "Summary"),
            context_sha256=f"{n:064x}",
        ))
    return made


def claim_gold(found: list[AuditRecord]) -> list[bool]:
    """Each claim's gold by construction: its span is a gold span exactly when it was annotated."""
    return [any(span.start == claim.start for span in record.gold.spans)
            for record in found if record.gold is not None
            for claim in (c.answer_span for c in record.claims) if claim is not None]


def row(rows: list[tuple[str, str, str]], name: str) -> tuple[str, str]:
    found = [(value, note) for metric, value, note in rows if metric == name]
    assert len(found) == 1, (name, [metric for metric, _, _ in rows])
    return found[0]


def flag_all_f1(gold: list[bool]) -> str:
    return f"{f1_score(gold, [True] * len(gold)):.3f}"


def test_a_flag_all_row_beside_every_label_and_task_f1() -> None:
    found = records()
    rows = metric_rows(score_reports(found, resamples=10))
    annotated = [r.gold for r in found if r.gold is not None]
    for kind in ("contradiction", "baseless"):
        gold = [any(a.kind == kind for a in g.annotations) for g in annotated]
        value, _ = row(rows, f"baseline: flag every answer {kind}, P / R / F1")
        assert value.split(" / ")[2] == flag_all_f1(gold)
        assert row(rows, f"{kind} F1")[0] != value.split(" / ")[2]  # the detector's own figure is another
    for task in ("QA", "Summary"):
        gold = [bool(g.hallucinated) for g in annotated if g.task_type == task]
        assert row(rows, f"baseline [{task}]: flag every answer, P / R / F1")[0].split(" / ")[2] == flag_all_f1(gold)
    assert row(rows, "baseline: flag every claim, P / R / F1")[0].split(" / ")[2] == flag_all_f1(claim_gold(found))


def test_each_claim_auroc_definition_has_its_own_name(tmp_path: Path) -> None:
    found = records()
    claims = [c for r in found for c in r.claims if c.score is not None]
    gold = claim_gold(found)
    raw = [c.score.p_unsupported for c in claims if c.score is not None]
    thresholded = [c.score.p_unsupported if c.score.decided_by == "head" else float(c.label != Label.ENTAILED)
                   for c in claims if c.score is not None]
    assert roc_auc_score(gold, raw) != pytest.approx(roc_auc_score(gold, thresholded))  # two definitions

    evaluated = row(metric_rows(score_reports(found, resamples=10)), "claim AUROC (judge's score)")[0]
    assert evaluated == f"{roc_auc_score(gold, raw):.3f}"

    path = tmp_path / "records.jsonl"
    path.write_text("".join(r.model_dump_json() + "\n" for r in found), encoding="utf-8")
    shown = CliRunner().invoke(app, ["calibrate", str(path), "--resamples", "10"])
    assert shown.exit_code == 0, shown.output
    table = {match[0].strip(): match[1].strip() for match in re.findall(r"^\| ([^|]+) \| ([^|]+) \|", shown.output,
                                                                     flags=re.MULTILINE)}
    assert table["claim AUROC (score as thresholded, guard-decided claims at 0 / 1)"] == \
        f"{roc_auc_score(gold, thresholded):.3f}"
    assert "claim AUROC" not in table  # never the bare name
    data = json.loads(CliRunner().invoke(app, ["calibrate", str(path), "--resamples", "10", "--json"]).output)
    assert data["validation"]["score_name"] == "score as thresholded, guard-decided claims at 0 / 1"


def test_rt4_agree_runs_prints_the_flag_all_row() -> None:
    rng = np.random.default_rng(11)
    gold = [bool(g) for g in rng.random(30) < 0.4]
    runs = [(f"run{r}.jsonl", [bool(v) for v in rng.random(30) < 0.5]) for r in range(2)]
    report = runs_report([("judge-a", runs)], gold, resamples=10)
    assert report.flag_everything_f1 == pytest.approx(f1_score(gold, [True] * len(gold)))
    console = Console(record=True, width=200)
    print_runs(report, console)
    assert re.search(rf"baseline: flag every answer\s*│\s*-\s*│\s*{flag_all_f1(gold)}\s*│\s*0\.500",
                     console.export_text())
