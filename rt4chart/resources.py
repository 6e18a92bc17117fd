"""Where the shipped prompt templates and judge profiles live.

A wheel carries them inside the package (``rt4chart/shipped/prompts``, ``rt4chart/shipped/judges``);
a source checkout keeps them at the repository root, which is where an editable install finds them.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def resource_dir(name: str) -> Path:
    """Directory of a shipped resource folder (``prompts`` or ``judges``)."""
    for candidate in (_PACKAGE / "shipped" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"rt4chart resource folder {name!r} is missing from the installation")
