"""The review loop: review controls of the HTML report in Debian's chromium (playwright), the review
file format, ``rt4 review-plan`` and ``rt4 agree --reviews`` (Horvitz-Thompson weighted figures,
checked against a computation done here by hand), and a small run of the coverage simulation of
evals/review/coverage.py."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from fixtures.reports.runs import rt4, verify
from playwright.sync_api import Browser, BrowserContext, ConsoleMessage, Page
from test_html_report import debian_chromium

from rt4chart.analysis.review import ClaimReview, ReviewFileError, read_reviews, run_key, write_reviews
from rt4chart.analysis.review_agreement import review_agreement
from rt4chart.records.io import read_records
from rt4chart.report.audited import AuditedSample
from rt4chart.report.review_plan import allocate, plan_reviews
from rt4chart.types import AuditRecord, ClaimVerdict, JudgeScore, Label

COVERAGE_SCRIPT = Path(__file__).resolve().parent.parent / "evals" / "review" / "coverage.py"
LABELS = ["entailed", "contradicted", "baseless"]


@pytest.fixture(scope="module")
def audit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """answers.jsonl, its results and their report (``rt4 verify --report``)."""
    directory = tmp_path_factory.mktemp("review")
    completed = verify(directory, "--report", "report.html")
    assert completed.returncode == 1, completed.stderr  # hallucinated answers
    return directory


@pytest.fixture(scope="module")
def browser(audit: Path) -> Iterator[Browser]:
    # After `audit`: its in-process `rt4 verify` runs asyncio, which cannot start once playwright's
    # sync API holds an event loop in this thread.
    with debian_chromium() as launched:
        yield launched


class Tab:
    """A report open in a tab of ``context``, with every error and request it made."""

    def __init__(self, context: BrowserContext, path: Path) -> None:
        self.page: Page = context.new_page()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.on("request", lambda request: self.requests.append(request.url))
        self.page.goto(path.as_uri())
        self.page.wait_for_selector("#review-progress[data-total]", state="attached")

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.errors.append(message.text)

    def progress(self) -> str:
        return self.page.inner_text("#review-progress")

    def open_claim(self, record_id: str, index: int) -> None:
        self.page.locator(f'section.sample[data-id="{record_id}"] .chip[data-claim="{index}"]').click()

    def review_box(self, record_id: str) -> str:
        return f'section.sample[data-id="{record_id}"] .review'

    def export(self, target: Path) -> Path:
        with self.page.expect_download() as download:
            self.page.click("#review-export")
        download.value.save_as(target)
        return target


def _records(path: Path) -> list[AuditRecord]:
    return [line.report for line in read_records(path) if line.report is not None]


def test_review_in_the_report_exported_and_imported_back_keeps_every_review(
    audit: Path, browser: Browser, tmp_path: Path
) -> None:
    records = _records(audit / "results.jsonl")
    claims = sum(len(record.claims) for record in records)
    first = browser.new_context(accept_downloads=True)
    tab = Tab(first, audit / "report.html")
    assert tab.progress() == f"0 of {claims} reviewed"

    tab.open_claim("berlin-wrong", 1)  # the judge says contradicted; the reviewer says baseless
    box = tab.review_box("berlin-wrong")
    tab.page.click(f'{box} button:text-is("baseless")')
    tab.page.fill(f"{box} input.review-note", "the context never states a figure for that")
    tab.page.press(f"{box} input.review-note", "Enter")
    tab.open_claim("paris", 0)
    tab.page.click(f'{tab.review_box("paris")} button:text-is("confirm entailed")')
    assert tab.progress() == f"2 of {claims} reviewed"
    exported = read_reviews(tab.export(tmp_path / "reviews.jsonl"))

    run = run_key(records)
    assert sorted((r.record_id, r.claim_index, r.judge_label, r.label, r.note) for r in exported) == [
        ("berlin-wrong", 1, "contradicted", "baseless", "the context never states a figure for that"),
        ("paris", 0, "entailed", "entailed", None),
    ]
    assert {(r.run, r.inclusion_probability, r.stratum) for r in exported} == {(run, None, None)}
    by_id = {record.id: record for record in records}
    assert all(by_id[r.record_id].claims[r.claim_index].text == r.claim for r in exported)

    tab.page.reload()  # kept in the browser under the run
    tab.page.wait_for_selector("#review-progress[data-total]", state="attached")
    assert tab.progress() == f"2 of {claims} reviewed"
    assert tab.page.locator(".chip.reviewed").count() == 2  # cards drawn before the controls' setup are marked too
    assert tab.errors == [] and {url for url in tab.requests if not url.startswith("blob:")} == {
        (audit / "report.html").as_uri()
    }
    first.close()

    second = browser.new_context()  # another browser profile: nothing kept, the file brings the reviews back
    fresh = Tab(second, audit / "report.html")
    assert fresh.progress() == f"0 of {claims} reviewed"
    fresh.page.set_input_files("#review-import", str(tmp_path / "reviews.jsonl"))
    # A selector, not wait_for_function: its polling evaluates a string, which the page's CSP forbids.
    fresh.page.wait_for_selector(f'#review-progress[data-reviewed="{len(exported)}"]', state="attached")
    assert fresh.progress() == f"2 of {claims} reviewed"
    assert fresh.page.locator(".chip.reviewed").count() == 2 and fresh.page.locator(".chip.to-review").count() == 0
    assert "imported 2 reviews" in fresh.page.inner_text("#review-message")
    fresh.open_claim("berlin-wrong", 1)
    box = fresh.review_box("berlin-wrong")
    assert fresh.page.inner_text(f"{box} b") == "reviewed: baseless"
    assert fresh.page.input_value(f"{box} input.review-note") == "the context never states a figure for that"
    assert read_reviews(fresh.export(tmp_path / "again.jsonl")) == exported
    assert fresh.errors == []
    second.close()

    agreed = rt4("agree", "results.jsonl", "--reviews", str(tmp_path / "again.jsonl"), "--json", cwd=audit)
    assert agreed.returncode == 0, agreed.stderr
    figures = json.loads(agreed.stdout)
    assert (figures["used"], figures["weighted"], figures["unsure"]) == (2, False, 0)
    contradicted = next(f for f in figures["labels"] if f["label"] == "contradicted")
    assert (contradicted["precision"]["value"], contradicted["precision"]["n"]) == (0.0, 1)
    assert "zero width" in contradicted["precision"]["warnings"][0]  # [0, 0] from one review is said to be fragile
    table = rt4("agree", "results.jsonl", "--reviews", str(tmp_path / "again.jsonl"), cwd=audit)
    assert table.returncode == 0 and "against 2 reviews (unweighted" in table.stdout
    assert "! precision contradicted: an interval of zero width" in " ".join(table.stdout.split())


def _claim(index: int, label: str | None, confidence: float | None = None) -> ClaimVerdict:
    return ClaimVerdict(index=index, text=f"claim {index}", sentence_index=0, answer_span=None,
                        label=Label(label) if label else None, confidence=confidence)


def _audit(claims_per_label: dict[str, int], path: Path | None = None) -> list[AuditRecord]:
    """Records of five claims each, the judge's labels in the given numbers, confidences spread."""
    labels = [label for label, count in claims_per_label.items() for _ in range(count)]
    records = []
    for number in range(0, len(labels), 5):
        chunk = labels[number:number + 5]
        claims = [_claim(i, label, 0.5 + 0.5 * ((number + i) % 7) / 7) for i, label in enumerate(chunk)]
        records.append(AuditRecord(id=f"r{number // 5}", line=number // 5 + 1, claims=claims))
    if path is not None:
        path.write_text("".join(record.model_dump_json() + "\n" for record in records), encoding="utf-8")
    return records


def test_a_plan_report_asks_for_the_planned_claims_and_its_reviews_carry_their_inclusion_probability(
    browser: Browser, tmp_path: Path
) -> None:
    _audit({"entailed": 40, "contradicted": 6, "baseless": 9}, tmp_path / "audit.jsonl")
    completed = rt4("review-plan", "audit.jsonl", "--n", "12", "--report", "plan.html", "--out", "plan.jsonl",
                    cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    planned = [json.loads(line) for line in (tmp_path / "plan.jsonl").read_text(encoding="utf-8").splitlines()]
    context = browser.new_context(accept_downloads=True)
    tab = Tab(context, tmp_path / "plan.html")
    assert tab.progress() == f"0 of {len(planned)} reviewed"
    assert tab.page.locator("section.sample").count() == len({p["record_id"] for p in planned})
    assert tab.page.locator(".chip.to-review").count() == len(planned)  # the planned claims stand out
    pick = planned[0]
    tab.open_claim(pick["record_id"], pick["claim_index"])
    box = tab.review_box(pick["record_id"])
    assert f"inclusion probability {pick['inclusion_probability']:.3g}"[:30] in tab.page.inner_text(box)
    tab.page.click(f'{box} button:text-is("unsure")')
    unplanned = next(
        i for i in range(5) if not any(p["record_id"] == pick["record_id"] and p["claim_index"] == i for p in planned)
    )
    tab.open_claim(pick["record_id"], unplanned)
    assert tab.page.inner_text(box) == "not in this review plan"
    assert tab.progress() == f"1 of {len(planned)} reviewed"
    assert tab.page.locator(".chip.reviewed").count() == 1
    [review] = read_reviews(tab.export(tmp_path / "reviews.jsonl"))
    assert (review.record_id, review.claim_index, review.label) == (pick["record_id"], pick["claim_index"], "unsure")
    assert (review.inclusion_probability, review.stratum) == (pick["inclusion_probability"], pick["stratum"])
    assert tab.errors == []
    context.close()


def test_a_review_file_line_that_is_not_a_review_is_named(tmp_path: Path) -> None:
    good = ClaimReview(run="k", record_id="a", claim_index=0, claim="c", judge_label="entailed", label="baseless")
    path = tmp_path / "reviews.jsonl"
    write_reviews(path, [good])
    assert read_reviews(path) == [good]
    lines = [good.model_dump_json(), json.dumps({**good.model_dump(), "label": "wrong"}), "{not json"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ReviewFileError, match=r"line 2: not an rt4chart.review/1 review \(label: "):
        read_reviews(path)
    _audit({"entailed": 5}, tmp_path / "audit.jsonl")
    completed = rt4("agree", "audit.jsonl", "--reviews", "reviews.jsonl", cwd=tmp_path)
    assert completed.returncode == 2 and "reviews.jsonl line 2" in completed.stderr


def test_reviews_of_claims_the_audit_does_not_have_are_refused(tmp_path: Path) -> None:
    records = _audit({"entailed": 5}, tmp_path / "audit.jsonl")
    wrong = ClaimReview(run=run_key(records), record_id="r0", claim_index=1, claim="another claim",
                        judge_label="entailed", label="entailed")
    write_reviews(tmp_path / "reviews.jsonl", [wrong])
    completed = rt4("agree", "audit.jsonl", "--reviews", "reviews.jsonl", cwd=tmp_path)
    assert completed.returncode == 2 and "'another claim'" in completed.stderr
    two = rt4("agree", "audit.jsonl", "audit.jsonl", "--reviews", "reviews.jsonl", cwd=tmp_path)
    assert two.returncode == 2 and "one OUTPUT.jsonl" in two.stderr


def test_weighted_figures_equal_a_horvitz_thompson_computation_by_hand() -> None:
    # Judge label, reviewer label, inclusion probability: fixed data with unequal probabilities.
    rows = [
        ("entailed", "entailed", 0.1), ("entailed", "entailed", 0.1), ("entailed", "baseless", 0.1),
        ("entailed", "entailed", 0.5), ("entailed", "contradicted", 0.5),
        ("contradicted", "contradicted", 0.8), ("contradicted", "entailed", 0.8), ("contradicted", "contradicted", 1.0),
        ("baseless", "baseless", 0.4), ("baseless", "entailed", 0.4), ("baseless", "baseless", 0.25),
        ("baseless", "unsure", 0.4), (None, "entailed", 0.5),
    ]
    records = [AuditRecord(id=f"r{i}", line=i + 1, claims=[_claim(0, judge)]) for i, (judge, _, _) in enumerate(rows)]
    run = run_key(records)
    reviews = [
        ClaimReview(run=run, record_id=f"r{i}", claim_index=0, claim="claim 0", judge_label=judge,  # type: ignore[arg-type]
                    label=label, inclusion_probability=probability, stratum=str(judge))  # type: ignore[arg-type]
        for i, (judge, label, probability) in enumerate(rows)
    ]
    result = review_agreement(records, reviews, resamples=200, seed=3)

    counted = [(j, r, 1 / p) for j, r, p in rows if j is not None and r != "unsure"]
    total = sum(w for _, _, w in counted)
    for figures in result.labels:
        label = figures.label
        both = sum(w for j, r, w in counted if j == label and r == label)
        assert figures.precision.value == pytest.approx(both / sum(w for j, _, w in counted if j == label))
        assert figures.recall.value == pytest.approx(both / sum(w for _, r, w in counted if r == label))
        assert figures.precision.n == sum(j == label for j, _, _ in counted)
        assert figures.recall.n == sum(r == label for _, r, _ in counted)
        assert figures.precision.ci_low is not None and figures.precision.ci_high is not None
    observed = sum(w for j, r, w in counted if j == r) / total
    expected = sum(
        sum(w for j, _, w in counted if j == label) * sum(w for _, r, w in counted if r == label) for label in LABELS
    ) / total**2
    assert result.agreement.value == pytest.approx(observed)
    assert result.kappa.value == pytest.approx((observed - expected) / (1 - expected))
    assert (result.weighted, result.used, result.unsure, result.without_judge_label) == (True, 11, 1, 1)

    unweighted = review_agreement(
        records, [r.model_copy(update={"inclusion_probability": None}) for r in reviews], resamples=0
    )
    judged_entailed = [r for j, r, _ in counted if j == "entailed"]
    entailed = judged_entailed.count("entailed") / len(judged_entailed)
    assert unweighted.labels[0].precision.value == pytest.approx(entailed) != result.labels[0].precision.value
    with pytest.raises(ValueError, match="cannot be pooled"):
        review_agreement(records, [reviews[0].model_copy(update={"inclusion_probability": None}), *reviews[1:]])


def test_allocation_is_neyman_within_and_equal_across_with_a_floor() -> None:
    assert allocate([100, 100], [50.0, 10.0], 24) == [20, 4]  # n_h proportional to N_h * S_h
    assert allocate([100, 100, 100], [1.0, 1.0, 1.0], 30) == [10, 10, 10]
    assert allocate([3, 100, 100], [1.0, 1.0, 1.0], 30) == [3, 14, 13]  # a small label's leftovers go to the others
    assert allocate([100, 100], [100.0, 0.0], 10) == [8, 2]  # every stratum keeps its floor
    assert allocate([1, 2], [1.0, 1.0], 10) == [1, 2]  # never more than the stratum holds


def test_a_plan_is_a_seeded_stratified_draw_with_its_inclusion_probabilities() -> None:
    records = _audit({"entailed": 120, "contradicted": 15, "baseless": 30})
    for record in records[:3]:  # a scoring judge's claims are banded by the probability of their label's side
        record.claims[0] = record.claims[0].model_copy(
            update={"confidence": None, "score": JudgeScore(p_unsupported=0.2, threshold=0.5, decided_by="head")}
        )
    records[-1].claims[-1] = _claim(4, None)
    audited = [AuditedSample(record) for record in records]
    plan = plan_reviews(audited, 45, seed=7)
    assert plan.without_judge_label == 1
    assert sum(s.size for s in plan.strata) == sum(len(r.claims) for r in records) - 1  # every labelled claim once
    per_label = Counter(claim.judge_label for claim in plan.claims)
    assert per_label == {"entailed": 15, "contradicted": 15, "baseless": 15}
    drawn = Counter(claim.stratum for claim in plan.claims)
    for stratum in plan.strata:
        assert drawn[stratum.name] == stratum.sample >= min(2, stratum.size)
        assert stratum.inclusion_probability == pytest.approx(stratum.sample / stratum.size)
    probability = {stratum.name: stratum.inclusion_probability for stratum in plan.strata}
    assert all(claim.inclusion_probability == probability[claim.stratum] for claim in plan.claims)
    assert len({(c.record_id, c.claim_index) for c in plan.claims}) == len(plan.claims)
    assert plan_reviews(audited, 45, seed=7) == plan != plan_reviews(audited, 45, seed=8)


def _coverage_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("review_coverage", COVERAGE_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_the_interval_covers_the_true_precision_of_a_known_population_about_as_often_as_it_says() -> None:
    simulation = _coverage_script()
    known = simulation.population(records=100, claims_per_record=5, seed=1)
    result = simulation.coverage(known, draws=20, n=60, resamples=200)
    precision = [figure for name, figure in result.items() if name.startswith("precision")]
    assert len(precision) == 3 and all(figure["draws"] == 20 for figure in precision)
    pooled = sum(figure["coverage"] for figure in precision) / 3
    assert pooled >= 0.8, result  # nominal 0.95; 60 draws in all, so a broken estimator (unweighted) falls far below


def test_a_plan_needs_an_output_and_claims_with_a_judge_label(tmp_path: Path) -> None:
    records = [AuditRecord(id="failed", line=1, claims=[_claim(0, None)])]
    (tmp_path / "audit.jsonl").write_text(records[0].model_dump_json() + "\n", encoding="utf-8")
    nothing = rt4("review-plan", "audit.jsonl", cwd=tmp_path)
    assert nothing.returncode == 2 and "--report" in nothing.stderr
    unlabelled = rt4("review-plan", "audit.jsonl", "--out", "plan.jsonl", cwd=tmp_path)
    assert unlabelled.returncode == 2 and "no claim with a judge label" in unlabelled.stderr
    assert not (tmp_path / "plan.jsonl").exists()


def test_ids_and_claims_with_control_characters_match_between_plan_page_and_agree(tmp_path: Path) -> None:
    hostile = "\x1b[2J\u202e"  # a terminal escape and a bidi override: the report shows them as visible characters
    claim = ClaimVerdict(index=0, text=f"claim {hostile}", sentence_index=0, answer_span=None, label=Label.BASELESS)
    record = AuditRecord(id=f"r{hostile}", line=1, claims=[claim])
    (tmp_path / "audit.jsonl").write_text(record.model_dump_json() + "\n", encoding="utf-8")
    assert rt4("review-plan", "audit.jsonl", "--out", "plan.jsonl", cwd=tmp_path).returncode == 0
    [planned] = [json.loads(line) for line in (tmp_path / "plan.jsonl").read_text(encoding="utf-8").splitlines()]
    assert "\x1b" not in planned["record_id"] + planned["claim"]
    review = ClaimReview(**{k: planned[k] for k in ("run", "record_id", "claim_index", "claim", "judge_label",
                                                     "inclusion_probability", "stratum")}, label="baseless")
    write_reviews(tmp_path / "reviews.jsonl", [review])
    agreed = rt4("agree", "audit.jsonl", "--reviews", "reviews.jsonl", "--json", cwd=tmp_path)
    assert agreed.returncode == 0, agreed.stderr
    result = json.loads(agreed.stdout)
    assert (result["used"], result["warnings"]) == (1, [])
