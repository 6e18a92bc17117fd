"""The teacher-forcing prompt of the context sensitivity ratio: one file, two prefixes, one version.

``prompts/csr.txt`` has a ``[with_context]`` section (placing the context D and the question q)
and a ``[without_context]`` section (q only). The answer is appended right after either prefix,
so both prefixes end with the same text ("### Answer" and a newline): the answer then tokenizes
identically under both, which the ratio needs (it divides per token). The sha256 of the file's
bytes is its version, as for the judge prompts (:mod:`rt4chart.method.prompts`); it is part of the
signal cache key and of every signal record.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from string import Template

from rt4chart.method.text import join_passages
from rt4chart.resources import resource_dir

TEMPLATE_FILE = "csr.txt"
_WITH, _WITHOUT = "[with_context]\n", "[without_context]\n"


@dataclass(frozen=True)
class CsrTemplate:
    """The two prompt prefixes that precede the teacher-forced answer."""

    with_context: Template
    without_context: Template
    version: str

    def prefixes(self, context: str | list[str], question: str | None) -> tuple[str, str]:
        """The prefix with D and q, and the prefix with q alone; each ends with one newline."""
        joined, _ = join_passages(context)
        fields = {"context": joined, "question": question or ""}
        return (
            self.with_context.substitute(fields).rstrip() + "\n",
            self.without_context.substitute(fields).rstrip() + "\n",
        )


def parse_csr_template(source: str) -> CsrTemplate:
    """Parse the template file's text; both sections are required, in this order."""
    head, separator, without = source.partition(_WITHOUT)
    if not separator or not head.startswith(_WITH):
        raise ValueError(f"{TEMPLATE_FILE} must have a [with_context] section followed by a [without_context] section")
    version = hashlib.sha256(source.encode()).hexdigest()[:12]
    return CsrTemplate(Template(head.removeprefix(_WITH).strip()), Template(without.strip()), version)


@cache
def load_csr_template(directory: Path | None = None) -> CsrTemplate:
    """Load ``csr.txt`` from ``directory`` (default: the shipped ``prompts`` folder)."""
    folder = directory or resource_dir("prompts")
    return parse_csr_template((folder / TEMPLATE_FILE).read_text(encoding="utf-8"))
