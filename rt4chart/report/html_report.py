"""The self-contained HTML report of an audit (``rt4 report --html``, ``rt4 verify --report``).

One file, inline CSS and JS, no network fetch (its Content-Security-Policy forbids any). The run
summary is rendered by Jinja2 with autoescaping; the samples travel as one JSON document inside a
``<script type="application/json">`` block (Jinja's ``tojson`` escapes ``<``, ``>``, ``&`` and
``'``, so no text can close the block) and the page's script builds each sample's view from it
with DOM text nodes only, a page of samples at a time, so answer and context text never becomes
markup and a run of thousands of samples opens at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape

from rt4chart.analysis.review import PlannedClaim, run_key
from rt4chart.method.citations import passage_names
from rt4chart.method.text import join_passages
from rt4chart.records.io import write_text_atomically
from rt4chart.report.audited import AuditedSample
from rt4chart.report.progress import RunSummary
from rt4chart.types import Label

_TEMPLATES = Environment(
    loader=PackageLoader("rt4chart.report", "templates"),
    autoescape=select_autoescape(["html", "j2"]),
    trim_blocks=True,
    lstrip_blocks=True,
)


def sample_payload(item: AuditedSample) -> dict[str, Any]:
    """What the page's script needs to show one sample."""
    report = item.report
    sample = item.sample
    return {
        "id": report.id,
        "line": report.line,
        "label": report.label,
        "hallucinated": report.hallucinated,
        "judge": report.judge,
        "errors": report.errors,
        "judge_errors": item.judge_errors,
        "ungrounded": item.ungrounded,
        "question": sample.question if sample else None,
        "answer": sample.answer if sample else None,
        "context": item.context_text,
        "document_titles": {d.id: d.title for d in sample.documents or [] if d.title} if sample else {},
        "claims": [claim.model_dump(mode="json") for claim in report.claims],
        "usage_by_judge": {name: usage.model_dump() for name, usage in report.usage_by_judge.items()},
        "cost_usd": report.usage.cost_usd,
        "extra": item.extra,
        **citation_payload(item),
    }


def citation_payload(item: AuditedSample) -> dict[str, Any]:
    """What the citation view (templates/citations.html.j2) needs of a sample that cites: the
    answer's citation audit and each passage's name and offsets in the joined context; nothing for
    a sample without citation markers, so its payload is what it always was."""
    audit, sample = item.report.citations, item.sample
    if audit is None:
        return {}
    passages: list[dict[str, Any]] = []
    if sample is not None and isinstance(sample.context, list):
        _, starts = join_passages(sample.context)
        names = passage_names(range(len(starts)), audit.passage_ids)
        passages = [
            {"name": name, "start": start, "end": start + len(text)}
            for name, start, text in zip(names, starts, sample.context, strict=True)
        ]
    return {"citations": audit.model_dump(mode="json"), "passages": passages}


def summary_rows(audited: list[AuditedSample]) -> dict[str, Any]:
    """The header's figures: counts per label, judges, prompt versions, cost, cache hits, errors."""
    summary = RunSummary()
    for item in audited:
        summary.add(item.report)
    return {
        "records": summary.records,
        "counts": {
            "entailed": summary.labels[Label.ENTAILED],
            "contradicted": summary.labels[Label.CONTRADICTED],
            "baseless": summary.labels[Label.BASELESS],
            "invalid": summary.invalid,
        },
        "hallucinated": summary.hallucinated,
        "judges": sorted({item.report.judge for item in audited if item.report.judge}),
        "prompt_versions": sorted({item.report.prompt_version for item in audited if item.report.prompt_version}),
        "cost_usd": summary.usage.cost_usd,
        "calls": summary.usage.calls,
        "cache_hits": summary.usage.cache_hits,
        "judge_errors": sum(bool(item.judge_errors) for item in audited),
        "ungrounded_claims": summary.ungrounded,
        "with_input": any(item.sample is not None for item in audited),
        "citations": summary.citations.model_dump(mode="json") if summary.citations.answers else None,
    }


def render_template(name: str, **values: Any) -> str:
    """Render one of the package's HTML templates (autoescaped) with ``values``."""
    return _TEMPLATES.get_template(name).render(**values)


def review_setup(
    audited: list[AuditedSample], run: str | None = None, plan: Sequence[PlannedClaim] | None = None
) -> dict[str, Any]:
    """What the review controls (templates/review.html.j2) need: the run key reviews are kept and
    exported under (``run``, else the key of ``audited``), and a plan's claims (``None``: every claim
    is reviewable, and reviews carry no inclusion probability)."""
    return {
        "run": run if run is not None else run_key([item.report for item in audited]),
        "plan": None if plan is None else [claim.model_dump(mode="json") for claim in plan],
    }


def render_html(
    audited: list[AuditedSample], title: str, *, run: str | None = None, plan: Sequence[PlannedClaim] | None = None
) -> str:
    """The whole report as one HTML document (``run``/``plan``: see :func:`review_setup`)."""
    template = _TEMPLATES.get_template("report.html.j2")
    return template.render(
        title=title,
        summary=summary_rows(audited),
        samples=[sample_payload(item) for item in audited],
        review=review_setup(audited, run, plan),
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    )


def write_html(
    path: Path,
    audited: list[AuditedSample],
    title: str,
    *,
    run: str | None = None,
    plan: Sequence[PlannedClaim] | None = None,
) -> None:
    write_text_atomically(path, [render_html(audited, title, run=run, plan=plan)])
