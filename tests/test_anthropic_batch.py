"""rt4 verify --batch with an ``anthropic/...`` judge against the Message Batches stand-in
(tests/anthropic_batch_server.py): its shapes, records identical to the online litellm path on the
same replies, cache_control on the shared block only, cache reads and writes priced at their rates,
the key kept to the provider, --resume after kill -9, failed lines resubmitted once."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from anthropic_batch_server import anthropic_batch_server, blocks_of
from faults import Fault, grounded
from faults import sentences_as_claims_grounded as judge_reply
from test_batch import EXAMPLES, REPO, records, samples_file, verdicts, wait_until

from rt4chart.judges.anthropic_batch import AnthropicBatchSender
from rt4chart.judges.batch import LINE_OVERHEAD_BYTES, BatchSettings, _Held
from rt4chart.judges.policy import PolicyBackend
from rt4chart.judges.prompt_cache import split_shared_head
from rt4chart.judges.registry import JudgeConfigError, resolve_judge

KEY = "sk-ant-test-" + "k3y" * 8
"""The key the profile's variable holds: sent as x-api-key, never written anywhere."""

KEY_ENV = {"RT4_TEST_ANTHROPIC_KEY": KEY, "RT4_BATCH_POLL_S": "0.02"}


def profile(tmp_path: Path, origin: str) -> Path:
    """An Anthropic judge at the stand-in, with its key variable and input/output prices; its JSON
    schema asked for, so that litellm sends it online as the forced tool the batch params carry."""
    path = tmp_path / "claude.toml"
    path.write_text(
        f'name = "claude"\nmodel = "anthropic/claude-test"\napi_base = "{origin}"\n'
        'api_key_env = "RT4_TEST_ANTHROPIC_KEY"\nresponse_format = "json_schema"\n'
        "input_usd_per_mtok = 3.0\noutput_usd_per_mtok = 15.0\n",
        encoding="utf-8",
    )
    return path


def rt4(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rt4chart", *map(str, args)], capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO), **KEY_ENV},
    )


def call(method: str, url: str, body: dict[str, Any] | None = None) -> bytes:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method=method)
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: bytes = response.read()
        return answer


def params(claim: str) -> dict[str, Any]:
    return {"model": "claude-test", "max_tokens": 50,
            "messages": [{"role": "user", "content": f"Context: the sky is blue.\nClaims:\n[0] {claim}"}]}


def test_the_stand_in_speaks_message_batches_with_errored_expired_and_canceled_lines() -> None:
    requests = [{"custom_id": name, "params": params(claim)}
                for name, claim in (("a", "the sky is blue"), ("b", "grass is red"), ("c", "the sky is blue"))]
    with anthropic_batch_server(grounded, Fault("ok"), Fault("server_error")) as server:
        batches = f"{server.origin}/v1/messages/batches"
        created = json.loads(call("POST", batches, {"requests": requests}))
        assert created["processing_status"] == "in_progress" and created["request_counts"]["processing"] == 3
        assert created["results_url"] is None
        assert json.loads(call("GET", f"{batches}/{created['id']}"))["processing_status"] == "in_progress"
        ended = json.loads(call("GET", f"{batches}/{created['id']}"))
        assert ended["processing_status"] == "ended"
        assert ended["request_counts"] == {"processing": 0, "succeeded": 2, "errored": 1, "canceled": 0, "expired": 0}
        lines = [json.loads(line) for line in call("GET", ended["results_url"]).splitlines()]
        server.expire, server.expired_answers = 1, 1
        expiring = json.loads(call("POST", batches, {"requests": requests}))
        cancelled = json.loads(call("POST", batches, {"requests": requests}))
        assert json.loads(call("POST", f"{batches}/{cancelled['id']}/cancel"))["processing_status"] == "canceling"
        for batch in (expiring, cancelled, expiring, cancelled):
            batch.update(json.loads(call("GET", f"{batches}/{batch['id']}")))
        listed = json.loads(call("GET", f"{batches}?limit=10"))["data"]
        expired_lines, cancelled_lines = (
            [json.loads(line)["result"]["type"] for line in call("GET", batch["results_url"]).splitlines()]
            for batch in (expiring, cancelled)
        )
    assert [line["result"]["type"] for line in lines] == ["succeeded", "errored", "succeeded"]
    assert lines[0]["result"]["message"]["content"][0]["type"] == "text"  # no tool was asked for
    assert expired_lines == ["succeeded", "expired", "expired"] and cancelled_lines == ["canceled"] * 3
    assert [row["id"] for row in listed] == [cancelled["id"], expiring["id"], created["id"]]
    assert server.submitted == {"a": 3, "b": 3, "c": 3}


def test_anthropic_batch_records_equal_online_ones_with_the_shared_block_cached(tmp_path: Path) -> None:
    inputs = EXAMPLES / "answers.jsonl"
    runs: dict[str, list[dict[str, Any]]] = {}
    with anthropic_batch_server(judge_reply) as server:
        for mode in ("online", "batch"):
            # The stand-in's prompt cache emptied for each mode, so both write and read alike.
            server.cached_prefixes.clear()
            server.headers.clear()
            out = tmp_path / f"{mode}.jsonl"
            extra = ("--batch",) if mode == "batch" else ()
            done = rt4("verify", inputs, "--judge", profile(tmp_path, server.origin), "--no-cache",
                       "--fail-on", "never", "--out", out, *extra)
            assert done.returncode == 0, done.stderr
            runs[mode] = records(out)
            sent = server.online if mode == "online" else server.batch_params
            assert sent and len(server.online) == len(server.batch_params or server.online)  # batch: none online
            assert {h.get("x-api-key") for h in server.headers} == {KEY}
            assert {h.get("anthropic-version") for h in server.headers} == {"2023-06-01"}
            assert set(server.submitted.values()) <= {1}
            written = [out.read_text(), done.stdout, done.stderr, *(p.read_text() for p in tmp_path.glob(f"{mode}.*"))]
            assert not any(KEY in text for text in written)
            for request in sent:
                # The system prompt and the user message's head (instructions and the context) are
                # marked; the claims follow in an unmarked block.
                marked = [block for block in blocks_of(request) if block.get("cache_control")]
                assert [block["cache_control"] for block in marked] == [{"type": "ephemeral"}] * 2
                user = request["messages"][0]["content"]
                if "Claims:\n" in "".join(block["text"] for block in user):
                    assert len(user) == 2 and "Claims:\n" in user[1]["text"] and "cache_control" not in user[1]
                    assert "Claims:\n" not in user[0]["text"] and "</data-" in user[0]["text"]
                assert request["tool_choice"] == {"name": "json_tool_call", "type": "tool"}
    assert verdicts(runs["batch"]) == verdicts(runs["online"])
    totals = {mode: {field: sum(row["usage"][field] for row in rows) for field in
                     ("calls", "prompt_tokens", "cached_prompt_tokens", "cache_write_prompt_tokens", "cost_usd")}
              for mode, rows in runs.items()}
    assert totals["online"]["cached_prompt_tokens"] > 0 and totals["online"]["cache_write_prompt_tokens"] > 0
    for field in ("calls", "prompt_tokens", "cached_prompt_tokens", "cache_write_prompt_tokens"):
        assert totals["batch"][field] == totals["online"][field]
    assert abs(totals["batch"]["cost_usd"] - totals["online"]["cost_usd"] / 2) < 1e-12
    # Online: uncached prompt tokens at 3 $/M, reads at 0.1x, writes at 1.25x, completions at 15 $/M.
    for row in runs["online"]:
        usage = row["usage"]
        uncached = usage["prompt_tokens"] - usage["cached_prompt_tokens"] - usage["cache_write_prompt_tokens"]
        expected = (uncached * 3.0 + usage["cached_prompt_tokens"] * 0.3 + usage["cache_write_prompt_tokens"] * 3.75
                    + usage["completion_tokens"] * 15.0) / 1e6
        assert abs(usage["cost_usd"] - expected) < 1e-12


def test_the_shared_head_ends_with_the_first_data_block() -> None:
    head, rest = split_shared_head("Judge.\n\nContext:\n<data-0123456789abcdef>\nS1\n</data-0123456789abcdef>\n\n"
                                   "Claims:\n<data-fedcba9876543210>\n[0] x\n</data-fedcba9876543210>")
    assert head.endswith("</data-0123456789abcdef>\n") and rest.startswith("\nClaims:")
    assert split_shared_head("no data here") == ("no data here", "")


@pytest.mark.parametrize(
    ("rounds_done", "batch_id_lost"), [(0, False), (1, False), (2, False), (1, True)],
    ids=["decomposition", "local", "global", "local, killed before the journal named its batch"],
)
def test_a_killed_anthropic_batch_run_resumes_without_submitting_any_request_twice(
    tmp_path: Path, rounds_done: int, batch_id_lost: bool
) -> None:
    inputs = samples_file(tmp_path / "in.jsonl", 6)
    out, journal = tmp_path / "out.jsonl", tmp_path / "out.jsonl.batches.jsonl"
    with anthropic_batch_server(judge_reply) as server:
        server.finishing = rounds_done  # the next round stays at the provider
        command = ("verify", inputs, "--judge", profile(tmp_path, server.origin), "--no-cache", "--batch",
                   "--samples-in-flight", "6", "--fail-on", "never", "--out", out)
        child = subprocess.Popen(
            [sys.executable, "-m", "rt4chart", *map(str, command)], stderr=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO), **KEY_ENV},
        )
        wait_until(lambda: len(server.batches) == rounds_done + 1, "the round's batch")
        wait_until(lambda: journal.read_text(encoding="utf-8").count('"batch"') == rounds_done + 1, "the journal")
        child.send_signal(signal.SIGKILL)
        child.wait()
        if batch_id_lost:
            # As if killed between the batch's creation and the journal's line naming it: found
            # again among the listed batches by the custom ids of its results.
            lines = journal.read_text(encoding="utf-8").splitlines()
            journal.write_text("".join(line + "\n" for line in lines[:-1]), encoding="utf-8")
        server.finishing = None
        resumed = rt4(*command, "--resume")
        assert KEY not in journal.read_text(encoding="utf-8")
    assert resumed.returncode == 0, resumed.stderr
    assert set(server.submitted.values()) == {1}, server.submitted
    assert len(server.batches) == 3
    rows = records(out)
    assert [row["id"] for row in rows] == [f"s{n}" for n in range(6)]
    assert not any(row.get("incomplete") for row in rows)


def test_errored_lines_are_submitted_once_more_then_their_calls_fail_with_exit_4(tmp_path: Path) -> None:
    inputs = samples_file(tmp_path / "in.jsonl", 2)
    for failures, exit_code in ((1, 0), (2, 4)):
        out = tmp_path / f"failed{failures}.jsonl"
        with anthropic_batch_server(judge_reply) as server:
            server.fail = failures
            done = rt4("verify", inputs, "--judge", profile(tmp_path, server.origin), "--no-cache", "--decomposer",
                       "rules", "--no-global", "--batch", "--fail-on", "never", "--out", out)
        assert done.returncode == exit_code, done.stderr
        assert max(server.submitted.values()) == 2
        rows = records(out)
        if failures == 1:
            assert not any(row.get("incomplete") for row in rows)
        else:
            assert all(row["incomplete"] for row in rows)
            assert all("errored: api_error: internal error (submitted 2 times)" in error
                       for row in rows for claim in row["claims"] for error in claim["errors"])


def test_an_expired_anthropic_batch_keeps_its_answers_and_submits_the_rest_once_more(tmp_path: Path) -> None:
    inputs = samples_file(tmp_path / "in.jsonl", 3)
    with anthropic_batch_server(judge_reply) as server:
        server.expire, server.expired_answers = 1, 1
        done = rt4("verify", inputs, "--judge", profile(tmp_path, server.origin), "--no-cache", "--batch",
                   "--fail-on", "never", "--out", tmp_path / "out.jsonl")
    assert done.returncode == 0, done.stderr
    assert sorted(server.submitted.values()).count(2) == 2  # the two requests the expired batch left
    assert not any(row.get("incomplete") for row in records(tmp_path / "out.jsonl"))


def test_a_round_is_split_by_the_provider_s_request_and_byte_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    async def chunks() -> list[list[str]]:
        judge = resolve_judge("anthropic/claude-test", api_base="http://127.0.0.1:9", batch=BatchSettings())
        assert isinstance(judge, PolicyBackend) and isinstance(judge.sender, AnthropicBatchSender)
        loop = asyncio.get_running_loop()
        bodies = {f"r{n}": _Held(b"x" * (100 * (n + 1)), loop.create_future(), 0.0) for n in range(5)}
        monkeypatch.setattr(AnthropicBatchSender, "max_batch_requests", 2)
        by_count = judge.sender.rounds._chunks(bodies)
        monkeypatch.setattr(AnthropicBatchSender, "max_batch_requests", 100)
        # Room for the first two lines together; any two of the longer ones are over it.
        lines = [len(held.body) + LINE_OVERHEAD_BYTES for held in bodies.values()]
        monkeypatch.setattr(AnthropicBatchSender, "max_batch_bytes", lines[0] + lines[1])
        by_bytes = judge.sender.rounds._chunks(bodies)
        await judge.aclose()
        return [*by_count, [], *by_bytes]

    assert asyncio.run(chunks()) == [["r0", "r1"], ["r2", "r3"], ["r4"], [], ["r0", "r1"], ["r2"], ["r3"], ["r4"]]


def test_an_anthropic_model_string_under_batch_needs_its_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(JudgeConfigError, match="ANTHROPIC_API_KEY"):
        resolve_judge("anthropic/claude-3-5-haiku-20241022", batch=BatchSettings())
