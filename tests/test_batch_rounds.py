"""The batch collector's rounds against the Batch API stand-in (tests/batch_server.py), in process:
a round admitted by the budget whole or not at all, a round split by its bytes as well as its
requests, and a line two calls share booked once."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from batch_server import BatchServer, batch_server
from conftest import VerifyRequestFactory
from faults import judge_every_claim
from test_batch import profile

from rt4chart.judges.batch import BATCH_PRICE_FACTOR, LINE_OVERHEAD_BYTES, BatchSender, BatchSettings
from rt4chart.judges.policy import PolicyBackend
from rt4chart.judges.registry import JudgeStack, judge_stack
from rt4chart.judges.replies import prompt_token_bound
from rt4chart.protocol import BudgetExhausted, JudgeRequest, JudgeResponse, provider_wait_now
from rt4chart.types import Usage

INPUT_USD_PER_MTOK, OUTPUT_USD_PER_MTOK = 2.0, 8.0
"""The online prices of :func:`test_batch.profile`'s judge."""


def line_worst_case_usd(request: JudgeRequest) -> float:
    """What one batched request can cost at most: its prompt bounded by its bytes, a reply of
    ``max_tokens``, at batch prices (the rule the budget's admission follows, written out here)."""
    prompt = prompt_token_bound(request.messages) * INPUT_USD_PER_MTOK / 1e6
    reply = request.params.max_tokens * OUTPUT_USD_PER_MTOK / 1e6
    return (prompt + reply) * BATCH_PRICE_FACTOR


def sender_of(stack: JudgeStack) -> BatchSender:
    """The batch sender under a stack's meter."""
    leaf = stack.inner.inner if hasattr(stack.inner, "inner") else stack.inner
    assert isinstance(leaf, PolicyBackend) and isinstance(leaf.sender, BatchSender)
    return leaf.sender


def stack_for(tmp_path: Path, base_url: str, budget_usd: float | None) -> JudgeStack:
    return judge_stack(str(profile(tmp_path)), api_base=base_url, budget_usd=budget_usd,
                       batch=BatchSettings(poll_s=0.02, journal=tmp_path / "journal.jsonl"))


CLAIMS = (["The trial is free."], ["The trial lasts a month."], ["Cancel any time."])
"""Three requests of one round (distinct bodies)."""


@pytest.mark.parametrize("fits", [True, False], ids=["round fits", "round one cent short"])
def test_a_round_is_admitted_whole_at_batch_prices_or_not_submitted_at_all(
    tmp_path: Path, verify_request: VerifyRequestFactory, fits: bool
) -> None:
    requests = [verify_request(claims) for claims in CLAIMS]
    worst = sum(line_worst_case_usd(request) for request in requests)
    # Each call alone fits (online, each would be reserved and sent); the round as a whole does not.
    budget = worst if fits else worst - min(line_worst_case_usd(r) for r in requests) / 2

    async def audit(base_url: str) -> tuple[list[JudgeResponse | BaseException], JudgeStack]:
        stack = stack_for(tmp_path, base_url, budget)
        answers = await asyncio.gather(*(stack.complete(r) for r in requests), return_exceptions=True)
        await stack.aclose()
        return answers, stack

    with batch_server(judge_every_claim("baseless")) as server:
        answers, stack = asyncio.run(audit(server.base_url))
    journal = tmp_path / "journal.jsonl"
    if fits:
        assert all(isinstance(a, JudgeResponse) and a.error is None for a in answers), answers
        assert [batch["request_counts"]["total"] for batch in server.created_batches] == [3]
        # Spend booked from the output's usage; the round's reservation released in full.
        assert 0 < stack.ledger.spent_usd <= worst
        assert stack.ledger.spent_usd == pytest.approx(sum(a.usage.cost_usd for a in answers
                                                           if isinstance(a, JudgeResponse)))
    else:
        assert all(isinstance(a, BudgetExhausted) for a in answers), answers
        assert not server.batches and not server.submitted  # nothing of the round went out
        assert not journal.exists() or not journal.read_text(encoding="utf-8").strip()
        assert stack.ledger.spent_usd == 0
    assert stack.ledger.reserved_usd == pytest.approx(0, abs=1e-15)


def test_a_round_is_split_by_the_bytes_of_its_input_file_as_well_as_by_its_requests(
    tmp_path: Path, verify_request: VerifyRequestFactory
) -> None:
    requests = [verify_request(claims) for claims in CLAIMS]
    waits: list[str] = []

    async def audit(base_url: str, server_holds: Callable[[bool], None], **caps: int) -> None:
        stack = stack_for(tmp_path, base_url, None)
        for cap, value in caps.items():  # the sender's caps (max_batch_requests, max_batch_bytes), lowered
            setattr(sender_of(stack), f"max_batch_{cap}", value)
        calls = asyncio.gather(*(stack.complete(r) for r in requests))
        if caps:  # while the provider holds the batches, the progress line names the one waited on
            while (wait := provider_wait_now()) is None or "round 1, batch " not in wait:
                await asyncio.sleep(0.01)
            waits.append(wait)
            server_holds(False)
        answers = await calls
        await stack.aclose()
        assert all(answer.error is None for answer in answers)

    def input_lines(server: BatchServer) -> list[list[bytes]]:
        return [server.files[batch["input_file_id"]].splitlines(keepends=True) for batch in server.created_batches]

    with batch_server(judge_every_claim("baseless")) as server:
        asyncio.run(audit(server.base_url, lambda _: None))
        [whole] = input_lines(server)
    sizes = [len(line) for line in whole]  # in the round's order
    # A line is counted as its body and LINE_OVERHEAD_BYTES, more than the custom id, method and URL it adds: a
    # cap of the first two lines and that overhead each holds those two and not the third.
    two = sizes[0] + sizes[1] + 2 * LINE_OVERHEAD_BYTES
    for caps, expected in (({"bytes": two}, [2, 1]), ({"bytes": 1}, [1, 1, 1]), ({"requests": 2}, [2, 1])):
        with batch_server(judge_every_claim("baseless")) as server:
            server.finishing = 0

            def hold(held: bool, server: BatchServer = server) -> None:
                server.finishing = 0 if held else None

            asyncio.run(audit(server.base_url, hold, **caps))
            batches = input_lines(server)
        # Created concurrently: the stand-in may see the round's batches in either order.
        assert sorted(len(lines) for lines in batches) == sorted(expected), caps
        assert all(sum(map(len, lines)) <= caps.get("bytes", sum(sizes)) or len(lines) == 1 for lines in batches)
        assert sorted(line for lines in batches for line in lines) == sorted(whole)  # each request once
        # The batches are created concurrently: the oldest wait may be any of them.
        named = re.fullmatch(rf"round 1, batch (\d) of {len(expected)} waiting on the provider: batch-\d+, "
                             r"(\d) requests, \d+ s", waits[-1])
        assert named is not None, waits[-1]
        assert int(named[2]) == expected[int(named[1]) - 1]


def test_a_line_two_calls_share_is_booked_once_the_second_call_as_a_cache_hit(
    tmp_path: Path, verify_request: VerifyRequestFactory
) -> None:
    same, other = verify_request(["The trial is free."]), verify_request(["Cancel any time."])

    async def audit(base_url: str) -> tuple[list[JudgeResponse], JudgeStack]:
        stack = stack_for(tmp_path, base_url, 1.0)
        answers = await asyncio.gather(stack.complete(same), stack.complete(other), stack.complete(same))
        await stack.aclose()
        return answers, stack

    with batch_server(judge_every_claim("baseless")) as server:
        (first, second, shared), stack = asyncio.run(audit(server.base_url))
    assert [batch["request_counts"]["total"] for batch in server.created_batches] == [2]
    assert shared.parsed == first.parsed and shared.error is None
    for paid in (first, second):
        assert paid.usage.calls == 1 and paid.usage.cost_usd > 0 and paid.usage.cache_hits == 0
    # Recorded as an answer from the judge-call cache is: no call, no tokens, no cost.
    assert shared.usage == Usage(cache_hits=1)
    assert stack.ledger.spent_usd == pytest.approx(first.usage.cost_usd + second.usage.cost_usd)
    assert stack.ledger.usage.calls == 2 and stack.ledger.usage.cache_hits == 1
    assert stack.ledger.reserved_usd == pytest.approx(0, abs=1e-15)
