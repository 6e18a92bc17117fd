"""Optional parts: a missing one skips its tests with the reason, and under RT4_REQUIRE_ALL=1 (set by
`bash .ci/run`, which installs every part) any skip fails the run instead, naming what was missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

PROBES = {
    "test_missing_module.py": "import pytest\n"
    "pytest.importorskip('rt4_no_such_part', reason='needs the no-such part')\n\n"
    "def test_never_runs() -> None:\n    pass\n",
    "test_missing_program.py": "from conftest import require_program\n\n"
    "def test_needs_a_program() -> None:\n    require_program('rt4-no-such-program', 'a program nobody has')\n",
}


def run_probes(directory: Path, require_all: bool) -> subprocess.CompletedProcess[str]:
    for name, text in PROBES.items():
        (directory / name).write_text(text, encoding="utf-8")
    environment = {key: value for key, value in os.environ.items() if key != "RT4_REQUIRE_ALL"}
    if require_all:
        environment["RT4_REQUIRE_ALL"] = "1"
    environment["PYTHONPATH"] = os.pathsep.join([str(TESTS), environment.get("PYTHONPATH", "")])
    # The suite's conftest as a plugin, over probe files outside the suite.
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "conftest", "--rootdir", str(directory),
               "-p", "no:cacheprovider", "--continue-on-collection-errors", str(directory)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment, check=False)


@pytest.mark.parametrize("require_all", [False, True], ids=["by default", "RT4_REQUIRE_ALL=1"])
def test_a_missing_part_skips_with_its_reason_or_fails_when_every_part_is_required(
    tmp_path: Path, require_all: bool
) -> None:
    result = run_probes(tmp_path, require_all)
    output, closing = result.stdout + result.stderr, result.stdout.strip().splitlines()[-1]
    assert "needs the no-such part" in output and "needs a program nobody has" in output
    if require_all:
        assert result.returncode == 1, output
        assert output.count("skipped under RT4_REQUIRE_ALL=1") == 2 and "skipped" not in closing
    else:
        assert result.returncode == 0, output
        assert "2 skipped" in closing
