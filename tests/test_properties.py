"""Property tests over the reader and the pipeline: random bytes, wrong types, huge and empty
fields, right-to-left and combining characters, CRLF. Every line yields exactly one item (a sample
or a clear per-line error), every offset in a record points at the text it claims to, and the CLI
exits per its contract (2 with any bad line, else 0 or 1)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from fixtures.spine.judges import RecordingBackend, scripted
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from rt4chart.cli.app import app
from rt4chart.method.tasks import ClaimJudgement, VerifyInput, VerifyOutput
from rt4chart.method.text import numbers_in, segment_context
from rt4chart.options import AuditOptions
from rt4chart.protocol import JudgeRequest, JudgeResponse
from rt4chart.records.io import json_lines, parse_lines
from rt4chart.runs.engine import Pipeline
from rt4chart.types import Label, Sample

# Hebrew and Arabic letters, right-to-left marks, combining accents, zero-width joiners, CJK, emoji.
UNUSUAL = "אבגדהשלוםمرحبا\u200f\u200e\u202e\u0301\u0308\u0327\u200d\u200b中文字🙂 "
words = st.text(alphabet=st.sampled_from(list("abcdefghij ") + list(UNUSUAL)), min_size=1, max_size=12)
sentences = st.builds(lambda w: " ".join(w).strip() + ".", st.lists(words, min_size=1, max_size=6))
texts = st.builds(lambda parts, crlf: ("\r\n" if crlf else " ").join(parts),
                  st.lists(sentences, min_size=1, max_size=5), st.booleans())
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8,
)
wrongly_typed = st.fixed_dictionaries(
    {}, optional={"id": json_values, "context": json_values, "question": json_values, "answer": json_values}
)


def quoting_judge() -> RecordingBackend:
    """A judge that entails every claim, quoting the first sentence it is shown (the scripted
    judge's decomposition and verdict shapes, with a quote that is really in the context)."""

    def quote(request: JudgeRequest, response: JudgeResponse) -> JudgeResponse:
        payload = request.payload
        if not isinstance(payload, VerifyInput) or not isinstance(response.parsed, VerifyOutput):
            return response
        evidence = [payload.sentences[0].text] if payload.sentences else []
        judgements = [
            ClaimJudgement(claim=j.claim, label=Label.ENTAILED if evidence else Label.BASELESS, evidence=evidence)
            for j in response.parsed.judgements
        ]
        return response.model_copy(update={"parsed": VerifyOutput(judgements=judgements)})

    backend = scripted({"verify": [], "default": "baseless"})
    backend.rewrite = quote
    return backend


@settings(max_examples=200, deadline=None)
@given(st.lists(st.binary(max_size=80) | st.builds(lambda v: json.dumps(v).encode(), wrongly_typed), max_size=8),
       st.booleans())
def test_every_non_blank_line_yields_exactly_one_item(lines: list[bytes], crlf: bool) -> None:
    ending = b"\r\n" if crlf else b"\n"
    raw = [line.replace(b"\n", b" ").replace(b"\r", b" ") + ending for line in lines]
    items = list(parse_lines(json_lines(raw)))
    expected = [number for number, line in enumerate(raw, start=1)
                if line.decode("utf-8", "replace").removeprefix("\ufeff" if number == 1 else "").strip()]
    assert [item.line for item in items] == expected
    for item in items:
        assert (item.sample is None) != (item.error is None)
        if item.error is not None:
            assert item.error.startswith(f"line {item.line}: ") and "\n" not in item.error
        else:
            assert item.sample is not None and item.sample.answer.strip()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(texts, min_size=1, max_size=3), texts, st.none() | texts)
def test_every_offset_of_a_record_points_at_its_text(context: list[str], answer: str, question: str | None) -> None:
    sample = Sample(id="p", context=context if len(context) > 1 else context[0], question=question, answer=answer)
    pipeline = Pipeline(quoting_judge(), AuditOptions(window=2, overlap=1, decomposer="rules"))
    report = asyncio.run(pipeline.verify_sample(sample))
    joined, _ = segment_context(sample.context)
    assert report.label is not None or report.errors
    for claim in report.claims:
        assert claim.answer_span is not None
        assert 0 <= claim.answer_span.start < claim.answer_span.end <= len(answer)
        for evidence in claim.evidence:
            assert joined[evidence.start : evidence.end] == evidence.text
    for span in report.spans:
        assert 0 <= span.start < span.end <= len(answer)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(
    st.builds(lambda c, a: {"id": "x", "context": c, "answer": a}, texts, texts),
    wrongly_typed,
    st.just({"id": "big", "context": "word " * 20000, "answer": "A long one. " * 200}),
    st.just({"id": "empty", "context": "", "answer": "Something."}),
), min_size=1, max_size=4), st.booleans())
def test_the_cli_writes_one_record_per_line_and_exits_per_the_contract(
    tmp_path: Path, rows: list[dict[str, Any]], crlf: bool
) -> None:
    inputs, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    ending = "\r\n" if crlf else "\n"
    inputs.write_text("".join(json.dumps(row, ensure_ascii=False) + ending for row in rows), encoding="utf-8")
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"verify": [], "default": "baseless"}), encoding="utf-8")
    result = CliRunner().invoke(app, ["verify", str(inputs), "--judge", f"scripted:{rules}", "--no-cache",
                                      "--out", str(out), "-q"])
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["line"] for r in records] == list(range(1, len(rows) + 1))
    invalid = [r for r in records if r["label"] is None]
    assert all(r["errors"] for r in invalid)
    assert result.exit_code == (2 if invalid else 1), result.output


_UNIT_WORDS = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
]
_TENS_WORDS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def _in_words(number: int) -> str:
    """An integer below 1000 in English words ("three hundred forty-two")."""
    hundreds, rest = divmod(number, 100)
    words = [f"{_UNIT_WORDS[hundreds]} hundred"] if hundreds else []
    if rest >= 20:
        tens, units = divmod(rest, 10)
        words.append(_TENS_WORDS[tens - 2] + (f"-{_UNIT_WORDS[units]}" if units else ""))
    elif rest or not words:
        words.append(_UNIT_WORDS[rest])
    return " ".join(words)


@settings(max_examples=300, deadline=None)
@given(st.integers(2, 999), st.sampled_from([("", 1), (" thousand", 10**3), (" million", 10**6), (" billion", 10**9)]))
def test_numbers_in_words_and_digits_read_the_same(number: int, scale: tuple[str, int]) -> None:
    word, factor = scale
    assert numbers_in(f"It has {_in_words(number)}{word} seats.") == {float(number * factor)}
    assert numbers_in(f"It has {number * factor:,} seats.") == {float(number * factor)}
    assert numbers_in(f"It has {number}{word} seats.") == {float(number * factor)}


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 99), st.integers(1, 9))
def test_a_decimal_with_a_scale_word_is_its_digits(whole: int, tenth: int) -> None:
    digits = f"{(whole * 10 + tenth) * 100_000:,}"
    assert numbers_in(f"{whole}.{tenth} million people") == numbers_in(f"{digits} people")
