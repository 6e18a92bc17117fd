"""Prompt templates: loaded from files, rendered with ``string.Template``, versioned by hash.

A template file holds a ``[system]`` section and a ``[user]`` section. The sha256 of a file's bytes
is its version; together with the rendering code (:mod:`rt4chart.method.tasks`) it goes into the cache
key and every output record, so a result can always be traced to the exact prompt that produced it.

Field values come from the text under audit (context, question, answer, claims), so each one is
rendered between ``<data-H>`` and ``</data-H>`` lines whose tag ``H`` is a hash of the value itself:
a value cannot hold its own closing tag (that would change the hash), so text under audit cannot
end its block and forge prompt structure (a second ``Claims:`` list, new instructions). The tag is
deterministic, so identical requests stay identical for the cache. Only fields rt4chart writes
itself (:data:`TRUSTED_FIELDS`) go in as they are.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from string import Template

from rt4chart.languages import ENGLISH, language_name
from rt4chart.protocol import Message
from rt4chart.resources import resource_dir

TRUSTED_FIELDS = frozenset({"hint", "target"})
"""Fields built by rt4chart alone (the location hint ``S3-S5``, a sentence number), never from the
text under audit."""


@dataclass(frozen=True)
class PromptTemplate:
    """One prompt file, parsed."""

    name: str
    system: Template
    user: Template
    version: str

    def render(self, **fields: str) -> list[Message]:
        """Fill the template, every value delimited (:func:`delimit`); a missing field is a
        programming error and raises ``KeyError``."""
        delimited = {name: value if name in TRUSTED_FIELDS else delimit(value) for name, value in fields.items()}
        return [
            Message(role="system", content=self.system.substitute(delimited)),
            Message(role="user", content=self.user.substitute(delimited)),
        ]


def delimit(value: str) -> str:
    """``value`` between tag lines it cannot close (listings inside keep their own lines). Empty
    values stay empty: there is nothing to delimit."""
    if not value:
        return value
    tag = f"data-{hashlib.sha256(value.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"
    return f"<{tag}>\n{value}\n</{tag}>"


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


LANGUAGE_NOTE = Template(
    "The answer is written in $language. Write every claim and rationale in $language, as the answer "
    "words it. Copy every quote from the context exactly as it is written there: the same script, "
    "punctuation and spacing, never translated. The JSON keys and the labels (entailed, "
    "contradicted, baseless) stay in English."
)
"""What a prompt adds to its system message for an answer that is not English (English prompts
are the templates as they are, byte for byte)."""


def localize(messages: list[Message], prompt_version: str, language: str) -> tuple[list[Message], str]:
    """``messages`` for an answer in ``language`` (an ISO 639-1 code), with the version of what
    they now say: unchanged for English; else the system message ends with :data:`LANGUAGE_NOTE`."""
    if language == ENGLISH or not messages or messages[0].role != "system":
        return messages, prompt_version
    note = LANGUAGE_NOTE.substitute(language=language_name(language))
    system = Message(role="system", content=f"{messages[0].content}\n\n{note}")
    version = hashlib.sha256(f"{prompt_version}:{note}".encode()).hexdigest()[:12]
    return [system, *messages[1:]], version
