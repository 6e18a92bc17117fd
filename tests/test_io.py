"""JSONL input: every non-blank line yields one item, a sample or the reason it is bad."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rt4chart.records.io import (
    InputLine,
    dump_report,
    error_report,
    read_completed,
    read_jsonl,
    read_predictions,
    read_records,
)
from rt4chart.types import AuditRecord

VALID = {"id": "a", "context": "The trial lasts 14 days.", "answer": "It lasts 14 days."}


def _read(tmp_path: Path, lines: list[str] | bytes) -> list[InputLine]:
    path = tmp_path / "input.jsonl"
    if isinstance(lines, bytes):
        path.write_bytes(lines)
    else:
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return list(read_jsonl(path))


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        pytest.param("{not json", "not valid JSON", id="not-json"),
        pytest.param('{"id": "x", "context": "c"}', "answer", id="missing-answer"),
        pytest.param('{"id": "x", "answer": "a"}', "context", id="missing-context"),
        pytest.param('{"id": "x", "context": "c", "answer": ""}', "answer is empty", id="empty-answer"),
        pytest.param('{"id": "x", "context": "c", "answer": " \\n "}', "answer is empty", id="blank-answer"),
        pytest.param('{"id": "x", "context": "c", "answer": 42}', "answer", id="answer-not-a-string"),
        pytest.param('{"id": "x", "context": 3, "answer": "a"}', "context", id="context-not-text"),
        pytest.param('{"id": "x", "context": ["ok", 3], "answer": "a"}', "context", id="passage-not-text"),
        pytest.param('{"id": "x", "context": "c", "answer": "a", "question": 1}', "question", id="question-type"),
        pytest.param('{"id": ["x"], "context": "c", "answer": "a"}', "id", id="id-a-list"),
        pytest.param('{"id": {"k": 1}, "context": "c", "answer": "a"}', "id", id="id-an-object"),
        pytest.param('{"id": true, "context": "c", "answer": "a"}', "id", id="id-a-boolean"),
        pytest.param('["a", "b"]', "expected a JSON object, got list", id="array"),
        pytest.param('"just a string"', "expected a JSON object, got str", id="string"),
        pytest.param("null", "expected a JSON object", id="null"),
    ],
)
def test_bad_lines_name_their_line_number_and_problem(tmp_path: Path, line: str, problem: str) -> None:
    items = _read(tmp_path, [json.dumps(VALID), line])
    assert [item.line for item in items] == [1, 2]
    bad = items[1]
    assert bad.sample is None and bad.error is not None
    assert bad.error.startswith("line 2: ")
    assert problem in bad.error
    assert items[0].sample is not None


def test_blank_lines_are_skipped_but_line_numbers_stay_those_of_the_file(tmp_path: Path) -> None:
    items = _read(tmp_path, ["", json.dumps(VALID), "   ", "{broken", json.dumps({**VALID, "id": "b"})])
    assert [(item.line, item.sample.id if item.sample else None) for item in items] == [
        (2, "a"),
        (4, None),
        (5, "b"),
    ]


@pytest.mark.parametrize(
    ("record", "expected_id"),
    [
        ({**VALID, "id": "s-1"}, "s-1"),
        ({**VALID, "id": 7}, "7"),
        ({key: value for key, value in VALID.items() if key != "id"}, "line-1"),
    ],
)
def test_ids_are_strings_and_default_to_the_line(tmp_path: Path, record: dict[str, object], expected_id: str) -> None:
    [item] = _read(tmp_path, [json.dumps(record)])
    assert item.sample is not None and item.sample.id == expected_id


def test_an_invalid_line_keeps_its_id_for_the_error_record(tmp_path: Path) -> None:
    [item] = _read(tmp_path, [json.dumps({"id": "keep-me", "context": "c"})])
    report = error_report(item)
    assert (report.id, report.line, report.label) == ("keep-me", 1, None)
    assert report.errors == [item.error]


def test_passages_question_and_gold_are_read(tmp_path: Path) -> None:
    record = {**VALID, "context": ["One.", "Two."], "question": "How long?", "gold": {"hallucinated": False}}
    [item] = _read(tmp_path, [json.dumps(record)])
    assert item.sample is not None
    assert item.sample.context == ["One.", "Two."] and item.sample.question == "How long?"
    assert item.sample.gold is not None and item.sample.gold.hallucinated is False


def test_a_line_that_is_not_utf8_is_one_bad_line_not_a_crash(tmp_path: Path) -> None:
    good = json.dumps(VALID).encode()
    items = _read(tmp_path, good + b"\n" + b'{"id": "x", "answer": "caf\xe9"}\n' + good + b"\n")
    assert [item.line for item in items] == [1, 2, 3]
    assert items[1].sample is None and items[1].error is not None
    assert items[1].error.startswith("line 2: ") and "UTF-8" in items[1].error
    assert items[0].sample is not None and items[2].sample is not None


def test_a_byte_order_mark_does_not_break_the_first_line(tmp_path: Path) -> None:
    items = _read(tmp_path, b"\xef\xbb\xbf" + json.dumps(VALID).encode() + b"\n")
    assert [item.sample.id if item.sample else item.error for item in items] == ["a"]


def test_unicode_text_is_read_exactly(tmp_path: Path) -> None:
    record = {**VALID, "answer": "Caf\u00e9 \u201cquoted\u201d \u2014 \U0001f600."}
    [item] = _read(tmp_path, [json.dumps(record, ensure_ascii=False)])
    assert item.sample is not None and item.sample.answer == record["answer"]


def test_a_dumped_report_is_one_line_that_reads_back() -> None:
    report = AuditRecord(id="x", line=3, errors=["line 3: answer is empty"])
    text = dump_report(report)
    assert "\n" not in text
    assert AuditRecord.model_validate_json(text) == report


# --- lines that once crashed the reader or everything after it (issue 27, item 2) ----------------

POISONED = {
    "lone-surrogate": '{"id": "p", "context": "The sky is blue.", "answer": "The sky is blue \\ud800."}',
    "surrogate-key": '{"id": "p", "context": "c", "answer": "a", "meta": {"\\udfff": 1}}',
    "deep": '{"id": "p", "nest": ' + "[" * 100_000 + "]" * 100_000 + "}",
    "deeper-than-the-limit": '{"id": "p", "nest": ' + "[" * 80 + "]" * 80 + "}",
    "huge-integer": '{"id": "p", "context": "c", "answer": "a", "n": ' + "7" * 5000 + "}",
}


@pytest.mark.parametrize("kind", POISONED)
def test_one_poisoned_line_is_one_error_and_every_other_line_is_read(tmp_path: Path, kind: str) -> None:
    good = [json.dumps({**VALID, "id": f"g{i}"}) for i in range(3)]
    items = _read(tmp_path, [good[0], POISONED[kind], good[1], good[2]])
    assert [item.line for item in items] == [1, 2, 3, 4]
    assert items[1].sample is None and items[1].error and items[1].error.startswith("line 2: ")
    assert [item.sample.id for item in (items[0], items[2], items[3]) if item.sample] == ["g0", "g1", "g2"]
    # What an error record carries can always be written.
    dump_report(error_report(items[1])).encode("utf-8")


def test_a_line_that_only_looks_like_a_surrogate_escape_is_read(tmp_path: Path) -> None:
    # An escaped backslash before "ud800" is a backslash and five letters, and json.dumps writes an emoji as
    # a surrogate pair escape: both take the full check, which must pass them.
    backslash = {**VALID, "answer": "It lasts 14 days, see C:\\ud800."}
    emoji = {**VALID, "answer": "It lasts 14 days \U0001f600."}
    items = _read(tmp_path, [json.dumps(backslash), json.dumps(emoji)])
    assert [item.sample.answer for item in items if item.sample] == [backslash["answer"], emoji["answer"]]


def test_an_oversized_line_is_refused_with_its_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import rt4chart.records.io

    monkeypatch.setattr(rt4chart.records.io, "MAX_LINE_CHARS", 100)
    items = _read(tmp_path, [json.dumps({**VALID, "context": "x" * 200}), json.dumps(VALID)])
    assert items[0].error is not None and "over the limit of 100" in items[0].error
    assert items[1].sample is not None


def test_one_record_reader_names_every_bad_line_and_the_torn_last_one(tmp_path: Path) -> None:
    good, other = AuditRecord(id="a", line=1), AuditRecord(id="b", line=2)
    path = tmp_path / "out.jsonl"
    path.write_bytes(
        (dump_report(good) + "\n").encode() + b"\xff\xfe\n" + b'{"no": "record"}\n' + dump_report(other).encode()
    )
    records = list(read_records(path))
    assert [(r.number, r.report is not None, r.torn) for r in records] == [
        (1, True, False), (2, False, False), (3, False, False), (4, True, True)
    ]
    assert "UTF-8" in (records[1].problem or "") and "not an rt4chart output record" in (records[2].problem or "")
    # Resume keeps the whole records before the torn line and passes over the bad ones.
    items = [InputLine(1, None, raw_id="a"), InputLine(2, None, raw_id="b")]
    assert list(read_completed(path, items)) == [1]
    # Scoring refuses the file at its first bad line, named.
    with pytest.raises(ValueError, match=r"out.jsonl:2: not valid UTF-8"):
        read_predictions(path)



@pytest.mark.parametrize("field", ["context", "passages", "answer"])
def test_a_sample_beyond_the_documented_input_limits_is_an_error_record(tmp_path: Path, field: str) -> None:
    from rt4chart.records.io import MAX_ANSWER_CHARS, MAX_CONTEXT_CHARS

    record: dict[str, object] = dict(VALID)
    if field == "context":
        record["context"] = "The trial lasts 14 days. " * (MAX_CONTEXT_CHARS // 25 + 1)
    elif field == "passages":
        record["context"] = ["The trial lasts 14 days. " * (MAX_CONTEXT_CHARS // 50 + 1)] * 2
    else:
        record["answer"] = "It lasts 14 days. " * (MAX_ANSWER_CHARS // 18 + 1)
    items = _read(tmp_path, [json.dumps(record), json.dumps(VALID)])
    assert items[0].sample is None and items[0].error is not None and "over the limit" in items[0].error
    assert items[1].sample is not None


def test_records_written_before_the_open_signal_maps_still_read(tmp_path: Path) -> None:
    # Written by `rt4 verify` on 62f7240 (free_trial, scripted judge): "signals": null, "attention": null.
    old = Path(__file__).parent / "fixtures" / "records" / "free_trial_62f7240.jsonl"
    lines = list(read_records(old))
    assert len(lines) == 1 and lines[0].problem is None, lines
    report = lines[0].report
    assert report is not None
    assert report.signals == {} and report.label is not None
    assert all(claim.signals == {} for claim in report.claims)
