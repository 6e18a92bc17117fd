"""Review notes that are not text, in the HTML report's review controls (Debian's chromium through
playwright): a review file line whose note is a JSON object is named as not a review, and a browser
that kept such a review (an older page imported it) still draws the claim's panel, before and after a
reload, with the valid reviews kept."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.reports.runs import verify
from playwright.sync_api import Browser
from test_html_report import debian_chromium
from test_review import Tab

from rt4chart.analysis.review import REVIEW_FORMAT, run_key
from rt4chart.records.io import read_records
from rt4chart.types import AuditRecord

HOSTILE_NOTES = [{"toString": 1}, {"a": 1}, ["x"], 5]
"""Notes that are not text; an object whose toString is no function cannot even become a string."""


@pytest.fixture(scope="module")
def audit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("notes")
    completed = verify(directory, "--report", "report.html")
    assert completed.returncode == 1, completed.stderr  # hallucinated answers
    return directory


@pytest.fixture(scope="module")
def browser(audit: Path) -> Iterator[Browser]:
    with debian_chromium() as launched:  # after `audit`: see tests/test_review.py
        yield launched


def _records(audit: Path) -> dict[str, AuditRecord]:
    return {line.report.id or "": line.report for line in read_records(audit / "results.jsonl") if line.report}


def review_line(records: dict[str, AuditRecord], record_id: str, index: int, label: str, note: object) -> str:
    record = records[record_id]
    return json.dumps({
        "format": REVIEW_FORMAT, "run": run_key(list(records.values())), "record_id": record_id,
        "claim_index": index, "claim": record.claims[index].text, "judge_label": record.claims[index].label,
        "label": label, "note": note,
    })


def key(record_id: str, index: int) -> str:
    """The page's localStorage key of a claim's review (keyOf: JavaScript's JSON.stringify)."""
    return json.dumps([record_id, index], separators=(",", ":"))


def panel_of(tab: Tab, record_id: str, index: int) -> str:
    """The claim's review panel, opened: its text (title, buttons) and its note."""
    tab.open_claim(record_id, index)
    box = tab.review_box(record_id)
    tab.page.wait_for_selector(f"{box} input.review-note")
    return tab.page.inner_text(f"{box} b") + " | " + tab.page.input_value(f"{box} input.review-note")


def test_an_imported_note_that_is_not_text_is_refused_and_every_panel_still_draws(
    audit: Path, browser: Browser, tmp_path: Path
) -> None:
    records = _records(audit)
    lines = [review_line(records, "berlin-wrong", 1, "baseless", note) for note in HOSTILE_NOTES]
    lines.append(review_line(records, "paris", 0, "entailed", "checked by hand"))
    (tmp_path / "reviews.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    context = browser.new_context()
    tab = Tab(context, audit / "report.html")
    tab.page.set_input_files("#review-import", str(tmp_path / "reviews.jsonl"))
    tab.page.wait_for_selector('#review-progress[data-reviewed="1"]', state="attached")
    bad = ", ".join(str(number) for number in range(1, len(HOSTILE_NOTES) + 1))
    assert tab.page.inner_text("#review-message") == f"imported 1 reviews, lines not reviews: {bad}"
    assert panel_of(tab, "berlin-wrong", 1) == "review: | "
    assert panel_of(tab, "paris", 0) == "reviewed: entailed | checked by hand"
    tab.page.reload()
    tab.page.wait_for_selector("#review-progress[data-total]", state="attached")
    assert panel_of(tab, "berlin-wrong", 1) == "review: | "
    assert panel_of(tab, "paris", 0) == "reviewed: entailed | checked by hand"
    assert tab.errors == []
    context.close()


def test_a_kept_review_with_a_note_that_is_not_text_no_longer_breaks_the_panel_after_reload(
    audit: Path, browser: Browser
) -> None:
    records = _records(audit)
    storage_key = f"{REVIEW_FORMAT}:{run_key(list(records.values()))}"
    kept = {
        key("berlin-wrong", 1): {"label": "baseless", "note": {"toString": 1}},  # what an older page stored
        key("berlin-wrong", 0): {"label": "unsure", "note": None},
        key("paris", 0): {"label": "entailed", "note": "checked by hand"},
    }
    context = browser.new_context()
    tab = Tab(context, audit / "report.html")
    tab.page.evaluate("([key, value]) => localStorage.setItem(key, value)", [storage_key, json.dumps(kept)])
    for _ in range(2):  # the page that reads the broken store, and a reload of it
        tab.page.reload()
        tab.page.wait_for_selector("#review-progress[data-total]", state="attached")
        assert tab.page.get_attribute("#review-progress", "data-reviewed") == "2"
        assert tab.page.inner_text("#review-message").startswith("dropped 1 reviews kept in this browser")
        assert panel_of(tab, "berlin-wrong", 1) == "review: | "
        assert panel_of(tab, "berlin-wrong", 0) == "reviewed: unsure | "
        assert panel_of(tab, "paris", 0) == "reviewed: entailed | checked by hand"
    assert tab.errors == []
    context.close()
