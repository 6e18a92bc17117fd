"""The judge cache on a real ``redis-server`` (Debian's package; ``.ci/run`` installs it), started
here on 127.0.0.1 with a random port and a temporary directory. Without redis-server these tests
fail, they do not skip: the shared cache would otherwise go untested.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("redis", reason="needs the Redis client (the redis extra)")

import redis
from audit_fixtures import read_records, without_usage, write_samples
from conftest import VerifyRequestFactory, require_program
from faults import fault_server, grounded

from rt4chart.judges.cache import CacheError, open_cache, request_key
from rt4chart.judges.redis_cache import KEY_PREFIX
from rt4chart.method.tasks import VerifyOutput
from rt4chart.protocol import JudgeResponse

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = require_program("redis-server", "a Redis server (apt-get install redis-server; .ci/run does it)")
    directory = tmp_path_factory.mktemp("redis")
    port = _free_port()
    process = subprocess.Popen(
        [server, "--bind", "127.0.0.1", "--port", str(port), "--dir", str(directory), "--save", "",
         "--appendonly", "no", "--protected-mode", "yes"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(host="127.0.0.1", port=port)
    deadline = time.monotonic() + 30
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            assert process.poll() is None and time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0"
    client.close()
    process.terminate()
    process.wait(timeout=30)


def rt4(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rt4chart", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_warm_rerun_makes_no_call_and_another_process_shares_the_hits(tmp_path: Path, redis_url: str) -> None:
    write_samples(tmp_path / "in.jsonl", 12)
    (tmp_path / "other").mkdir()
    samples = write_samples(tmp_path / "other" / "in.jsonl", 16)  # the same 12 samples, and 4 new ones
    with fault_server(grounded) as server:
        audit = ["--judge", "openai/smollm2", "--api-base", server.base_url, "--decomposer", "rules",
                 "--cache-url", redis_url, "-q"]
        cold = rt4("verify", "in.jsonl", "--out", "cold.jsonl", *audit, cwd=tmp_path)
        assert cold.returncode == 1, cold.stderr
        cold_calls = len(server.requests)
        assert cold_calls > 0
        warm = rt4("verify", "in.jsonl", "--out", "warm.jsonl", *audit, cwd=tmp_path)
        assert warm.returncode == 1, warm.stderr
        assert len(server.requests) == cold_calls, "a warm rerun makes no judge call"
        # Another process, in another directory with no disk cache in common: only the new samples are judged.
        shared = rt4("verify", "in.jsonl", "--out", "shared.jsonl", *audit, cwd=tmp_path / "other")
        assert shared.returncode == 1, shared.stderr
        assert len(server.requests) == cold_calls + cold_calls // 3
    cold_records = read_records(tmp_path / "cold.jsonl")
    warm_records = read_records(tmp_path / "warm.jsonl")
    assert [without_usage(r) for r in warm_records] == [without_usage(r) for r in cold_records]
    assert sum(r["usage"]["cache_hits"] for r in warm_records) == cold_calls
    assert all(r["usage"]["calls"] == 0 for r in warm_records)
    shared_records = read_records(tmp_path / "other" / "shared.jsonl")
    assert [r["id"] for r in shared_records] == [s["id"] for s in samples]
    assert all(r["usage"]["calls"] == 0 for r in shared_records[:12])
    assert all(r["usage"]["cache_hits"] == 0 < r["usage"]["calls"] for r in shared_records[12:])
    assert not (tmp_path / "cache").exists()


def test_damaged_and_failed_entries_are_never_served(redis_url: str, verify_request: VerifyRequestFactory) -> None:
    own_database = redis_url.rsplit("/", 1)[0] + "/1"  # apart from the other tests' entries
    cache = open_cache(own_database)
    client = redis.Redis.from_url(own_database)
    try:
        request = verify_request(["The trial lasts 30 days."])
        key = request_key("some-judge", request)
        reply = VerifyOutput.model_validate({"judgements": [{"claim": 0, "label": "baseless"}]})
        cache.put(key, JudgeResponse(parsed=None, error="no valid reply"))
        assert client.get(KEY_PREFIX + key) is None, "a failure is never stored"
        cache.put(key, JudgeResponse(parsed=reply, judge="some-judge"))
        hit = cache.get(key, VerifyOutput)
        assert hit is not None and hit.parsed == reply
        client.set(KEY_PREFIX + key, b'{"parsed": {"judgements": "torn')
        assert cache.get(key, VerifyOutput) is None
        assert client.get(KEY_PREFIX + key) is None, "a damaged entry is dropped"
        client.set("someone-else:entry", b"kept")
        cache.put(key, JudgeResponse(parsed=reply, judge="some-judge"))
        assert cache.stats().entries == 1 and cache.clear() == 1
        assert client.get("someone-else:entry") == b"kept", "only rt4chart's entries are cleared"
    finally:
        client.delete("someone-else:entry")
        client.close()
        cache.close()


def test_an_unreachable_server_is_a_usage_error_without_its_password(tmp_path: Path) -> None:
    write_samples(tmp_path / "in.jsonl", 1)
    url = f"redis://:hunter2-redis-secret@127.0.0.1:{_free_port()}/0"
    with pytest.raises(CacheError) as raised:
        open_cache(url)
    assert "hunter2" not in str(raised.value) and "127.0.0.1" in str(raised.value)
    done = rt4("verify", "in.jsonl", "--decomposer", "rules", "--cache-url", url, cwd=tmp_path)
    assert done.returncode == 2
    assert "cannot use the cache server" in done.stderr and "hunter2" not in done.stderr


def test_cache_stats_and_clear_read_the_server_named_by_cache_url(
    tmp_path: Path, redis_url: str, verify_request: VerifyRequestFactory
) -> None:
    own_database = redis_url.rsplit("/", 1)[0] + "/2"  # apart from the other tests' entries
    cache = open_cache(own_database)
    try:
        for text in ("The trial lasts 30 days.", "The fee is 5 euros."):
            reply = VerifyOutput.model_validate({"judgements": [{"claim": 0, "label": "baseless"}]})
            key = request_key("some-judge", verify_request([text]))
            cache.put(key, JudgeResponse(parsed=reply, judge="some-judge"))
    finally:
        cache.close()
    stats = rt4("cache", "stats", "--cache-url", own_database, cwd=tmp_path)
    assert stats.returncode == 0, stats.stderr
    assert "2 entries" in stats.stdout and own_database in stats.stdout
    cleared = rt4("cache", "clear", "--cache-url", own_database, cwd=tmp_path)
    assert cleared.returncode == 0, cleared.stderr
    after = rt4("cache", "stats", "--cache-url", own_database, cwd=tmp_path)
    assert "0 entries" in after.stdout
    both = rt4("cache", "stats", "--cache-url", own_database, "--cache-dir", "cache", cwd=tmp_path)
    assert both.returncode == 2 and "alternatives" in both.stderr
    assert not (tmp_path / "cache").exists()


def test_a_frozen_server_blocks_neither_the_event_loop_nor_the_run(tmp_path: Path) -> None:
    """Issue 27: a frozen Redis (SIGSTOP) once held the loop 5 s per get and per put (16 of 40
    records in 900 s). Now each operation runs in a worker thread with a short timeout, and after a
    few failures the store leaves the server alone: the run finishes on the judge alone."""
    import asyncio
    import signal

    from rt4chart.judges.redis_cache import FAILURES_THAT_OPEN
    from rt4chart.judges.registry import judge_stack
    from rt4chart.options import AuditOptions
    from rt4chart.records.io import read_jsonl
    from rt4chart.runs.engine import Pipeline, run_audit

    server = require_program("redis-server", "a Redis server (apt-get install redis-server; .ci/run does it)")
    port = _free_port()
    process = subprocess.Popen([server, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                cache = open_cache(f"redis://127.0.0.1:{port}/0")
                break
            except CacheError:
                assert process.poll() is None and time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        os.kill(process.pid, signal.SIGSTOP)  # frozen: connections accepted by the kernel, never answered
        inputs, rules = tmp_path / "in.jsonl", tmp_path / "rules.json"
        write_samples(inputs, 40)
        rules.write_text('{"verify": [{"claim": "opens at", "label": "entailed", "evidence": ["opens at"]}], '
                         '"default": "baseless"}', encoding="utf-8")
        stack = judge_stack(f"scripted:{rules}", cache=cache)
        records: list[object] = []
        ticks = 0

        async def audit() -> None:
            nonlocal ticks
            task = asyncio.ensure_future(run_audit(Pipeline(stack, AuditOptions(decomposer="rules")),
                                                   list(read_jsonl(inputs)), tmp_path / "out.jsonl", records.append))
            while not task.done():  # the loop keeps turning while cache operations wait
                ticks += 1
                await asyncio.sleep(0.01)
            await task

        asyncio.run(asyncio.wait_for(audit(), timeout=600))  # a hang guard, not a measurement
        assert len(read_records(tmp_path / "out.jsonl")) == 40
        assert all(r["label"] is not None for r in read_records(tmp_path / "out.jsonl"))
        assert ticks > 1
        assert cache._store._failures >= FAILURES_THAT_OPEN  # the store's circuit opened
    finally:
        os.kill(process.pid, signal.SIGCONT)
        process.terminate()
        process.wait(timeout=30)
