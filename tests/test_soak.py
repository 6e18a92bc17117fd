"""A small soak: the bench of ``evals/bench/soak.py`` at 60 samples (the documented run uses 2,000).

Real ``rt4 verify`` runs against the fault server with 10% 429s, 5% 5xx, 2% hangs past the
timeout and 3% malformed replies: nothing is lost, nothing is duplicated, and every record whose
calls eventually succeeded is the record a fault-free run writes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_faults_lose_no_record_and_change_no_judged_verdict(tmp_path: Path) -> None:
    figures = tmp_path / "soak.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "evals" / "bench" / "soak.py"), "--samples", "60", "--memory-baseline", "20",
         "--no-record", "--json", str(figures)],
        env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(figures.read_text(encoding="utf-8"))
    assert sum(result["faults_injected"].values()) > 0, "faults were injected"
    assert result["requests"]["faulty"] > result["requests"]["fault_free"], "and retried"
    assert result["fault_free_all_judged"]
    assert result["records"] == 60 and result["records_lost"] == 0 and result["records_duplicated"] == 0
    assert result["in_input_order"]
    assert result["succeeded"] > 0
    assert result["succeeded_equal_to_fault_free"] == result["succeeded"]
    assert result["unjudged_with_errors"] == result["unjudged"]
