"""How ``rt4 diff`` shows a :class:`rt4chart.analysis.diff.RunDiff`: the terminal view (rich), a Markdown
summary (a pull-request comment, ``$GITHUB_STEP_SUMMARY``) and a self-contained HTML diff.

The HTML diff has the report's look (``templates/diff.html.j2``): one file, inline CSS and JS, a
Content-Security-Policy that forbids every fetch, the data as one JSON block (Jinja's ``tojson``
escapes ``<``, ``>``, ``&``, ``'``) from which the page builds its view with DOM text nodes only, so
no claim, rationale or evidence text ever becomes markup.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from rt4chart.analysis.diff import AnswerCategory, AnswerDiff, ClaimChange, PairedTest, RunDiff
from rt4chart.records.io import write_text_atomically

CATEGORY_TITLES: dict[str, str] = {
    AnswerCategory.NEW: "newly hallucinated",
    AnswerCategory.FIXED: "fixed",
    AnswerCategory.CHANGED_LABEL: "changed label",
    AnswerCategory.STILL_HALLUCINATED: "still hallucinated",
    AnswerCategory.STILL_FAITHFUL: "still faithful",
    AnswerCategory.ADDED: "added answers",
    AnswerCategory.REMOVED: "removed answers",
    AnswerCategory.UNJUDGED: "unjudged in a run",
    "answer_changed": "answer text changed",
}
_MARKDOWN_ROWS = 20
"""Answers listed per category in the Markdown summary (a PR comment has a size limit)."""


def _rate(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _signed(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:+.1f} pp"


def test_sentence(test: PairedTest, unit: str) -> str:
    """One line saying whether the rate changed and whether that is real."""
    if not test.pairs:
        return f"no {unit} judged in both runs"
    ci = f"[{_signed(test.ci_low)}, {_signed(test.ci_high)}]"
    verdict = ("worse beyond the CI" if test.worse else "better beyond the CI" if test.better
               else "not distinguishable from noise")
    if (test.worse or test.better) and test.p_value >= 1 - test.confidence:
        # Few discordant pairs, all one way: the percentile CI can exclude 0 where the exact test cannot.
        verdict += f", but the exact test does not confirm it at {1 - test.confidence:.2g}"
    return (f"{unit} hallucination rate {_rate(test.base_rate)} -> {_rate(test.new_rate)} "
            f"({_signed(test.difference)}, {test.confidence:.0%} paired bootstrap CI {ci}); exact McNemar "
            f"p = {test.p_value:.4g} on {test.discordant} discordant of {test.pairs} pairs "
            f"({test.base_only} fixed, {test.new_only} new): {verdict}")


def _label_change(answer: AnswerDiff) -> str:
    return f"{answer.base_label or '-'} -> {answer.new_label or '-'}"


def _claim_line(change: ClaimChange) -> str:
    if change.kind == "flip" and change.base is not None and change.new is not None:
        return f"claim {change.new.index} {change.base.label} -> {change.new.label}: {change.new.text}"
    side = change.new if change.new is not None else change.base
    assert side is not None
    return f"claim {side.index} {change.kind} ({side.label}): {side.text}"


def _rationales(change: ClaimChange) -> str:
    """Each run's rationale for the claim, for the Markdown summary (empty when neither gave one)."""
    said = [f"{name}: {side.rationale}" for name, side in (("before", change.base), ("now", change.new))
            if side is not None and side.rationale]
    return f" ({'; '.join(said)})" if said else ""


def print_diff(result: RunDiff, console: Console) -> None:
    """The terminal view: configuration, counts, tests, then every changed answer with its claims."""
    config = result.config
    console.print(Text.assemble(("comparison: ", "bold"), (config.kind, "bold cyan"), f" - {config.explanation}"),
                  highlight=False, soft_wrap=True)
    for warning in result.warnings:
        console.print(Text.assemble(("warning: ", "bold yellow"), warning), highlight=False, soft_wrap=True)
    counts = Table(title="answers", show_header=False, title_justify="left")
    counts.add_column("category", style="bold")
    counts.add_column("answers", justify="right")
    for key, title in CATEGORY_TITLES.items():
        counts.add_row(title, str(result.counts.get(key, 0)))
    claims = result.claim_counts
    counts.add_row("claims matched / flipped / added / removed",
                   f"{claims['matched']} / {claims['flip']} / {claims['added']} / {claims['removed']}")
    console.print(counts)
    console.print(Text(test_sentence(result.answer_test, "answer")), highlight=False, soft_wrap=True)
    console.print(Text(test_sentence(result.claim_test, "claim")), highlight=False, soft_wrap=True)
    for answer in result.answers:
        if answer.category is AnswerCategory.STILL_HALLUCINATED and not answer.claims and not answer.answer_changed:
            continue
        title = CATEGORY_TITLES[answer.category] + (", answer text changed" if answer.answer_changed else "")
        if answer.gate_new and answer.category in (AnswerCategory.STILL_HALLUCINATED, AnswerCategory.CHANGED_LABEL):
            title += ", with a new unsupported claim"
        console.print(Text.assemble(("\n" + str(answer.id), "bold"), f"  {title}  {_label_change(answer)}"),
                      highlight=False, soft_wrap=True)
        for change in answer.claims:
            console.print(Text("  " + _claim_line(change)), highlight=False, soft_wrap=True)
            for name, side in (("before", change.base), ("now", change.new)):
                if side is None:
                    continue
                if side.rationale:
                    console.print(Text(f"    {name} rationale: {side.rationale}"), highlight=False, soft_wrap=True)
                for evidence in side.evidence:
                    console.print(Text(f"    {name} evidence: \"{evidence.text}\""), highlight=False, soft_wrap=True)


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell (no pipe, no line break, no HTML)."""
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace("|", "\\|").replace("\r", " ").replace("\n", " "))


def diff_markdown(result: RunDiff, title: str = "rt4chart diff") -> str:
    """A Markdown summary fit for a pull-request comment or ``$GITHUB_STEP_SUMMARY``."""
    config = result.config
    lines = [f"### {_cell(title)}", "", f"**{config.kind}**: {_cell(config.explanation)}", ""]
    lines += [f"> **Warning:** {_cell(warning)}" for warning in result.warnings]
    if result.warnings:
        lines.append("")
    lines += ["| answers | count |", "|---|---:|"]
    lines += [f"| {title_} | {result.counts.get(key, 0)} |" for key, title_ in CATEGORY_TITLES.items()]
    claims = result.claim_counts
    lines += ["", f"Claims: {claims['matched']} matched, {claims['flip']} flipped, {claims['added']} added, "
              f"{claims['removed']} removed.", ""]
    lines += [f"- {_cell(test_sentence(result.answer_test, 'answer'))}",
              f"- {_cell(test_sentence(result.claim_test, 'claim'))}", ""]
    headings = {AnswerCategory.ADDED: "added and hallucinated",
                AnswerCategory.STILL_HALLUCINATED: "still hallucinated, with a new unsupported claim"}
    for category in (AnswerCategory.NEW, AnswerCategory.ADDED, AnswerCategory.STILL_HALLUCINATED,
                     AnswerCategory.FIXED, AnswerCategory.CHANGED_LABEL):
        # Added and still hallucinated answers are listed only where they fail --fail-on new.
        answers = [answer for answer in result.answers if answer.category is category
                   and (category not in headings or answer.gate_new)]
        if not answers:
            continue
        heading = headings.get(category, CATEGORY_TITLES[category])
        lines += [f"<details><summary>{heading}: {len(answers)}</summary>", "",
                  "| id | label | claims that changed (rationales) |", "|---|---|---|"]
        for answer in answers[:_MARKDOWN_ROWS]:
            changes = " / ".join(_claim_line(change) + _rationales(change) for change in answer.claims) or "-"
            lines.append(f"| `{_cell(str(answer.id))}` | {_label_change(answer)} | {_cell(changes)} |")
        if len(answers) > _MARKDOWN_ROWS:
            lines.append(f"| ... | | {len(answers) - _MARKDOWN_ROWS} more (see the HTML diff) |")
        lines += ["", "</details>", ""]
    return "\n".join(lines) + "\n"


def render_diff_html(result: RunDiff, title: str) -> str:
    """The HTML diff as one document."""
    from rt4chart.report.html_report import render_template  # Jinja2: loaded only when an HTML diff is asked for

    return render_template(
        "diff.html.j2",
        title=title,
        result=result.model_dump(mode="json"),
        categories=CATEGORY_TITLES,
        answer_test=test_sentence(result.answer_test, "answer"),
        claim_test=test_sentence(result.claim_test, "claim"),
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    )


def write_diff_html(path: Path, result: RunDiff, title: str) -> None:
    write_text_atomically(path, [render_diff_html(result, title)])
