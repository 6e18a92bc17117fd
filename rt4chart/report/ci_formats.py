"""What CI systems read: JUnit XML and GitHub Actions annotations, per sample under the run's policy.

JUnit: one test suite per run, one test case per input line. A sample that fails the policy
(``--fail-on``) is a ``<failure>`` whose text lists its unfaithful claims with their evidence; an
input line that could not be audited, or a sample whose judging met errors, is an ``<error>``
(and only that when the sole unfaithful claims are ones a judge error left without a verdict).

GitHub: one workflow command per sample that needs attention, pointing at its input line, so the
annotation appears on that line of the answers file in the pull request.
"""

from __future__ import annotations

import socket
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from rt4chart.method.citations import describe_claim
from rt4chart.options import CITATION_POLICIES, FailOn
from rt4chart.records.io import write_text_atomically
from rt4chart.report.audited import AuditedSample
from rt4chart.types import Label


def _quote(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def finding_lines(item: AuditedSample) -> list[str]:
    """The sample's unfaithful claims, each with its rationale and evidence, as plain lines."""
    lines: list[str] = []
    for claim in item.report.claims:
        if claim.label is Label.ENTAILED:
            continue
        lines.append(f"[{claim.label or 'unjudged'}] claim {claim.index}: {claim.text}")
        if claim.rationale:
            lines.append(f"  why: {claim.rationale}")
        for evidence in claim.evidence:
            lines.append(f'  evidence (context {evidence.start}-{evidence.end}): "{_quote(evidence.text)}"')
        if not claim.grounded:
            lines.append("  (the judge's evidence was not found in the context)")
    return lines + citation_lines(item)


def citation_lines(item: AuditedSample) -> list[str]:
    """The sample's claims whose citation does not hold, each with what it cites and what supports it."""
    audit = item.report.citations
    if audit is None:
        return []
    return [
        line
        for claim in item.report.claims
        if claim.citation is not None and claim.citation.verdict not in (None, "supported")
        for line in (f"[citation {claim.citation.verdict}] claim {claim.index}: {claim.text}",
                     f"  {describe_claim(claim.citation, audit.passage_ids)}")
    ]


def _problem(item: AuditedSample) -> str | None:
    """Why a sample is an error rather than a verdict: unreadable input or judge errors."""
    report = item.report
    if report.label is None:
        return "; ".join(report.errors) or "no verdict"
    if item.judge_errors:
        return "; ".join(item.judge_errors)
    return None


def _judged_failure(item: AuditedSample, policy: FailOn) -> bool:
    """Whether a judge's verdict on some claim fails the sample; a claim left unjudged by a judge
    error makes the answer baseless, but that is the judge's error, not a verdict to report."""
    if policy in CITATION_POLICIES:
        return item.fails(policy)  # a citation verdict comes from the judge's verdicts, never from an error
    failing = (Label.CONTRADICTED,) if policy is FailOn.CONTRADICTED else (Label.CONTRADICTED, Label.BASELESS)
    return item.fails(policy) and any(claim.label in failing for claim in item.report.claims)


def _failure_message(item: AuditedSample, policy: FailOn) -> str:
    report = item.report
    if policy in CITATION_POLICIES:
        bad = sum(c.citation is not None and c.citation.verdict in CITATION_POLICIES[policy] for c in report.claims)
        return f"line {report.line}: {bad} of {len(report.claims)} claims {policy.value}"
    bad = sum(claim.label is not Label.ENTAILED for claim in report.claims)
    return f"line {report.line}: {report.label}, {bad} of {len(report.claims)} claims not entailed"


def _failure_policy(fail_on: FailOn) -> FailOn:
    # `--fail-on never` keeps the exit code at 0, yet the report should still show what is wrong.
    return FailOn.HALLUCINATED if fail_on is FailOn.NEVER else fail_on


def junit_xml(
    audited: list[AuditedSample], suite_name: str, fail_on: FailOn = FailOn.HALLUCINATED,
    pre_existing: frozenset[int] = frozenset(),
) -> str:
    """The run as JUnit XML (the Ant/Surefire format Jenkins, GitLab and GitHub tools read).

    ``pre_existing``: input lines whose hallucination the ``--baseline`` audit had too; they are
    skipped with that reason rather than failed (only what a change brings fails it).
    """
    policy = _failure_policy(fail_on)
    failing = [item for item in audited if _judged_failure(item, policy)]
    skipped = sum(item.report.line in pre_existing for item in failing)
    errors = sum(_problem(item) is not None for item in audited)
    counts = {"tests": str(len(audited)), "failures": str(len(failing) - skipped), "errors": str(errors)}
    root = ElementTree.Element("testsuites", {"name": "rt4chart", **counts})
    suite = ElementTree.SubElement(
        root,
        "testsuite",
        {
            "name": suite_name,
            **counts,
            "skipped": str(skipped),
            "timestamp": datetime.now(UTC).replace(microsecond=0, tzinfo=None).isoformat(),
            "hostname": socket.gethostname(),
        },
    )
    properties = ElementTree.SubElement(suite, "properties")
    judges = sorted({item.report.judge for item in audited if item.report.judge})
    prompts = sorted({item.report.prompt_version for item in audited if item.report.prompt_version})
    for name, value in (("judge", ", ".join(judges)), ("prompt_version", ", ".join(prompts)), ("fail_on", policy)):
        ElementTree.SubElement(properties, "property", {"name": name, "value": value})
    for item in audited:
        report = item.report
        name = report.id if report.id is not None else f"line-{report.line}"
        case = ElementTree.SubElement(suite, "testcase", {"name": name, "classname": "rt4chart.audit"})
        problem = _problem(item)
        if problem is not None:
            kind = "invalid input" if report.label is None else "judge error"
            error = ElementTree.SubElement(case, "error", {"type": kind, "message": f"line {report.line}: {problem}"})
            error.text = problem
        if _judged_failure(item, policy):
            message = _failure_message(item, policy)
            if report.line in pre_existing:
                message += "; hallucinated in the baseline too"
            kind = "skipped" if report.line in pre_existing else "failure"
            finding = ElementTree.SubElement(case, kind, {"type": str(report.label), "message": message})
            finding.text = "\n".join(finding_lines(item))
    ElementTree.indent(root)
    return ElementTree.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def write_junit(
    path: Path, audited: list[AuditedSample], suite_name: str, fail_on: FailOn,
    pre_existing: frozenset[int] = frozenset(),
) -> None:
    write_text_atomically(path, [junit_xml(audited, suite_name, fail_on, pre_existing)])


def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def github_annotations(
    audited: Iterable[AuditedSample], input_file: str | None, fail_on: FailOn = FailOn.HALLUCINATED,
    pre_existing: frozenset[int] = frozenset(),
) -> list[str]:
    """GitHub Actions workflow commands (``::error file=F,line=N,title=T::message``), one per sample.

    Samples that fail the policy and samples that could not be judged are errors; hallucinated
    samples the policy lets pass, and those the ``--baseline`` audit had too (``pre_existing``
    input lines), are warnings; entailed samples get none.
    """
    policy = _failure_policy(fail_on)
    commands: list[str] = []
    for item in audited:
        report = item.report
        problem = _problem(item)
        if problem is not None:
            level, title, lines = "error", "rt4chart: not judged", [problem]
        elif policy in CITATION_POLICIES and item.fails(policy):
            level, title, lines = "error", f"rt4chart: citations {policy.value}", citation_lines(item)
        elif report.hallucinated:
            known = report.line in pre_existing
            level = "error" if item.fails(policy) and not known else "warning"
            title = f"rt4chart: {report.label}" + (" (also in the baseline)" if known else "")
            lines = finding_lines(item)
        else:
            continue
        where = [f"file={_escape_property(input_file)}", f"line={report.line}"] if input_file else []
        where.append(f"title={_escape_property(f'{title} ({report.id})')}")
        commands.append(f"::{level} {','.join(where)}::{_escape_data(chr(10).join(lines))}")
    return commands
