"""Shared by the benchmarks: print a measured result and record it in RESULTS.md.

Each benchmark owns one ``## section`` of ``evals/bench/RESULTS.md`` and replaces it on every run,
so the file always holds the latest measured figures with the command and date that produced them.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import shlex
import sys
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")
HEADER = (
    "# Benchmark results\n\nWritten by the scripts in this folder; every section names the command that produced it.\n"
)


def command_line() -> str:
    return "python " + shlex.join([os.path.relpath(sys.argv[0]), *sys.argv[1:]])


def record(section: str, lines: list[str]) -> None:
    """Print ``lines`` and store them as the ``## section`` of RESULTS.md."""
    body = "\n".join(
        [
            f"## {section}",
            "",
            f"Command: `{command_line()}`  ",
            f"Measured: {datetime.date.today().isoformat()} on {os.cpu_count()} CPU cores "
            f"({platform.machine()}, Python {platform.python_version()})",
            "",
            *lines,
            "",
        ]
    )
    print(body)
    text = RESULTS.read_text(encoding="utf-8") if RESULTS.exists() else HEADER
    pattern = re.compile(rf"^## {re.escape(section)}\n.*?(?=^## |\Z)", re.S | re.M)
    text = pattern.sub(lambda _: body + "\n", text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + body
    RESULTS.write_text(text.rstrip("\n") + "\n", encoding="utf-8")
