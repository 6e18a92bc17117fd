"""Claim-level repair (``rt4chart.method.repair``, ``rt4 repair``): real audits by scripted judges, then
each strategy; edits are checked against the original answer and applied back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import LLAMA_MAX_TOKENS
from fixtures.spine.judges import RecordingBackend
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import rt4chart
from rt4chart.cli.app import app
from rt4chart.judges.litellm import LiteLLMBackend
from rt4chart.judges.registry import JudgeProfile
from rt4chart.judges.scripted import ScriptedBackend
from rt4chart.judges.serve import LocalServer
from rt4chart.method.decompose import decompose_by_rules
from rt4chart.method.repair import Edit, Repairer, RepairRecord, RepairStrategy, apply_edits, summarize
from rt4chart.method.tasks import RepairInput, RepairOutput, load_prompts, template_version
from rt4chart.method.text import join_passages, segment_context, split_sentences
from rt4chart.protocol import GenerationParams, JudgeRequest, JudgeResponse
from rt4chart.types import AuditRecord, ClaimVerdict, Evidence, Gold, Label, Sample

CONTEXT = [
    "Café Zürich opened in 1998 in Geneva. It serves crème brûlée daily.",
    "The owner is Ana Müller. The café closes on Mondays. 店は駅の近くにあります。",
]
OPENED = "Café Zürich opened in 1998 in Geneva."
CLAUSES = "Café Zürich opened in 2005; it serves crème brûlée daily. The owner is Ana Müller."
"""Two sentences, the first of two clauses (the rule-based decomposer's claims), one contradicted."""
MONDAYS = "The café closes on Mondays."

RULES: dict[str, Any] = {
    "decompose": {
        "opened in 2005 and serves": ["Café Zürich opened in 2005.", "Café Zürich serves crème brûlée daily."],
    },
    "verify": [
        {"claim": "2005", "label": "contradicted", "evidence": ["opened in 1998"]},
        {"claim": "in 2001", "label": "contradicted", "evidence": ["Café Zürich opened in 1998"]},
        {"claim": "Sundays", "label": "contradicted", "evidence": ["closes on Mondays"]},
        {"claim": "crème brûlée", "label": "entailed", "evidence": ["It serves crème brûlée daily."]},
        {"claim": "Ana Müller", "label": "entailed", "evidence": ["The owner is Ana Müller."]},
        {"claim": "Mondays", "label": "entailed", "evidence": [MONDAYS]},
        {"claim": "opened in 1998", "label": "entailed", "evidence": [OPENED]},
        {"claim": "駅の近く", "label": "entailed", "evidence": ["店は駅の近くにあります。"]},
    ],
    "repair": [
        {"sentence": "opened in 2005; it serves", "text": "Café Zürich opened in 1998; it serves crème brûlée daily."},
    ],
    "default": "baseless",
}


@pytest.fixture
def scripted(tmp_path: Path) -> ScriptedBackend:
    path = tmp_path / "rules.json"
    path.write_text(json.dumps(RULES, ensure_ascii=False), encoding="utf-8")
    return ScriptedBackend.from_file(path)


def audit(answer: str, judge: ScriptedBackend, decomposer: str = "rules") -> tuple[AuditRecord, Sample]:
    sample = Sample(id="s", context=CONTEXT, question="Tell me about Café Zürich.", answer=answer)
    return rt4chart.verify(sample, judge=judge, decomposer=decomposer), sample


def repair(strategy: RepairStrategy, report: AuditRecord, sample: Sample, judge: Any = None) -> RepairRecord:
    record = asyncio.run(Repairer(strategy, judge).repair(report, sample))
    check_edits(record, sample)
    return record


def check_edits(record: RepairRecord, sample: Sample) -> None:
    """Offsets valid against the original; applying the edits gives the repaired answer exactly."""
    assert record.original == sample.answer
    assert record.repaired is not None, record.errors
    position = 0
    for edit in record.edits:
        assert position <= edit.start <= edit.end <= len(sample.answer)
        assert sample.answer[edit.start : edit.end] == edit.removed
        assert edit.removed or edit.inserted, "an edit changes something"
        position = edit.end
    assert apply_edits(sample.answer, record.edits) == record.repaired


def check_invents_nothing(record: RepairRecord, sample: Sample) -> None:
    """remove/extract without a judge: outside the edits the text is the original's; every inserted
    text is whole context sentences (each named in the edit's evidence) and the spaces between them."""
    context, _ = join_passages(sample.context)
    for edit in record.edits:
        assert not edit.generated
        rest = edit.inserted
        for evidence in edit.evidence if edit.inserted else []:
            assert context[evidence.start : evidence.end] == evidence.text
            assert evidence.text in rest
            rest = rest.replace(evidence.text, "", 1)
        assert not rest.strip(), f"text from neither the answer nor the context: {rest!r}"
    assert set(record.repaired or "") <= set(sample.answer) | set(context)


# --- multi-claim sentences ---------------------------------------------------------------------


def test_remove_cuts_only_the_unsupported_clause_of_a_rule_decomposed_sentence(scripted: ScriptedBackend) -> None:
    report, sample = audit(CLAUSES, scripted)
    assert [c.label for c in report.claims] == [Label.CONTRADICTED, Label.ENTAILED, Label.ENTAILED]
    record = repair("remove", report, sample)
    assert record.repaired == "it serves crème brûlée daily. The owner is Ana Müller."
    [edit] = record.edits
    assert (edit.removed, edit.claims) == ("Café Zürich opened in 2005; ", [0])
    assert edit.evidence and edit.evidence[0].text == "opened in 1998"
    assert record.claim_retention == 1.0
    check_invents_nothing(record, sample)


def test_remove_keeps_the_closing_punctuation_when_the_last_clause_goes(scripted: ScriptedBackend) -> None:
    answer = "Café Zürich serves crème brûlée daily; it opened in 2005; the owner is Ana Müller!"
    report, sample = audit(answer, scripted)
    record = repair("remove", report, sample)
    assert record.repaired == "Café Zürich serves crème brûlée daily; the owner is Ana Müller!"
    report, sample = audit("Ana Müller owns it; it serves crème brûlée daily; it opened in 2005.", scripted)
    record = repair("remove", report, sample)
    assert record.repaired == "Ana Müller owns it; it serves crème brûlée daily."
    assert [e.removed for e in record.edits] == ["; it opened in 2005"]


def test_mixed_sentence_of_judge_claims_is_dropped_without_a_judge_and_rewritten_with_one(
    scripted: ScriptedBackend,
) -> None:
    answer = "Café Zürich opened in 2005 and serves crème brûlée daily. The owner is Ana Müller."
    report, sample = audit(answer, scripted, decomposer="judge")
    assert [c.label for c in report.claims] == [Label.CONTRADICTED, Label.ENTAILED, Label.ENTAILED]
    dropped = repair("remove", report, sample)
    assert dropped.repaired == "The owner is Ana Müller."
    assert "not separate clauses" in dropped.edits[0].reason
    assert dropped.claim_retention == 0.5  # the supported claim of the dropped sentence is lost
    rewritten = repair("remove", report, sample, judge=scripted)
    # the scripted judge's default rewrite: the sentence's supported claims
    assert rewritten.repaired == "Café Zürich serves crème brûlée daily. The owner is Ana Müller."
    [edit] = rewritten.edits
    assert edit.generated and edit.claims == [0]
    assert rewritten.judge == scripted.name and rewritten.prompt_version == template_version(load_prompts()["repair"])
    assert rewritten.claim_retention == 1.0


def test_extract_puts_the_contradicting_context_after_a_shortened_sentence(scripted: ScriptedBackend) -> None:
    report, sample = audit(CLAUSES, scripted)
    record = repair("extract", report, sample)
    assert record.repaired == f"it serves crème brûlée daily. {OPENED} The owner is Ana Müller."
    _, inserted = record.edits
    assert inserted.start == inserted.end and inserted.evidence[0].sentence_ids == [0]
    check_invents_nothing(record, sample)


def test_rewrite_changes_only_what_the_judge_rewrote(scripted: ScriptedBackend) -> None:
    report, sample = audit(CLAUSES, scripted)
    record = repair("rewrite", report, sample, judge=scripted)
    assert record.repaired == "Café Zürich opened in 1998; it serves crème brûlée daily. The owner is Ana Müller."
    [edit] = record.edits
    # narrowed to the characters the rewrite changed; the rest of the sentence is kept verbatim
    assert (edit.start, edit.removed, edit.inserted, edit.generated) == (22, "2005", "1998", True)
    assert edit.claims == [0] and edit.evidence[0].text == "opened in 1998"


def test_rewrite_request_carries_keep_and_fix_groups_and_the_context(scripted: ScriptedBackend) -> None:
    recorder = RecordingBackend(scripted)
    report, sample = audit("It opened in 2005. The owner is Ana Müller; it closes on Sundays.", scripted)
    repair("rewrite", report, sample, judge=recorder)
    [request] = recorder.requests
    assert request.task == "repair" and isinstance(request.payload, RepairInput)
    first, second = request.payload.items
    assert (first.keep, first.fix, first.drop) == ([], ["It opened in 2005."], [])
    assert (second.keep, second.fix) == (["The owner is Ana Müller"], ["it closes on Sundays."])
    assert len(request.payload.context) == len(segment_context(CONTEXT)[1])
    assert "[S3] The café closes on Mondays." in request.messages[1].content
    assert "fix:\n  - it closes on Sundays." in request.messages[1].content


# --- adjacent sentences, all flagged, overlapping evidence -------------------------------------


def test_adjacent_flagged_sentences(scripted: ScriptedBackend) -> None:
    answer = "The owner is Ana Müller. It opened in 2005. It closes on Sundays. 店は駅の近くにあります。"
    report, sample = audit(answer, scripted)
    removed = repair("remove", report, sample)
    assert removed.repaired == "The owner is Ana Müller. 店は駅の近くにあります。"
    check_invents_nothing(removed, sample)
    extracted = repair("extract", report, sample)
    assert extracted.repaired == f"The owner is Ana Müller. {OPENED} {MONDAYS} 店は駅の近くにあります。"
    assert [e.evidence[0].sentence_ids for e in extracted.edits] == [[0], [3]]
    check_invents_nothing(extracted, sample)


def test_adjacent_flagged_sentences_at_the_end_leave_no_trailing_space(scripted: ScriptedBackend) -> None:
    report, sample = audit("The owner is Ana Müller. It opened in 2005. It is in Paris.", scripted)
    record = repair("remove", report, sample)
    assert record.repaired == "The owner is Ana Müller."
    assert len(record.edits) == 1, "deletions that share whitespace are merged"


def test_answer_with_every_claim_flagged_gives_an_empty_repair(scripted: ScriptedBackend) -> None:
    report, sample = audit("1. It opened in 2005.\n2. It is in Paris; it closes on Sundays.", scripted)
    assert all(c.label != Label.ENTAILED for c in report.claims)
    record = repair("remove", report, sample)
    assert record.repaired == "" and record.empty
    [edit] = record.edits
    assert (edit.start, edit.end) == (0, len(sample.answer))
    assert edit.claims == [c.index for c in report.claims]
    assert record.text_retention == 0.0 and record.claim_retention is None
    extracted = repair("extract", report, sample)
    assert not extracted.empty
    assert extracted.repaired == f"1. {OPENED}\n2. {MONDAYS}"


def test_list_items_go_with_their_marker(scripted: ScriptedBackend) -> None:
    report, sample = audit("1. It opened in 2005.\n2. The owner is Ana Müller.\n3. It is in Paris.", scripted)
    assert repair("remove", report, sample).repaired == "2. The owner is Ana Müller."


def test_overlapping_evidence_is_put_in_once(scripted: ScriptedBackend) -> None:
    report, sample = audit("It opened in 2005. Really, it opened in 2001. The owner is Ana Müller.", scripted)
    quotes = [e.text for c in report.claims[:2] for e in c.evidence]
    assert quotes == ["opened in 1998", "Café Zürich opened in 1998"]  # overlapping quotes of sentence 0
    record = repair("extract", report, sample)
    assert record.repaired == f"{OPENED} The owner is Ana Müller."
    check_invents_nothing(record, sample)


def test_an_entailed_answer_is_left_alone(scripted: ScriptedBackend) -> None:
    report, sample = audit("The owner is Ana Müller.", scripted)
    for strategy in ("remove", "extract"):
        record = repair(strategy, report, sample)  # type: ignore[arg-type]
        assert (record.repaired, record.edits, record.text_retention) == (sample.answer, [], 1.0)


# --- judges that fail ---------------------------------------------------------------------------


def test_a_failed_rewrite_deletes_the_flagged_sentences_and_says_so(scripted: ScriptedBackend) -> None:
    def fail(request: JudgeRequest, response: JudgeResponse) -> JudgeResponse:
        return JudgeResponse(error="HTTP 500", judge=response.judge)

    report, sample = audit("It opened in 2005. The owner is Ana Müller.", scripted)
    record = repair("rewrite", report, sample, judge=RecordingBackend(scripted, rewrite=fail))
    assert record.repaired == "The owner is Ana Müller."
    assert any("rewrite failed (HTTP 500)" in e for e in record.errors)


def test_a_rewrite_that_skips_a_sentence_deletes_it(scripted: ScriptedBackend) -> None:
    def skip_first(request: JudgeRequest, response: JudgeResponse) -> JudgeResponse:
        assert isinstance(response.parsed, RepairOutput)
        kept = RepairOutput(sentences=[s for s in response.parsed.sentences if s.sentence != 0])
        return response.model_copy(update={"parsed": kept})

    report, sample = audit("It opened in 2005. The owner is Ana Müller; it closes on Sundays.", scripted)
    record = repair("rewrite", report, sample, judge=RecordingBackend(scripted, rewrite=skip_first))
    assert record.repaired == "The owner is Ana Müller"
    assert any("no rewrite for flagged sentences [0]" in e for e in record.errors)


def test_a_record_of_another_answer_is_an_error_not_a_crash(scripted: ScriptedBackend) -> None:
    report, _ = audit("It opened in 2005. The owner is Ana Müller.", scripted)
    other = Sample(id="s", context=CONTEXT, answer="Short.")
    record = asyncio.run(Repairer("remove").repair(report, other))
    assert record.repaired is None and "does not belong to this sample" in record.errors[0]


def test_smollm2_rewrites_through_llamacpp_into_a_consistent_record(
    llamacpp: LocalServer, scripted: ScriptedBackend
) -> None:
    """Plumbing with a real model: the repair prompt and schema go through llama.cpp and litellm;
    whatever SmolLM2-135M writes (or fails to), the record's edits apply back exactly."""
    profile = JudgeProfile(name="openai/smollm2", model="openai/smollm2", max_attempts=2, backoff_s=0.01)
    backend = LiteLLMBackend(profile.litellm_settings(), api_key="no-key", api_base=llamacpp.api_base)
    report, sample = audit(CLAUSES, scripted)
    repairer = Repairer("rewrite", backend, GenerationParams(max_tokens=LLAMA_MAX_TOKENS))
    try:
        record = asyncio.run(repairer.repair(report, sample))
    finally:
        asyncio.run(backend.aclose())
    check_edits(record, sample)
    assert record.judge == backend.name and record.prompt_version == template_version(load_prompts()["repair"])
    assert record.usage.calls >= 1 and record.usage.prompt_tokens > 200
    assert record.edits, "the flagged sentence is rewritten or, when the reply is unusable, deleted"
    assert all(e.generated for e in record.edits) or any("rewrite failed" in e for e in record.errors)
    assert not any(e.start < len("Café Zürich opened in 2005; it serves crème brûlée daily. ") < e.end
                   for e in record.edits if not e.generated), "the entailed sentence is never deleted"


# --- the property: remove and extract invent nothing ------------------------------------------

WORD = st.text(alphabet="abcxyzéüßж日本 ", min_size=1, max_size=8).map(lambda w: w.strip() or "w")
CLAUSE = st.lists(WORD, min_size=1, max_size=4).map(" ".join)
SENTENCE = st.lists(CLAUSE, min_size=1, max_size=3).map(lambda parts: "; ".join(parts).capitalize() + ".")
LINE = st.tuples(st.sampled_from(["", "- ", "1. "]), st.lists(SENTENCE, min_size=1, max_size=3)).map(
    lambda t: t[0] + " ".join(t[1])
)
ANSWER = st.lists(LINE, min_size=1, max_size=4).map("\n".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answer=ANSWER, data=st.data(), strategy=st.sampled_from(["remove", "extract"]))
def test_remove_and_extract_take_every_character_from_the_answer_or_the_context(
    answer: str, data: st.DataObject, strategy: RepairStrategy
) -> None:
    context_text, sentences = segment_context(CONTEXT)
    claims = decompose_by_rules(split_sentences(answer))
    verdicts = []
    for claim in claims:
        label = data.draw(st.sampled_from([Label.ENTAILED, Label.CONTRADICTED, Label.BASELESS, None]))
        cited = data.draw(st.lists(st.sampled_from(sentences), max_size=2)) if label == Label.CONTRADICTED else []
        evidence = [Evidence(start=s.start, end=s.end, text=s.text, sentence_ids=[s.index]) for s in cited]
        verdicts.append(ClaimVerdict(**claim.model_dump(), label=label, evidence=evidence))
    report = AuditRecord(id="p", line=1, label=Label.BASELESS, hallucinated=True, claims=verdicts)
    sample = Sample(id="p", context=CONTEXT, answer=answer)
    record = repair(strategy, report, sample)
    check_invents_nothing(record, sample)
    supported = [v for v in verdicts if v.label == Label.ENTAILED]
    if not supported and (strategy == "remove" or not any(v.evidence for v in verdicts)):
        assert record.empty and record.repaired == ""
    for verdict in supported:  # whole supported sentences are never touched
        span = verdict.answer_span
        assert span is not None
        siblings = [v for v in verdicts if v.answer_span == span]
        if all(v.label == Label.ENTAILED for v in siblings):
            assert not any(e.start < span.end and e.end > span.start for e in record.edits)
    assert context_text  # the context the evidence was drawn from


def _report(answer: str, labels: list[Label]) -> tuple[AuditRecord, Sample]:
    claims = decompose_by_rules(split_sentences(answer))
    verdicts = [ClaimVerdict(**c.model_dump(), label=label) for c, label in zip(claims, labels, strict=True)]
    return AuditRecord(id="r", line=1, label=Label.BASELESS, hallucinated=True, claims=verdicts), Sample(
        id="r", context=CONTEXT, answer=answer
    )


@pytest.mark.parametrize(
    ("answer", "labels", "repaired"),
    [
        # found by the property test: a line emptied sentence by sentence loses its marker too
        ("- A. A. A.", [Label.CONTRADICTED, Label.BASELESS, Label.CONTRADICTED], ""),
        # and a sentence that looks like a list marker ("A.") is a sentence, not a marker
        ("A. A.", [Label.ENTAILED, Label.CONTRADICTED], "A."),
        ("Xx.\n- Bb. Cc.\nYy.", [Label.ENTAILED, Label.BASELESS, Label.BASELESS, Label.ENTAILED], "Xx.\nYy."),
    ],
)
def test_whitespace_and_markers_left_by_deleted_sentences(answer: str, labels: list[Label], repaired: str) -> None:
    report, sample = _report(answer, labels)
    assert repair("remove", report, sample).repaired == repaired


# --- summary and CLI -------------------------------------------------------------------------


def test_summary_counts_gold_clean_answers_that_were_edited() -> None:
    def record(edited: bool, clean: bool | None) -> RepairRecord:
        edits = [Edit(start=0, end=1, removed="x", reason="r")] if edited else []
        gold = None if clean is None else Gold(hallucinated=not clean)
        return RepairRecord(id="a", line=1, strategy="remove", original="x", repaired="" if edited else "x",
                            edits=edits, text_retention=0.0 if edited else 1.0, gold=gold)

    summary = summarize("remove", [record(True, True), record(False, True), record(True, False), record(True, None)])
    assert (summary.gold_clean, summary.gold_clean_edited, summary.gold_clean_edited_share) == (2, 1, 0.5)
    assert summary.edited == 3 and summary.text_retention == 0.25


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def test_cli_verify_then_repair_then_reverify(tmp_path: Path) -> None:
    rules = _write(tmp_path / "rules.jsonl", [RULES]).rename(tmp_path / "rules.json")
    samples = _write(tmp_path / "in.jsonl", [
        {"id": "a", "context": CONTEXT, "answer": "It opened in 2005. The owner is Ana Müller.",
         "gold": {"hallucinated": False}},
        {"id": "b", "context": CONTEXT, "answer": "It closes on Sundays."},
        {"id": "c", "context": CONTEXT, "answer": "The owner is Ana Müller.", "gold": {"hallucinated": False}},
    ])
    verified, repaired = tmp_path / "verified.jsonl", tmp_path / "repaired.jsonl"
    runner = CliRunner()
    judge = ["--judge", f"scripted:{rules}", "--cache-dir", str(tmp_path / "cache")]
    runner.invoke(app, ["verify", str(samples), "--out", str(verified), "--decomposer", "rules", *judge])
    result = runner.invoke(app, [
        "repair", str(verified), "--strategy", "extract", "--input", str(samples), "--out", str(repaired),
        "--verify-after", "--verify-judge", f"scripted:{rules}", "--cache-dir", str(tmp_path / "cache"),
    ])
    assert result.exit_code == 0, result.output
    records = [RepairRecord.model_validate_json(line) for line in repaired.read_text(encoding="utf-8").splitlines()]
    assert [r.repaired for r in records] == [f"{OPENED} The owner is Ana Müller.", MONDAYS, "The owner is Ana Müller."]
    assert all(r.verified_after and r.verified_after.hallucinated is False for r in records)
    assert "1/2" in "".join(result.stderr.split()), "one of two gold-clean answers was edited"


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--strategy", "shrink"], "--strategy must be one of"),
        (["--strategy", "rewrite"], "needs --judge"),
        ([], "--input SAMPLES.jsonl is required"),
        (["--input", "{samples}", "--judge", "embedded"], "cannot write text"),
    ],
)
def test_cli_usage_errors_are_one_line_and_exit_2(tmp_path: Path, arguments: list[str], message: str) -> None:
    samples = _write(tmp_path / "in.jsonl", [{"id": "a", "context": "C.", "answer": "A."}])
    verified = _write(tmp_path / "verified.jsonl", [{"id": "a", "line": 1, "label": "entailed"}])
    arguments = [a.replace("{samples}", str(samples)) for a in arguments]
    result = CliRunner().invoke(app, ["repair", str(verified), *arguments])
    assert result.exit_code == 2
    assert message in " ".join(result.stderr.split()) and "Traceback" not in result.output


def test_cli_bad_records_each_get_an_error_record(tmp_path: Path) -> None:
    samples = _write(tmp_path / "in.jsonl", [{"id": "a", "context": "C.", "answer": "A."}])
    verified = tmp_path / "verified.jsonl"
    verified.write_text(
        'not json\n{"id": "zzz", "line": 1, "label": "entailed"}\n{"id": "a", "line": 1, "label": "entailed"}\n'
    )
    result = CliRunner().invoke(app, ["repair", str(verified), "--input", str(samples), "-q"])
    assert result.exit_code == 2
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(records) == 3
    assert "not an rt4 verify record" in records[0]["errors"][0]
    assert "no valid sample with id 'zzz' on line 1" in records[1]["errors"][0]
    assert records[2]["repaired"] == "A." and records[2]["errors"] == []


def test_repair_of_an_empty_records_file_is_a_usage_error(tmp_path: Path) -> None:
    from audit_fixtures import write_samples
    from typer.testing import CliRunner

    from rt4chart.cli.app import app

    inputs, verified = tmp_path / "in.jsonl", tmp_path / "verified.jsonl"
    write_samples(inputs, 2)
    for content in ("", "\n \n"):
        verified.write_text(content, encoding="utf-8")
        done = CliRunner().invoke(app, ["repair", str(verified), "--input", str(inputs), "--no-cache"])
        assert done.exit_code == 2 and "hold no record" in done.output, done.output


REWRITE = json.dumps({"sentences": [{"sentence": 0, "text": MONDAYS}]})
"""A repairing judge's reply: the one flagged sentence of each answer rewritten from the context."""


def _verified_guides(tmp_path: Path, n: int) -> tuple[Path, Path]:
    """``n`` answers, each one sentence the scripted judge finds contradicted, and their verify records."""
    rules = _write(tmp_path / "rules.jsonl", [RULES]).rename(tmp_path / "rules.json")
    samples = _write(tmp_path / "in.jsonl", [
        {"id": f"guide-{k}", "context": CONTEXT, "answer": f"It closes on Sundays, says guide {k}."}
        for k in range(1, n + 1)
    ])
    verified = tmp_path / "verified.jsonl"
    done = CliRunner().invoke(app, ["verify", str(samples), "--out", str(verified), "--decomposer", "rules",
                                    "--judge", f"scripted:{rules}", "--no-cache", "-q"])
    assert done.exit_code == 1 and len(verified.read_text(encoding="utf-8").splitlines()) == n, done.output
    return samples, verified


def _rewrite_args(verified: Path, samples: Path, server: Any, out: Path) -> list[str]:
    return ["repair", str(verified), "--input", str(samples), "--strategy", "rewrite", "--judge", "openai/fault",
            "--api-base", server.base_url, "--no-cache", "--out", str(out), "-q"]


@contextlib.contextmanager
def _repair_stopped_mid_way(
    tmp_path: Path, answers: int, finished: int, stop: signal.Signals
) -> Iterator[tuple[Any, list[str], Path, str, int]]:
    """``rt4 repair --strategy rewrite`` of ``answers`` guides in a process of its own, sent ``stop``
    once ``finished`` records are written and the next request is held by the server. Yields the
    fault server (its gate open again), the command's arguments, its output, stderr and exit code."""
    from faults import fault_server

    samples, verified = _verified_guides(tmp_path, answers)
    out = tmp_path / "repaired.jsonl"
    answered: list[int] = []

    def reply(body: dict[str, Any]) -> str:
        answered.append(1)
        if len(answered) == finished:
            server.gate.clear()  # the next request is held: the run is caught mid-way
        return REWRITE

    with fault_server(reply) as server:
        args = _rewrite_args(verified, samples, server, out)
        run = subprocess.Popen([sys.executable, "-m", "rt4chart", *args, "--samples-in-flight", "1"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
        deadline = time.monotonic() + 300  # a bound on the wait, not a measurement
        while (len(server.requests) <= finished or not out.is_file() or out.read_text().count("\n") < finished) and (
            time.monotonic() < deadline and run.poll() is None
        ):
            time.sleep(0.05)
        run.send_signal(stop)
        _, stderr = run.communicate(timeout=60)
        server.gate.set()
        yield server, args, out, " ".join(stderr.decode().split()), run.returncode


def test_sigterm_stops_a_repair_as_it_stops_a_verify_run(tmp_path: Path) -> None:
    """rt4 repair runs through the run layer's one synchronous entry: SIGTERM (a cancelled job) exits
    130 saying how many repair records were kept and that --resume goes on from them."""
    with _repair_stopped_mid_way(tmp_path, 4, 2, signal.SIGTERM) as (_, _, out, stderr, returncode):
        assert returncode == 130, stderr
        assert f"interrupted: 2 complete records are in {out}" in stderr and "--resume" in stderr, stderr


def test_a_killed_repair_resumes_without_rewriting_the_finished_answers(tmp_path: Path) -> None:
    with _repair_stopped_mid_way(tmp_path, 6, 3, signal.SIGKILL) as (server, args, out, stderr, _):
        assert len(server.requests) == 4 and out.read_text().count("\n") == 3, stderr
        resumed = CliRunner().invoke(app, [*args, "--resume"])
        assert resumed.exit_code == 0, resumed.output
        assert len(server.requests) == 4 + 3, "only the three answers not yet repaired were sent again"
    records = [RepairRecord.model_validate_json(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r.id for r in records] == [f"guide-{k}" for k in range(1, 7)]
    assert all(r.repaired == MONDAYS and not r.errors for r in records)


def test_repair_records_come_in_input_order_with_samples_in_flight(tmp_path: Path) -> None:
    import threading

    from faults import fault_server

    samples, verified = _verified_guides(tmp_path, 6)
    out = tmp_path / "repaired.jsonl"
    others = threading.Event()

    def reply(body: dict[str, Any]) -> str:
        # The first answer's rewrite comes only after another one's: completion order is not input order.
        if "guide 1." in json.dumps(body, ensure_ascii=False):
            others.wait(timeout=60)
        else:
            others.set()
        return REWRITE

    with fault_server(reply) as server:
        done = CliRunner().invoke(app, [*_rewrite_args(verified, samples, server, out), "--samples-in-flight", "2",
                                        "--concurrency", "8"])
    assert done.exit_code == 0, done.output
    assert others.is_set() and server.max_in_flight == 2, "two answers repaired at once, never more"
    records = [RepairRecord.model_validate_json(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r.id for r in records] == [f"guide-{k}" for k in range(1, 7)]
    assert [r.line for r in records] == list(range(1, 7))
