"""Start-up cost where it is needed only: the quick commands import no heavy dependency."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("nltk", "torch", "transformers", "litellm", "sklearn", "scipy", "numpy")

PROBE = """
import json, sys
from rt4chart.cli.app import app
try:
    app(sys.argv[1:], standalone_mode=False)
except SystemExit:
    pass
heavy = sorted({name.split(".")[0] for name in sys.modules} & set(json.loads(HEAVY)))
print("HEAVY=" + json.dumps(heavy))
"""


@pytest.mark.parametrize(
    "command", [["--help"], ["judges"], ["cache", "stats", "--cache-dir", "{cache}"], ["verify", "--help"]]
)
def test_quick_commands_import_no_heavy_dependency(tmp_path: Path, command: list[str]) -> None:
    args = [part.format(cache=tmp_path / "cache") for part in command]
    probe = PROBE.replace("HEAVY)", repr(json.dumps(HEAVY)) + ")")
    result = subprocess.run(
        [sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=120, check=False
    )
    line = next(line for line in result.stdout.splitlines() if line.startswith("HEAVY="))
    assert json.loads(line.removeprefix("HEAVY=")) == [], result.stderr
