"""``rt4 eval``, ``rt4 compare`` and ``rt4 repair`` with ``--batch`` against the Batch API stand-in
(tests/batch_server.py), through the real CLI: what each writes is what the online command writes
apart from usage and transport fields; a killed batch repair resumes without submitting a request
twice; and ``rt4 verify --batch --budget`` stops before a round it cannot pay, as online stops."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from batch_server import batch_server
from faults import sentences_as_claims_grounded as judge_reply
from test_batch import REPO, profile, records, rt4, samples_file, verdicts, wait_until
from test_batch_rounds import INPUT_USD_PER_MTOK, OUTPUT_USD_PER_MTOK

from rt4chart.judges.batch import BATCH_PRICE_FACTOR
from rt4chart.judges.replies import prompt_token_bound
from rt4chart.protocol import Message

FIXTURES = Path(__file__).parent / "fixtures" / "datasets" / "ragtruth-qa"
POLL = ("--batch-poll", "0.02")


def without_transport(value: Any) -> Any:
    """A result file's content without what the calls cost and how long they took."""
    noisy = {"usage", "usage_by_judge", "calls", "cost_usd", "wall_seconds", "date"}
    if isinstance(value, dict):
        return {key: without_transport(item) for key, item in value.items() if key not in noisy}
    if isinstance(value, list):
        return [without_transport(item) for item in value]
    return value


def test_rt4_eval_in_batch_mode_predicts_and_measures_what_online_eval_does(tmp_path: Path) -> None:
    results: dict[str, Path] = {}
    with batch_server(judge_reply) as server:
        for mode, extra in (("online", ()), ("batch", ("--batch", *POLL))):
            results[mode] = tmp_path / mode
            done = rt4("eval", "ragtruth-qa", "--path", FIXTURES, "--split", "dev", "--judge", profile(tmp_path),
                       "--api-base", server.base_url, "--cache-dir", tmp_path / f"{mode}-cache", "--resamples", "10",
                       "--save-predictions", "--results-dir", results[mode], *extra)
            assert done.returncode == 0, done.stderr
        online_calls = len(server.online)
    assert online_calls > 0 and sum(server.submitted.values()) <= online_calls  # shared lines go once
    assert set(server.submitted.values()) == {1} and server.created_batches
    online_files = sorted(path.name for path in results["online"].iterdir())
    assert online_files == sorted(path.name for path in results["batch"].iterdir())
    for name in online_files:
        online_text, batch_text = ((results[mode] / name).read_text(encoding="utf-8") for mode in ("online", "batch"))
        if name.endswith(".jsonl"):
            assert verdicts(records(results["batch"] / name)) == verdicts(records(results["online"] / name)), name
        elif name.endswith(".json"):
            online_json, batch_json = json.loads(online_text), json.loads(batch_text)
            assert without_transport(batch_json) == without_transport(online_json), name


def test_rt4_compare_in_batch_mode_writes_what_online_compare_writes(tmp_path: Path) -> None:
    inputs = samples_file(tmp_path / "in.jsonl", 3)
    other = tmp_path / "other.toml"
    # Another judge: another name and model, so that its requests are its own.
    text = profile(tmp_path).read_text(encoding="utf-8")
    other.write_text(text.replace('"priced"', '"other"').replace('"openai/fault"', '"openai/other"'), encoding="utf-8")
    judges = f"{profile(tmp_path)},{other}"
    with batch_server(judge_reply) as server:
        for mode, extra in (("online", ()), ("batch", ("--batch", *POLL))):
            done = rt4("compare", inputs, "--judges", judges, "--api-base", server.base_url, "--no-cache",
                       "--resamples", "10", "--out-dir", tmp_path / mode, *extra)
            assert done.returncode == 0, done.stderr
    assert set(server.submitted.values()) == {1} and server.created_batches
    written = sorted(path.name for path in (tmp_path / "online").iterdir())
    assert written == sorted(path.name for path in (tmp_path / "batch").iterdir() if "batches" not in path.name)
    for name in written:
        if name.endswith(".jsonl"):
            assert verdicts(records(tmp_path / "batch" / name)) == verdicts(records(tmp_path / "online" / name))
        elif name.endswith(".json"):
            loaded = [json.loads((tmp_path / mode / name).read_text(encoding="utf-8")) for mode in ("batch", "online")]
            assert without_transport(loaded[0]) == without_transport(loaded[1]), name


def verified_records(tmp_path: Path, base_url: str, inputs: Path) -> Path:
    """``rt4 verify`` records of ``inputs`` (online), what ``rt4 repair`` reads."""
    out = tmp_path / "verified.jsonl"
    done = rt4("verify", inputs, "--judge", profile(tmp_path), "--api-base", base_url, "--no-cache",
               "--fail-on", "never", "--out", out)
    assert done.returncode == 0, done.stderr
    return out


def repair_or_judge(body: dict[str, Any]) -> str:
    """A reply function: a repair request gets each flagged sentence rewritten as the context's
    second sentence; any other request :func:`faults.sentences_as_claims_grounded`'s reply."""
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    flagged = re.findall(r"^\[(\d+)\] (.*)\n  keep:", user, flags=re.MULTILINE)
    if not flagged:
        return judge_reply(body)
    return json.dumps({"sentences": [{"sentence": int(n), "text": "It sells bread."} for n, _ in flagged]})


def repair_command(tmp_path: Path, base_url: str, inputs: Path, verified: Path, out: Path) -> list[str | Path]:
    return ["repair", verified, "--input", inputs, "--strategy", "rewrite", "--judge", profile(tmp_path),
            "--api-base", base_url, "--no-cache", "--samples-in-flight", "6", "--out", out]


def test_rt4_repair_in_batch_mode_resumes_after_a_kill_and_writes_what_online_repair_writes(
    tmp_path: Path,
) -> None:
    inputs = samples_file(tmp_path / "in.jsonl", 6)
    online_out, batch_out = tmp_path / "online.jsonl", tmp_path / "batch.jsonl"
    journal = tmp_path / "batch.jsonl.batches.jsonl"
    with batch_server(repair_or_judge) as server:
        verified = verified_records(tmp_path, server.base_url, inputs)
        online = rt4(*repair_command(tmp_path, server.base_url, inputs, verified, online_out))
        assert online.returncode == 0, online.stderr
        server.finishing = 0  # the rewrite round stays at the provider: killed while it waits
        command = [*repair_command(tmp_path, server.base_url, inputs, verified, batch_out), "--batch", *POLL]
        child = subprocess.Popen([sys.executable, "-m", "rt4chart", *map(str, command)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 env={**os.environ, "PYTHONPATH": str(REPO)})
        wait_until(lambda: len(server.batches) == 1, "the rewrite round's batch")
        wait_until(lambda: journal.exists() and '"batch"' in journal.read_text(encoding="utf-8"), "the journal")
        child.send_signal(signal.SIGKILL)
        child.wait()
        server.finishing = None
        resumed = rt4(*command, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert len(server.batches) == 1 and set(server.submitted.values()) == {1}, server.submitted
    rewritten = records(batch_out)
    assert verdicts(rewritten) == verdicts(records(online_out))
    assert len(rewritten) == 6 and all("It sells bread." in json.dumps(row) for row in rewritten)



def test_a_killed_batch_repair_resumes_its_verify_after_re_audit_without_submitting_twice(tmp_path: Path) -> None:
    """The re-audit of --verify-after keeps its records and journal beside --out (OUT.verify-after.jsonl), so a
    kill while its first round waits at the provider costs nothing on --resume."""
    inputs = samples_file(tmp_path / "in.jsonl", 6)
    online_out, batch_out = tmp_path / "online.jsonl", tmp_path / "batch.jsonl"
    journal = tmp_path / "batch.jsonl.verify-after.jsonl.batches.jsonl"
    with batch_server(repair_or_judge) as server:
        verified = verified_records(tmp_path, server.base_url, inputs)
        online = rt4(*repair_command(tmp_path, server.base_url, inputs, verified, online_out), "--verify-after")
        assert online.returncode == 0, online.stderr
        server.finishing = 1  # the rewrite round finishes; the re-audit's first round stays at the provider
        command = [*repair_command(tmp_path, server.base_url, inputs, verified, batch_out), "--verify-after",
                   "--batch", *POLL]
        child = subprocess.Popen([sys.executable, "-m", "rt4chart", *map(str, command)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 env={**os.environ, "PYTHONPATH": str(REPO)})
        wait_until(lambda: len(server.batches) == 2, "the re-audit's first batch")
        wait_until(lambda: journal.exists() and '"batch"' in journal.read_text(encoding="utf-8"), "its journal")
        child.send_signal(signal.SIGKILL)
        child.wait()
        server.finishing = None
        resumed = rt4(*command, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert len(server.batches) >= 3 and set(server.submitted.values()) == {1}, server.submitted
    assert verdicts(records(batch_out)) == verdicts(records(online_out))


def test_a_batch_budget_stop_submits_nothing_of_the_round_it_cannot_pay_and_stops_as_online(
    tmp_path: Path,
) -> None:
    inputs = samples_file(tmp_path / "in.jsonl", 2)
    estimate = rt4("estimate", inputs, "--judge", profile(tmp_path), "--api-base", "http://127.0.0.1:9/v1",
                   "--cache-dir", tmp_path / "empty-cache", "--batch", "--json")
    assert estimate.returncode == 0, estimate.stderr
    worst = json.loads(estimate.stdout)["worst_case_usd"]
    common = ("verify", inputs, "--judge", profile(tmp_path), "--no-cache", "--fail-on", "never")
    outcomes: dict[str, subprocess.CompletedProcess[str]] = {}
    with batch_server(judge_reply) as server:
        # The estimate's worst case at batch prices admits every round of the run.
        enough = rt4(*common, "--api-base", server.base_url, "--batch", *POLL, "--budget", str(worst),
                     "--out", tmp_path / "enough.jsonl")
        assert enough.returncode == 0, enough.stderr
        rounds = len(server.created_batches)
        spent = sum(row["usage"]["cost_usd"] for row in records(tmp_path / "enough.jsonl"))
        assert 0 < spent <= worst
    for mode, extra in (("online", ()), ("batch", ("--batch", *POLL))):
        # A budget far below one line's worst case: online, the first call is refused; in batch
        # mode, the first round, before anything is journaled or submitted.
        with batch_server(judge_reply) as server:
            outcomes[mode] = rt4(*common, "--api-base", server.base_url, "--budget", str(spent / 1000),
                                 "--out", tmp_path / f"{mode}.jsonl", *extra)
            assert not server.batches and not server.submitted and not server.online
    assert rounds >= 2
    assert outcomes["online"].returncode == outcomes["batch"].returncode == 3, outcomes["batch"].stderr
    assert "stopped by budget" in outcomes["batch"].stderr or "stopped by budget" in outcomes["batch"].stdout
    assert records(tmp_path / "batch.jsonl") == records(tmp_path / "online.jsonl") == []
    journal = tmp_path / "batch.jsonl.batches.jsonl"
    assert not journal.exists() or not journal.read_text(encoding="utf-8").strip()


def test_a_batch_budget_that_cannot_pay_the_second_round_keeps_the_first_and_submits_no_more(
    tmp_path: Path,
) -> None:
    inputs = samples_file(tmp_path / "in.jsonl", 1)
    command = ("verify", inputs, "--judge", profile(tmp_path), "--no-cache", "--fail-on", "never", "--batch", *POLL)
    with batch_server(judge_reply) as server:
        full = rt4(*command, "--api-base", server.base_url, "--out", tmp_path / "full.jsonl")
        assert full.returncode == 0, full.stderr
        first, second = (batch["_lines"] for batch in server.created_batches[:2])
        first_output = server.files[server.created_batches[0]["output_file_id"]].splitlines()
    usage = json.loads(first_output[0])["response"]["body"]["usage"]
    first_cost = (usage["prompt_tokens"] * INPUT_USD_PER_MTOK + usage["completion_tokens"] * OUTPUT_USD_PER_MTOK) / 1e6
    first_cost *= BATCH_PRICE_FACTOR
    worst = [sum(body_worst_case_usd(line["body"]) for line in lines) for lines in (first, second)]
    # Enough for the first round's worst case, and for its real cost plus all but a cent's fraction
    # of the second round's worst case: the second round cannot be admitted.
    budget = first_cost + worst[1] * 0.999
    assert budget >= worst[0]
    journal = tmp_path / "out.jsonl.batches.jsonl"
    with batch_server(judge_reply) as server:
        stopped = rt4(*command, "--api-base", server.base_url, "--budget", str(budget), "--out", tmp_path / "out.jsonl")
        assert len(server.created_batches) == 1 and set(server.submitted.values()) == {1}
    assert stopped.returncode == 3, stopped.stderr
    assert "stopped by budget" in stopped.stderr + stopped.stdout
    entries = [json.loads(line) for line in journal.read_text(encoding="utf-8").splitlines()]
    assert len(entries) == 2  # the first round, intended then created: nothing of the second
    assert records(tmp_path / "out.jsonl") == []  # the one sample was not finished


def body_worst_case_usd(body: dict[str, Any]) -> float:
    """:func:`test_batch_rounds.line_worst_case_usd` of a batch line's body."""
    messages = [Message.model_validate(message) for message in body["messages"]]
    prompt = prompt_token_bound(messages) * INPUT_USD_PER_MTOK / 1e6
    return (prompt + body["max_tokens"] * OUTPUT_USD_PER_MTOK / 1e6) * BATCH_PRICE_FACTOR
