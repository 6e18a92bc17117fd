"""Turn a ``--judge`` value into a backend.

Accepted forms: ``scripted:RULES.json``.
"""

from __future__ import annotations

from rt4chart.backends.base import Backend
from rt4chart.backends.scripted import ScriptedBackend


class JudgeConfigError(ValueError):
    """The judge cannot be used as specified (unknown name, missing key, bad rules file)."""


def resolve_judge(spec: str) -> Backend:
    """Build the backend named by ``spec``; raises :class:`JudgeConfigError` when it cannot."""
    kind, _, argument = spec.partition(":")
    if kind == "scripted":
        if not argument:
            raise JudgeConfigError("scripted judge needs a rules file: --judge scripted:RULES.json")
        try:
            return ScriptedBackend.from_file(argument)
        except ValueError as error:
            raise JudgeConfigError(str(error)) from error
    raise JudgeConfigError(f"unknown judge {spec!r}")
