"""The readable terminal view of audited samples (``rt4 show``; ``rt4 verify`` on a terminal).

Per sample: a heading with id, input line and verdict; the answer with each claim's sentence
coloured by its worst final label; then every claim with its label, rationale and evidence shown
inside its surrounding context. Past :data:`FULL_VIEW_SAMPLES` samples, the passing ones take one
line each (``rt4 show --all`` shows them in full). A reporting module: it prints, to the console it is given.
"""

from __future__ import annotations

import json

from rich.console import Console, RenderableType
from rich.padding import Padding
from rich.text import Text

from rt4chart.method.citations import describe_answer, describe_claim
from rt4chart.report.audited import AuditedSample
from rt4chart.types import ClaimVerdict, Label

LABEL_STYLES: dict[Label | None, str] = {
    Label.ENTAILED: "green",
    Label.CONTRADICTED: "bold red",
    Label.BASELESS: "yellow",
    None: "magenta",
}
"""Colour of each final label; ``None`` = a claim or record without a verdict."""

_SEVERITY: dict[Label | None, int] = {Label.ENTAILED: 0, None: 1, Label.BASELESS: 2, Label.CONTRADICTED: 3}
"""Which label a sentence shows when its claims disagree: the AND-join order, unjudged above entailed."""

CONTEXT_MARGIN = 60
"""Characters of context shown on each side of a piece of evidence."""


def _label_text(label: Label | None) -> Text:
    return Text(str(label) if label is not None else "no verdict", style=LABEL_STYLES[label])


def answer_text(answer: str, claims: list[ClaimVerdict]) -> Text:
    """The answer with each claim's sentence styled by the most severe label of its claims."""
    text = Text(answer)
    worst: dict[tuple[int, int], Label | None] = {}
    for claim in claims:
        if claim.answer_span is None:
            continue
        key = (claim.answer_span.start, claim.answer_span.end)
        if key not in worst or _SEVERITY[claim.label] > _SEVERITY[worst[key]]:
            worst[key] = claim.label
    for (start, end), label in worst.items():
        text.stylize(f"{LABEL_STYLES[label]} underline", start, end)
    return text


QUOTE_MARKS = ("«", "»")
"""Around the quote, so that its boundaries show without colour (a CI log, ``NO_COLOR``, a pipe)."""


def _word_window(context: str, start: int, end: int) -> tuple[int, int]:
    """Up to ``CONTEXT_MARGIN`` characters each side of ``[start, end)``, cut at spaces, never mid-word."""
    left, right = max(0, start - CONTEXT_MARGIN), min(len(context), end + CONTEXT_MARGIN)
    if left > 0 and not context[left - 1].isspace():
        space = context.find(" ", left, start)
        left = space + 1 if space != -1 else start
    if right < len(context) and not context[right].isspace():
        space = context.rfind(" ", end, right)
        right = space if space != -1 else end
    return left, right


def evidence_in_context(context: str, start: int, end: int) -> Text:
    """The evidence quote, highlighted and between :data:`QUOTE_MARKS`, inside whole words of its
    context (up to ``CONTEXT_MARGIN`` characters each side)."""
    left, right = _word_window(context, start, end)
    text = Text("…" if left else "", style="dim")
    text.append(context[left:start].replace("\n", " "), style="dim")
    text.append(QUOTE_MARKS[0], style="bold")
    text.append(context[start:end].replace("\n", " "), style="reverse")
    text.append(QUOTE_MARKS[1], style="bold")
    text.append(context[end:right].replace("\n", " "), style="dim")
    text.append("…" if right < len(context) else "", style="dim")
    return text


def _indented(text: Text, columns: int) -> Padding:
    """``text`` indented by ``columns``, its wrapped lines too."""
    return Padding(text, (0, 0, 0, columns), expand=False)


def claim_lines(item: AuditedSample, claim: ClaimVerdict) -> list[RenderableType]:
    """The lines that show one claim: label and text, rationale, each evidence quote inside its
    context with where it sits (offsets and sentence numbers), grounding and errors."""
    heading = Text.assemble((f"[{claim.index}] ", "bold"), _label_text(claim.label), "  ", claim.text)
    details: list[Text] = []
    if claim.rationale:
        details.append(Text(f"why: {claim.rationale}", style="italic"))
    if claim.score is not None:
        details.append(Text(f"score: {claim.score.describe()}", style="dim"))
    elif claim.confidence is not None:
        details.append(Text(f"confidence: {claim.confidence:g}", style="dim"))
    context = item.context_text
    for evidence in claim.evidence:
        quote = (
            evidence_in_context(context, evidence.start, evidence.end)
            if context is not None and context[evidence.start : evidence.end] == evidence.text
            else Text(f'"{evidence.text}"', style="reverse")
        )
        sentences = ", ".join(str(number) for number in evidence.sentence_ids)
        matched = "" if evidence.match == "exact" else f", quote matched {evidence.match}"
        source = "" if evidence.source is None else f", {evidence.source.describe()}"
        where = f"  [context {evidence.start}-{evidence.end}, sentence {sentences}{matched}{source}]"
        details.append(Text.assemble("evidence: ", quote, (where, "dim")))
    if not claim.grounded:
        details.append(Text("evidence not found in the context", style="magenta"))
    if claim.citation is not None and item.report.citations is not None:
        style = "green" if claim.citation.verdict == "supported" else "yellow"
        details.append(Text(f"citation: {describe_claim(claim.citation, item.report.citations.passage_ids)}", style))
    details.extend(Text(f"error: {error}", style="red") for error in claim.errors)
    return [_indented(heading, 2), *(_indented(detail, 6) for detail in details)]


def sample_view(item: AuditedSample) -> list[RenderableType]:
    """The lines that show one audited sample."""
    report = item.report
    heading = Text.assemble(
        (report.id or "(no id)", "bold"), f"  line {report.line}  ", _label_text(report.label)
    )
    if report.judge:
        heading.append(f"  judge {report.judge}", style="dim")
    lines: list[RenderableType] = [heading]
    if item.sample is not None:
        if item.sample.question:
            lines.append(Text(f"Q: {item.sample.question}", style="dim"))
        answer = answer_text(item.sample.answer, report.claims)
        for marker in report.citations.markers if report.citations is not None else []:
            answer.stylize("cyan", marker.start, marker.end)
        lines.append(Text.assemble("A: ", answer))
    if report.citations is not None:
        lines.append(_indented(Text(f"citations: {describe_answer(report.citations)}", style="cyan"), 2))
    for claim in report.claims:
        lines.extend(claim_lines(item, claim))
    lines.extend(_indented(Text(f"error: {error}", style="red"), 2) for error in report.errors)
    for key, value in item.extra.items():
        lines.append(_indented(Text(f"{key}: {json.dumps(value, ensure_ascii=False)[:400]}", style="cyan"), 2))
    return lines


FULL_VIEW_SAMPLES = 10
"""Up to this many samples every one is shown in full. Above it a sample that passes (entailed,
complete, no error) takes one line, so that the ones to read stand out and the run's summary after
them is not scrolled away by pages of entailed claims (100 samples were 5,000 lines)."""


def passes(item: AuditedSample) -> bool:
    """Whether a sample has nothing to read: entailed, every verdict in, no error."""
    report = item.report
    return report.label == Label.ENTAILED and not report.incomplete and not report.errors


def sample_line(item: AuditedSample) -> Text:
    """One line for a sample: its heading and the start of its answer."""
    line = Text.assemble((item.report.id or "(no id)", "bold"), f"  line {item.report.line}  ",
                         _label_text(item.report.label))
    if item.sample is not None:
        line.append("  " + " ".join(item.sample.answer.split()), style="dim")
    return line


def print_samples(audited: list[AuditedSample], console: Console, *, show_all: bool = False) -> None:
    """Print each sample's view, separated by blank lines; above :data:`FULL_VIEW_SAMPLES` samples,
    unless ``show_all``, the passing ones one line each (and a last line saying so)."""
    collapse = not show_all and len(audited) > FULL_VIEW_SAMPLES
    collapsed = 0
    previous_was_line = False
    for position, item in enumerate(audited):
        if collapse and passes(item):
            if position and not previous_was_line:
                console.print()
            console.print(sample_line(item), highlight=False, no_wrap=True, overflow="ellipsis")
            collapsed += 1
            previous_was_line = True
            continue
        if position:
            console.print()
        for line in sample_view(item):
            console.print(line, highlight=False)
        previous_was_line = False
    if collapsed:
        console.print()
        console.print(
            Text(f"{collapsed} of {len(audited)} samples passed and are shown one line each; "
                 "`rt4 show RESULTS.jsonl --all` shows every sample in full.", style="dim"),
            highlight=False,
        )
