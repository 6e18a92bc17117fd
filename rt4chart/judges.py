"""Turn a ``--judge`` value into a backend.

Accepted forms: ``scripted:RULES.json``.
"""

from __future__ import annotations

from collections.abc import Callable

from rt4chart.backends.base import Backend
from rt4chart.backends.scripted import ScriptedBackend


DEFAULT_JUDGE = "embedded"
"""The judge used when none is named: needs no key and no network."""


class JudgeConfigError(ValueError):
    """The judge cannot be used as specified (unknown name, missing key, bad rules file)."""


def resolve_judge(
    spec: str | None = None,
    *,
    api_base: str | None = None,
    concurrency: int | None = None,
    wrap: Callable[[Backend], Backend] | None = None,
) -> Backend:
    """Build the backend named by ``spec`` (default :data:`DEFAULT_JUDGE`).

    ``api_base`` and ``concurrency`` override the judge profile; ``wrap`` is applied to every
    model-calling backend (each stage of a cascade) and is how the disk cache and the budget are
    put in front of the calls. Raises :class:`JudgeConfigError` before any work when the judge
    cannot be used (unknown name, missing API key, unreadable rules file).
    """
    spec = spec or DEFAULT_JUDGE
    kind, _, argument = spec.partition(":")
    if kind == "scripted":
        if not argument:
            raise JudgeConfigError("scripted judge needs a rules file: --judge scripted:RULES.json")
        try:
            backend: Backend = ScriptedBackend.from_file(argument)
        except ValueError as error:
            raise JudgeConfigError(str(error)) from error
        return wrap(backend) if wrap else backend
    raise JudgeConfigError(f"unknown judge {spec!r}")
