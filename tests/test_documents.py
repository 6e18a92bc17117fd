"""Documents as input (rt4chart.documents): prose documents with ids, JSON values and tables, through the
real ``rt4 verify`` with a scripted judge. Each claim's label and each evidence's ``source`` (document,
offsets in it, the JSON path or table cell it quotes) are checked exactly, and the offsets against the
document's own rendered text, never against the module's figures.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fixtures.reports.runs import rt4

from rt4chart.documents import Document, render_document
from rt4chart.method.grounding import passage_map
from rt4chart.method.text import join_passages
from rt4chart.records.traces import read_otlp_traces
from rt4chart.types import Sample

FIXTURES = Path(__file__).resolve().parent / "fixtures"
EXIT_USAGE = 2

WEATHER = {"city": "Oslo", "tomorrow": {"summary": "rain", "precipitation_mm": 12, "wind_kmh": 9}}
"""A weather tool's JSON reply."""
SALES = "| region | revenue |\n|---|---|\n| North | 120 |\n| South | 80 |"
"""An SQL result as a Markdown table."""
AGENT_TURN = {
    "id": "agent-1",
    "question": "Should I bring an umbrella to the Oslo office, and how did the regions do?",
    "documents": [
        {"id": "weather_api", "data": WEATHER},
        {"id": "sales_sql", "table": SALES, "format": "markdown"},
        {"id": "kb-1", "title": "Office guide", "text": "The Oslo office is next to the harbour. It opens at 8 am."},
        {"id": "kb-2", "text": "Visitors sign in at the front desk. The office closes at 6 pm."},
    ],
    "answer": (
        "It will rain in Oslo tomorrow. The South region earned 80. The Oslo office opens at 8 am and "
        "closes at 6 pm. The North region earned 150. Rain is expected near the harbour office."
    ),
}
"""A hand-made agent turn: a tool returning JSON, an SQL result table, two retrieved documents."""

RULES: dict[str, Any] = {
    "decompose": {
        "opens at 8 am": ["The Oslo office opens at 8 am.", "The Oslo office closes at 6 pm."],
        "near the harbour": ["Rain is expected near the harbour office."],
    },
    "verify": [
        {"claim": "rain in Oslo", "label": "entailed", "evidence": ["tomorrow.summary: rain"]},
        {"claim": "South region", "label": "entailed", "evidence": ["region: South | revenue: 80"]},
        {"claim": "opens at 8 am", "label": "entailed", "evidence": ["It opens at 8 am."]},
        {"claim": "closes at 6 pm", "label": "entailed", "evidence": ["The office closes at 6 pm."]},
        {"claim": "North region", "label": "contradicted", "evidence": ["row 1: region: North | revenue: 120"]},
        # A claim that mixes two tool outputs: the weather JSON and the office guide.
        {"claim": "near the harbour", "label": "entailed",
         "evidence": ["tomorrow.summary: rain", "The Oslo office is next to the harbour."]},
    ],
}


def _verify(directory: Path, lines: list[dict[str, Any]], rules: dict[str, Any], *args: str) -> tuple[int, list[Any]]:
    answers, rules_file, out = directory / "answers.jsonl", directory / "rules.json", directory / "out.jsonl"
    answers.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    rules_file.write_text(json.dumps(rules), encoding="utf-8")
    done = rt4("verify", str(answers), "--judge", f"scripted:{rules_file}", "--out", str(out), "-q", *args,
               cwd=directory)
    assert "Traceback" not in done.stderr
    return done.returncode, [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def _rendered(line: dict[str, Any]) -> dict[str, str]:
    return {d["id"]: render_document(Document.model_validate(d)).text for d in line["documents"]}


def _sources(record: dict[str, Any], texts: dict[str, str]) -> list[tuple[str, str, list[tuple[str, Any]]]]:
    """Each claim's label and its evidence as (document, quoted text there, units), the quote read from
    the document's own text at the source's offsets (and checked against the record's evidence text)."""
    found = []
    for claim in record["claims"]:
        evidence = []
        for item in claim["evidence"]:
            source = item["source"]
            quoted = texts[source["document"]][source["start"]:source["end"]]
            assert quoted == item["text"]
            units = [(unit["path"], (unit.get("row"), unit.get("column"))) for unit in source.get("units", [])]
            evidence.append((source["document"], quoted, units))
        found.append((claim["text"], claim["label"], evidence))
    return found


def test_an_agent_turn_s_claims_name_the_tool_output_field_cell_and_document(tmp_path: Path) -> None:
    code, [record] = _verify(tmp_path, [AGENT_TURN], RULES, "--no-cache", "--decomposer", "judge")
    assert code == 1  # one claim contradicted
    none = (None, None)
    assert _sources(record, _rendered(AGENT_TURN)) == [
        ("It will rain in Oslo tomorrow.", "entailed",
         [("weather_api", "tomorrow.summary: rain", [("$.tomorrow.summary", none)])]),
        ("The South region earned 80.", "entailed",
         [("sales_sql", "region: South | revenue: 80",
           [("$[1].region", (2, "region")), ("$[1].revenue", (2, "revenue"))])]),
        ("The Oslo office opens at 8 am.", "entailed", [("kb-1", "It opens at 8 am.", [])]),
        ("The Oslo office closes at 6 pm.", "entailed", [("kb-2", "The office closes at 6 pm.", [])]),
        ("The North region earned 150.", "contradicted",
         [("sales_sql", "row 1: region: North | revenue: 120",
           [("$[0].region", (1, "region")), ("$[0].revenue", (1, "revenue"))])]),
        ("Rain is expected near the harbour office.", "entailed",
         [("weather_api", "tomorrow.summary: rain", [("$.tomorrow.summary", none)]),
          ("kb-1", "The Oslo office is next to the harbour.", [])]),
    ]
    assert record["passages"] == 4


def test_a_table_reads_the_same_as_csv_markdown_or_records() -> None:
    records = [{"region": "North", "revenue": "120"}, {"region": "South", "revenue": "80"}]
    given = [
        Document(id="t", table=SALES, format="markdown"),
        Document(id="t", table="region,revenue\nNorth,120\nSouth,80\n", format="csv"),
        Document.model_validate({"id": "t", "table": records}),
    ]
    rendered = [render_document(document) for document in given]
    assert [r.text for r in rendered] == ["row 1: region: North | revenue: 120\nrow 2: region: South | revenue: 80"] * 3
    assert all(r.units == rendered[0].units for r in rendered)
    assert [rendered[0].text[u.start:u.end] for u in rendered[0].units] == [
        "region: North", "revenue: 120", "region: South", "revenue: 80"]


def test_a_long_structure_is_windowed_and_its_evidence_keeps_its_path(tmp_path: Path) -> None:
    readings = {f"sensor_{n:02d}": {"reading": n * 10, "unit": "kPa"} for n in range(30)}
    line = {"id": "long", "documents": [{"id": "plant", "data": {"sensors": readings}}],
            "answer": "Sensor 27 reads 270 kPa."}
    rules = {"verify": [{"claim": "Sensor 27", "label": "entailed", "evidence": ["sensors.sensor_27.reading: 270"]}]}
    code, [record] = _verify(tmp_path, [line], rules, "--no-cache", "--window", "6", "--overlap", "2")
    assert code == 0
    assert record["context_sentences"] == 60 and record["chunks"] > 1
    [claim] = record["claims"]
    [evidence] = claim["evidence"]
    assert evidence["source"]["units"] == [{"path": "$.sensors.sensor_27.reading"}]
    # The deciding local vote came from a window that holds sensor 27's reading, not the first one.
    deciding = [vote["chunk"] for vote in claim["votes"] if vote["label"] == "entailed"]
    assert deciding and 0 not in deciding


def test_equal_json_values_in_any_key_order_are_one_cache_entry(tmp_path: Path) -> None:
    answer = "It will rain in Oslo tomorrow."
    reordered = {"tomorrow": {"wind_kmh": 9, "precipitation_mm": 12, "summary": "rain"}, "city": "Oslo"}
    other = {**WEATHER, "tomorrow": {**WEATHER["tomorrow"], "wind_kmh": 30}}
    lines = [{"id": name, "documents": [{"id": "weather_api", "data": data}], "answer": answer}
             for name, data in (("first", WEATHER), ("reordered", reordered), ("other", other))]
    rules = {"verify": [{"claim": "rain", "label": "entailed", "evidence": ["tomorrow.summary: rain"]}]}
    code, records = _verify(tmp_path, lines, rules, "--cache-dir", str(tmp_path / "cache"), "--decomposer", "rules")
    assert code == 0
    usage = {record["id"]: (record["usage"]["calls"], record["usage"]["cache_hits"]) for record in records}
    assert usage["first"][0] > 0 and usage["first"][1] == 0
    assert usage["reordered"] == (0, usage["first"][0])  # every call answered from the first line's entries
    assert usage["other"][0] > 0  # a different value is a different prompt
    assert records[0]["context_sha256"] == records[1]["context_sha256"] != records[2]["context_sha256"]


@pytest.mark.parametrize(
    ("documents", "problem"),
    [
        pytest.param([{"id": "a", "txt": "y"}], "documents[0]: txt: Extra inputs are not permitted", id="misspelt"),
        pytest.param([{"id": "a", "text": "y"}, {"id": "a", "text": "z"}], "documents: ids must be unique",
                     id="duplicate-ids"),
        pytest.param([{"id": "a", "text": "y", "data": {"k": 1}}], "documents[0]: give exactly one of text, data, "
                     "table", id="two-bodies"),
        pytest.param([{"id": "t", "table": "a,b\n1,2"}], 'documents[0]: a table given as text needs "format"',
                     id="table-without-format"),
        pytest.param([{"id": "t", "table": "|a|b|\n|--|--|\n|1|", "format": "markdown"}],
                     "documents[0]: table row 1 has 1 cells, its header 2", id="ragged-table"),
        pytest.param([{"id": "t", "table": "|a|b|\n|1|2|", "format": "markdown"}],
                     "documents[0]: a Markdown table needs a header row and a |---| separator row", id="no-separator"),
        pytest.param([], "documents: a non-empty list", id="empty"),
        pytest.param("text", "documents: a non-empty list", id="not-a-list"),
    ],
)
def test_a_bad_documents_line_is_one_clear_error_record_and_exit_2(
    tmp_path: Path, documents: Any, problem: str
) -> None:
    good = {"id": "good", "documents": [{"id": "a", "text": "The sky is blue."}], "answer": "The sky is blue."}
    bad = {"id": "bad", "documents": documents, "answer": "The sky is blue."}
    both = {"id": "both", "context": "x", "documents": [{"id": "a", "text": "y"}], "answer": "The sky is blue."}
    rules = {"verify": [{"claim": "sky", "label": "entailed", "evidence": ["The sky is blue."]}]}
    code, records = _verify(tmp_path, [good, bad, both], rules, "--no-cache")
    assert code == EXIT_USAGE
    assert [(r["id"], r["label"]) for r in records] == [("good", "entailed"), ("bad", None), ("both", None)]
    assert len(records[1]["errors"]) == 1 and records[1]["errors"][0].startswith(f"line 2: {problem}")
    assert records[2]["errors"] == ["line 3: give either context or documents, not both"]


def test_documents_read_from_a_trace_name_the_evidence(tmp_path: Path) -> None:
    traces = FIXTURES / "traces" / "real_sdk_openai.json"
    rules = FIXTURES.parent.parent / "examples" / "answers.rules.json"
    out = tmp_path / "out.jsonl"
    done = rt4("verify", str(traces), "--input-format", "otlp", "--judge", f"scripted:{rules}", "--no-cache",
               "-o", str(out), "-q", cwd=tmp_path)
    assert done.returncode == EXIT_USAGE  # the export's third trace has no documents
    items = {item.raw_id: item.sample for item in read_otlp_traces(traces)}
    checked = 0
    for record in map(json.loads, out.read_text(encoding="utf-8").splitlines()):
        sample = items[record["id"]]
        for claim in record["claims"]:
            for evidence in claim["evidence"]:
                assert sample is not None and isinstance(sample.context, list) and sample.passage_ids
                source = evidence["source"]
                passage = sample.context[sample.passage_ids.index(source["document"])]
                assert passage[source["start"]:source["end"]] == evidence["text"]
                checked += 1
    assert checked


def test_ragtruth_data_to_text_records_are_audited_with_evidence_on_json_paths(tmp_path: Path) -> None:
    converted = tmp_path / "d2t.jsonl"
    done = rt4("convert", "ragtruth", "--path", str(FIXTURES / "documents" / "ragtruth"), "--out", str(converted),
               cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in converted.read_text(encoding="utf-8").splitlines()]
    assert [(line["id"], [d["id"] for d in line["documents"]], "context" in line) for line in lines] == [
        ("d2t-1", ["15596"], False), ("d2t-2", ["15597"], False)]
    rules = {
        "decompose": {"free WiFi": ["Blue Lagoon Sushi offers free WiFi.", "Blue Lagoon Sushi offers delivery."]},
        "verify": [
            {"claim": "open on Sunday", "label": "entailed", "evidence": ["hours.Sunday: 12:00-20:00"]},
            {"claim": "free WiFi", "label": "entailed", "evidence": ["attributes.WiFi: u'free'"]},
            {"claim": "offers delivery", "label": "contradicted",
             "evidence": ["attributes.RestaurantsDelivery: false"]},
            {"claim": "outdoor seating", "label": "entailed", "evidence": ["attributes.OutdoorSeating: true"]},
            {"claim": "margaritas", "label": "entailed", "evidence": ["Great margaritas and a sunny patio."]},
        ],
    }
    rules_file = tmp_path / "rules.json"
    rules_file.write_text(json.dumps(rules), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    done = rt4("verify", str(converted), "--judge", f"scripted:{rules_file}", "--no-cache", "-o", str(out), "-q",
               cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [[(c["label"], [u["path"] for e in c["evidence"] for u in e["source"]["units"]]) for c in r["claims"]]
            for r in records] == [
        [("entailed", ["$.hours.Sunday"]), ("entailed", ["$.attributes.WiFi"]),
         ("contradicted", ["$.attributes.RestaurantsDelivery"])],
        [("entailed", ["$.attributes.OutdoorSeating"]), ("entailed", ["$.review_info[0].review_text"])],
    ]
    # The gold conflict span ("and delivery") lies in the contradicted claim's answer sentence.
    gold = records[0]["gold"]["spans"][0]
    contradicted = records[0]["claims"][2]["answer_span"]
    assert contradicted["start"] <= gold["start"] and gold["end"] <= contradicted["end"]


def test_rt4_show_names_each_evidence_s_source(tmp_path: Path) -> None:
    code, [record] = _verify(tmp_path, [AGENT_TURN], RULES, "--no-cache", "--decomposer", "judge")
    assert code == 1
    shown = rt4("show", "out.jsonl", "--input", "answers.jsonl", cwd=tmp_path)
    text = " ".join(shown.stdout.split())  # lines wrap where the console ends
    source = record["claims"][4]["evidence"][0]["source"]
    assert (f"sales_sql \u00b7 characters {source['start']}\u2013{source['end']} \u00b7 row 1, column region "
            "($[0].region) \u00b7 row 1, column revenue ($[0].revenue)") in text


def test_an_answer_cites_documents_by_their_ids(tmp_path: Path) -> None:
    line = {**AGENT_TURN, "answer": "The Oslo office opens at 8 am [kb-1]. The office closes at 6 pm [kb-1]."}
    rules = {"verify": [{"claim": "opens at 8 am", "label": "entailed", "evidence": ["It opens at 8 am."]},
                        {"claim": "closes at 6 pm", "label": "entailed", "evidence": ["The office closes at 6 pm."]}]}
    code, [record] = _verify(tmp_path, [line], rules, "--no-cache", "--decomposer", "rules")
    assert code == 0
    assert record["citations"]["passage_ids"] == ["weather_api", "sales_sql", "kb-1", "kb-2"]
    assert [(c["citation"]["verdict"], [e["source"]["document"] for e in c["evidence"]]) for c in record["claims"]] == [
        ("supported", ["kb-1"]), ("misattributed", ["kb-2"])]


def test_a_quote_across_two_documents_is_sourced_to_the_one_it_starts_in() -> None:
    sample = Sample.model_validate({"id": "x", "answer": "A.", "documents": [
        {"id": "a", "text": "The sky is blue."}, {"id": "b", "text": "Grass is green."}]})
    passages = passage_map(sample)
    assert passages is not None
    joined = join_passages(sample.context)[0]
    across = joined.index("blue"), joined.index("Grass") + len("Grass")
    assert passages.source(*across).model_dump() == {"document": "a", "start": 11, "end": 16}
    # Whitespace folding may let a quote begin on the separator: it begins in the next document.
    separator = joined.index("\n\n")
    assert passages.source(separator, len(joined)).model_dump() == {
        "document": "b", "start": 0, "end": 15}
