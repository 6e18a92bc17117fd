"""`rt4 export --csv` and `rt4chart.to_dataframe`: audit records as a table, one row per claim or per
answer. The CLI runs as a user runs it (a subprocess, 80 columns); the CSV is read back with the csv
module and compared cell by cell with the records it came from (scripted judge of the examples)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXAMPLES, require_module

import rt4chart
from rt4chart.records.io import dump_report, read_predictions
from rt4chart.report.tables import ANSWER_COLUMNS, CLAIM_COLUMNS
from rt4chart.types import AuditRecord, Label, Sample

JUDGE = f"scripted:{EXAMPLES / 'answers.rules.json'}"
README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture(scope="module")
def records_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    samples = [Sample.model_validate_json(line)
               for line in (EXAMPLES / "answers.jsonl").read_text(encoding="utf-8").splitlines()]
    records = rt4chart.verify(samples, JUDGE)
    path = tmp_path_factory.mktemp("export") / "audit.jsonl"
    path.write_text("".join(dump_report(record) + "\n" for record in records), encoding="utf-8")
    return path


def rt4(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rt4chart", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "80"}, timeout=300, check=False)


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8", newline="") as file:
        return list(csv.DictReader(file))


def test_claim_level_csv_has_one_row_per_claim_matching_the_records(records_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "claims.csv"
    result = rt4("export", records_file, "--csv", out)
    assert result.returncode == 0, result.stderr
    assert str(out) in result.stderr
    records = read_predictions(records_file)
    rows = read_csv(out)
    claims = [(record, claim) for record in records for claim in record.claims]
    assert len(rows) == len(claims) and len(claims) > len(records)
    assert list(rows[0]) == [column.name for column in CLAIM_COLUMNS]
    for row, (record, claim) in zip(rows, claims, strict=True):
        assert (row["id"], int(row["line"]), int(row["claim_index"])) == (record.id, record.line, claim.index)
        assert row["claim"] == claim.text and row["label"] == claim.label
        assert row["evidence"] == " | ".join(evidence.text for evidence in claim.evidence)
        span = claim.answer_span
        assert span is not None and (int(row["answer_start"]), int(row["answer_end"])) == (span.start, span.end)
        assert row["grounded"] == ("true" if claim.grounded else "false")
    assert {row["label"] for row in rows} >= {Label.ENTAILED, Label.CONTRADICTED, Label.BASELESS}


def test_answer_level_csv_counts_each_answers_claims(records_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "answers.csv"
    result = rt4("export", records_file, "--csv", out, "--level", "answer")
    assert result.returncode == 0, result.stderr
    records = read_predictions(records_file)
    rows = read_csv(out)
    assert [row["id"] for row in rows] == [record.id for record in records]
    assert list(rows[0]) == [column.name for column in ANSWER_COLUMNS]
    for row, record in zip(rows, records, strict=True):
        counts = {label: sum(claim.label is label for claim in record.claims) for label in Label}
        assert row["label"] == record.label and int(row["claims"]) == len(record.claims)
        assert int(row["contradicted"]) == counts[Label.CONTRADICTED] and int(row["baseless"]) == counts[Label.BASELESS]
        assert float(row["support"]) == pytest.approx(counts[Label.ENTAILED] / len(record.claims))
        assert row["hallucinated"] == ("true" if record.hallucinated else "false")


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--csv", "out.csv", "--level", "sentence"], "--level must be one of claim, answer"),
     ([], "nothing to write: give --csv"),
     (["--csv", "{results}"], "")],
)
def test_bad_export_requests_are_usage_errors(
    records_file: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    result = rt4("export", records_file, *[arg.format(results=records_file) for arg in args])
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert message in result.stderr


def test_a_missing_or_damaged_results_file_is_a_usage_error(tmp_path: Path) -> None:
    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text('{"id": "x"\n', encoding="utf-8")
    for results in (tmp_path / "absent.jsonl", damaged):
        result = rt4("export", results, "--csv", tmp_path / "out.csv")
        assert result.returncode == 2 and str(results) in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out.csv").exists()


def test_to_dataframe_has_the_csv_columns_and_rows(records_file: Path) -> None:
    require_module("pandas", "pandas (optional: only rt4chart.to_dataframe needs it)")
    records = read_predictions(records_file)
    claims = rt4chart.to_dataframe(records)
    assert list(claims.columns) == [column.name for column in CLAIM_COLUMNS]
    assert len(claims) == sum(len(record.claims) for record in records)
    answers = rt4chart.to_dataframe(records_file, level="answer")
    assert list(answers["id"]) == [record.id for record in records]
    assert list(answers["label"]) == [str(record.label) for record in records]


def test_to_dataframe_without_pandas_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)  # what an environment without pandas raises on import
    with pytest.raises(ImportError, match="needs pandas, which is not installed: pip install pandas"):
        rt4chart.to_dataframe([AuditRecord(id="a", line=1)])


def test_the_readme_documents_every_column() -> None:
    readme = README.read_text(encoding="utf-8")
    section = readme[readme.index("## Export"):]
    section = section[: section.index("\n## ", 1)]
    for column in (*CLAIM_COLUMNS, *ANSWER_COLUMNS):
        assert f"`{column.name}`" in section, column.name
