"""Faithful where it changes an LLM's verdicts, honest when the judge fails: batched replies are
checked against the claims asked, a judge that fails leaves verdicts open (exit 4), the global stage
is told each claim's first-pass label, and ungrounded verdicts are downgraded. Against real HTTP
servers on 127.0.0.1 (tests/faults.py)."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from faults import Fault, claims_in, fault_server
from typer.testing import CliRunner

from rt4chart.cli.app import app
from rt4chart.judges.registry import judge_stack
from rt4chart.options import AuditOptions
from rt4chart.runs.engine import Pipeline
from rt4chart.types import AuditRecord, Label, Sample

SAMPLE = Sample(
    id="store",
    context="Store 1 opens at 2 am. It sells 3 kinds of bread.",
    answer="Store 1 opens at 9 am. It also sells cakes.",
)


def verdicts_for(body: dict[str, Any], shift: int) -> str:
    """A judge that finds the opening hour contradicted and the cakes baseless, numbering the claims
    of a request from ``shift``."""
    judgements = []
    for position, claim in enumerate(claims_in(body)):
        contradicted = "opens at" in claim
        judgements.append({
            "claim": position + shift,
            "label": "contradicted" if contradicted else "baseless",
            "evidence": ["opens at 2 am"] if contradicted else [],
            "rationale": "fault server",
            "confidence": 0.9,
        })
    return json.dumps({"judgements": judgements})


def audit(base_url: str, **options: Any) -> AuditRecord:
    async def run() -> AuditRecord:
        stack = judge_stack("openai/fault", api_base=base_url)
        try:
            return await Pipeline(stack, AuditOptions(decomposer="rules", **options)).verify_sample(SAMPLE)
        finally:
            await stack.aclose()

    return asyncio.run(run())


def test_a_batch_reply_numbered_from_one_is_not_trusted() -> None:
    # Batched requests get claims numbered 1..n (a verdict shifted onto the wrong claim if trusted);
    # single-claim requests get them right.
    def reply(body: dict[str, Any]) -> str:
        return verdicts_for(body, shift=1 if len(claims_in(body)) > 1 else 0)

    with fault_server(reply) as server:
        report = audit(server.base_url, global_verification=False)
    assert len(server.requests) == 3  # the batch, then each of its two claims alone
    assert [claim.label for claim in report.claims] == [Label.CONTRADICTED, Label.BASELESS]
    assert report.label == Label.CONTRADICTED
    for claim in report.claims:
        assert any("batched reply not used" in error and "[1, 2]" in error for error in claim.errors)


def test_an_unparseable_batch_reply_falls_back_to_one_call_per_claim() -> None:
    def reply(body: dict[str, Any]) -> str:
        return "I would rather not say." if len(claims_in(body)) > 1 else verdicts_for(body, shift=0)

    with fault_server(reply) as server:
        report = audit(server.base_url, global_verification=False)
    # The batch and its re-ask (max_reasks=1) fail to parse; then one call per claim.
    assert len(server.requests) == 4
    assert [claim.label for claim in report.claims] == [Label.CONTRADICTED, Label.BASELESS]
    assert all(any("batched reply not used" in e for e in claim.errors) for claim in report.claims)


def test_a_judge_that_refuses_leaves_the_verdict_open_and_exits_4(tmp_path: Path) -> None:
    inputs, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inputs.write_text(SAMPLE.model_dump_json() + "\n", encoding="utf-8")
    with fault_server(verdicts_for_nothing, default=Fault("echo_key")) as server:
        result = CliRunner().invoke(app, [
            "verify", str(inputs), "--judge", "openai/fault", "--api-base", server.base_url,
            "--decomposer", "rules", "--no-cache", "--out", str(out),
        ])
    assert result.exit_code == 4, result.output
    [record] = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert record["label"] is None and record["hallucinated"] is None and record["incomplete"] is True
    assert [claim["label"] for claim in record["claims"]] == [None, None]
    assert all(claim["errors"] for claim in record["claims"])
    # One local call for the batch (a call with no reply is not split claim by claim), one global.
    assert len(server.requests) == 2


def verdicts_for_nothing(body: dict[str, Any]) -> str:
    return "{}"


def test_a_known_contradiction_decides_the_answer_even_when_other_claims_are_open() -> None:
    # The first request (the local batch) answers; every later one (the global stage) fails.
    with fault_server(lambda body: verdicts_for(body, 0), Fault("ok"), default=Fault("echo_key")) as server:
        report = audit(server.base_url)
    assert report.label == Label.CONTRADICTED and report.hallucinated is True
    assert [claim.label for claim in report.claims] == [Label.CONTRADICTED, Label.BASELESS]  # local labels kept
    assert not report.incomplete


def test_the_global_stage_names_each_claims_first_pass_label() -> None:
    with fault_server(lambda body: verdicts_for(body, 0)) as server:
        audit(server.base_url)
    global_prompts = [
        next(m["content"] for m in body["messages"] if m["role"] == "user")
        for body in server.requests
        if "whole context" in next(m["content"] for m in body["messages"] if m["role"] == "user")
    ]
    # Grouped by (deciding chunk, local label): the contradicted claim with its hint, the baseless
    # one without, each told its first-pass label.
    assert len(global_prompts) == 2
    assert any("first pass: contradicted" in p and "Location hint" in p for p in global_prompts)
    assert any("first pass: baseless" in p and "Location hint" not in p for p in global_prompts)


def test_an_ungrounded_verdict_is_downgraded_unless_kept() -> None:
    def reply(body: dict[str, Any]) -> str:
        judgements = [
            {"claim": i, "label": "entailed", "evidence": ["words that are nowhere"], "rationale": "r"}
            for i, _ in enumerate(claims_in(body))
        ]
        return json.dumps({"judgements": judgements})

    with fault_server(reply) as server:
        downgraded = audit(server.base_url, global_verification=False)
        kept = audit(server.base_url, global_verification=False, ungrounded="keep")
    assert [c.label for c in downgraded.claims] == [Label.BASELESS, Label.BASELESS]
    # The judge's text stays on the vote that was downgraded.
    assert all(not c.votes[0].grounded and c.votes[0].rationale == "r" for c in downgraded.claims)
    assert all("downgraded to baseless" in " ".join(c.errors) for c in downgraded.claims)
    assert [c.label for c in kept.claims] == [Label.ENTAILED, Label.ENTAILED]
    assert all(not c.grounded for c in kept.claims)


def test_global_auto_skips_the_global_call_for_a_one_chunk_context() -> None:
    with fault_server(lambda body: verdicts_for(body, 0)) as server:
        full = audit(server.base_url)
        calls_full = len(server.requests)
        skipped = audit(server.base_url, global_auto=True)
    assert calls_full == 3 and len(server.requests) - calls_full == 1
    assert (full.global_stage, skipped.global_stage) == ("full", "skipped: one chunk")
    assert [c.label for c in skipped.claims] == [c.local_label for c in skipped.claims]


def untagged(prompt: str) -> str:
    """A prompt without the delimiter lines that fence each field of the text under audit."""
    return "\n".join(line for line in prompt.splitlines() if not re.fullmatch(r"</?data-[0-9a-f]+>", line))


def decomposer(shift: int = 0, leave_out: int | None = None) -> Any:
    """A judge whose batched decomposition numbers sentences from ``shift`` and may leave one out;
    per-sentence requests and verification are answered correctly."""

    def reply(body: dict[str, Any]) -> str:
        user = untagged(next(m["content"] for m in body["messages"] if m["role"] == "user"))
        if "Sentence to split" in user:
            return json.dumps({"claims": [user.rsplit("\n", 1)[-1].strip()]})
        if "Answer sentences:" in user:
            listing = user.rsplit("Answer sentences:\n", 1)[-1].splitlines()
            entries = [
                {"sentence": i + shift, "claims": [line.split("] ", 1)[1]]}
                for i, line in enumerate(listing) if line.startswith("[") and i != leave_out
            ]
            return json.dumps({"sentences": entries})
        return verdicts_for(body, 0)

    return reply


def decomposed(base_url: str, **options: Any) -> AuditRecord:
    async def run() -> AuditRecord:
        stack = judge_stack("openai/fault", api_base=base_url)
        try:
            pipeline = Pipeline(stack, AuditOptions(decomposer="judge", global_verification=False, **options))
            return await pipeline.verify_sample(SAMPLE.model_copy(update={"question": "When does it open?"}))
        finally:
            await stack.aclose()

    return asyncio.run(run())


def _prompts(server: Any, marker: str) -> list[str]:
    users = [next(m["content"] for m in body["messages"] if m["role"] == "user") for body in server.requests]
    return [user for user in users if marker in user]


def test_a_decomposition_numbered_from_one_asks_every_sentence_again_alone() -> None:
    with fault_server(decomposer(shift=1)) as server:
        report = decomposed(server.base_url)
    assert len(_prompts(server, "Answer sentences:")) == 1 and len(_prompts(server, "Sentence to split")) == 2
    assert [(c.sentence_index, c.text) for c in report.claims] == [
        (0, "Store 1 opens at 9 am."), (1, "It also sells cakes."),
    ]
    assert report.decomposition is not None and report.decomposition.reasked == 2
    assert any("numbered the answer sentences [1, 2]" in error for error in report.errors)


def test_a_sentence_left_out_is_the_only_one_asked_again() -> None:
    with fault_server(decomposer(leave_out=1)) as server:
        report = decomposed(server.base_url)
    [again] = _prompts(server, "Sentence to split")
    assert untagged(again).rstrip().endswith("It also sells cakes.")
    assert report.decomposition is not None and report.decomposition.reasked == 1
    assert [c.sentence_index for c in report.claims] == [0, 1]


def test_per_sentence_decomposition_and_the_question_only_when_allowed() -> None:
    with fault_server(decomposer()) as server:
        report = decomposed(server.base_url, decompose_per_sentence=True)
        hidden = _prompts(server, "Sentence to split")
        shown = decomposed(server.base_url, decompose_per_sentence=True, decompose_with_question=True)
    assert len(hidden) == 2 and all("When does it open?" not in prompt for prompt in hidden)
    assert report.decomposition is not None and report.decomposition.mode == "judge-per-sentence"
    assert [c.sentence_index for c in report.claims] == [c.sentence_index for c in shown.claims] == [0, 1]
    assert all("When does it open?" in p for p in _prompts(server, "Sentence to split")[2:])
