"""Issue 27's hostile probes, re-run end to end: each is the real ``rt4`` CLI (or, for the items whose
set-up needs a fault server, a Ray cluster or a mounted disk, the test that builds it) against
inputs written here, and the table says what was expected and what was observed.

    python evals/hostile/probes.py [--no-record]

Writes ``evals/hostile/RESULTS.md`` (``--no-record``: prints only). Exit status 1 when a probe did
not observe what it expected.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from audit_fixtures import write_rules, write_samples  # noqa: E402

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


def rt4(folder: Path, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
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
        environment = {**os.environ, "PYTHONPATH": str(ROOT)}
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
    (folder / "x[").mkdir()  # the path of the probe: a folder `x[` holding `]y.jsonl`
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
        environment = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test], cwd=ROOT,
                              env=environment, capture_output=True, text=True, timeout=900, check=False)
        summary = (done.stdout.strip().splitlines() or ["no output"])[-1]
        return Observed(done.returncode == 0, summary.replace("=", "").strip())
    return probe


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-record", action="store_true", help="Do not write evals/hostile/RESULTS.md.")
    arguments = parser.parse_args()
    rows = ["| probe | expected | observed | as expected |", "|---|---|---|---|"]
    failed = 0
    for probe in PROBES:
        with TemporaryDirectory() as folder:
            observed = probe.run(Path(folder))
        failed += not observed.ok
        rows.append(f"| {probe.name} | {probe.expected} | {observed.text} | {'yes' if observed.ok else 'NO'} |")
        print(rows[-1], flush=True)
    command = "python " + shlex.join([os.path.relpath(sys.argv[0], ROOT), *sys.argv[1:]])
    body = [
        "# Issue 27 hostile probes, re-run end to end",
        "",
        f"Command: `{command}`  ",
        f"Measured: {datetime.date.today().isoformat()}, on the shared 2-core machine (8 helpers at work).",
        "",
        *rows,
        "",
        f"{len(PROBES) - failed} of {len(PROBES)} as expected.",
        "",
    ]
    if not arguments.no_record:
        RESULTS.write_text("\n".join(body), encoding="utf-8")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
