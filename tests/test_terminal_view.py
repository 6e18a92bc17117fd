"""The readable terminal view: ``rt4 show`` with colours forced at a fixed width, and ``rt4 verify``
on a real pseudo-terminal (readable view) versus a pipe or ``--format jsonl`` (JSONL)."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import struct
import subprocess
import termios
from pathlib import Path

import pytest
from fixtures.reports.runs import RULES, copy_answers, rt4, rt4_process, verify
from rich.console import Console
from rich.style import Style
from rich.text import Text

from rt4chart.report.audited import AuditedSample
from rt4chart.report.terminal_view import claim_lines
from rt4chart.types import AuditRecord, ClaimVerdict, Evidence, JudgeScore, Label, Sample

WIDTH = 100


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("terminal")
    assert verify(directory).returncode == 1
    return directory


def _styles_of(text: Text, fragment: str) -> list[Style]:
    """Styles applied anywhere inside the first occurrence of ``fragment``."""
    start = text.plain.index(fragment)
    end = start + len(fragment)
    return [
        span.style if isinstance(span.style, Style) else Style.parse(span.style)
        for span in text.spans if span.start < end and span.end > start
    ]


ANSI_COLOURS = {1: "red", 2: "green", 3: "yellow", 5: "magenta", 6: "cyan"}


def _colour(styles: list[Style]) -> set[str]:
    """Names of the standard colours among ``styles`` (ANSI codes read back are numbers)."""
    return {ANSI_COLOURS.get(style.color.number or 0, style.color.name) for style in styles if style.color is not None}


def _show(audited: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> Text:
    # FORCE_COLOR and COLUMNS make rich write colours at a fixed width into the captured output.
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    completed = rt4("show", "results.jsonl", "--input", "answers.jsonl", *args, cwd=audited)
    assert completed.returncode == 0, completed.stderr
    assert "\x1b[" in completed.stdout  # colours were written
    return Text.from_ansi(completed.stdout)


def test_show_colours_claim_spans_by_label_and_highlights_their_evidence(
    audited: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = _show(audited, monkeypatch)
    lines = text.plain.splitlines()
    assert all(len(line) <= WIDTH for line in lines)
    assert [line.split()[0] for line in lines if "  line " in line] == ["paris", "berlin-wrong", "script-injection"]
    assert _colour(_styles_of(text, "It has 10 million inhabitants.")) == {"red"}
    assert _colour(_styles_of(text, "Berlin is the capital of Germany. It")) >= {"green"}
    assert _colour(_styles_of(text, "The list has")) == {"yellow"}
    unwrapped = " ".join(text.plain.split())  # wrapped lines (and the passage break) back to single spaces
    assert "evidence: …" in unwrapped and "weekly market. «It has 3.7 million inhabitants.» The city" in unwrapped
    assert any(style.reverse for style in _styles_of(text, "3.7 million"))  # the quote stands out in its context
    assert not any(style.reverse for style in _styles_of(text, "The city has many lakes."))
    assert "<script>window.__pwned = 'answer'</script>" in text.plain  # markup-like text is shown as is


def test_show_filters_by_id_and_by_verdict(audited: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    only = _show(audited, monkeypatch, "--only", "hallucinated").plain
    assert "berlin-wrong" in only and "script-injection" in only and "paris  line" not in only
    only = _show(audited, monkeypatch, "--only", "contradicted").plain
    assert "berlin-wrong" in only and "script-injection" not in only
    one = _show(audited, monkeypatch, "--id", "paris").plain
    assert one.startswith("paris  line 1  entailed") and "berlin" not in one
    missing = rt4("show", "results.jsonl", "--id", "nope", cwd=audited)
    assert missing.returncode == 2 and "no sample with id 'nope'" in missing.stderr
    # --help offers only what --only accepts; never (a run policy) is refused by the option itself.
    never = rt4("show", "results.jsonl", "--only", "never", cwd=audited)
    assert never.returncode == 2 and "never" in never.stderr
    offered = rt4("show", "--help", cwd=audited)
    help_text = Text.from_ansi(offered.stdout).plain
    assert "<contradicted|hallucinated|" in "".join(help_text.split()) and "never" not in help_text


def _verify_on_a_terminal(directory: Path, *args: str) -> str:
    """Run ``rt4 verify`` (no --out) with stdout on a pseudo-terminal WIDTH columns wide; return what it showed."""
    copy_answers(directory)
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, WIDTH, 0, 0))
    process = rt4_process(
        "verify", "answers.jsonl", "--judge", f"scripted:{RULES}", "--cache-dir", "cache", "--quiet", *args,
        cwd=directory, stdin=subprocess.DEVNULL, stdout=terminal, stderr=subprocess.DEVNULL,
        env={key: value for key, value in os.environ.items() if key not in ("COLUMNS", "FORCE_COLOR", "NO_COLOR")},
    )
    os.close(terminal)
    shown = bytearray()
    while True:
        try:
            data = os.read(controller, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not data:
            break
        shown += data
    os.close(controller)
    assert process.wait(timeout=300) == 1
    return shown.decode("utf-8").replace("\r\n", "\n")


def test_verify_on_a_terminal_prints_the_readable_view_and_jsonl_when_asked(tmp_path: Path) -> None:
    shown = _verify_on_a_terminal(tmp_path)
    text = Text.from_ansi(shown)
    assert "berlin-wrong  line 2  contradicted" in text.plain
    assert _colour(_styles_of(text, "It has 10 million inhabitants.")) == {"red"}
    assert all(len(line) <= WIDTH for line in text.plain.splitlines())
    assert '"claims"' not in text.plain
    records = [json.loads(line) for line in _verify_on_a_terminal(tmp_path, "--format", "jsonl").splitlines()]
    assert [record["id"] for record in records] == ["paris", "berlin-wrong", "script-injection"]


def test_verify_into_a_pipe_writes_jsonl(tmp_path: Path) -> None:
    completed = verify(tmp_path)  # --out: a file always gets JSONL
    assert completed.returncode == 1 and completed.stdout == ""
    copy_answers(tmp_path)
    piped = rt4("verify", "answers.jsonl", "--judge", f"scripted:{RULES}", "--cache-dir", "cache", "-q", cwd=tmp_path)
    ids = [json.loads(line)["id"] for line in piped.stdout.splitlines()]
    assert ids == ["paris", "berlin-wrong", "script-injection"]


def test_a_scored_verdict_names_its_probability_threshold_and_decider_and_how_its_quote_matched() -> None:
    # "baseless, 0.05" once read as 95% entailed: the view now says what the number is.
    context = "The earth\u2019s day lasts 24 hours."
    score = JudgeScore(p_unsupported=0.05, threshold=0.145, decided_by="no_content_overlap")
    evidence = Evidence(start=0, end=len(context), text=context, sentence_ids=[0], match="folded")
    claim = ClaimVerdict(
        index=0, text="The day lasts 24 hours.", sentence_index=0, answer_span=None, label=Label.BASELESS,
        confidence=0.05, score=score, evidence=[evidence],
    )
    record = AuditRecord(id="s", line=1, claims=[claim])
    item = AuditedSample(record, Sample(id="s", context=context, answer=claim.text))
    console = Console(width=WIDTH, record=True)
    for line in claim_lines(item, claim):
        console.print(line)
    shown = " ".join(console.export_text().split())
    assert "P(not entailed) 0.05 (entailed below 0.145) \u00b7 decided by no content overlap" in shown
    assert "quote matched folded" in shown
    assert "confidence" not in shown


def test_evidence_without_colour_keeps_the_quote_boundaries_and_whole_words() -> None:
    from rt4chart.report.terminal_view import evidence_in_context

    before = "Alpha bravo charlie delta echo foxtrot golf hotel india juliett kilo lima mike. "
    quote = "The trial lasts 14 days."
    after = " November oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu."
    context = before + quote + after
    shown = evidence_in_context(context, len(before), len(before) + len(quote)).plain
    assert f"«{quote}»" in shown
    left, right = shown.split(f"«{quote}»")
    assert left.startswith("…") and right.endswith("…")
    words = set(context.replace(".", " ").split())
    assert all(word in words for word in left.strip("… ").replace(".", " ").split())
    assert all(word in words for word in right.strip("… ").replace(".", " ").split())


def test_many_samples_show_failing_ones_in_full_and_passing_ones_one_line_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from audit_fixtures import write_rules, write_samples

    from rt4chart.report.terminal_view import FULL_VIEW_SAMPLES

    count = 3 * FULL_VIEW_SAMPLES
    samples = write_samples(tmp_path / "answers.jsonl", count)
    for sample in samples[::2]:  # every other answer keeps only its entailed sentence
        sample["answer"] = sample["answer"].split(". ")[0] + "."
    (tmp_path / "answers.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples), encoding="utf-8")
    rules = write_rules(tmp_path / "rules.json")
    audit = rt4("verify", "answers.jsonl", "--judge", f"scripted:{rules}", "--no-cache", "-o", "results.jsonl", "-q",
                cwd=tmp_path)
    assert audit.returncode == 1, audit.stderr
    monkeypatch.setenv("COLUMNS", str(WIDTH))
    shown = rt4("show", "results.jsonl", "--input", "answers.jsonl", cwd=tmp_path).stdout.splitlines()
    headings = [line for line in shown if "  line " in line]
    assert [line.split()[0] for line in headings] == [s["id"] for s in samples]
    passing = [line for line in headings if "  entailed" in line]
    assert len(passing) == len(samples[::2]) and all(len(line) <= WIDTH for line in shown)
    assert sum("It also sells cakes." in line and "baseless" in line for line in shown) == len(samples[1::2])
    assert not any("opens daily" in line for line in shown[: shown.index(headings[1])])  # no evidence of s0
    last = " ".join(" ".join(shown[-3:]).split())  # the closing note, wrapped or not
    assert f"{len(passing)} of {count} samples passed and are shown one line each" in last
    every = rt4("show", "results.jsonl", "--input", "answers.jsonl", "--all", cwd=tmp_path).stdout.splitlines()
    assert sum("opens daily" in line for line in every) == count  # each sample's evidence, passing ones too
    assert len(every) > len(shown) and "shown one line each" not in " ".join(every)
