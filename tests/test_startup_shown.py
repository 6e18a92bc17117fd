"""Start-up is shown: the progress line says what is loading, and the summary's wall time counts from
the process's start (issue 46)."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from io import StringIO
from pathlib import Path

from conftest import EXAMPLES
from rich.console import Console

from rt4chart.judges.budget import Ledger
from rt4chart.protocol import loading
from rt4chart.report.progress import AuditProgress

REPOSITORY = Path(__file__).resolve().parent.parent


def test_the_heartbeat_says_at_once_what_is_loading() -> None:
    stream = StringIO()
    printed = threading.Event()

    class Watched(StringIO):
        def write(self, text: str) -> int:
            stream.write(text)
            if "loading" in text:
                printed.set()
            return len(text)

    console = Console(file=Watched(), force_terminal=False, width=200)
    # An hour between heartbeat lines: only a model starting to load can print one now.
    with AuditProgress(4, Ledger(), console, log_every_s=3600) as progress, loading("the test's encoder"):
        assert printed.wait(timeout=60), stream.getvalue()
        assert "loading the test's encoder" in progress.status()
    assert re.search(r"rt4: 0/4 samples \| 0 judge calls done \| loading the test's encoder \|", stream.getvalue())
    assert "loading" not in progress.status()


WRAPPER = """
import sys, time
time.sleep(float(sys.argv[1]))  # the process exists this long before rt4chart is even imported
sys.argv = ["rt4", *sys.argv[2:]]
from rt4chart.cli.app import main
main()
"""


def test_the_summary_wall_time_counts_from_the_process_start() -> None:
    asleep = 4.0
    result = subprocess.run(
        [sys.executable, "-c", WRAPPER, str(asleep), "verify", str(EXAMPLES / "answers.jsonl"),
         "--judge", f"scripted:{EXAMPLES / 'answers.rules.json'}", "--format", "jsonl", "--no-cache"],
        capture_output=True, text=True, timeout=600, check=False, cwd=REPOSITORY, env=None,
    )
    assert result.returncode == 1, result.stderr
    wall = re.search(r"wall time\s*│\s*([0-9.]+) s", result.stderr)
    assert wall is not None, result.stderr
    assert float(wall.group(1)) >= asleep


AGE_PROBE = """
import time
entered = time.monotonic()  # after the interpreter's own start-up
time.sleep(1.0)
from rt4chart.report.progress import RunSummary, time_runs_from_process_start
time_runs_from_process_start()
now = time.monotonic()
print(now - RunSummary().started, now - entered)
"""


def test_under_the_cli_a_run_summary_counts_from_the_process_start() -> None:
    """What ``rt4`` sets up: a summary made now is as old as the process, which is older than the
    probe's first line (to /proc's clock tick, 10 ms)."""
    result = subprocess.run([sys.executable, "-c", AGE_PROBE], capture_output=True, text=True, timeout=120, check=True)
    summary_age, since_first_line = (float(value) for value in result.stdout.split())
    assert summary_age >= since_first_line - 0.011
