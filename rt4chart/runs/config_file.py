"""Finding and reading a project's config file (``rt4chart.toml``, or ``pyproject.toml``'s
``[tool.rt4chart]``): the standard library only, so the pytest plugin can look for one in every
session without importing the run layer's models (:mod:`rt4chart.runs.config` validates what is found)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

CONFIG_FILE = "rt4chart.toml"
"""The project config file of its own (every key at the top level)."""
PYPROJECT = "pyproject.toml"
"""The Python project file, whose ``[tool.rt4chart]`` table holds the same keys."""


class ConfigError(ValueError):
    """A config file that cannot be read, or a key or value in it that is wrong (named with the file)."""


def find_config(start: Path) -> tuple[Path, dict[str, Any]] | None:
    """The config file that applies in ``start`` and its table, or ``None``: the first directory from
    ``start`` upward with either file (``rt4chart.toml`` first; a ``pyproject.toml`` without the table
    is passed over)."""
    for directory in (start.resolve(), *start.resolve().parents):
        own = directory / CONFIG_FILE
        if own.is_file():
            return own, _read(own)
        pyproject = directory / PYPROJECT
        if pyproject.is_file():
            table = _read(pyproject).get("tool", {}).get("rt4chart")
            if table is not None:
                if not isinstance(table, dict):
                    raise ConfigError(f"{pyproject}: [tool.rt4chart] must be a table of settings")
                return pyproject, table
    return None


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"{path}: cannot read it as TOML: {error}") from None
