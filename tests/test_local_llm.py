"""The README's local-LLM walkthrough: SmolLM2-135M behind llama.cpp (`rt4 serve`) gives replies that
parse, because its shipped profile sends bounded reply schemas that llama.cpp decodes under."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from conftest import EXAMPLES, VerifyRequestFactory, backend_over

from rt4chart.judges.registry import load_profiles
from rt4chart.judges.serve import LocalServer
from rt4chart.method.tasks import VerifyInput, VerifyOutput

CLAIMS = ["The free trial lasts 14 days.", "The trial needs no credit card."]


def test_smollm2_replies_parse_and_quote_the_context(llamacpp: LocalServer, verify_request: VerifyRequestFactory,
                                                     transport: str) -> None:
    # With the plain schema (open arrays and strings) SmolLM2 repeats a quote or a judgement until
    # max_tokens cuts its JSON; the bounded one ends the reply after one judgement per claim.
    profile = load_profiles()["smollm2"]
    assert profile.bounded_replies
    request = verify_request(CLAIMS)
    backend = backend_over(transport, profile, api_base=llamacpp.api_base)
    reply = asyncio.run(backend.complete(request))
    asyncio.run(backend.aclose())
    assert reply.error is None and type(reply.parsed) is VerifyOutput, reply.raw
    assert [judgement.claim for judgement in reply.parsed.judgements] == [0, 1]
    assert isinstance(request.payload, VerifyInput)
    context = {sentence.text for sentence in request.payload.sentences}
    for judgement in reply.parsed.judgements:
        assert set(judgement.evidence) <= context
        assert bool(judgement.evidence) == (judgement.label != "baseless")


def test_the_walkthrough_gives_verdicts_on_an_example(llamacpp: LocalServer, tmp_path: Path) -> None:
    sample = tmp_path / "one.jsonl"
    sample.write_text((EXAMPLES / "answers.jsonl").read_text(encoding="utf-8").splitlines()[1] + "\n")
    out = tmp_path / "out.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "rt4chart", "verify", str(sample), "--judge", "openai/smollm2",
         "--api-base", llamacpp.api_base, "--concurrency", "2", "--decomposer", "rules", "-o", str(out),
         "--cache-dir", str(tmp_path / "cache")],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert result.returncode in (0, 1), result.stderr
    record = json.loads(out.read_text(encoding="utf-8"))
    assert record["label"] is not None and not record["incomplete"], record["errors"]
    assert all(claim["label"] is not None and claim["grounded"] for claim in record["claims"])
