"""Prompt templates: loaded from files, rendered with ``string.Template``, versioned by hash.

A template file holds a ``[system]`` section and a ``[user]`` section. The sha256 of a file's bytes
is its version; together with the rendering code (:mod:`rt4chart.tasks`) it goes into the cache
key and every output record, so a result can always be traced to the exact prompt that produced it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from string import Template

from rt4chart.backends.base import Message
from rt4chart.resources import resource_dir


@dataclass(frozen=True)
class PromptTemplate:
    """One prompt file, parsed."""

    name: str
    system: Template
    user: Template
    version: str

    def render(self, **fields: str) -> list[Message]:
        """Fill the template; a missing field is a programming error and raises ``KeyError``."""
        return [
            Message(role="system", content=self.system.substitute(fields)),
            Message(role="user", content=self.user.substitute(fields)),
        ]


def parse_template(name: str, source: str) -> PromptTemplate:
    """Parse a template file's text into its system and user parts."""
    head, separator, user = source.partition("[user]\n")
    if not separator or not head.startswith("[system]\n"):
        raise ValueError(f"prompt {name!r} must have a [system] section followed by a [user] section")
    system = head.removeprefix("[system]\n").strip()
    version = hashlib.sha256(source.encode()).hexdigest()[:12]
    return PromptTemplate(name, Template(system), Template(user.strip()), version)


@cache
def load_templates(names: tuple[str, ...], directory: Path | None = None) -> dict[str, PromptTemplate]:
    """Load the templates ``names`` from ``directory`` (default: the shipped ``prompts`` folder)."""
    folder = directory or resource_dir("prompts")
    return {name: parse_template(name, (folder / f"{name}.txt").read_text(encoding="utf-8")) for name in names}
