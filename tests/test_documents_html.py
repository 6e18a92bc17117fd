# ruff: noqa: RUF001 - the report writes ranges with an en dash
"""The report shows where evidence comes from, in a real headless browser (Debian's chromium driven by
playwright): the document, its title, the quote's characters in it, the JSON path or table cell."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.reports.runs import rt4
from playwright.sync_api import Browser
from test_documents import AGENT_TURN, RULES
from test_html_report import OpenedReport, debian_chromium


@pytest.fixture(scope="module")
def audited(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The hand-made agent turn audited into an HTML report by ``rt4 verify``."""
    directory = tmp_path_factory.mktemp("documents-html")
    (directory / "answers.jsonl").write_text(json.dumps(AGENT_TURN) + "\n", encoding="utf-8")
    (directory / "rules.json").write_text(json.dumps(RULES), encoding="utf-8")
    completed = rt4("verify", "answers.jsonl", "--judge", "scripted:rules.json", "--decomposer", "judge", "--no-cache",
                    "-q", "--out", "out.jsonl", "--report", "report.html", cwd=directory)
    assert completed.returncode == 1, completed.stderr  # one claim is contradicted
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


def _sources_of(opened: OpenedReport, claim: int) -> list[str]:
    card = opened.page.locator(opened.card("agent-1"))
    card.locator(f'.chip[data-claim="{claim}"]').click()
    return card.locator(".detail ul.sources li.source").all_inner_texts()


def test_a_claim_from_two_tool_outputs_shows_both_sources(opened: OpenedReport, audited: Path) -> None:
    record = json.loads((audited / "out.jsonl").read_text(encoding="utf-8"))
    mixed = record["claims"][5]
    starts = [(e["source"]["start"], e["source"]["end"]) for e in mixed["evidence"]]
    assert _sources_of(opened, 5) == [
        f"weather_api · characters {starts[0][0]}–{starts[0][1]} · $.tomorrow.summary",
        f"kb-1 “Office guide” · characters {starts[1][0]}–{starts[1][1]}",
    ]
    assert opened.errors == []


def test_a_table_claim_shows_its_cells(opened: OpenedReport, audited: Path) -> None:
    record = json.loads((audited / "out.jsonl").read_text(encoding="utf-8"))
    source = record["claims"][4]["evidence"][0]["source"]
    assert _sources_of(opened, 4) == [
        f"sales_sql · characters {source['start']}–{source['end']} · row 1, column region ($[0].region)"
        " · row 1, column revenue ($[0].revenue)"
    ]
    assert opened.errors == []
