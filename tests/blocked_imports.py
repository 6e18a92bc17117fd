"""Run the ``rt4`` command in a process where some modules cannot be imported.

    python tests/blocked_imports.py torch,transformers -- verify examples/answers.jsonl

Each blocked name (a top-level package, or a dotted module) raises ``ModuleNotFoundError`` as an
uninstalled package would; every attempt is appended, one name a line, to the file named by
``$RT4_BLOCKED_LOG`` when it is set, so a test can tell that nothing even tried.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import runpy
import sys
from collections.abc import Sequence
from types import ModuleType


class Blocker(importlib.abc.MetaPathFinder):
    """Refuses the modules named, and records each refusal."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in self.names or fullname.split(".")[0] in self.names:
            if log := os.environ.get("RT4_BLOCKED_LOG"):
                with open(log, "a", encoding="utf-8") as file:
                    file.write(fullname + "\n")
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked)", name=fullname)
        return None


if __name__ == "__main__":
    blocked, separator, *arguments = sys.argv[1:]
    assert separator == "--", "usage: blocked_imports.py NAME[,NAME...] -- RT4 ARGUMENTS..."
    sys.meta_path.insert(0, Blocker(frozenset(blocked.split(","))))
    sys.argv = ["rt4", *arguments]
    runpy.run_module("rt4chart", run_name="__main__")
