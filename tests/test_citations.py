"""Answers that cite their sources (rt4chart.method.citations), through the real ``rt4 verify``.

``fixtures/citations/cited_answers.jsonl`` holds 24 hand-made cited answers over one store's five
passages (given as plain strings, or named ``{"id", "text"}``), each line with the citation verdict,
the number of citations and the number of citations that count for ALCE precision of every claim,
labelled by hand (``expected``); ``rules.json`` scripts a judge that quotes each fact from the
passage that states it. ALCE precision and recall are computed here from those labels, and again
from the records' own labels and evidence offsets, never from the module's figures.
"""

from __future__ import annotations

import asyncio
import json
import re
import xml.etree.ElementTree as ElementTree
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from conftest import require_embedded
from fixtures.reports.runs import rt4

from rt4chart.judges.scripted import ScriptedBackend
from rt4chart.method.citations import find_citations
from rt4chart.method.tasks import VerifyInput
from rt4chart.method.text import join_passages
from rt4chart.options import AuditOptions
from rt4chart.protocol import BackendWrapper, JudgeRequest, JudgeResponse
from rt4chart.records.io import parse_sample
from rt4chart.runs.engine import Pipeline
from rt4chart.runs.planning import worst_case_calls
from rt4chart.types import Sample

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "citations"
ANSWERS = FIXTURES / "cited_answers.jsonl"
RULES = FIXTURES / "rules.json"
SCRIPTED = ["--judge", f"scripted:{RULES}", "--decomposer", "rules"]


def lines() -> list[dict[str, Any]]:
    return [json.loads(line) for line in ANSWERS.read_text(encoding="utf-8").splitlines()]


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def verify(directory: Path, *args: str, answers: Path = ANSWERS) -> tuple[int, list[dict[str, Any]]]:
    out = directory / "out.jsonl"
    completed = rt4("verify", str(answers), "--out", str(out), "--no-cache", "-q", *args, cwd=directory)
    return completed.returncode, records(out)


@cache
def _scripted_run(directory: str) -> tuple[int, tuple[str, ...]]:
    code, found = verify(Path(directory), *SCRIPTED, "--junit", "junit.xml", "--fail-on", "misattributed")
    return code, tuple(json.dumps(record) for record in found)


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, list[dict[str, Any]]]:
    directory = tmp_path_factory.mktemp("cited-scripted")
    code, found = _scripted_run(str(directory))
    return directory, code, [json.loads(record) for record in found]


# --- ALCE, computed here --------------------------------------------------------------------------


def alce(claims: list[tuple[str | None, int, int]]) -> tuple[float | None, float | None]:
    """ALCE citation (precision, recall) of one answer from (verdict, citations, citations that
    count) per claim: recall = supported claims / claims; precision = counting citations / citations
    (0 without any, as ALCE's eval.py scores an output that cites nothing)."""
    citations = sum(n for _, n, _ in claims)
    precision = (sum(r for _, _, r in claims) / citations if citations else 0.0) if claims else None
    recall = sum(verdict == "supported" for verdict, _, _ in claims) / len(claims) if claims else None
    return precision, recall


def mean(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return sum(known) / len(known) if known else None


_MARKER = re.compile(r"[ \t]*(?:\[\^?([^\[\]]+)\]|\(Sources? ([^()]+)\))")


def _refs(body: str) -> list[str]:
    return [ref.strip() for ref in re.split(r",|\band\b", body) if ref.strip()]


def own_markers(line: dict[str, Any]) -> list[tuple[int, int, list[str]]]:
    """The markers of a line's answer as this test reads them: (start, end, refs); ``[sic]`` is none."""
    ids = [p["id"] for p in line["context"]] if isinstance(line["context"][0], dict) else []
    found = []
    for match in _MARKER.finditer(line["answer"]):
        refs = _refs(match.group(1) or match.group(2))
        if all(ref.isdigit() or ref in ids for ref in refs):
            found.append((match.start() + len(match.group()) - len(match.group().lstrip(" \t")), match.end(), refs))
    return found


def without_markers(line: dict[str, Any]) -> str:
    """The line's answer with its markers (and the spaces before them) deleted, as by hand."""
    answer, kept, position = line["answer"], [], 0
    for start, end, _ in own_markers(line):
        kept.append(answer[position:start].rstrip(" \t"))
        position = end
    return "".join([*kept, answer[position:]])


def recomputed(line: dict[str, Any], record: dict[str, Any]) -> list[tuple[str | None, int, int]]:
    """Each claim's (citation verdict, citations, counting citations), derived from the record's
    claim labels, evidence offsets and cited check, and this test's own reading of the markers."""
    texts = [p["text"] if isinstance(p, dict) else p for p in line["context"]]
    ids = [p["id"] for p in line["context"]] if isinstance(line["context"][0], dict) else None
    _, starts = join_passages(texts)
    bounds = [(start, start + len(text)) for start, text in zip(starts, texts, strict=True)]

    def passage_at(offset: int) -> int:
        return next(index for index, (start, end) in enumerate(bounds) if start <= offset < end)

    def passage_of(ref: str) -> int | None:
        if ids is not None and ref in ids:
            return ids.index(ref)
        return int(ref) - 1 if ref.isdigit() and 1 <= int(ref) <= len(texts) else None

    sentence_starts = sorted({c["answer_span"]["start"] for c in record["claims"]})
    markers = own_markers(line)
    out = []
    for claim in record["claims"]:
        start = claim["answer_span"]["start"]
        following = [s for s in sentence_starts if s > start]
        until = following[0] if following else len(line["answer"]) + 1
        refs = [ref for m_start, _, refs in markers if start <= m_start < until for ref in refs]
        cited = list(dict.fromkeys(p for ref in refs if (p := passage_of(ref)) is not None))
        n_citations = len(cited) + len({ref for ref in refs if passage_of(ref) is None})
        evidence = {passage_at(e["start"]) for e in claim["evidence"]}
        if claim["label"] != "entailed":
            out.append(("unsupported" if refs else None, n_citations, 0))
            continue
        if not refs:
            out.append(("uncited", 0, 0))
            continue
        if evidence and evidence <= set(cited):
            supporting = evidence
        else:
            check = claim["citation"]["cited_check"]
            ran = check is not None and check["label"] == "entailed"
            supporting = {passage_at(e["start"]) for e in check["evidence"]} & set(cited) if ran else set()
        if not supporting:
            out.append(("misattributed", n_citations, 0))
        else:
            out.append(("supported", n_citations, alce_relevant(cited, supporting, claim["citation"]["subset_checks"])))
    return out


def alce_relevant(cited: list[int], supporting: set[int], checks: list[dict[str, Any]]) -> int:
    """ALCE's count of the citations that count of a supported claim: its one citation; of several,
    each whose passage alone supports the claim or without which the rest do not. A subset holding
    all the supporting evidence supports; the record's subset checks answer the rest."""
    if len(cited) == 1:
        return 1
    judged = {tuple(c["passages"]): c["label"] == "entailed" for c in checks}

    def holds(passages: set[int]) -> bool:
        return supporting <= passages or judged[tuple(sorted(passages))]

    return sum(holds({p}) or not holds(set(cited) - {p}) for p in cited)


# --- the hand-labelled set through rt4 verify ------------------------------------------------------


def test_the_set_is_big_enough_and_covers_every_verdict() -> None:
    expected = [verdict for line in lines() for verdict, _, _ in line["expected"]]
    assert len(lines()) >= 20
    assert {"supported", "misattributed", "unsupported", "uncited", None} <= set(expected)


def test_every_claim_gets_its_hand_labelled_citation_verdict(scripted: tuple[Path, int, list[dict[str, Any]]]) -> None:
    _, _, found = scripted
    for line, record in zip(lines(), found, strict=True):
        got = [
            [c["citation"]["verdict"], len(c["citation"]["cited"]) + len(c["citation"]["unresolved"]),
             len(c["citation"]["relevant"])]
            for c in record["claims"]
        ]
        assert got == line["expected"], line["id"]


def test_alce_precision_and_recall_per_answer_and_per_run(scripted: tuple[Path, int, list[dict[str, Any]]]) -> None:
    directory, _, found = scripted
    per_answer = [alce([tuple(claim) for claim in line["expected"]]) for line in lines()]
    for (precision, recall), record in zip(per_answer, found, strict=True):
        assert record["citations"]["precision"] == pytest.approx(precision) if precision is not None else (
            record["citations"]["precision"] is None)
        assert record["citations"]["recall"] == pytest.approx(recall)
    manifest = json.loads((directory / "out.jsonl.manifest.json").read_text(encoding="utf-8"))
    run = manifest["counts"]["citations"]
    assert run["precision"] == pytest.approx(mean([p for p, _ in per_answer]))
    assert run["recall"] == pytest.approx(mean([r for _, r in per_answer]))
    counted = [verdict for line in lines() for verdict, _, _ in line["expected"]]
    assert run["verdicts"] == {v: counted.count(v) for v in ("supported", "misattributed", "unsupported", "uncited")}


def test_the_records_own_labels_and_evidence_give_the_same_verdicts(
    scripted: tuple[Path, int, list[dict[str, Any]]],
) -> None:
    _, _, found = scripted
    for line, record in zip(lines(), found, strict=True):
        assert [list(claim) for claim in recomputed(line, record)] == line["expected"], line["id"]


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, list[dict[str, Any]]]:
    """The set audited by the embedded judge (the default one, offline) through ``rt4 verify``."""
    require_embedded()
    directory = tmp_path_factory.mktemp("cited-embedded")
    code, found = verify(directory, "--judge", "embedded")
    return directory, code, found


def test_the_embedded_judge_end_to_end(embedded: tuple[Path, int, list[dict[str, Any]]]) -> None:
    # Its verdicts are its own, so the check is that every citation verdict and figure follows from
    # its labels and evidence as defined, recomputed here.
    directory, code, found = embedded
    assert code in (0, 1)
    assert len(found) == len(lines())
    per_answer = []
    for line, record in zip(lines(), found, strict=True):
        claims = recomputed(line, record)
        assert [c["citation"]["verdict"] for c in record["claims"]] == [verdict for verdict, _, _ in claims], line["id"]
        per_answer.append(alce(claims))
        precision, recall = per_answer[-1]
        assert record["citations"]["recall"] == pytest.approx(recall)
        assert record["citations"]["precision"] == (pytest.approx(precision) if precision is not None else None)
    run = json.loads((directory / "out.jsonl.manifest.json").read_text(encoding="utf-8"))["counts"]["citations"]
    assert run["recall"] == pytest.approx(mean([r for _, r in per_answer]))


def test_misattributed_answers_fail_the_run_and_show_in_junit(scripted: tuple[Path, int, list[dict[str, Any]]]) -> None:
    directory, code, _ = scripted
    failing = {line["id"] for line in lines() if any(v == "misattributed" for v, _, _ in line["expected"])}
    assert code == 1
    suite = ElementTree.parse(directory / "junit.xml").getroot().find("testsuite")
    assert suite is not None
    failed = {case.get("name") for case in suite.iter("testcase") if case.find("failure") is not None}
    assert failed == failing
    text = next(case.find("failure") for case in suite.iter("testcase") if case.get("name") == "named-wrong-id")
    assert text is not None and "cites refunds" in (text.text or "") and "supported by returns" in (text.text or "")


@pytest.mark.parametrize(("policy", "ids", "code"), [
    ("misattributed", ["plain-one-marker", "named-baseless-uncited"], 0),
    ("miscited", ["plain-one-marker", "plain-uncited"], 1),
    ("miscited", ["plain-one-marker", "named-after-period"], 0),
    ("misattributed", ["plain-one-marker", "plain-wrong-passage"], 1),
])
def test_citation_policies_decide_the_exit_code_and_annotations(
    tmp_path: Path, policy: str, ids: list[str], code: int,
) -> None:
    subset = tmp_path / "subset.jsonl"
    subset.write_text("".join(json.dumps(line) + "\n" for line in lines() if line["id"] in ids), encoding="utf-8")
    out = tmp_path / "out.jsonl"
    completed = rt4("verify", str(subset), "--out", str(out), "--no-cache", "-q", "--github", "--fail-on", policy,
                    *SCRIPTED, cwd=tmp_path)
    assert completed.returncode == code, completed.stderr
    annotations = [line for line in completed.stdout.splitlines() if line.startswith("::error")]
    assert len(annotations) == code  # one failing answer, annotated on its own input line
    if code:
        assert "line=2" in annotations[0] and f"citations {policy}" in annotations[0]


# --- markers, ids and offsets ---------------------------------------------------------------------


def test_stripped_markers_keep_their_offsets_and_claim_spans_map_to_the_answer(
    scripted: tuple[Path, int, list[dict[str, Any]]],
) -> None:
    _, _, found = scripted
    for line, record in zip(lines(), found, strict=True):
        answer = line["answer"]
        markers = record["citations"]["markers"]
        assert [(m["start"], m["end"]) for m in markers] == [(s, e) for s, e, _ in own_markers(line)], line["id"]
        for marker in markers:
            assert answer[marker["start"] : marker["end"]] == marker["text"]
        for claim in record["claims"]:
            start, end = claim["answer_span"]["start"], claim["answer_span"]["end"]
            # The sentence's span in the answer as given, the markers inside it deleted by offsets.
            kept, position = [], start
            for m_start, m_end, _ in own_markers(line):
                if start <= m_start < end:
                    kept.append(answer[position:m_start].rstrip(" "))
                    position = m_end
            kept.append(answer[position:end])
            assert claim["text"].strip(" ;") in "".join(kept), (line["id"], claim["text"])
            assert not any(m["text"] in claim["text"] for m in markers)


@pytest.mark.parametrize(("answer", "refs"), [
    ("Fact one [1].", [["1"]]),
    ("Fact one [1, 3].", [["1", "3"]]),
    ("Fact one [1][2].", [["1"], ["2"]]),
    ("Fact one [^2].", [["2"]]),
    ("Fact one (Source 2).", [["2"]]),
    ("Fact one (sources 1 and 3).", [["1", "3"]]),
    ("Fact one [sic] stays [2].", [["2"]]),
    ("Fact one [citation needed].", None),
    ("Fact one and nothing cited.", None),
])
def test_marker_forms(answer: str, refs: list[list[str]] | None) -> None:
    sample = Sample(id="x", context=["a.", "b.", "c."], answer=answer)
    cited = find_citations(sample)
    if refs is None:
        assert cited is None
        return
    assert cited is not None
    assert [m.refs for m in cited.markers] == refs
    assert "[" not in cited.answer.replace("[sic]", "") and "(Source" not in cited.answer
    assert cited.sentences[0].text == cited.answer
    assert answer[cited.sentences[0].start : cited.sentences[0].end].startswith("Fact one")


def test_a_single_string_context_has_no_passages_to_cite() -> None:
    assert find_citations(Sample(id="x", context="One text [1].", answer="It says so [1].")) is None


def test_passage_ids_and_positions() -> None:
    sample = Sample.model_validate({
        "id": "x", "answer": "A [doc-7]. B [2]. C [doc-9].",
        "context": [{"id": "doc-7", "text": "a."}, {"id": "doc-8", "text": "b."}],
    })
    assert sample.context == ["a.", "b."] and sample.passage_ids == ["doc-7", "doc-8"]
    cited = find_citations(sample)
    assert cited is not None
    # An unknown id is no marker (it stays in the text); a number is a position.
    assert [(m.refs, m.passages, m.sentence_index) for m in cited.markers] == [(["doc-7"], [0], 0), (["2"], [1], 1)]
    assert "[doc-9]" in cited.answer


@pytest.mark.parametrize("context", [
    [{"id": "a", "text": "x."}, {"id": "a", "text": "y."}],
    [{"id": "a", "text": "x."}, "y."],
    [{"id": "a"}],
])
def test_badly_named_passages_are_a_clear_error_and_one_record(tmp_path: Path, context: list[Any]) -> None:
    answers = tmp_path / "in.jsonl"
    answers.write_text(json.dumps({"id": "bad", "context": context, "answer": "It says so [a]."}) + "\n"
                       + json.dumps(lines()[0]) + "\n", encoding="utf-8")
    code, found = verify(tmp_path, *SCRIPTED, answers=answers)
    assert code == 2 and len(found) == 2
    assert found[0]["label"] is None and "context" in found[0]["errors"][0]
    assert found[1]["citations"]["verdicts"]["supported"] == 1


def test_a_configured_pattern_is_a_cli_flag(tmp_path: Path) -> None:
    answer = "Laptops can be returned within 30 days <cite 2>. Express shipping costs 15 dollars <cite 3>."
    line = {**lines()[0], "answer": answer}
    answers = tmp_path / "in.jsonl"
    answers.write_text(json.dumps(line) + "\n", encoding="utf-8")
    code, found = verify(tmp_path, *SCRIPTED, "--citation-pattern", r"<cite (?P<refs>[^>]+)>", answers=answers)
    assert code == 0
    assert [c["citation"]["verdict"] for c in found[0]["claims"]] == ["misattributed", "supported"]
    bad = rt4("verify", str(answers), "--citation-pattern", "(", *SCRIPTED, cwd=tmp_path)
    assert bad.returncode == 2 and "citation_pattern" in bad.stderr.replace("-", "_")


# --- answers without markers, and the judge's view ------------------------------------------------


def test_answers_without_markers_give_records_without_citation_fields(tmp_path: Path) -> None:
    examples = Path(__file__).resolve().parent.parent / "examples"
    code, found = verify(tmp_path, "--judge", f"scripted:{examples / 'answers.rules.json'}",
                         answers=examples / "answers.jsonl")
    assert code in (0, 1) and found
    assert all("citations" not in record and all("citation" not in c for c in record["claims"]) for record in found)


def test_the_judge_sees_the_answer_without_its_markers(scripted: tuple[Path, int, list[dict[str, Any]]]) -> None:
    # The same answers with their markers deleted by hand: the same claims, the same verdicts.
    _, _, found = scripted
    backend = ScriptedBackend.from_file(RULES)
    pipeline = Pipeline(backend, AuditOptions(decomposer="rules"))
    for number, (line, record) in enumerate(zip(lines(), found, strict=True), 1):
        sample = parse_sample({**line, "answer": without_markers(line)}, number).sample
        assert sample is not None
        twin = asyncio.run(pipeline.verify_sample(sample))
        assert twin.citations is None
        assert [(c.text, c.label) for c in twin.claims] == [(c["text"], c["label"]) for c in record["claims"]]


def test_the_worst_case_plan_bounds_the_run_and_counts_the_cited_checks(
    scripted: tuple[Path, int, list[dict[str, Any]]],
) -> None:
    _, _, found = scripted
    pipeline = Pipeline(ScriptedBackend.from_file(RULES), AuditOptions(decomposer="rules"))
    for number, (line, record) in enumerate(zip(lines(), found, strict=True), 1):
        sample = parse_sample(line, number).sample
        assert sample is not None
        twin = sample.model_copy(update={"answer": without_markers(line)})
        assert worst_case_calls(pipeline, sample) >= record["usage"]["calls"]
        if record["citations"]["checks"]:
            assert worst_case_calls(pipeline, sample) > worst_case_calls(pipeline, twin)


def test_rt4_estimate_with_the_embedded_judge_plans_the_cited_checks(
    tmp_path: Path, embedded: tuple[Path, int, list[dict[str, Any]]],
) -> None:
    plan = rt4("estimate", str(ANSWERS), "--json", cwd=tmp_path)
    assert plan.returncode == 0, plan.stderr
    _, _, found = embedded
    assert json.loads(plan.stdout)["calls_expected"] == sum(r["usage"]["calls"] for r in found)
    assert any(r["citations"]["checks"] for r in found)
    assert any("citations:" in note for note in json.loads(plan.stdout)["notes"])


def test_the_readme_example(tmp_path: Path) -> None:
    examples = Path(__file__).resolve().parent.parent / "examples"
    code, found = verify(tmp_path, "--judge", f"scripted:{examples / 'cited_answers.rules.json'}",
                         answers=examples / "cited_answers.jsonl")
    assert code == 1  # one answer is contradicted
    verdicts = {record["id"]: [c["citation"]["verdict"] for c in record["claims"]] for record in found}
    assert verdicts == {
        "clinic-supported": ["supported", "supported"],
        "clinic-misattributed": ["misattributed"],
        "clinic-unsupported": ["unsupported"],
        "clinic-uncited": ["supported", "uncited"],
        "clinic-numbered": ["supported", "supported"],
    }


def test_rt4_compare_checks_citations_on_its_shared_claims(tmp_path: Path) -> None:
    flag = tmp_path / "flag.rules.json"
    flag.write_text(json.dumps({"default": "baseless"}), encoding="utf-8")
    completed = rt4("compare", str(ANSWERS), "--judges", f"scripted:{RULES},scripted:{flag}", "--out-dir", "out",
                    "--no-cache", "-q", "--resamples", "20", cwd=tmp_path)
    assert completed.returncode in (0, 1), completed.stderr
    runs = [records(f) for f in sorted((tmp_path / "out").glob("scripted*.jsonl"))]
    assert len(runs) == 2
    by_rules = next(found for found in runs if found[0]["claims"][0]["label"] == "entailed")
    by_flag = next(found for found in runs if found[0]["claims"][0]["label"] == "baseless")
    for line, rules_record, flag_record in zip(lines(), by_rules, by_flag, strict=True):
        assert [c["citation"]["verdict"] for c in rules_record["claims"]] == [v for v, _, _ in line["expected"]]
        # A judge that finds nothing entailed: every cited claim unsupported, no other verdict.
        assert {c["citation"]["verdict"] for c in flag_record["claims"]} <= {"unsupported", None}


class RefusesCitedChecks(BackendWrapper):
    """The scripted judge, except that it fails every check against cited passages alone (the only
    local request of these one-chunk contexts that names no chunk)."""

    async def complete(self, request: JudgeRequest) -> JudgeResponse:
        payload = request.payload
        if isinstance(payload, VerifyInput) and payload.stage == "local" and payload.chunk is None:
            return JudgeResponse(error="refused", judge=self.name)
        return await self.inner.complete(request)


def test_a_failed_cited_check_leaves_the_citation_open_and_says_why() -> None:
    line = next(line for line in lines() if line["id"] == "plain-list-items")  # one supported, one checked
    sample = parse_sample(line, 1).sample
    assert sample is not None
    record = asyncio.run(
        Pipeline(RefusesCitedChecks(ScriptedBackend.from_file(RULES)), AuditOptions(decomposer="rules"))
        .verify_sample(sample)
    )
    supported, checked = record.claims
    assert supported.citation is not None and supported.citation.verdict == "supported"
    assert checked.citation is not None and checked.citation.verdict is None
    assert checked.citation.cited_check is not None and checked.citation.cited_check.label is None
    assert any("citation check failed" in error for error in checked.errors)
    assert record.citations is not None and record.citations.recall == 1.0  # the open claim is not scored
    assert record.citations.checks == 1 and record.label == "entailed"


def test_rt4_show_prints_each_claims_citation(scripted: tuple[Path, int, list[dict[str, Any]]]) -> None:
    directory, _, _ = scripted
    shown = rt4("show", "out.jsonl", "--input", str(ANSWERS), "--id", "named-wrong-id", cwd=directory)
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert "citations: ALCE precision 0.00 · ALCE recall 0.00 · 0 supported, 1 misattributed" in text
    assert "citation: misattributed · cites refunds · supported by returns · cited passages alone: baseless" in text


@pytest.mark.parametrize("policy", ["misattributed", "miscited"])
def test_rt4_show_only_the_answers_failing_a_citation_policy(
    scripted: tuple[Path, int, list[dict[str, Any]]], policy: str,
) -> None:
    directory, _, _ = scripted
    failing = {"misattributed": {"misattributed"}, "miscited": {"misattributed", "unsupported", "uncited"}}[policy]
    expected = [line["id"] for line in lines() if any(v in failing for v, _, _ in line["expected"])]
    shown = rt4("show", "out.jsonl", "--only", policy, "--all", cwd=directory)
    assert shown.returncode == 0, shown.stderr
    headings = [line.split()[0] for line in shown.stdout.splitlines() if re.match(r"^\S+\s+line \d+", line)]
    assert headings == expected
