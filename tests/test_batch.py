"""rt4 verify --batch against the Batch API stand-in (tests/batch_server.py): the stand-in's own
shapes, records and cache identical to online mode, rounds across samples, batch prices, the journal
and --resume after a kill, failed and expired batches."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from batch_server import batch_server
from conftest import VerifyRequestFactory
from faults import Fault, fault_server, grounded, judge_every_claim
from faults import sentences_as_claims_grounded as judge_reply

from rt4chart.analysis.datasets import default_data_dir, load_dataset
from rt4chart.judges.batch import BatchSender, BatchSettings
from rt4chart.judges.policy import PolicyBackend
from rt4chart.judges.registry import resolve_judge
from rt4chart.protocol import JudgeResponse

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
REPO = Path(__file__).resolve().parent.parent


def profile(tmp_path: Path) -> Path:
    """A judge profile on an OpenAI-compatible server with prices, so that costs can be compared."""
    path = tmp_path / "priced.toml"
    path.write_text(
        'name = "priced"\nmodel = "openai/fault"\napi = "openai-compatible"\n'
        "input_usd_per_mtok = 2.0\noutput_usd_per_mtok = 8.0\n",
        encoding="utf-8",
    )
    return path


def rt4(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The real CLI in a child process."""
    return subprocess.run(
        [sys.executable, "-m", "rt4chart", *map(str, args)],
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, capture_output=True, text=True, timeout=300,
        check=False,
    )


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


TRANSPORT_FIELDS = frozenset({"usage", "usage_by_judge", "calls", "cost_usd"})
"""Record fields that say what the calls cost and how they went, not what the judge found."""


def verdicts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records without their usage and transport fields, at any depth."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: strip(item) for key, item in value.items() if key not in TRANSPORT_FIELDS}
        if isinstance(value, list):
            return [strip(item) for item in value]
        return value

    return [strip(row) for row in rows]


def post(url: str, data: bytes, content_type: str) -> dict[str, Any]:
    request = urllib.request.Request(url, data=data, headers={"Content-Type": content_type}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, Any] = json.loads(response.read())
        return answer


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        data: bytes = response.read()
        return data


def upload(base_url: str, lines: list[dict[str, Any]]) -> str:
    boundary = uuid.uuid4().hex
    content = "".join(json.dumps(line) + "\n" for line in lines)
    form = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
        f"Content-Type: application/jsonl\r\n\r\n{content}\r\n--{boundary}--\r\n"
    )
    return str(post(f"{base_url}/files", form.encode(), f"multipart/form-data; boundary={boundary}")["id"])


def chat_line(custom_id: str, claim: str) -> dict[str, Any]:
    prompt = f"Context: the sky is blue.\nClaims:\n[0] {claim}"
    body = {"model": "fault", "messages": [{"role": "user", "content": prompt}], "max_tokens": 50}
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}


def create(base_url: str, file_id: str) -> dict[str, Any]:
    request = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h",
               "metadata": {"mine": "yes"}}
    return post(f"{base_url}/batches", json.dumps(request).encode(), "application/json")


def test_the_stand_in_answers_batches_as_the_online_server_answers_requests() -> None:
    lines = [chat_line("a", "the sky is blue"), chat_line("b", "grass is red"), chat_line("c", "the sky is blue")]
    with batch_server(grounded, Fault("ok"), Fault("server_error")) as server:
        batch = create(server.base_url, upload(server.base_url, lines))
        assert batch["status"] == "validating" and batch["metadata"] == {"mine": "yes"}
        url = f"{server.base_url}/batches/{batch['id']}"
        assert json.loads(get(url))["status"] == "in_progress"
        done = json.loads(get(url))
        assert done["status"] == "completed"
        assert done["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
        listed = json.loads(get(f"{server.base_url}/batches"))["data"]
        assert [row["id"] for row in listed] == [batch["id"]]
        outputs, errors = (
            [json.loads(line) for line in get(f"{server.base_url}/files/{done[kind]}/content").splitlines()]
            for kind in ("output_file_id", "error_file_id")
        )
        assert server.submitted == {"a": 1, "b": 1, "c": 1}
    # The second line met the scripted 500; the others are answered as online.
    assert [row["custom_id"] for row in outputs] == ["a", "c"] and [row["custom_id"] for row in errors] == ["b"]
    assert errors[0]["response"]["status_code"] == 500
    with fault_server(grounded) as online:
        for row, line in zip(outputs, (lines[0], lines[2]), strict=True):
            answer = post(f"{online.base_url}/chat/completions", json.dumps(line["body"]).encode(), "application/json")
            assert row["response"]["body"]["choices"] == answer["choices"]
            assert row["response"]["body"]["usage"] == answer["usage"]


def test_the_stand_in_expires_and_fails_batches_and_cancels_them() -> None:
    lines = [chat_line(name, "the sky is blue") for name in "abc"]
    with batch_server(grounded) as server:
        server.expire, server.expired_answers, server.fail = 1, 1, 1
        failed = create(server.base_url, upload(server.base_url, lines))
        expired = create(server.base_url, upload(server.base_url, lines))
        server.finishing = 2
        held = create(server.base_url, upload(server.base_url, lines))
        for batch in (failed, expired, held):
            get(f"{server.base_url}/batches/{batch['id']}")
        states = {b["id"]: json.loads(get(f"{server.base_url}/batches/{b['id']}")) for b in (failed, expired, held)}
        cancelled = post(f"{server.base_url}/batches/{held['id']}/cancel", b"", "application/json")
        expired_errors = get(f"{server.base_url}/files/{states[expired['id']]['error_file_id']}/content").splitlines()
    assert states[failed["id"]]["status"] == "failed" and states[failed["id"]]["output_file_id"] is None
    assert states[expired["id"]]["status"] == "expired"
    assert states[expired["id"]]["request_counts"] == {"total": 3, "completed": 1, "failed": 2}
    assert [json.loads(line)["error"]["code"] for line in expired_errors] == ["batch_expired"] * 2
    assert states[held["id"]]["status"] == "in_progress" and cancelled["status"] == "cancelled"


def samples_file(path: Path, count: int) -> Path:
    """``count`` answers of two sentences each, the first said by the context word for word."""
    rows = [
        {"id": f"s{n}", "question": f"What about store {n}?",
         "context": f"Store {n} opens at {n % 12 + 1} am. It sells bread.",
         "answer": f"Store {n} opens at {n % 12 + 1} am. It also sells cakes {n}."}
        for n in range(count)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def test_a_batch_audit_runs_in_one_round_per_stage_whatever_the_number_of_samples(tmp_path: Path) -> None:
    for count in (3, 12):
        inputs = samples_file(tmp_path / f"in{count}.jsonl", count)
        with batch_server(judge_reply) as server:
            done = rt4("verify", inputs, "--judge", profile(tmp_path), "--api-base", server.base_url, "--no-cache",
                       "--batch", "--batch-poll", "0.02", "--samples-in-flight", str(count),
                       "--out", tmp_path / f"out{count}.jsonl")
        assert done.returncode == 1, done.stderr  # the cakes are baseless
        # Decomposition, local windows, global stage: three rounds, each holding every sample's calls
        # (the global stage asks a sample's entailed and baseless claims apart, by first-pass label).
        assert [batch["request_counts"]["total"] for batch in server.created_batches] == [count, count, 2 * count]
        assert set(server.submitted.values()) == {1} and not server.online


def test_batch_records_equal_online_ones_at_half_the_price_and_fill_the_online_cache(tmp_path: Path) -> None:
    judge = profile(tmp_path)
    cache = tmp_path / "cache"
    for name in ("answers.jsonl", "cited_answers.jsonl"):
        inputs = EXAMPLES / name
        with batch_server(judge_reply) as server:
            common = ("verify", inputs, "--judge", judge, "--api-base", server.base_url, "--fail-on", "never")
            online = rt4(*common, "--no-cache", "--out", tmp_path / f"online-{name}")
            online_calls = len(server.online)
            batched = rt4(*common, "--cache-dir", cache, "--batch", "--out", tmp_path / f"batch-{name}",
                          env={"RT4_BATCH_POLL_S": "0.02"})
            assert len(server.online) == online_calls  # the batch run sent nothing online
            rerun = rt4(*common, "--cache-dir", cache, "--out", tmp_path / f"rerun-{name}")
            assert len(server.online) == online_calls  # the online rerun was answered by the cache
        assert online.returncode == batched.returncode == rerun.returncode == 0, batched.stderr
        assert sum(server.submitted.values()) == online_calls and set(server.submitted.values()) == {1}
        online_rows, batch_rows = records(tmp_path / f"online-{name}"), records(tmp_path / f"batch-{name}")
        assert verdicts(batch_rows) == verdicts(online_rows)
        assert verdicts(records(tmp_path / f"rerun-{name}")) == verdicts(online_rows)
        for online_row, batch_row in zip(online_rows, batch_rows, strict=True):
            assert batch_row["usage"]["calls"] == online_row["usage"]["calls"]
            assert batch_row["usage"]["prompt_tokens"] == online_row["usage"]["prompt_tokens"]
            assert batch_row["usage"]["cost_usd"] > 0
            assert abs(batch_row["usage"]["cost_usd"] - online_row["usage"]["cost_usd"] / 2) < 1e-12


def wait_until(condition: Any, what: str, limit_s: float = 120.0) -> None:
    """Poll ``condition`` until it holds (a check of the stand-in's state, not a guess at timing)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {limit_s} s for {what}")
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("rounds_done", "batch_id_lost"), [(0, False), (1, False), (2, False), (1, True)],
    ids=["decomposition", "local", "global", "local, killed before the journal named its batch"],
)
def test_a_killed_batch_run_resumes_without_submitting_any_request_twice(
    tmp_path: Path, rounds_done: int, batch_id_lost: bool
) -> None:
    inputs = samples_file(tmp_path / "in.jsonl", 6)
    out, journal, progress = tmp_path / "out.jsonl", tmp_path / "out.jsonl.batches.jsonl", tmp_path / "stderr.txt"
    with batch_server(judge_reply) as server:
        server.finishing = rounds_done  # the next round stays at the provider
        command = ("verify", inputs, "--judge", profile(tmp_path), "--api-base", server.base_url, "--no-cache",
                   "--batch", "--batch-poll", "0.02", "--samples-in-flight", "6", "--fail-on", "never", "--out", out)
        with progress.open("w", encoding="utf-8") as log:
            child = subprocess.Popen(
                [sys.executable, "-m", "rt4chart", *map(str, command)], stderr=log, stdout=subprocess.DEVNULL,
                env={**os.environ, "PYTHONPATH": str(REPO), "RT4_HEARTBEAT_S": "0.1"},
            )
            # Killed once the round's batch exists at the provider, the journal names it and the
            # progress line says it is waiting.
            wait_until(lambda: len(server.batches) == rounds_done + 1, "the round's batch")
            wait_until(lambda: journal.read_text(encoding="utf-8").count('"batch"') == rounds_done + 1, "the journal")
            waiting = f"round {rounds_done + 1} waiting on the provider"
            wait_until(lambda: waiting in progress.read_text(encoding="utf-8"), "the progress line")
            child.send_signal(signal.SIGKILL)
            child.wait()
        assert re.search(rf"round {rounds_done + 1} waiting on the provider: batch-\d+, (6|12) requests, \d+ s",
                         progress.read_text(encoding="utf-8"))
        if batch_id_lost:
            # As if killed between the batch's creation and the journal's line naming it: the
            # provider holds it, under the submission id of its metadata.
            lines = journal.read_text(encoding="utf-8").splitlines()
            journal.write_text("".join(line + "\n" for line in lines[:-1]), encoding="utf-8")
            assert '"batch"' in lines[-1] and '"batch"' not in lines[-2]
        server.finishing = None
        resumed = rt4(*command, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert set(server.submitted.values()) == {1}, server.submitted
    assert len(server.batches) == 3
    rows = records(out)
    assert [row["id"] for row in rows] == [f"s{n}" for n in range(6)]
    assert not any(row.get("incomplete") for row in rows)


def test_a_failed_batch_is_submitted_once_more_then_its_calls_fail_as_online_ones(tmp_path: Path) -> None:
    inputs = samples_file(tmp_path / "in.jsonl", 2)
    for failures, exit_code in ((1, 0), (2, 4)):
        out = tmp_path / f"failed{failures}.jsonl"
        with batch_server(judge_reply) as server:
            server.fail = failures
            # Decomposed by rules, no global stage: the local verification is the one round (a failed
            # decomposition falls back to rules and the global stage re-judges, as online).
            done = rt4("verify", inputs, "--judge", profile(tmp_path), "--api-base", server.base_url, "--no-cache",
                       "--decomposer", "rules", "--no-global", "--batch", "--batch-poll", "0.02", "--fail-on", "never",
                       "--out", out)
        assert done.returncode == exit_code, done.stderr
        rows = records(out)
        # The failed round's requests go once more, never a third time.
        assert max(server.submitted.values()) == 2
        if failures == 1:
            assert not any(row.get("incomplete") for row in rows)
        else:
            assert all(row["incomplete"] for row in rows)
            assert all("failed without its line (submitted 2 times)" in error
                       for row in rows for claim in row["claims"] for error in claim["errors"])


def test_an_expired_batch_keeps_its_answers_and_submits_the_rest_once_more(tmp_path: Path) -> None:
    inputs = samples_file(tmp_path / "in.jsonl", 3)
    with batch_server(judge_reply) as server:
        server.expire, server.expired_answers = 1, 1
        done = rt4("verify", inputs, "--judge", profile(tmp_path), "--api-base", server.base_url, "--no-cache",
                   "--batch", "--batch-poll", "0.02", "--fail-on", "never", "--out", tmp_path / "out.jsonl")
    assert done.returncode == 0, done.stderr
    assert sorted(server.submitted.values()).count(2) == 2  # the two lines the expired batch left
    assert not any(row.get("incomplete") for row in records(tmp_path / "out.jsonl"))


def test_re_asks_of_invalid_replies_go_out_together_in_one_more_round(tmp_path: Path) -> None:
    count = 4
    inputs = samples_file(tmp_path / "in.jsonl", count)
    # Every decomposition reply of the first round is prose: each sample re-asks once.
    with batch_server(judge_reply, *[Fault("invalid_json")] * count) as server:
        done = rt4("verify", inputs, "--judge", profile(tmp_path), "--api-base", server.base_url, "--no-cache",
                   "--batch", "--batch-poll", "0.02", "--samples-in-flight", str(count),
                   "--out", tmp_path / "out.jsonl")
    assert done.returncode == 1, done.stderr
    assert [batch["request_counts"]["total"] for batch in server.created_batches] == [count, count, count, 2 * count]
    assert set(server.submitted.values()) == {1}  # a re-ask is another request (the bad reply in its prompt)


RAGTRUTH_DEV = default_data_dir() / "ragtruth-qa" / "dev.jsonl"


@pytest.mark.skipif(not RAGTRUTH_DEV.is_file(), reason="RAGTruth QA dev is not beside the checkout")
def test_batch_records_equal_online_ones_on_40_ragtruth_qa_dev_answers(tmp_path: Path) -> None:
    inputs = tmp_path / "dev.jsonl"
    samples = load_dataset("ragtruth-qa", RAGTRUTH_DEV.parent, "dev", 40)
    inputs.write_text("".join(s.model_dump_json(exclude={"gold"}) + "\n" for s in samples), encoding="utf-8")
    with batch_server(judge_reply) as server:
        common = ("verify", inputs, "--judge", profile(tmp_path), "--api-base", server.base_url, "--no-cache",
                  "--samples-in-flight", "40", "--fail-on", "never")
        online = rt4(*common, "--out", tmp_path / "online.jsonl")
        batched = rt4(*common, "--batch", "--batch-poll", "0.02", "--out", tmp_path / "batch.jsonl")
    assert online.returncode == batched.returncode == 0, batched.stderr
    # Each distinct request once: two answers asking the very same request share one line.
    distinct = {json.dumps(body, sort_keys=True) for body in server.online}
    assert len(server.submitted) == len(distinct) and set(server.submitted.values()) == {1}
    assert verdicts(records(tmp_path / "batch.jsonl")) == verdicts(records(tmp_path / "online.jsonl"))


def test_an_estimate_under_batch_prices_the_same_plan_at_half_the_rate(tmp_path: Path) -> None:
    # A server that is never called: an estimate calls no judge.
    common = ("estimate", EXAMPLES / "answers.jsonl", "--judge", profile(tmp_path), "--api-base",
              "http://127.0.0.1:9/v1", "--cache-dir", tmp_path / "cache", "--json")
    online, batched = (rt4(*common, *extra) for extra in ((), ("--batch",)))
    assert online.returncode == batched.returncode == 0, batched.stderr
    online_plan, batch_plan = json.loads(online.stdout), json.loads(batched.stdout)
    assert batch_plan["calls_worst_case"] == online_plan["calls_worst_case"]
    assert batch_plan["prompt_tokens"] == online_plan["prompt_tokens"] > 0
    for figure in ("expected_usd", "worst_case_usd"):
        assert online_plan[figure] > 0
        assert abs(batch_plan[figure] - online_plan[figure] / 2) < 1e-9 * online_plan[figure]


def test_a_call_abandoned_before_its_round_is_never_submitted(
    tmp_path: Path, verify_request: VerifyRequestFactory
) -> None:
    """A run that stops (budget, interrupt) cancels its samples' calls: those still waiting for
    their round leave it, so nothing is paid for a reply no one will read."""

    async def audit(base_url: str) -> JudgeResponse:
        judge = resolve_judge(str(profile(tmp_path)), api_base=base_url, batch=BatchSettings(poll_s=0.02))
        assert isinstance(judge, PolicyBackend) and isinstance(judge.sender, BatchSender)
        abandoned = asyncio.ensure_future(judge.complete(verify_request(["The trial is free."])))
        while not judge.sender.rounds.pending:  # it joins the round being gathered, then its sample stops
            await asyncio.sleep(0)
        abandoned.cancel()
        kept = await judge.complete(verify_request(["The trial lasts a month."]))
        await judge.aclose()
        return kept

    with batch_server(judge_every_claim("baseless")) as server:
        kept = asyncio.run(audit(server.base_url))
    assert kept.error is None and kept.parsed is not None
    assert [batch["request_counts"]["total"] for batch in server.created_batches] == [1]


def test_a_run_without_resume_starts_a_new_journal(tmp_path: Path) -> None:
    inputs, out = samples_file(tmp_path / "in.jsonl", 2), tmp_path / "out.jsonl"
    for _ in range(2):  # two servers: the second knows none of the first one's batches
        with batch_server(judge_reply) as server:
            done = rt4("verify", inputs, "--judge", profile(tmp_path), "--api-base", server.base_url, "--no-cache",
                       "--batch", "--batch-poll", "0.02", "--fail-on", "never", "--out", out)
        assert done.returncode == 0, done.stderr
        assert len(server.batches) == 3 and set(server.submitted.values()) == {1}
    journal = [json.loads(line) for line in (tmp_path / "out.jsonl.batches.jsonl").read_text().splitlines()]
    assert len(journal) == 6  # this run's three submissions, each intended then created
