"""Chat verifiers over the OpenAI-compatible transport, against the fault-injecting server: Lynx asked
each claim in its own prompt, its PASS/FAIL JSON read back as verdicts, and Bespoke-MiniCheck's one-token
Yes/No read from its log probabilities (over aiohttp and litellm), alone and as cascade stages."""

from __future__ import annotations

import asyncio
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rt4chart.judges.registry import resolve_judge
from rt4chart.method.tasks import VerifyInput, VerifyOutput
from rt4chart.method.text import split_sentences
from rt4chart.protocol import JudgeRequest
from rt4chart.types import Label
from tests.faults import Fault, fault_server

SAMPLE = {"id": "s1", "question": "How tall is the tower?",
          "context": "The tower is 330 metres tall. It stands in Paris.",
          "answer": "The tower is 330 metres tall. It was built in 1850."}
LYNX_OPENING = "Given the following QUESTION, DOCUMENT and ANSWER"


def lynx(body: dict[str, Any]) -> str:
    """Lynx's reply: PASS when the claim (the ANSWER) holds 330, FAIL otherwise."""
    (message,) = body["messages"]
    answer = message["content"].split("ANSWER:\n", 1)[1].split("\n\n--", 1)[0]
    score = "PASS" if "330" in answer else "FAIL"
    return json.dumps({"REASONING": [f"- the answer says {answer!r}"], "SCORE": score})


def rt4(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                         os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "rt4chart", *args], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300, check=False)


def _setup(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text(json.dumps(SAMPLE) + "\n")
    (tmp_path / "lynx.toml").write_text('name = "lynx"\nmodel = "openai/lynx"\nadapter = "lynx"\n')


def _claims(path: Path) -> dict[str, str]:
    (record,) = [json.loads(line) for line in path.read_text().splitlines()]
    return {claim["text"]: claim["label"] for claim in record["claims"]}


def test_lynx_judges_each_claim_in_its_own_prompt(tmp_path: Path) -> None:
    _setup(tmp_path)
    with fault_server(lynx) as server:
        run = rt4(tmp_path, "verify", "in.jsonl", "--judge", "lynx.toml", "--api-base", server.base_url,
                  "--decomposer", "rules", "--no-cache", "--out", "out.jsonl")
    assert run.returncode == 1, run.stderr  # one claim is not supported
    labels = _claims(tmp_path / "out.jsonl")
    assert labels == {"The tower is 330 metres tall.": "entailed", "It was built in 1850.": "baseless"}
    record = json.loads((tmp_path / "out.jsonl").read_text())
    assert record["judge"].startswith(f"lynx@{server.base_url}+lynx#")
    asked = set()
    for body in server.requests:
        (message,) = body["messages"]  # Lynx's prompt: one user message, no system prompt
        assert message["role"] == "user" and message["content"].startswith(LYNX_OPENING)
        assert "QUESTION (THIS DOES NOT COUNT AS BACKGROUND INFORMATION):\nHow tall is the tower?" in message["content"]
        assert "DOCUMENT:\nThe tower is 330 metres tall. It stands in Paris." in message["content"]
        asked.add(message["content"].split("ANSWER:\n", 1)[1].split("\n\n--", 1)[0])
    assert asked == set(labels)


def test_lynx_as_a_cascade_stage_and_its_failures_as_errors(tmp_path: Path) -> None:
    _setup(tmp_path)
    rules = tmp_path / "rules.json"
    # A first stage that settles nothing (confidence 0.5 under the stage's 0.9): Lynx decides every claim.
    rules.write_text(json.dumps({"verify": [{"claim": "", "label": "baseless", "confidence": 0.5}]}))
    with fault_server(lynx) as server:
        run = rt4(tmp_path, "verify", "in.jsonl", "--judge", f"cascade:scripted:{rules}@0.9,lynx.toml",
                  "--api-base", server.base_url, "--decomposer", "rules", "--no-cache", "--out", "out.jsonl")
    assert run.returncode == 1, run.stderr
    assert _claims(tmp_path / "out.jsonl")["The tower is 330 metres tall."] == "entailed"
    assert server.requests
    # Replies that are not Lynx's JSON: the claims get errors and no verdict (exit 4), never a guess.
    with fault_server(lynx, default=Fault("invalid_json")) as server:
        run = rt4(tmp_path, "verify", "in.jsonl", "--judge", "lynx.toml", "--api-base", server.base_url,
                  "--decomposer", "rules", "--no-cache", "--out", "failed.jsonl")
    assert run.returncode == 4, run.stderr
    record = json.loads((tmp_path / "failed.jsonl").read_text())
    assert all(claim["label"] is None for claim in record["claims"])


MINICHECK_SYSTEM = "Determine whether the provided claim is consistent with the corresponding document."


def minicheck_claim(body: dict[str, Any]) -> str:
    """The claim of a Bespoke-MiniCheck request (its user message is ``Document: ...\\nClaim: ...``)."""
    return str(body["messages"][-1]["content"].split("\nClaim: ", 1)[1])


def minicheck_logprobs(body: dict[str, Any]) -> dict[str, float]:
    """Bespoke-MiniCheck's first token: sure Yes on the 330 claim, "yes" variants at 0.4 on the Paris
    claim (unsure), sure No on the rest."""
    claim = minicheck_claim(body)
    if "330" in claim:
        return {"Yes": math.log(0.9), "No": math.log(0.05), " yes": math.log(0.03)}
    if "Paris" in claim:
        return {"No": math.log(0.55), "Yes": math.log(0.3), " yes": math.log(0.1)}
    return {"No": math.log(0.95), "Yes": math.log(0.04)}


MINICHECK_SAMPLE = {**SAMPLE, "answer": "The tower is 330 metres tall. It stands in Paris. It was built in 1850."}


def _minicheck_setup(tmp_path: Path, api: str) -> None:
    (tmp_path / "in.jsonl").write_text(json.dumps(MINICHECK_SAMPLE) + "\n")
    (tmp_path / "minicheck.toml").write_text(
        f'name = "minicheck"\nmodel = "openai/minicheck"\nadapter = "bespoke-minicheck"\napi = "{api}"\n')


def _judged(path: Path) -> dict[str, dict[str, Any]]:
    (record,) = [json.loads(line) for line in path.read_text().splitlines()]
    return {claim["text"]: claim for claim in record["claims"]}


@pytest.mark.parametrize("api", ["openai-compatible", "litellm"])
def test_bespoke_minicheck_reads_p_yes_from_the_first_tokens_logprobs(tmp_path: Path, api: str) -> None:
    _minicheck_setup(tmp_path, api)
    with fault_server("unused", token_logprobs=minicheck_logprobs) as server:
        run = rt4(tmp_path, "verify", "in.jsonl", "--judge", "minicheck.toml", "--api-base", server.base_url,
                  "--decomposer", "rules", "--no-cache", "--out", "out.jsonl")
    assert run.returncode == 1, run.stderr
    claims = _judged(tmp_path / "out.jsonl")
    tall, paris, built = (claims[text] for text in ("The tower is 330 metres tall.", "It stands in Paris.",
                                                    "It was built in 1850."))
    assert (tall["label"], paris["label"], built["label"]) == ("entailed", "baseless", "baseless")
    # P(Yes) sums the candidates that read "yes": 0.93, 0.4 and 0.04; confidence is that of the label given.
    assert tall["confidence"] == pytest.approx(0.93)
    assert paris["confidence"] == pytest.approx(0.6)
    assert built["confidence"] == pytest.approx(0.96)
    assert {minicheck_claim(body) for body in server.requests} == set(claims)
    for body in server.requests:
        # MiniCheck's own request: one token, its top 5 candidates, no structured output, its two messages.
        assert body["max_tokens"] == 1 and body["logprobs"] is True and body["top_logprobs"] == 5
        assert "response_format" not in body
        system, user = body["messages"]
        assert system["role"] == "system" and system["content"].startswith(MINICHECK_SYSTEM)
        assert user["content"].startswith("Document: The tower is 330 metres tall. It stands in Paris.\nClaim: ")


def test_bespoke_minicheck_as_a_cascade_stage_settles_only_what_it_is_sure_of(tmp_path: Path) -> None:
    _minicheck_setup(tmp_path, "openai-compatible")
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"verify": [{"claim": "", "label": "baseless", "confidence": 1.0}]}))
    with fault_server("unused", token_logprobs=minicheck_logprobs) as server:
        run = rt4(tmp_path, "verify", "in.jsonl", "--judge", f"cascade:minicheck.toml@0.9,scripted:{rules}",
                  "--api-base", server.base_url, "--decomposer", "rules", "--no-cache", "--out", "out.jsonl")
    assert run.returncode == 1, run.stderr
    decided = {text: (claim["label"], claim["judge"].split("@")[0].split(":")[0]) for text, claim in
               _judged(tmp_path / "out.jsonl").items()}
    # Sure (0.93, 0.96): MiniCheck's verdicts stand; unsure (0.6): the next stage decides.
    assert decided == {"The tower is 330 metres tall.": ("entailed", "minicheck"),
                       "It stands in Paris.": ("baseless", "scripted"),
                       "It was built in 1850.": ("baseless", "minicheck")}


def test_a_server_without_logprobs_leaves_minicheck_claims_unjudged(tmp_path: Path) -> None:
    _minicheck_setup(tmp_path, "openai-compatible")
    with fault_server("Yes") as server:  # a one-token reply, but no log probabilities
        run = rt4(tmp_path, "verify", "in.jsonl", "--judge", "minicheck.toml", "--api-base", server.base_url,
                  "--decomposer", "rules", "--no-cache", "--out", "out.jsonl")
    assert run.returncode == 4, run.stderr
    (record,) = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert all(claim["label"] is None for claim in record["claims"])
    assert "log probabilities" in json.dumps(record)
    # Never re-asked for JSON (asking again in the same call cannot bring log probabilities).
    assert server.requests and all(len(body["messages"]) == 2 for body in server.requests)


def guardian_turns(body: dict[str, Any]) -> tuple[str, str]:
    """The context and the claim of a Granite Guardian 3.0-3.2 request (a context turn, the claim as the
    assistant's)."""
    context, claim = body["messages"]
    assert (context["role"], claim["role"]) == ("context", "assistant")
    return str(context["content"]), str(claim["content"])


def guardian_logprobs(body: dict[str, Any]) -> dict[str, float]:
    """Granite Guardian's first token (Yes = risk, the claim NOT grounded): sure No on the 330 claim,
    unsure on the Paris claim, sure Yes on the rest."""
    _, claim = guardian_turns(body)
    if "330" in claim:
        return {"No": math.log(0.9), "Yes": math.log(0.05), " no": math.log(0.03)}
    if "Paris" in claim:
        return {"Yes": math.log(0.5), "No": math.log(0.3)}
    return {"Yes": math.log(0.95), "No": math.log(0.04)}


def _guardian_setup(tmp_path: Path, adapter: str, api: str = "openai-compatible", extra: str = "") -> None:
    (tmp_path / "in.jsonl").write_text(json.dumps(MINICHECK_SAMPLE) + "\n")
    (tmp_path / "guardian.toml").write_text(
        f'name = "guardian"\nmodel = "openai/guardian"\nadapter = "{adapter}"\napi = "{api}"\n{extra}')


@pytest.mark.parametrize("api", ["openai-compatible", "litellm"])
def test_granite_guardian_reads_p_risk_from_the_first_tokens_logprobs(tmp_path: Path, api: str) -> None:
    _guardian_setup(tmp_path, "granite-guardian", api)
    with fault_server("unused", token_logprobs=guardian_logprobs) as server:
        run = rt4(tmp_path, "verify", "in.jsonl", "--judge", "guardian.toml", "--api-base", server.base_url,
                  "--decomposer", "rules", "--no-cache", "--out", "out.jsonl")
    assert run.returncode == 1, run.stderr
    claims = _judged(tmp_path / "out.jsonl")
    tall, paris, built = (claims[text] for text in ("The tower is 330 metres tall.", "It stands in Paris.",
                                                    "It was built in 1850."))
    assert (tall["label"], paris["label"], built["label"]) == ("entailed", "baseless", "baseless")
    # P(risk) = P(yes) / (P(yes) + P(no)) over the candidates; P(supported) = 1 - P(risk).
    assert tall["confidence"] == pytest.approx(1 - 0.05 / (0.05 + 0.93))
    assert paris["confidence"] == pytest.approx(0.5 / 0.8)
    assert built["confidence"] == pytest.approx(0.95 / 0.99)
    assert {guardian_turns(body)[1] for body in server.requests} == set(claims)
    for body in server.requests:
        # The authors' turns and risk for the model's own chat template, which the server applies.
        assert guardian_turns(body)[0] == "The tower is 330 metres tall. It stands in Paris."
        assert body["chat_template_kwargs"] == {"guardian_config": {"risk_name": "groundedness"}}
        assert body["max_tokens"] == 1 and body["logprobs"] is True and "response_format" not in body


def guardian_score(body: dict[str, Any]) -> str:
    """Granite Guardian 3.3's reply: ``<score> no </score>`` (grounded) on the 330 claim, yes otherwise."""
    (claim,) = body["messages"]
    assert claim["role"] == "assistant"
    return f"<score> {'no' if '330' in claim['content'] else 'yes'} </score>"


def test_granite_guardian_3_3_reads_its_score_tag(tmp_path: Path) -> None:
    _guardian_setup(tmp_path, "granite-guardian-3.3")
    with fault_server(guardian_score) as server:  # no log probabilities: the tag decides
        run = rt4(tmp_path, "verify", "in.jsonl", "--judge", "guardian.toml", "--api-base", server.base_url,
                  "--decomposer", "rules", "--no-cache", "--out", "out.jsonl")
    assert run.returncode == 1, run.stderr
    claims = _judged(tmp_path / "out.jsonl")
    assert {text: claim["label"] for text, claim in claims.items()} == {
        "The tower is 330 metres tall.": "entailed", "It stands in Paris.": "baseless",
        "It was built in 1850.": "baseless"}
    # A verdict read from text states no probability.
    assert all(claim["confidence"] is None for claim in claims.values())
    for body in server.requests:
        assert body["chat_template_kwargs"] == {
            "guardian_config": {"criteria_id": "groundedness"}, "think": False,
            "documents": [{"doc_id": "0", "text": "The tower is 330 metres tall. It stands in Paris."}]}


def test_a_granite_guardian_reply_without_a_verdict_is_an_error(tmp_path: Path) -> None:
    _guardian_setup(tmp_path, "granite-guardian-3.3")
    with fault_server("<score> unsure </score>") as server:
        run = rt4(tmp_path, "verify", "in.jsonl", "--judge", "guardian.toml", "--api-base", server.base_url,
                  "--decomposer", "rules", "--no-cache", "--out", "out.jsonl")
    assert run.returncode == 4, run.stderr
    (record,) = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert all(claim["label"] is None for claim in record["claims"])
    assert "<score> yes|no </score>" in json.dumps(record) and server.requests


LONG_CONTEXT = [f"Filler sentence number {n} says nothing about towers." for n in range(12)] + \
    ["The tower is 330 metres tall."]


def minicheck_document(body: dict[str, Any]) -> str:
    """The document of a Bespoke-MiniCheck request."""
    return str(body["messages"][-1]["content"].split("\nClaim: ", 1)[0].removeprefix("Document: "))


def supported_where_stated(body: dict[str, Any]) -> dict[str, float]:
    """Yes only when the chunk states the claim word for word."""
    yes = minicheck_claim(body) in minicheck_document(body)
    return {"Yes": math.log(0.9), "No": math.log(0.1)} if yes else {"No": math.log(0.9), "Yes": math.log(0.1)}


def test_bespoke_minicheck_cuts_a_long_context_into_chunks_and_takes_the_best(tmp_path: Path) -> None:
    limit = 600
    profile = tmp_path / "minicheck.toml"
    profile.write_text(f'name = "minicheck"\nmodel = "openai/minicheck"\nadapter = "bespoke-minicheck"\n'
                       f'max_model_len = {limit}\n')
    claims = ["The tower is 330 metres tall.", "It was built in 1850."]
    payload = VerifyInput(stage="global", claims=claims, sentences=split_sentences(" ".join(LONG_CONTEXT)))
    with fault_server("unused", token_logprobs=supported_where_stated) as server:
        judge = resolve_judge(str(profile), api_base=server.base_url)
        request = JudgeRequest(task="verify", payload=payload, output_schema=VerifyOutput, messages=[],
                               prompt_version="test")
        response = asyncio.run(judge.complete(request))
    assert isinstance(response.parsed, VerifyOutput), response.error
    tall, built = response.parsed.judgements
    assert (tall.label, built.label) == (Label.ENTAILED, Label.BASELESS)
    # The evidence is the chunk that supported the claim, not the whole context.
    assert "The tower is 330 metres tall." in tall.evidence and len(tall.evidence) < len(LONG_CONTEXT)
    assert "chunks" in tall.rationale
    for claim in claims:
        chunks = [minicheck_document(body) for body in server.requests if minicheck_claim(body) == claim]
        # Several chunks, in order and together the whole context, each call within the limit (UTF-8 bytes
        # bound the tokens of a byte-level tokenizer; the reply's token besides).
        whole = " ".join(LONG_CONTEXT)
        assert len(chunks) > 1 and " ".join(sorted(chunks, key=whole.index)) == whole  # calls arrive in any order
    assert all(sum(len(m["content"].encode()) for m in body["messages"]) + body["max_tokens"] < limit
               for body in server.requests)


def test_a_claim_that_fills_max_model_len_alone_is_an_error(tmp_path: Path) -> None:
    profile = tmp_path / "minicheck.toml"
    profile.write_text('name = "minicheck"\nmodel = "openai/minicheck"\nadapter = "bespoke-minicheck"\n'
                       'max_model_len = 300\n')
    payload = VerifyInput(stage="global", claims=["word " * 80], sentences=split_sentences("The tower is tall."))
    with fault_server("unused", token_logprobs=supported_where_stated) as server:
        judge = resolve_judge(str(profile), api_base=server.base_url)
        response = asyncio.run(judge.complete(JudgeRequest(task="verify", payload=payload, output_schema=VerifyOutput,
                                                           messages=[], prompt_version="test")))
    assert response.parsed is None and "no room for context within max_model_len 300" in (response.error or "")
    assert not server.requests
