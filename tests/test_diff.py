"""``rt4 diff`` and the baseline gate on real audit files: the real CLI, scripted judges whose rules
differ on purpose, a recording server on 127.0.0.1 for the reuse of baseline records, and the
statistics checked against statsmodels / scipy computed here independently."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from faults import fault_server, grounded
from fixtures.reports.runs import rt4
from scipy.stats import bootstrap
from statsmodels.stats.contingency_tables import mcnemar

from rt4chart.analysis.diff import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, diff_files, paired_test

CONTEXT = ("The shop opens at 9 am. The shop closes at 5 pm. Parking is free on Sundays. "
           "Returns are accepted within 30 days.")

BASE_ANSWERS = {
    "s-new": "The shop opens at 9 am.",
    "s-fixed": "The shop closes at 5 pm.",
    "s-still": "Parking costs 3 dollars.",
    "s-faithful": "Returns are accepted within 30 days.",
    "s-changed": "Parking is free every day.",
    "s-edited": "Returns are accepted within 30 days. Parking is free on Sundays.",
    "s-removed": "The shop closes at 5 pm.",
    "s-bad": "The shop opens at 9 am.",
}
NEW_ANSWERS = {
    **{key: value for key, value in BASE_ANSWERS.items() if key != "s-removed"},
    "s-edited": "Returns are accepted within 30 days. Parking is free on Mondays. The shop sells bikes.",
    "s-added": "The shop sells bikes.",
    "s-bad": "",  # not a valid sample in the new run: unjudged
}


def _rule(claim: str, label: str, evidence: str | None = None) -> dict[str, Any]:
    return {"claim": claim, "label": label, "evidence": [evidence] if evidence else []}


# The baseline's judge wrongly contradicts the closing hour; the new judge wrongly contradicts the
# opening hour and calls "free every day" contradicted rather than baseless.
BASE_RULES = {"verify": [
    _rule("opens at 9", "entailed", "The shop opens at 9 am."),
    _rule("closes at 5", "contradicted", "The shop closes at 5 pm."),
    _rule("within 30 days", "entailed", "Returns are accepted within 30 days."),
    _rule("free on Sundays", "entailed", "Parking is free on Sundays."),
], "default": "baseless"}
NEW_RULES = {"verify": [
    _rule("opens at 9", "contradicted", "The shop opens at 9 am."),
    _rule("closes at 5", "entailed", "The shop closes at 5 pm."),
    _rule("within 30 days", "entailed", "Returns are accepted within 30 days."),
    _rule("free on Sundays", "entailed", "Parking is free on Sundays."),
    _rule("free every day", "contradicted", "Parking is free on Sundays."),
], "default": "baseless"}


def _write_input(path: Path, answers: dict[str, str]) -> Path:
    lines = [json.dumps({"id": key, "context": CONTEXT, "answer": answer}) for key, answer in answers.items()]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _rules_file(directory: Path, rules: dict[str, Any]) -> Path:
    """The rules in a file named after them: a scripted judge's name holds its file's name."""
    path = directory / ("base.rules.json" if rules is BASE_RULES else "new.rules.json")
    path.write_text(json.dumps(rules), encoding="utf-8")
    return path


def _audit(directory: Path, name: str, answers: dict[str, str], rules: dict[str, Any], *extra: str) -> Path:
    inputs = _write_input(directory / f"{name}.input.jsonl", answers)
    rules_file = _rules_file(directory, rules)
    out = directory / f"{name}.jsonl"
    rt4("verify", str(inputs), "--judge", f"scripted:{rules_file}", "--out", str(out), "--no-cache", "-q",
        "--fail-on", "never", *extra, cwd=directory)
    assert out.is_file()
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("diff")
    return _audit(directory, "base", BASE_ANSWERS, BASE_RULES), _audit(directory, "new", NEW_ANSWERS, NEW_RULES)


def _records(path: Path) -> dict[str, dict[str, Any]]:
    return {record["id"]: record for record in map(json.loads, path.read_text().splitlines())}


def test_every_category_is_counted_exactly(runs: tuple[Path, Path]) -> None:
    result = diff_files(*runs)
    assert result.counts == {
        "new": 2, "fixed": 1, "changed_label": 1, "still_hallucinated": 1, "still_faithful": 1,
        "added": 1, "removed": 1, "unjudged": 1, "answer_changed": 2,  # s-edited, and s-bad's emptied answer
    }
    by_id = {answer.id: answer for answer in result.answers}
    assert by_id["s-changed"].base_label == "baseless" and by_id["s-changed"].new_label == "contradicted"
    edited = by_id["s-edited"]
    assert edited.category == "new" and edited.answer_changed and edited.gate_new
    # The edited sentence states another fact (Mondays, not Sundays): a claim removed and one added,
    # never a flip of its old self; the new sentence is an added claim.
    kinds = sorted((change.kind, (change.new or change.base).text) for change in edited.claims)  # type: ignore[union-attr]
    assert kinds == [("added", "Parking is free on Mondays."), ("added", "The shop sells bikes."),
                     ("removed", "Parking is free on Sundays.")]
    assert result.claim_counts == {"matched": 6, "flip": 3, "added": 2, "removed": 1}
    assert sorted(str(a.id) for a in result.gate_new) == ["s-added", "s-edited", "s-new"]


def test_a_flip_carries_both_verdicts_evidence(runs: tuple[Path, Path]) -> None:
    result = diff_files(*runs)
    [flip] = next(answer for answer in result.answers if answer.id == "s-fixed").claims
    assert flip.base is not None and flip.new is not None
    assert (flip.base.label, flip.new.label) == ("contradicted", "entailed")
    assert [e.text for e in flip.base.evidence] == [e.text for e in flip.new.evidence] == ["The shop closes at 5 pm."]


def test_the_comparison_kind_follows_the_configurations(tmp_path: Path, runs: tuple[Path, Path]) -> None:
    base, new = runs
    assert diff_files(base, new).config.kind == "mixed"
    same_answers = _audit(tmp_path, "judge", BASE_ANSWERS, NEW_RULES)
    judged = diff_files(base, same_answers)
    assert judged.config.kind == "judge comparison" and judged.config.judge_changed and judged.warnings
    same_judge = _audit(tmp_path, "system", NEW_ANSWERS, BASE_RULES)
    system = diff_files(base, same_judge)
    assert system.config.kind == "system comparison" and not system.config.judge_changed and not system.warnings
    option = _audit(tmp_path, "option", BASE_ANSWERS, BASE_RULES, "--window", "3", "--overlap", "1")
    optioned = diff_files(base, option)
    assert optioned.config.kind == "judge comparison"
    assert optioned.config.options_changed == {"overlap": [10, 1], "window": [25, 3]}


def test_old_records_without_a_manifest_or_answer_hash_still_compare(tmp_path: Path, runs: tuple[Path, Path]) -> None:
    base, new = runs
    stripped = []
    for path in runs:
        copy = tmp_path / path.name
        records = [json.loads(line) for line in path.read_text().splitlines()]
        old = [{key: value for key, value in record.items() if key != "answer_sha256"} for record in records]
        copy.write_text("".join(json.dumps(record) + "\n" for record in old))
        stripped.append(copy)
    result = diff_files(*stripped)
    assert result.counts == diff_files(base, new).counts
    assert result.config.base.options is None and "options unknown" in result.config.explanation


def _reference(base: list[int], new: list[int]) -> tuple[float, tuple[float, float]]:
    """statsmodels' exact McNemar and scipy's paired percentile bootstrap, computed here."""
    table = [[sum(b == 1 and n == 1 for b, n in zip(base, new, strict=True)),
              sum(b == 1 and n == 0 for b, n in zip(base, new, strict=True))],
             [sum(b == 0 and n == 1 for b, n in zip(base, new, strict=True)),
              sum(b == 0 and n == 0 for b, n in zip(base, new, strict=True))]]
    p_value = float(mcnemar(table, exact=True).pvalue)
    interval = bootstrap(
        (np.array(base, float), np.array(new, float)), lambda b, n, axis: n.mean(axis) - b.mean(axis),
        paired=True, vectorized=True, n_resamples=BOOTSTRAP_RESAMPLES, batch=1000, method="percentile",
        rng=np.random.default_rng(BOOTSTRAP_SEED),
    ).confidence_interval
    return p_value, (float(interval.low), float(interval.high))


def test_mcnemar_and_bootstrap_equal_statsmodels_and_scipy_on_fixed_data() -> None:
    base = [1, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0, 0, 0, 1, 1, 0, 0, 0, 1, 0] * 3
    new = [1, 1, 0, 1, 0, 1, 1, 0, 1, 1, 1, 0, 0, 1, 0, 1, 1, 0, 1, 1] * 3
    test = paired_test(map(bool, base), map(bool, new))
    p_value, (low, high) = _reference(base, new)
    assert test.p_value == pytest.approx(p_value, abs=1e-9)
    assert test.ci_low == pytest.approx(low, abs=1e-9) and test.ci_high == pytest.approx(high, abs=1e-9)
    assert test.base_only == sum(b > n for b, n in zip(base, new, strict=True)) == 6
    assert test.new_only == sum(n > b for b, n in zip(base, new, strict=True)) == 18 and test.discordant == 24


def test_the_diffs_tests_equal_the_reference_on_the_audit_files(runs: tuple[Path, Path]) -> None:
    base, new = (_records(path) for path in runs)
    judged = [key for key in new if key in base and new[key]["label"] and base[key]["label"]]
    base_flags = [int(base[key]["hallucinated"]) for key in judged]
    new_flags = [int(new[key]["hallucinated"]) for key in judged]
    result = diff_files(*runs)
    p_value, (low, high) = _reference(base_flags, new_flags)
    test = result.answer_test
    assert test.pairs == len(judged) == 6 and (test.base_only, test.new_only) == (1, 2)
    assert test.p_value == pytest.approx(p_value, abs=1e-9)
    assert test.ci_low == pytest.approx(low, abs=1e-9) and test.ci_high == pytest.approx(high, abs=1e-9)
    # s-edited's Sundays -> Mondays claim is an added and a removed claim, not a matched pair.
    assert result.claim_test.pairs == 6 and (result.claim_test.base_only, result.claim_test.new_only) == (1, 1)


def test_cli_writes_json_markdown_and_html(tmp_path: Path, runs: tuple[Path, Path]) -> None:
    base, new = runs
    done = rt4("diff", str(base), str(new), "--json", "--markdown", "summary.md", "--html", "diff.html", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["counts"]["new"] == 2
    summary = (tmp_path / "summary.md").read_text()
    assert "| newly hallucinated | 2 |" in summary and "mixed" in summary and "McNemar" in summary
    assert "<details><summary>newly hallucinated: 2</summary>" in summary
    assert "Content-Security-Policy" in (tmp_path / "diff.html").read_text()
    terminal = rt4("diff", str(base), str(new), cwd=tmp_path)
    assert terminal.returncode == 0 and "s-changed" in terminal.stdout and "baseless -> contradicted" in terminal.stdout
    missing = rt4("diff", str(base), str(tmp_path / "nope.jsonl"), cwd=tmp_path)
    assert missing.returncode == 2 and "not found" in missing.stderr


def test_terminal_and_markdown_views_show_both_rationales_of_a_flip(tmp_path: Path, runs: tuple[Path, Path]) -> None:
    # s-changed: the baseline's judge had no rule for "free every day" (baseless), the new one has rule 4.
    base, new = runs
    terminal = rt4("diff", str(base), str(new), "--markdown", "summary.md", cwd=tmp_path)
    assert terminal.returncode == 0, terminal.stderr
    assert "before rationale: no rule matched" in terminal.stdout
    assert "now rationale: scripted rule 4" in terminal.stdout
    [row] = [line for line in (tmp_path / "summary.md").read_text().splitlines() if line.startswith("| `s-changed`")]
    assert "(before: no rule matched; now: scripted rule 4)" in row


def test_gate_exit_codes_for_new_worse_and_none(tmp_path: Path) -> None:
    valid_new = {key: value for key, value in NEW_ANSWERS.items() if key != "s-bad"}
    base = _audit(tmp_path, "gate-base", BASE_ANSWERS, BASE_RULES)
    inputs = _write_input(tmp_path / "pr.jsonl", valid_new)
    rules = _rules_file(tmp_path, BASE_RULES)

    def gate(*args: str) -> int:
        out = tmp_path / "pr-audit.jsonl"
        return rt4("verify", str(inputs), "--judge", f"scripted:{rules}", "--out", str(out), "--no-cache", "-q",
                   "--baseline", str(base), *args, cwd=tmp_path).returncode

    # Same judge: s-edited and s-added bring hallucinations; the rate rise is within the noise.
    assert gate("--fail-on", "new") == 1
    assert gate("--fail-on", "worse") == 0
    assert gate("--fail-on", "never") == 0
    assert gate() == 1  # the default policy: any hallucination
    # Nothing new against itself, although three answers are hallucinated.
    assert rt4("verify", str(tmp_path / "gate-base.input.jsonl"), "--judge", f"scripted:{rules}", "--out",
               str(tmp_path / "again.jsonl"), "--no-cache", "-q", "--baseline", str(base), "--fail-on", "new",
               cwd=tmp_path).returncode == 0
    # Worse beyond the CI: thirty faithful answers all flip under the new judge.
    many = {f"open-{n}": "The shop opens at 9 am." for n in range(30)}
    many_base = _audit(tmp_path, "many-base", many, BASE_RULES)
    new_rules = _rules_file(tmp_path, NEW_RULES)
    worse = rt4("verify", str(tmp_path / "many-base.input.jsonl"), "--judge", f"scripted:{new_rules}", "--out",
                str(tmp_path / "many-new.jsonl"), "--no-cache", "-q", "--baseline", str(many_base),
                "--fail-on", "worse",
                cwd=tmp_path)
    assert worse.returncode == 1
    assert "another" in worse.stderr.lower() or "differ in judge" in worse.stderr  # said loudly
    assert "worse by the exact McNemar test" in worse.stderr
    # Without a baseline, new and worse cannot decide anything.
    refused = rt4("verify", str(inputs), "--judge", f"scripted:{rules}", "--fail-on", "new", "-q", cwd=tmp_path)
    assert refused.returncode == 2 and "--baseline" in refused.stderr


def _annotated_id(command: str) -> str:
    """The sample id at the end of a workflow command's title (``title=... (ID)::message``)."""
    match = re.search(r"title=[^:]*\(([^()]*)\)::", command)
    assert match is not None, command
    return match.group(1)


def test_junit_skips_and_annotations_warn_pre_existing_hallucinations(tmp_path: Path) -> None:
    base = _audit(tmp_path, "ci-base", BASE_ANSWERS, BASE_RULES)
    valid_new = {key: value for key, value in NEW_ANSWERS.items() if key != "s-bad"}
    inputs = _write_input(tmp_path / "pr.jsonl", valid_new)
    done = rt4("verify", str(inputs), "--judge", f"scripted:{_rules_file(tmp_path, BASE_RULES)}", "--out",
               str(tmp_path / "pr-audit.jsonl"), "--no-cache", "-q", "--baseline", str(base), "--fail-on", "new",
               "--junit", "junit.xml", "--github", cwd=tmp_path)
    assert done.returncode == 1
    suite = ElementTree.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    assert suite is not None
    failed = {case.get("name") for case in suite.iter("testcase") if case.find("failure") is not None}
    skipped = {case.get("name"): element for case in suite.iter("testcase")
               if (element := case.find("skipped")) is not None}
    assert failed == {"s-edited", "s-added"}
    assert set(skipped) == {"s-fixed", "s-still", "s-changed"}
    assert all("baseline" in (element.get("message") or "") for element in skipped.values())
    assert suite.get("skipped") == "3" and suite.get("failures") == "2"
    errors = [line for line in done.stdout.splitlines() if line.startswith("::error")]
    warnings = [line for line in done.stdout.splitlines() if line.startswith("::warning")]
    assert sorted(map(_annotated_id, errors)) == ["s-added", "s-edited"]
    assert len(warnings) == 3 and all("also in the baseline" in line for line in warnings)
    # Any other policy with a baseline given still fails every hallucination.
    rt4("verify", str(inputs), "--judge", f"scripted:{_rules_file(tmp_path, BASE_RULES)}", "--out",
        str(tmp_path / "pr-audit.jsonl"), "--no-cache", "-q", "--baseline", str(base), "--junit", "all.xml",
        cwd=tmp_path)
    every = ElementTree.parse(tmp_path / "all.xml").getroot().find("testsuite")
    assert every is not None and (every.get("failures"), every.get("skipped")) == ("5", "0")


def test_a_rerun_with_the_baseline_and_an_empty_cache_makes_no_judge_call(tmp_path: Path) -> None:
    both = {key: BASE_ANSWERS[key] for key in ("s-faithful", "s-new")}
    inputs = _write_input(tmp_path / "answers.jsonl", both)
    # Rules decompose (the fault server answers verify requests only): every record is clean.
    judge = ["--judge", "openai/fault", "--decomposer", "rules", "--ungrounded", "keep", "-q", "--fail-on", "never"]
    with fault_server(grounded) as server:
        first = rt4("verify", str(inputs), *judge, "--api-base", server.base_url, "--out", "base.jsonl",
                    "--cache-dir", "cache-1", cwd=tmp_path)
        assert first.returncode == 0, first.stderr
        assert len(server.requests) > 0
        calls_before = len(server.requests)
        again = rt4("verify", str(inputs), *judge, "--api-base", server.base_url, "--out", "rerun.jsonl",
                    "--cache-dir", "cache-2", "--baseline", "base.jsonl", cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        assert len(server.requests) == calls_before  # not one request reached the judge
        # One answer edited: only that one is judged again.
        baseline_records = _records(tmp_path / "base.jsonl")
        _write_input(inputs, {"s-faithful": BASE_ANSWERS["s-faithful"], "s-new": "The shop opens at 10 am."})
        third = rt4("verify", str(inputs), *judge, "--api-base", server.base_url, "--out", "third.jsonl",
                    "--cache-dir", "cache-3", "--baseline", "base.jsonl", cwd=tmp_path)
        assert third.returncode == 0 and len(server.requests) > calls_before
    rerun = _records(tmp_path / "rerun.jsonl")
    assert rerun == baseline_records  # the baseline's records, as they were
    manifest = json.loads((tmp_path / "rerun.jsonl.manifest.json").read_text())
    assert manifest["reused_from_baseline"] == 2 and manifest["usage"]["calls"] == 0
    third_manifest = json.loads((tmp_path / "third.jsonl.manifest.json").read_text())
    assert third_manifest["reused_from_baseline"] == 1 and third_manifest["usage"]["calls"] > 0


def test_the_html_diff_in_chromium_filters_and_shows_both_evidences(tmp_path: Path, runs: tuple[Path, Path]) -> None:
    from test_html_report import OpenedReport, debian_chromium

    base, new = runs
    # The in-process CLI runs asyncio: it must finish before playwright's sync API holds a loop.
    assert rt4("diff", str(base), str(new), "--html", "diff.html", cwd=tmp_path).returncode == 0
    expected = diff_files(base, new)
    with debian_chromium() as browser:
        opened = OpenedReport(browser, tmp_path / "diff.html")
        page = opened.page
        for key in ("new", "fixed", "changed_label", "still_hallucinated", "added", "removed", "unjudged"):
            assert page.inner_text(f'[data-count="{key}"]') == str(expected.counts[key])
        assert page.locator("section.answer").count() == len(expected.answers)
        for category in ("new", "fixed"):
            page.select_option("#f-category", category)
            shown = page.locator("section.answer")
            assert shown.count() == expected.counts[category]
            assert {shown.nth(i).get_attribute("data-category") for i in range(shown.count())} == {category}
        page.select_option("#f-category", "changed")
        changed = [a for a in expected.answers if a.category == "changed_label" or a.answer_changed or a.claims]
        assert page.locator("section.answer").count() == len(changed)
        card = page.locator('section.answer[data-id="s-fixed"]')
        sides = card.locator(".sides")
        assert sides.is_hidden()
        card.locator(".claim").click()
        assert sides.is_visible()
        baseline, now = sides.locator(".verdict").nth(0), sides.locator(".verdict").nth(1)
        assert baseline.locator(".badge").inner_text() == "contradicted"
        assert now.locator(".badge").inner_text() == "entailed"
        for verdict in (baseline, now):
            assert verdict.locator("mark.evidence").inner_text() == "\u201cThe shop closes at 5 pm.\u201d"
    assert opened.errors == []
    assert opened.requests == [(tmp_path / "diff.html").as_uri()]  # nothing fetched besides the file itself


def test_claim_and_rationale_text_never_becomes_markup(tmp_path: Path) -> None:
    hostile = "<img src=x onerror=alert(1)></script><b>bold</b>"
    rules = {"verify": [_rule("img", "contradicted", "The shop opens at 9 am.")], "default": "baseless"}
    base = _audit(tmp_path, "h-base", {"x": hostile}, BASE_RULES)
    new = _audit(tmp_path, "h-new", {"x": hostile}, rules)
    assert rt4("diff", str(base), str(new), "--html", "h.html", "--markdown", "h.md", cwd=tmp_path).returncode == 0
    page = (tmp_path / "h.html").read_text()
    assert "<img" not in page and "</script><b>" not in page
    assert "<img" not in (tmp_path / "h.md").read_text()


def test_rt4_report_gates_existing_results_against_a_baseline(runs: tuple[Path, Path], tmp_path: Path) -> None:
    base, new = runs
    valid = tmp_path / "new-valid.jsonl"  # without the invalid line, whose exit 2 would come first
    valid.write_text("".join(line + "\n" for line in new.read_text().splitlines() if '"s-bad"' not in line))
    gated = rt4("report", str(valid), "--baseline", str(base), "--fail-on", "new", "--github", cwd=tmp_path)
    assert gated.returncode == 1
    errors = [line for line in gated.stdout.splitlines() if line.startswith("::error")]
    assert sorted(map(_annotated_id, errors)) == ["s-added", "s-edited", "s-new"]
    itself = rt4("report", str(base), "--baseline", str(base), "--fail-on", "new", "--github", cwd=tmp_path)
    assert itself.returncode == 0 and not any(line.startswith("::error") for line in itself.stdout.splitlines())
