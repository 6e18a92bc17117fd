"""The report's citation view in a real headless browser (Debian's chromium driven by playwright):
the run's ALCE figures in the header, each citing answer's figures, and the citation chip that
shows the context passage by passage with the cited and the supporting passage highlighted."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.reports.runs import rt4
from playwright.sync_api import Browser
from test_html_report import OpenedReport, debian_chromium

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "citations"
PASSAGES = [
    "Laptops can be returned within 30 days of delivery. The laptop must be in its original packaging.",
    "Refunds are issued to the original payment method. A refund reaches the card within 5 business days.",
]
NO_MARKERS = {"id": "no-markers", "context": PASSAGES, "answer": "Laptops can be returned within 30 days."}


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 24 cited answers and one without markers, audited into an HTML report by ``rt4 verify``."""
    directory = tmp_path_factory.mktemp("cited-html")
    answers = directory / "answers.jsonl"
    answers.write_text((FIXTURES / "cited_answers.jsonl").read_text(encoding="utf-8") + json.dumps(NO_MARKERS) + "\n",
                       encoding="utf-8")
    completed = rt4("verify", str(answers), "--judge", f"scripted:{FIXTURES / 'rules.json'}", "--decomposer", "rules",
                    "--no-cache", "-q", "--out", "out.jsonl", "--report", "report.html", cwd=directory)
    assert completed.returncode == 1, completed.stderr  # some answers are hallucinated
    return directory


@pytest.fixture(scope="module")
def browser(audited: Path) -> Iterator[Browser]:
    # `audited` first: its in-process run uses asyncio, which cannot start under playwright's loop.
    with debian_chromium() as launched:
        yield launched


@pytest.fixture
def opened(audited: Path, browser: Browser) -> Iterator[OpenedReport]:
    report = OpenedReport(browser, audited / "report.html")
    yield report
    report.page.close()


def test_the_header_shows_the_runs_citation_figures(opened: OpenedReport, audited: Path) -> None:
    run = json.loads((audited / "out.jsonl.manifest.json").read_text(encoding="utf-8"))["counts"]["citations"]
    page = opened.page
    for name in ("precision", "recall"):
        shown = page.text_content(f'[data-count="citation {name} (ALCE)"]') or ""
        # Two decimals, rounded by the page (JavaScript's toFixed rounds 0.625 up, Python's format down).
        assert len(shown) == 4 and float(shown) == pytest.approx(run[name], abs=0.0051)
    for verdict in ("supported", "misattributed", "unsupported", "uncited"):
        assert page.text_content(f'[data-count="citations {verdict}"]') == str(run["verdicts"][verdict])
    assert not opened.errors
    assert all(url.startswith("file:") for url in opened.requests)


def test_the_chip_highlights_the_cited_and_the_supporting_passage(opened: OpenedReport, audited: Path) -> None:
    record = next(json.loads(line) for line in (audited / "out.jsonl").read_text(encoding="utf-8").splitlines()
                  if json.loads(line)["id"] == "named-wrong-id")
    page = opened.page
    card = opened.card("named-wrong-id")
    figures = page.text_content(f"{card} .cite-figures") or ""
    assert "ALCE precision 0.00" in figures and "1 misattributed" in figures
    page.click(f'{card} .chip[data-claim="0"]')
    chip = f"{card} .detail .cite-chip"
    assert page.text_content(chip) == "citation misattributed"
    assert "cites refunds" in (page.text_content(f"{card} .detail .cite-text") or "")
    assert "supported by returns" in (page.text_content(f"{card} .detail .cite-text") or "")
    assert page.locator(f"{card} .passage.cited").count() == 0  # nothing highlighted before the click
    page.click(chip)
    cited = page.locator(f"{card} .passage.cited")
    supporting = page.locator(f"{card} .passage.supporting")
    assert cited.count() == 1 and cited.get_attribute("data-passage") == "refunds"
    assert supporting.count() == 1 and supporting.get_attribute("data-passage") == "returns"
    assert cited.text_content() == "[refunds] " + PASSAGES[1]
    evidence = record["claims"][0]["evidence"][0]["text"]
    assert supporting.locator("mark.evidence").text_content() == evidence
    page.click(chip)  # and off again
    assert page.locator(f"{card} .passage.cited, {card} .passage.supporting").count() == 0
    assert not opened.errors


def test_a_claim_supported_by_its_cited_passage_highlights_one_passage(opened: OpenedReport) -> None:
    page = opened.page
    card = opened.card("plain-cited-also-supports")
    page.click(f'{card} .chip[data-claim="0"]')
    assert "cited passages alone: entailed" in (page.text_content(f"{card} .detail .cite-text") or "")
    page.click(f"{card} .detail .cite-chip")
    highlighted = page.locator(f"{card} .passage.cited.supporting")
    assert highlighted.count() == 1 and highlighted.get_attribute("data-passage") == "5"
    assert highlighted.locator("mark.evidence").text_content() == "Card refunds arrive within 5 business days."


def test_an_answer_without_markers_shows_no_citation_view(opened: OpenedReport) -> None:
    page = opened.page
    card = opened.card("no-markers")
    page.click(f'{card} .chip[data-claim="0"]')
    page.wait_for_selector(f"{card} .detail:not([hidden])")
    assert page.locator(f"{card} .cite-chip, {card} .cite-figures, {card} .passage").count() == 0
    assert not opened.errors
