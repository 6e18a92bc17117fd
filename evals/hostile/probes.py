"""The hostile probes of issues 27 and 40, re-run end to end: each is the real ``rt4`` CLI (or, for the
items whose set-up needs a fault server, a Ray cluster or a mounted disk, the test that builds it)
against inputs written here, and the table says what was expected and what was observed.

    python evals/hostile/probes.py [--no-record] [--only TEXT]

Writes ``evals/hostile/RESULTS.md`` (``--no-record``: prints only; ``--only``: the probes whose name
holds TEXT, never recorded). Exit status 1 when a probe did not observe what it expected.

Issue 40's memory probes (gzip bombs, bodies that never end) run their client in a child process
under ``RLIMIT_AS`` (:data:`MEMORY_LIMIT`), so an unbounded client dies of MemoryError instead of
taking the machine's memory; the hostile server (``hostile_server.py``) bounds what it sends too.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import resource
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from audit_fixtures import write_rules, write_samples  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hostile_server import Mode, hostile_server  # noqa: E402

RESULTS = Path(__file__).with_name("RESULTS.md")


@dataclass
class Observed:
    ok: bool
    text: str


@dataclass
class Probe:
    name: str
    expected: str
    run: Callable[[Path], Observed]


def child_environment() -> dict[str, str]:
    """This checkout first on the path (what PYTHONPATH held after it); litellm's cost map offline."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def rt4(folder: Path, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    environment = child_environment()
    return subprocess.run([sys.executable, "-m", "rt4chart", *args], cwd=folder, env=environment, input=stdin,
                          capture_output=True, timeout=600, check=False)


def setup(folder: Path, samples: int = 4) -> list[str]:
    """Inputs ``a.jsonl`` and the scripted judge's arguments."""
    write_samples(folder / "a.jsonl", samples)
    rules = write_rules(folder / "rules.json")
    return ["--judge", f"scripted:{rules}", "--decomposer", "rules", "--no-cache", "-q"]


def unchanged(kept: bool) -> str:
    return "unchanged" if kept else "CHANGED"


def shown(leaked: bool) -> str:
    return "SHOWN" if leaked else "not shown"


def records(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.exists() else []


def refused_keeping_input(*flags: str) -> Callable[[Path], Observed]:
    def probe(folder: Path) -> Observed:
        judge = setup(folder)
        before = (folder / "a.jsonl").read_bytes()
        done = rt4(folder, "verify", "a.jsonl", *flags, *judge)
        kept = (folder / "a.jsonl").read_bytes() == before
        return Observed(done.returncode == 2 and kept, f"exit {done.returncode}, input {unchanged(kept)}")
    return probe


def report_html_onto_records(folder: Path) -> Observed:
    judge = setup(folder)
    rt4(folder, "verify", "a.jsonl", "--out", "o.jsonl", *judge)
    before = (folder / "o.jsonl").read_bytes()
    done = rt4(folder, "report", "o.jsonl", "--html", "o.jsonl")
    kept = (folder / "o.jsonl").read_bytes() == before
    return Observed(done.returncode == 2 and kept, f"exit {done.returncode}, records {unchanged(kept)}")


def stdin_onto_itself(folder: Path) -> Observed:
    judge = setup(folder)
    before = (folder / "a.jsonl").read_bytes()
    with open(folder / "a.jsonl", "rb") as source:
        environment = child_environment()
        done = subprocess.run([sys.executable, "-m", "rt4chart", "verify", "-", "--out", "a.jsonl", *judge],
                              cwd=folder, env=environment, stdin=source, capture_output=True, timeout=300, check=False)
    kept = (folder / "a.jsonl").read_bytes() == before
    return Observed(done.returncode == 2 and kept, f"exit {done.returncode}, input {unchanged(kept)}")


def poisoned_line(poison: str) -> Callable[[Path], Observed]:
    def probe(folder: Path) -> Observed:
        judge = setup(folder)
        lines = (folder / "a.jsonl").read_text(encoding="utf-8").splitlines()
        lines.insert(1, poison)
        (folder / "a.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        done = rt4(folder, "verify", "a.jsonl", "--out", "o.jsonl", *judge)
        written = records(folder / "o.jsonl")
        errors = [r for r in written if r["errors"] and r["label"] is None]
        ok = done.returncode == 2 and len(written) == 5 and len(errors) == 1
        return Observed(ok, f"exit {done.returncode}, {len(written)} records, {len(errors)} error record")
    return probe


def credentials_in_api_base(folder: Path) -> Observed:
    setup(folder)
    done = rt4(folder, "verify", "a.jsonl", "--judge", "openai/x", "--api-base", "http://user:s3cretpw@127.0.0.1:9/v1",
               "--no-cache", "-q")
    leaked = b"s3cretpw" in done.stdout + done.stderr
    return Observed(done.returncode == 2 and not leaked, f"exit {done.returncode}, password {shown(leaked)}")


def redis_password(folder: Path) -> Observed:
    done = rt4(folder, "cache", "stats", "--cache-url", "redis://127.0.0.1:9/0?password=hunter2secret")
    leaked = b"hunter2secret" in done.stdout + done.stderr
    return Observed(done.returncode == 2 and not leaked, f"exit {done.returncode}, password {shown(leaked)}")


def markup_in_path(folder: Path) -> Observed:
    judge = setup(folder)
    (folder / "x[").mkdir()  # the path of the issue's probe: a folder `x[` holding `]y.jsonl`
    (folder / "a.jsonl").rename(folder / "x[/]y.jsonl")
    done = rt4(folder, "verify", "x[/]y.jsonl", *judge)
    return Observed(done.returncode == 1 and b"Traceback" not in done.stderr, f"exit {done.returncode}")


def repair_empty(folder: Path) -> Observed:
    setup(folder)
    (folder / "empty.jsonl").write_text("", encoding="utf-8")
    done = rt4(folder, "repair", "empty.jsonl", "--input", "a.jsonl", "--out", "r.jsonl")
    return Observed(done.returncode == 2, f"exit {done.returncode}")


def ansi_in_answer(folder: Path) -> Observed:
    judge = setup(folder, 1)
    sample = json.loads((folder / "a.jsonl").read_text(encoding="utf-8"))
    sample["answer"] += " \x1b[2J\x1b]0;owned\x07 \u202e"
    (folder / "a.jsonl").write_text(json.dumps(sample) + "\n", encoding="utf-8")
    done = rt4(folder, "verify", "a.jsonl", "--format", "text", *judge)
    raw = b"\x1b[2J" in done.stdout or "\u202e".encode() in done.stdout
    return Observed(not raw, f"exit {done.returncode}, escapes {'RAW' if raw else 'made visible'}")


def pytest_probe(test: str) -> Callable[[Path], Observed]:
    def probe(folder: Path) -> Observed:
        environment = child_environment()
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test], cwd=ROOT,
                              env=environment, capture_output=True, text=True, timeout=900, check=False)
        summary = (done.stdout.strip().splitlines() or ["no output"])[-1]
        return Observed(done.returncode == 0, summary.replace("=", "").strip())
    return probe



# Issue 40 -------------------------------------------------------------------------------------------

MEMORY_LIMIT = 3 * 2**30
"""Address space of a probe's child (RLIMIT_AS): a normal run needs well under it."""
HOSTILE_RUN_S = 180.0
"""How long a hostile-server probe's child may run before the probe kills it."""
BOUNDED_PEAK_MIB = 1024
"""A bounded client's peak memory stays under this (a run against a sane server peaks near 300 MiB);
the bomb decodes to 2 GiB, so a client that buffers it meets MEMORY_LIMIT first."""


@dataclass
class Limited:
    """A child run under a memory limit and a deadline."""

    returncode: int | None
    """``None``: still running at the deadline (killed)."""
    stdout: bytes
    stderr: bytes
    peak_mib: float
    """Its peak resident memory (wait4's ru_maxrss)."""
    seconds: float

    def status(self) -> str:
        ending = f"exit {self.returncode}" if self.returncode is not None else "STILL RUNNING, killed"
        if b"MemoryError" in self.stderr:
            ending += " (MemoryError)"
        return f"{ending} after {self.seconds:.0f} s, peak {self.peak_mib:,.0f} MiB"


def limited(folder: Path, command: list[str], timeout_s: float = HOSTILE_RUN_S,
            memory_bytes: int = MEMORY_LIMIT) -> Limited:
    """``command`` in ``folder`` under RLIMIT_AS ``memory_bytes``, killed (its process group) at ``timeout_s``."""
    environment = child_environment()

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))

    started = time.monotonic()
    with open(folder / ".stdout", "w+b") as out, open(folder / ".stderr", "w+b") as err:
        child = subprocess.Popen(command, cwd=folder, env=environment, stdout=out, stderr=err,
                                 preexec_fn=limit, start_new_session=True)
        returncode: int | None = None
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                returncode = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() - started > timeout_s:
                os.killpg(child.pid, signal.SIGKILL)
                _, status, usage = os.wait4(child.pid, 0)
                break
            time.sleep(0.2)
        child.returncode = returncode if returncode is not None else -9  # reaped here, not by Popen
        out.seek(0)
        err.seek(0)
        return Limited(returncode, out.read(), err.read(), usage.ru_maxrss / 1024, time.monotonic() - started)


def rt4_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "rt4chart", *args]


def profile(folder: Path, base_url: str, api: str, *, timeout_s: float = 20.0) -> Path:
    """A judge profile at ``base_url`` over the ``api`` transport, two attempts, fast backoff."""
    path = folder / f"{api}.toml"
    path.write_text(f'name = "hostile-{api}"\nmodel = "openai/m"\napi_base = "{base_url}"\napi = "{api}"\n'
                    f"timeout_s = {timeout_s}\nmax_attempts = 2\nbackoff_s = 0.01\nbackoff_max_s = 0.05\n",
                    encoding="utf-8")
    return path


def hostile_reply(mode: Mode, api: str, timeout_s: float = 20.0) -> Callable[[Path], Observed]:
    """A run against a server in ``mode``: expected to stop with exit 4 (the judge unusable) inside
    the deadline, its peak memory under BOUNDED_PEAK_MIB (a MemoryError taken for a failed call and
    retried would also end in exit 4)."""
    def probe(folder: Path) -> Observed:
        write_samples(folder / "a.jsonl", 1)
        with hostile_server(mode) as server:
            judge = profile(folder, server.base_url, api, timeout_s=timeout_s)
            run = limited(folder, rt4_command("verify", "a.jsonl", "--judge", str(judge), "--decomposer", "rules",
                                              "--no-cache", "-q", "--concurrency", "1"))
        bounded = run.peak_mib < BOUNDED_PEAK_MIB and b"MemoryError" not in run.stderr
        return Observed(run.returncode == 4 and bounded, run.status())
    return probe


SIGNALS_CHILD = """
import json, math, sys
from rt4chart.signals.base import ScoreRequest, SignalError
from rt4chart.signals.vllm_client import VllmPromptLogprobsBackend, parse_prompt_logprobs
case = sys.argv[1]
request = [ScoreRequest(ids=[1, 5], first=1)]
try:
    if case == "endless":
        backend = VllmPromptLogprobsBackend(sys.argv[2], tokenizer=None, tokenizer_identity="t", model="m",
                                            timeout_s=20.0)
        print(backend.score(request))
    else:
        entry = {"5": 3.0} if case == "not-a-dict" else {"5": {"logprob": float("nan")}}
        print(parse_prompt_logprobs({"choices": [{"index": 0, "prompt_logprobs": [None, entry]}]}, request))
except SignalError as error:
    print("SignalError:", error)
    sys.exit(3)
"""


def signals_client(case: str) -> Callable[[Path], Observed]:
    """The signals' vLLM client: expected to raise SignalError (exit 3 of the child here)."""
    def probe(folder: Path) -> Observed:
        (folder / "child.py").write_text(SIGNALS_CHILD, encoding="utf-8")
        if case == "endless":
            with hostile_server("endless") as server:
                run = limited(folder, [sys.executable, "child.py", case, server.base_url])
        else:
            run = limited(folder, [sys.executable, "child.py", case])
        said = (run.stdout + run.stderr).decode(errors="replace").strip().splitlines()
        ok = run.returncode == 3 and run.peak_mib < BOUNDED_PEAK_MIB
        return Observed(ok, f"{run.status()}; {said[-1][:80] if said else 'no output'}")
    return probe


def long_number(where: str, digits: int = 309) -> Callable[[Path], Observed]:
    """An answer or a context holding an integer of ``digits`` digits, with the default judge."""
    def probe(folder: Path) -> Observed:
        samples = write_samples(folder / "a.jsonl", 3)
        number = "9" * digits
        if where == "answer":
            samples[1]["answer"] = f"Store 1 has the id {number}."
        else:
            samples[1]["context"] += f" Its id is {number}."
        (folder / "a.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples), encoding="utf-8")
        done = rt4(folder, "verify", "a.jsonl", "--out", "o.jsonl", "--no-cache", "-q")
        written = records(folder / "o.jsonl")
        ok = done.returncode in (0, 1) and len(written) == 3 and b"Traceback" not in done.stderr
        return Observed(ok, f"exit {done.returncode}, {len(written)} of 3 records")
    return probe


def citation_refs(marker: str) -> Callable[[Path], Observed]:
    """An answer citing ``marker`` (a ref past any passage), the judge decomposer (scripted)."""
    def probe(folder: Path) -> Observed:
        judge = setup(folder, 3)
        samples = [json.loads(line) for line in (folder / "a.jsonl").read_text(encoding="utf-8").splitlines()]
        samples[1]["answer"] = f"Store 1 opens at 2 am {marker}."
        samples[1]["context"] = ["Store 1 opens daily at 2 am.", "It sells bread."]
        (folder / "a.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples), encoding="utf-8")
        judge[judge.index("rules")] = "judge"  # the judge decomposer (the scripted judge's)
        done = rt4(folder, "verify", "a.jsonl", "--out", "o.jsonl", *judge)
        written = records(folder / "o.jsonl")
        ok = done.returncode in (0, 1) and len(written) == 3 and b"Traceback" not in done.stderr
        return Observed(ok, f"exit {done.returncode}, {len(written)} of 3 records")
    return probe


def sidecar_collision(kind: str) -> Callable[[Path], Observed]:
    """A run whose input, report, JUnit file or output is another file's sidecar: expected exit 2
    with every existing file unchanged."""
    def probe(folder: Path) -> Observed:
        judge = setup(folder)
        if kind == "baseline-manifest":
            rt4(folder, "verify", "a.jsonl", "--out", "base.jsonl", *judge)
        elif kind == "input":
            (folder / "a.jsonl").rename(folder / "o.jsonl.manifest.json")
        before = {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()}
        flags = {
            "input": ["o.jsonl.manifest.json", "--out", "o.jsonl"],
            "report": ["a.jsonl", "--out", "o.jsonl", "--report", "o.jsonl.manifest.json"],
            "junit": ["a.jsonl", "--out", "o.jsonl", "--junit", "o.jsonl.manifest.json"],
            "lock": ["a.jsonl", "--out", "o.jsonl", "--report", ".o.jsonl.lock"],
            "baseline-manifest": ["a.jsonl", "--out", "base.jsonl.manifest.json", "--baseline", "base.jsonl"],
        }[kind]
        done = rt4(folder, "verify", *flags, *judge)
        kept = all((folder / name).read_bytes() == data for name, data in before.items())
        created = sorted(path.name for path in folder.iterdir() if path.name not in before and path.is_file())
        ok = done.returncode == 2 and kept and not any(name.endswith((".html", ".xml")) for name in created)
        return Observed(ok, f"exit {done.returncode}, files {unchanged(kept)}")
    return probe


def damaged_baseline(damage: str) -> Callable[[Path], Observed]:
    """``verify --baseline B`` with B's manifest damaged: expected exit 2 before any judge call."""
    def probe(folder: Path) -> Observed:
        judge = setup(folder)
        rt4(folder, "verify", "a.jsonl", "--out", "base.jsonl", *judge)
        manifest = folder / "base.jsonl.manifest.json"
        text = manifest.read_text(encoding="utf-8")
        manifest.write_text({"truncated": text[: len(text) // 2], "garbage": "\x00\x01 not json {{{",
                             "nested": "[" * 100_000 + "]" * 100_000}[damage], encoding="utf-8")
        with hostile_server("ok") as server:
            calls = profile(folder, server.base_url, "openai-compatible")
            done = rt4(folder, "verify", "a.jsonl", "--out", "new.jsonl", "--baseline", "base.jsonl", "--judge",
                       str(calls), "--decomposer", "rules", "--no-cache", "-q")
            made = len(server.requests)
        ok = done.returncode == 2 and made == 0 and b"Traceback" not in done.stderr
        return Observed(ok, f"exit {done.returncode}, {made} judge calls")
    return probe


def diff_against(kind: str) -> Callable[[Path], Observed]:
    """``rt4 diff`` on a 100k-deep manifest, /dev/null or a folder: expected exit 2, saying what it is."""
    def probe(folder: Path) -> Observed:
        judge = setup(folder)
        rt4(folder, "verify", "a.jsonl", "--out", "base.jsonl", *judge)
        rt4(folder, "verify", "a.jsonl", "--out", "new.jsonl", *judge)
        if kind == "nested":
            (folder / "new.jsonl.manifest.json").write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
            target = "new.jsonl"
        else:
            (folder / "folder").mkdir()
            target = {"devnull": "/dev/null", "folder": "folder"}[kind]
        done = rt4(folder, "diff", "base.jsonl", target)
        said = done.stderr.decode(errors="replace")
        misleading = kind != "nested" and "not found" in said
        ok = done.returncode == 2 and not misleading and "Traceback" not in said
        return Observed(ok, f"exit {done.returncode}" + (", says 'file not found'" if misleading else ""))
    return probe


BUDGET_TESTS = """
import pytest
from rt4chart.testing import assert_grounded

@pytest.mark.parametrize("attempt", range(3))
def test_refund(attempt):
    assert_grounded("Store 1 opens at 2 am.", "Store 1 opens daily at 2 am. It sells bread.", decomposer="rules")
"""


def budget_skipped_session(*options: str) -> Callable[[Path], Observed]:
    """A pytest session whose budget ($0.02, $0.01 a call) refuses audits: pytest's exit status."""
    def probe(folder: Path) -> Observed:
        rules = write_rules(folder / "rules.json", cost_per_call=0.01)
        (folder / "test_budget.py").write_text(BUDGET_TESTS, encoding="utf-8")
        (folder / "pytest.ini").write_text("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
        environment = child_environment()
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_budget.py",
                               f"--rt4-judge=scripted:{rules}", "--rt4-budget=0.02", *options], cwd=folder,
                              env=environment, capture_output=True, text=True, timeout=600, check=False)
        expected = 0 if options else 1
        summary = (done.stdout.strip().splitlines() or ["no output"])[-1].replace("=", "").strip()
        reason = "rt4chart: session FAILED: the budget refused" in done.stdout
        ok = done.returncode == expected and reason != bool(options)
        return Observed(ok, f"pytest exit {done.returncode} ({summary}), reason {'said' if reason else 'not said'}")
    return probe


def redirect_elsewhere(api: str) -> Callable[[Path], Observed]:
    """A 307 to another origin: expected refused (exit 4), nothing sent there."""
    def probe(folder: Path) -> Observed:
        write_samples(folder / "a.jsonl", 1)
        with hostile_server("ok") as elsewhere, hostile_server(
            "redirect", redirect_to=elsewhere.base_url.removesuffix("/v1") + "/v1/chat/completions"
        ) as server:
            judge = profile(folder, server.base_url, api)
            done = rt4(folder, "verify", "a.jsonl", "--judge", str(judge), "--decomposer", "rules", "--no-cache", "-q")
            reached = len(elsewhere.requests)
        return Observed(done.returncode == 4 and reached == 0,
                        f"exit {done.returncode}, {reached} requests reached the other origin")
    return probe


def encoded_key_in_api_base(folder: Path) -> Observed:
    write_samples(folder / "a.jsonl", 1)
    with hostile_server("ok") as server:
        done = rt4(folder, "verify", "a.jsonl", "--judge", "openai/m", "--api-base",
                   f"{server.base_url}?api%5Fkey=s3cretKEY42", "--decomposer", "rules", "--no-cache",
                   "--out", "o.jsonl")
    written = b"".join(path.read_bytes() for path in folder.iterdir() if path.is_file() and path.name != "a.jsonl")
    leaked = b"s3cretKEY42" in done.stdout + done.stderr + written
    return Observed(not leaked, f"exit {done.returncode}, key {shown(leaked)}")


def zero_width_answer(folder: Path) -> Observed:
    """An answer of zero-width spaces, with the default judge (which refuses languages it does not read)."""
    setup(folder, 1)
    sample = json.loads((folder / "a.jsonl").read_text(encoding="utf-8"))
    sample["answer"] = "\u200b" * 12
    (folder / "a.jsonl").write_text(json.dumps(sample) + "\n", encoding="utf-8")
    done = rt4(folder, "verify", "a.jsonl", "--out", "o.jsonl", "--no-cache", "-q")
    label = (records(folder / "o.jsonl") or [{}])[0].get("label")
    return Observed(done.returncode == 1 and label == "baseless", f"exit {done.returncode}, label {label}")


def full_disk_report(folder: Path) -> Observed:
    judge = setup(folder, 40)
    disk = folder / "tiny"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True,
                             text=True, check=False)
    if mounted.returncode != 0:
        return Observed(False, f"cannot mount a tmpfs: {mounted.stderr.strip()}")
    try:
        done = rt4(folder, "verify", "a.jsonl", "--out", "o.jsonl", "--report", str(disk / "r.html"), *judge)
        said = done.stderr.decode(errors="replace")
        torn = (disk / "r.html").exists() and not (disk / "r.html").read_text(errors="replace").rstrip().endswith(
            "</html>")
    finally:
        subprocess.run(["umount", str(disk)], check=False)
    named = "r.html" in said
    ok = done.returncode == 2 and named and not torn
    return Observed(ok, f"exit {done.returncode}, file {'named' if named else 'NOT named'}, "
                        f"{'a TORN html left' if torn else 'no torn html'}")


def one_class_calibration(folder: Path) -> Observed:
    judge = setup(folder, 20)
    samples = [json.loads(line) for line in (folder / "a.jsonl").read_text(encoding="utf-8").splitlines()]
    for sample in samples:
        sample["gold"] = {"hallucinated": True, "spans": [{"start": 0, "end": len(sample["answer"])}]}
    (folder / "a.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples), encoding="utf-8")
    rt4(folder, "verify", "a.jsonl", "--out", "o.jsonl", *judge)
    done = rt4(folder, "calibrate", "o.jsonl", "--folds", "2", "--out", "p.toml", "--judge", judge[1])
    said = (done.stdout + done.stderr).decode(errors="replace")
    warned = re.search(r"\b(?:one|single|1) (?:class|label)\b|one-class|only (?:supported|unsupported)\b", said,
                       re.IGNORECASE) is not None
    ok = done.returncode == 2 or warned
    return Observed(ok, f"exit {done.returncode}, {'warned' if warned else 'no warning'}")


def serve_refused(*flags: str) -> Callable[[Path], Observed]:
    """``rt4 serve`` with a bad port, parallelism or model: expected exit 2 (killed after 60 s if it serves)."""
    def probe(folder: Path) -> Observed:
        extra = list(flags)
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            if "PORT_IN_USE" in extra:
                extra[extra.index("PORT_IN_USE")] = str(taken.getsockname()[1])
            if "GARBAGE_MODEL" in extra:
                (folder / "garbage.gguf").write_bytes(b"GGUF" + os.urandom(4096))
                extra[extra.index("GARBAGE_MODEL")] = "garbage.gguf"
            run = limited(folder, rt4_command("serve", *extra), timeout_s=60)
        return Observed(run.returncode == 2, run.status().split(" after")[0])
    return probe


def hanging_test_times_out(folder: Path) -> Observed:
    """The project's pytest configuration (pyproject's timeout) ends a test that never returns."""
    (folder / "test_hang.py").write_text("import time\n\ndef test_hang():\n    time.sleep(10**6)\n", encoding="utf-8")
    environment = child_environment()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
                           str(ROOT / "pyproject.toml"), "--rootdir", str(folder), "-o", "timeout=5",
                           str(folder / "test_hang.py")], cwd=folder, env=environment, capture_output=True, text=True,
                          timeout=120, check=False)
    configured = "timeout = " in (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    timed_out = "Timeout" in done.stdout
    ok = done.returncode == 1 and timed_out and configured
    return Observed(ok, f"pytest exit {done.returncode}, {'failed by its timeout' if timed_out else 'NO timeout'}; "
                        f"pyproject timeout {'set' if configured else 'NOT set'}")


def ray_tests_join_their_cluster(folder: Path) -> Observed:
    source = (ROOT / "tests" / "test_ray_engine.py").read_text(encoding="utf-8")
    auto = '"--address", "auto"' in source
    test = pytest_probe("tests/test_ray_engine.py::"
                        "test_a_run_without_an_address_starts_its_own_cluster_whatever_the_environment_names")(folder)
    return Observed(test.ok and not auto, f"{'--address auto used' if auto else 'no --address auto'}; {test.text}")

PROBES = [
    Probe("`verify a --out o --report a`", "exit 2, input unchanged",
          refused_keeping_input("--out", "o.jsonl", "--report", "a.jsonl")),
    Probe("`verify a --junit a`", "exit 2, input unchanged", refused_keeping_input("--junit", "a.jsonl")),
    Probe("`verify a --out o --report o`", "exit 2",
          refused_keeping_input("--out", "o.jsonl", "--report", "o.jsonl")),
    Probe("`report o --html o`", "exit 2, records unchanged", report_html_onto_records),
    Probe("`verify - --out F < F`", "exit 2, input unchanged", stdin_onto_itself),
    Probe("lone surrogate on line 2 of 5", "exit 2, 5 records, 1 error record",
          poisoned_line('{"id": "p", "context": "c", "answer": "The sky is blue \\ud800."}')),
    Probe("100,000-deep nested line", "exit 2, 5 records, 1 error record",
          poisoned_line("[" * 100_000 + "]" * 100_000)),
    Probe("5,000-digit integer", "exit 2, 5 records, 1 error record",
          poisoned_line('{"id": "p", "context": "c", "answer": "a", "n": ' + "9" * 5000 + "}")),
    Probe("`--api-base http://user:pw@host`", "exit 2, password not shown", credentials_in_api_base),
    Probe("`cache stats --cache-url redis://…?password=`", "exit 2, password not shown", redis_password),
    Probe("rich markup in the input path (`x[/]y.jsonl`)", "exit 1 (findings), no traceback", markup_in_path),
    Probe("`rt4 repair` on an empty file", "exit 2", repair_empty),
    Probe("ANSI escapes and U+202E in an answer, `--format text`", "made visible", ansi_in_answer),
    Probe("records held until the run ends (live records counted in the real CLI)", "bounded by the samples in flight",
          pytest_probe("tests/test_streaming.py")),
    Probe("fleet router refusals counted as calls", "calls = requests the servers received",
          pytest_probe("tests/test_fleet.py::test_a_router_with_no_deployment_to_offer_books_no_call")),
    Probe("Ray agents after a killed driver (SIGKILL, SIGTERM)", "no Ray process left",
          pytest_probe("tests/test_ray_engine.py::test_a_killed_driver_leaves_no_ray_process_behind")),
    Probe("a full cache disk (real 2 MiB tmpfs)", "exit 1, cache read, nothing stored, one warning",
          pytest_probe("tests/test_exit_codes.py::test_a_cache_on_a_full_disk_is_read_and_the_run_goes_on")),
    Probe("a full output disk (real 64 KiB tmpfs)", "exit 2 with what was kept",
          pytest_probe("tests/test_exit_codes.py::test_a_full_disk_is_exit_2_with_what_was_kept")),
    Probe("a judge that accepts and never answers", "exit 4 within a few attempts",
          pytest_probe("tests/test_judge_unavailable.py::"
                       "test_a_judge_that_accepts_and_never_answers_stops_the_run_within_a_few_attempts")),
]

ISSUE_40 = [
    Probe("litellm: a 2 MB gzip bomb reply (child under a 3 GiB RLIMIT_AS)", "exit 4, peak under 1 GiB",
          hostile_reply("gzip_bomb", "litellm")),
    Probe("litellm: a chunked body that never ends", "exit 4, peak under 1 GiB", hostile_reply("endless", "litellm")),
    Probe("litellm: headers trickled a byte per 0.5 s, `timeout_s = 5`", "exit 4 within the deadline",
          hostile_reply("trickle_headers", "litellm", timeout_s=5)),
    Probe("litellm: a body trickled a byte per 0.5 s, `timeout_s = 5`", "exit 4 within the deadline",
          hostile_reply("trickle_body", "litellm", timeout_s=5)),
    Probe("openai-compatible: a 2 MB gzip bomb reply", "exit 4, peak under 1 GiB",
          hostile_reply("gzip_bomb", "openai-compatible")),
    Probe("openai-compatible: a chunked body that never ends", "exit 4, peak under 1 GiB",
          hostile_reply("endless", "openai-compatible")),
    Probe("openai-compatible: headers trickled, `timeout_s = 5`", "exit 4 within the deadline",
          hostile_reply("trickle_headers", "openai-compatible", timeout_s=5)),
    Probe("signals vLLM client: a reply that never ends", "SignalError, peak under 1 GiB", signals_client("endless")),
    Probe("signals: a prompt_logprobs value that is not an object", "SignalError", signals_client("not-a-dict")),
    Probe("signals: NaN log-probabilities", "SignalError, not dropped", signals_client("nan")),
    Probe("309-digit integer in an answer, default judge", "exit 0/1, 3 of 3 records", long_number("answer")),
    Probe("309-digit integer in a context, default judge", "exit 0/1, 3 of 3 records", long_number("context")),
    Probe("citation marker `[9…9]` (400 digits), judge decomposer", "exit 0/1, 3 of 3 records",
          citation_refs("[" + "9" * 400 + "]")),
    Probe("citation marker `[1,1,…]` x 10,000, judge decomposer", "exit 0/1, 3 of 3 records",
          citation_refs("[" + ",".join(["1"] * 10_000) + "]")),
    Probe("input named `<out>.manifest.json`", "exit 2, files unchanged", sidecar_collision("input")),
    Probe("`--report <out>.manifest.json`", "exit 2, files unchanged", sidecar_collision("report")),
    Probe("`--junit <out>.manifest.json`", "exit 2, files unchanged", sidecar_collision("junit")),
    Probe("`--report .<out>.lock`", "exit 2, files unchanged", sidecar_collision("lock")),
    Probe("`--out` = the baseline's manifest", "exit 2, files unchanged", sidecar_collision("baseline-manifest")),
    Probe("`--baseline` with a truncated manifest", "exit 2, no judge call", damaged_baseline("truncated")),
    Probe("`--baseline` with a garbage manifest", "exit 2, no judge call", damaged_baseline("garbage")),
    Probe("`--baseline` with a 100,000-deep manifest", "exit 2, no judge call", damaged_baseline("nested")),
    Probe("`rt4 diff` on a 100,000-deep manifest", "exit 2", diff_against("nested")),
    Probe("`rt4 diff A /dev/null`", "exit 2, not 'file not found'", diff_against("devnull")),
    Probe("`rt4 diff A folder/`", "exit 2, not 'file not found'", diff_against("folder")),
    Probe("pytest session whose budget refused audits", "pytest exit 1, the reason said", budget_skipped_session()),
    Probe("the same with `--rt4-allow-budget-skips`", "pytest exit 0, no failure line",
          budget_skipped_session("--rt4-allow-budget-skips")),
    Probe("litellm: a 307 to another origin", "exit 4, nothing sent there", redirect_elsewhere("litellm")),
    Probe("openai-compatible: a 307 to another origin", "exit 4, nothing sent there",
          redirect_elsewhere("openai-compatible")),
    Probe("`--api-base …?api%5Fkey=` (URL-encoded)", "key not shown", encoded_key_in_api_base),
    Probe("an answer of zero-width spaces", "exit 1, baseless", zero_width_answer),
    Probe("a full disk while writing `--report` (real 64 KiB tmpfs)", "exit 2, file named, no torn HTML",
          full_disk_report),
    Probe("a review note that is a JSON object (report in chromium, reload)", "panel drawn, note refused",
          pytest_probe("tests/test_review_notes.py")),
    Probe("`rt4 calibrate` on one-class labels", "exit 2 or a warning", one_class_calibration),
    Probe('`"language": "xx"` on line 2 of 5', "exit 2, 5 records, 1 error record",
          poisoned_line('{"id": "p", "context": "Store 9 opens at 9 am.", "answer": "Store 9 opens at 9 am.", '
                        '"language": "xx"}')),
    Probe("`rt4 serve` on a port in use", "exit 2", serve_refused("--port", "PORT_IN_USE")),
    Probe("`rt4 serve --model garbage.gguf`", "exit 2", serve_refused("--port", "0", "--model", "GARBAGE_MODEL")),
    Probe("`rt4 serve --port -5`", "exit 2", serve_refused("--port", "-5")),
    Probe("`rt4 serve --port 70000`", "exit 2", serve_refused("--port", "70000")),
    Probe("`rt4 serve --parallel 0`", "exit 2", serve_refused("--port", "0", "--parallel", "0")),
    Probe("a test that never returns, the project's pytest config (`-o timeout=5`)", "failed by pytest-timeout",
          hanging_test_times_out),
    Probe("Ray tests join the cluster they started (by address)", "no `--address auto`; the env's cluster not joined",
          ray_tests_join_their_cluster),
]


SECTIONS = [("Issue 27", PROBES), ("Issue 40", ISSUE_40)]


def commit() -> str:
    """The commit the probes ran on, and whether the tree differed from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False).stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "--short=12", "HEAD") + (" (with uncommitted changes)" if dirty else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-record", action="store_true", help="Do not write evals/hostile/RESULTS.md.")
    parser.add_argument("--only", metavar="TEXT", help="Run only the probes whose name holds TEXT (never recorded).")
    arguments = parser.parse_args()
    ran_on = commit()
    body: list[str] = []
    failed = total = 0
    for title, probes in SECTIONS:
        rows = ["| probe | expected | observed | as expected |", "|---|---|---|---|"]
        for probe in probes:
            if arguments.only and arguments.only not in probe.name:
                continue
            with TemporaryDirectory() as folder:
                observed = probe.run(Path(folder))
            failed += not observed.ok
            total += 1
            text = observed.text.replace("|", "\\|")
            rows.append(f"| {probe.name} | {probe.expected} | {text} | {'yes' if observed.ok else 'NO'} |")
            print(rows[-1], flush=True)
        body += [f"## {title}", "", *rows, ""]
    command = "python " + shlex.join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])
    document = [
        "# Hostile probes of issues 27 and 40, re-run end to end",
        "",
        f"Command: `{command}`  ",
        f"Commit: {ran_on}  ",
        f"Measured: {datetime.date.today().isoformat()}, on the shared 2-core machine (other helpers at work).",
        "",
        *body,
        f"{total - failed} of {total} as expected.",
        "",
    ]
    if not arguments.no_record and not arguments.only:
        RESULTS.write_text("\n".join(document), encoding="utf-8")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
