"""Records streamed, not held: ``rt4 verify`` keeps no record once it is written.

The real CLI runs in a subprocess over a file of tiny samples with the scripted judge; after every
100th record written, that process counts its live :class:`rt4chart.types.AuditRecord` objects
(``gc``, on the main thread, the writer's own). A run that held its records would count them all by the end; a streamed
run holds only the records in flight. The same run with ``--report`` and ``--junit`` re-reads the
written file for them, and its outputs still hold every sample.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from audit_fixtures import read_records, write_rules, write_samples

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = 1200

COUNTING_DRIVER = """
import gc, json, os, runpy, sys
from rt4chart.records import io
from rt4chart.types import AuditRecord
counts, written = [], [0]
append = io.ReportAppender.append
def counted(self, report):
    append(self, report)
    written[0] += 1
    if written[0] % 100 == 0:
        counts.append(sum(isinstance(o, AuditRecord) for o in gc.get_objects()))
io.ReportAppender.append = counted
sys.argv = ["rt4", *sys.argv[2:]]
try:
    runpy.run_module("rt4chart", run_name="__main__")
finally:
    with open(os.environ["COUNTS_FILE"], "w") as handle:
        json.dump(counts, handle)
"""


def run_counting(tmp_path: Path, *args: str) -> tuple[int, list[int]]:
    counts_file = tmp_path / "counts.json"
    done = subprocess.run(
        [sys.executable, "-c", COUNTING_DRIVER, "rt4", *args], cwd=tmp_path, capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COUNTS_FILE": str(counts_file)}, timeout=600,
    )
    assert done.returncode in (0, 1) and counts_file.exists(), done.stderr[-3000:]
    return done.returncode, json.loads(counts_file.read_text(encoding="utf-8"))


def test_verify_holds_only_the_records_in_flight(tmp_path: Path) -> None:
    write_samples(tmp_path / "in.jsonl", SAMPLES)
    rules = write_rules(tmp_path / "rules.json")
    code, counts = run_counting(tmp_path, "verify", "in.jsonl", "--judge", f"scripted:{rules}", "--decomposer",
                                "rules", "--no-cache", "--out", "out.jsonl", "-q")
    assert code == 1  # the cakes are baseless in every sample
    records = read_records(tmp_path / "out.jsonl")
    assert [record["line"] for record in records] == list(range(1, SAMPLES + 1))
    assert len(counts) == SAMPLES // 100, "every 100th record written was counted"
    # 16 samples in flight (the default), each record copied a few times on its way out.
    assert max(counts) < SAMPLES // 10, f"live records grew with the samples: {counts}"


def test_reports_that_need_every_record_read_them_back_from_the_file(tmp_path: Path) -> None:
    write_samples(tmp_path / "in.jsonl", 40)
    rules = write_rules(tmp_path / "rules.json")
    code, _ = run_counting(tmp_path, "verify", "in.jsonl", "--judge", f"scripted:{rules}", "--decomposer", "rules",
                           "--no-cache", "--out", "out.jsonl", "--report", "audit.html", "--junit", "junit.xml", "-q")
    assert code == 1
    junit = (tmp_path / "junit.xml").read_text(encoding="utf-8")
    assert junit.count("<testcase") == 40 and junit.count("<failure") == 40
    html = (tmp_path / "audit.html").read_text(encoding="utf-8")
    assert all(f'"s{i}"' in html or f"s{i}<" in html for i in range(40))
    manifest = json.loads((tmp_path / "out.jsonl.manifest.json").read_text(encoding="utf-8"))
    assert manifest["counts"]["records"] == 40 and manifest["input"]["lines"] == 40
