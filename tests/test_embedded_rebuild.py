"""``evals/embedded/train.py`` (the embedded model's rebuild) writes only where it is told: ``--out``
is required, and a path inside an installed package (site-packages) is refused before any work, so
a rebuild never silently replaces the judge every later audit runs as."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRAIN = ROOT / "evals" / "embedded" / "train.py"


def train(*args: str) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(TRAIN), *args], capture_output=True, text=True, env=environment,
                          timeout=300, check=False)


def test_the_rebuild_needs_out() -> None:
    done = train()
    assert done.returncode == 2 and "--out" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_the_rebuild_refuses_to_write_into_an_installed_package(tmp_path: Path) -> None:
    inside = Path(sysconfig.get_paths()["purelib"]) / "rt4chart" / "judges" / "embedded" / "model.json"
    done = train("--out", str(inside))
    assert done.returncode == 2 and "installed package" in done.stderr and "Traceback" not in done.stderr, done.stderr
    # Through a symlink too: the refusal is about where the file lands.
    link = tmp_path / "model.json"
    link.symlink_to(inside)
    done = train("--out", str(link))
    assert done.returncode == 2 and "installed package" in done.stderr, done.stderr
