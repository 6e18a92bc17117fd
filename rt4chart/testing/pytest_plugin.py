"""The pytest plugin (entry point ``pytest11``): rt4chart audits inside a test suite.

Options: ``--rt4-judge``, ``--rt4-api-base``, ``--rt4-cache-dir`` / ``--rt4-cache-url``,
``--rt4-budget`` (one cap for the whole session, every xdist worker together), ``--rt4-report``
(the session's audits as one HTML report), ``--rt4-out`` (their records as JSONL). The fixture
``rt4_judge`` is the session's judge stack (closed at the end); ``rt4_sample`` is the sample of a
test marked ``@pytest.mark.rt4_samples("answers.jsonl")``, which runs once per line of that file.
A project's config file (``rt4chart.toml`` or ``[tool.rt4chart]``, as ``rt4`` finds it) gives the
defaults of the judge, API base, cache and budget options; a flag overrides it.
``--rt4-allow-budget-skips`` (or the ini option ``rt4_allow_budget_skips = true``) lets a session whose
budget stopped its audits pass.

The plugin is inert until a test audits or an ``--rt4-*`` option is given: no judge, thread or file
exists before, and a session that audits nothing prints nothing. A session judge that cannot be
configured (an unknown ``--rt4-judge``, a missing API key, an unusable cache) is refused before any
test runs, and one that cannot be reached (its circuit opened: ``JudgeUnavailable``) stops the session
at the first test that meets it (under pytest-xdist: its worker stops and the controller ends the
session): both are usage errors of the setup, not findings, so pytest exits 4
(``ExitCode.USAGE_ERROR``) naming the problem once instead of failing every grounding test. A judge
whose failures left one verdict open is that test's **error** (not a failure); a stop by the
session's budget skips the audits
after it, with the reason (a budget a test sets itself fails that test as any exception would), and
fails the session: pytest exits 1 with a line saying how many audits the budget refused, since a CI
gate must not go green on audits that never ran, unless the opt-out above says skips are accepted.

Under pytest-xdist every worker builds its own judge on the shared cache (a directory is safe for
concurrent processes; a Redis server too), the budget is one ledger file that every
worker reserves from under a file lock (:class:`rt4chart.testing.asserts.SharedLedger`), and the workers'
records come back to the controller (``workeroutput``), which writes the summary and the reports.

Light at import: pytest loads this module in every session of an environment where rt4chart is
installed, so rt4chart's own modules are imported only when a hook needs them.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from rt4chart.judges.registry import JudgeStack
    from rt4chart.records.io import InputLine
    from rt4chart.testing.asserts import AuditSession, SessionAudit
    from rt4chart.types import Sample

MARKER = "rt4_samples"
SAMPLE_FIXTURE = "rt4_sample"
_SESSION_KEY = pytest.StashKey["AuditSession"]()
_PROJECT_KEY = pytest.StashKey[dict[str, Any]]()
_UNREACHABLE_KEY = pytest.StashKey[str]()
_WORKER_OUTPUT = "rt4chart_records"
_LEDGER_INPUT = "rt4chart_ledger"
ALLOW_BUDGET_SKIPS = "rt4_allow_budget_skips"
"""The option (``--rt4-allow-budget-skips``) and ini name that accept a session stopped by its budget."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("rt4chart", "rt4chart grounding audits")
    group.addoption("--rt4-judge", metavar="SPEC", help="judge for the session's audits, as `rt4 verify --judge` "
                    "takes it (default: the embedded offline verifier)")
    group.addoption("--rt4-api-base", metavar="URL", help="base URL for a litellm judge")
    group.addoption("--rt4-cache-dir", metavar="DIR", help="cache judge calls in this directory (shared by xdist "
                    "workers)")
    group.addoption("--rt4-cache-url", metavar="URL", help="cache judge calls on this redis:// server")
    group.addoption("--rt4-budget", metavar="USD", type=float, help="one cap on judge spend for the whole "
                    "session, every xdist worker together; the audits after a stop are skipped")
    group.addoption("--rt4-allow-budget-skips", action="store_true", default=None,
                    help="let a session pass whose budget stopped its audits (by default such a session fails: "
                    "its skipped audits were never made)")
    parser.addini(ALLOW_BUDGET_SKIPS, type="bool", default=False,
                  help="rt4chart: let a session pass whose budget stopped its audits (as --rt4-allow-budget-skips)")
    group.addoption("--rt4-report", metavar="FILE.html", help="write the session's audits as one HTML report")
    group.addoption("--rt4-out", metavar="FILE.jsonl", help="write the session's audit records as JSONL")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f'{MARKER}(path): run the test once per sample of a JSONL file (relative to the test '
        f'file), given as the `{SAMPLE_FIXTURE}` fixture'
    )
    cache_dir, cache_url = config.getoption("rt4_cache_dir"), config.getoption("rt4_cache_url")
    if cache_dir and cache_url:
        raise pytest.UsageError("give --rt4-cache-dir or --rt4-cache-url, not both")
    budget = config.getoption("rt4_budget")
    if budget is not None and not (budget >= 0 and budget != float("inf")):
        raise pytest.UsageError(f"--rt4-budget must be a finite amount of at least 0 USD (got {budget})")
    config.stash[_PROJECT_KEY] = _project_defaults(config)
    if any(_option(config, option) is not None for option in _OPTIONS):
        session = _session(config)
        if not hasattr(config, "workerinput"):  # the controller checked the judge before any worker started
            _check_judge(session)


def _check_judge(session: AuditSession) -> None:
    """Build the session's judge now: a judge or cache that cannot be configured is a usage error
    before any test (cheap: a model is loaded, and an endpoint called, on the first audit only)."""
    from rt4chart.judges.cache import CacheError
    from rt4chart.judges.registry import JudgeConfigError

    try:
        session.judge()
    except (JudgeConfigError, CacheError) as error:
        raise pytest.UsageError(f"rt4chart: the session's judge cannot be used: {error}") from None


_OPTIONS = ("rt4_judge", "rt4_api_base", "rt4_cache_dir", "rt4_cache_url", "rt4_budget", "rt4_report", "rt4_out")

_FROM_PROJECT = {
    "rt4_judge": "judge", "rt4_api_base": "api_base", "rt4_cache_dir": "cache.cache_dir",
    "rt4_cache_url": "cache.cache_url", "rt4_budget": "limits.budget_usd",
}
"""The options a project's config file gives defaults for (its keys ``judge``, ``api-base``,
``cache-dir``, ``cache-url``, ``budget``, as ``rt4 verify`` reads them), by the field they set. The
file's outputs (``out``, ``report``) are ``rt4 verify``'s, not a test session's."""


def _project_defaults(config: pytest.Config) -> dict[str, Any]:
    """The session's defaults from the project's config file, found from pytest's working directory
    upward as ``rt4`` finds it (none: empty, and the run layer's models are never imported). A bad
    file is a usage error; a cache given by flag replaces the file's cache."""
    from rt4chart.runs.config_file import ConfigError, find_config

    try:
        found = find_config(config.invocation_params.dir)
        if found is None:
            return {}
        from rt4chart.runs.config import validated

        settings = validated(*found).settings
    except ConfigError as error:
        raise pytest.UsageError(f"rt4chart: {error}") from None
    if settings.get("cache.no_cache") or config.getoption("rt4_cache_dir") or config.getoption("rt4_cache_url"):
        settings = {path: value for path, value in settings.items() if not path.startswith("cache.")}
    return {option: settings[path] for option, path in _FROM_PROJECT.items() if settings.get(path) is not None}


def _option(config: pytest.Config, name: str) -> Any:
    """An ``--rt4-*`` option's value: the flag if given, else the project config file's, else ``None``."""
    value = config.getoption(name)
    return value if value is not None else config.stash.get(_PROJECT_KEY, {}).get(name)


def _session(config: pytest.Config) -> AuditSession:
    """The session's audits, made the active one on first use: when an ``--rt4-*`` option is given,
    once a test module imports :mod:`rt4chart.testing.asserts`, or when a fixture or the marker asks."""
    session = config.stash.get(_SESSION_KEY, None)
    if session is not None:
        return session
    from rt4chart.testing.asserts import AuditSession, SessionSettings, activate

    budget = _option(config, "rt4_budget")
    ledger_file = None
    if budget is not None:
        worker_input = getattr(config, "workerinput", None)
        if worker_input is not None:
            ledger_file = Path(worker_input[_LEDGER_INPUT])
        elif _distributed(config):
            ledger_file = Path(tempfile.mkdtemp(prefix="rt4chart-budget-")) / "ledger.json"
    settings = SessionSettings(
        judge=_option(config, "rt4_judge"), api_base=_option(config, "rt4_api_base"),
        cache=_option(config, "rt4_cache_dir") or _option(config, "rt4_cache_url"), budget_usd=budget,
        ledger_file=ledger_file,
    )
    session = config.stash[_SESSION_KEY] = AuditSession(settings)
    activate(session)
    return session


def _started(config: pytest.Config) -> AuditSession | None:
    """The session's audits if they exist (or a test module imported rt4chart.testing.asserts), else None."""
    if _SESSION_KEY in config.stash or "rt4chart.testing.asserts" in sys.modules:
        return _session(config)
    return None


def _distributed(config: pytest.Config) -> bool:
    """Whether this is the controller of a pytest-xdist run (its workers make the audits)."""
    return bool(getattr(config.option, "numprocesses", None)) or getattr(config.option, "dist", "no") != "no"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """pytest-xdist, controller: hand every worker the budget's ledger file."""
    if _option(node.config, "rt4_budget") is None:
        return
    ledger_file = _session(node.config).settings.ledger_file
    if ledger_file is not None:
        node.workerinput[_LEDGER_INPUT] = str(ledger_file)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """pytest-xdist, controller: take in a finished worker's audit records."""
    from rt4chart.testing.asserts import SessionAudit

    output = getattr(node, "workeroutput", {}).get(_WORKER_OUTPUT)
    if output:
        session = _session(node.config)
        payload = json.loads(output)
        session.records.extend(SessionAudit.model_validate(record) for record in payload["records"])
        session.skipped += payload["skipped"]
        session.stopped = session.stopped or payload["stopped"]
        if payload["unreachable"]:
            pytest.exit(payload["unreachable"], returncode=pytest.ExitCode.USAGE_ERROR)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    marker = metafunc.definition.get_closest_marker(MARKER)
    if marker is None:
        return
    if len(marker.args) != 1:
        raise pytest.UsageError(f'{metafunc.definition.nodeid}: use @pytest.mark.{MARKER}("answers.jsonl")')
    if SAMPLE_FIXTURE not in metafunc.fixturenames:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: a test marked {MARKER} takes the "
                                f"`{SAMPLE_FIXTURE}` argument (the sample of each run)")
    from rt4chart.records.io import read_jsonl

    path = Path(metafunc.definition.path).parent / marker.args[0]
    if not path.is_file():
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: samples file not found: {path}")
    items = list(read_jsonl(path))
    ids = [item.sample.id if item.sample is not None else f"line-{item.line}" for item in items]
    metafunc.parametrize(SAMPLE_FIXTURE, items, ids=ids, indirect=True)


@pytest.fixture
def rt4_sample(request: pytest.FixtureRequest) -> Sample:
    """The sample of this run of a test marked ``rt4_samples`` (an invalid line errors, naming why)."""
    item: InputLine | None = getattr(request, "param", None)
    if item is None:
        raise pytest.UsageError(f'{request.node.nodeid}: rt4_sample needs @pytest.mark.{MARKER}("answers.jsonl")')
    if item.sample is None:
        marker = request.node.get_closest_marker(MARKER)
        raise ValueError(f"{marker.args[0] if marker else 'samples file'} {item.error}")
    return item.sample


@pytest.fixture(scope="session")
def rt4_judge(pytestconfig: pytest.Config) -> Iterator[JudgeStack]:
    """The session's judge stack (``--rt4-judge``, cache, budget): pass it as ``judge=`` or leave
    ``judge`` out; it is closed at the end of the session."""
    session = _session(pytestconfig)
    yield session.judge()
    session.close()


def pytest_runtest_setup(item: pytest.Item) -> None:
    session = _started(item.config)
    if session is not None:
        session.current_test = item.nodeid


def _raised(excinfo: pytest.ExceptionInfo[BaseException], module: str, name: str) -> bool:
    """Whether ``excinfo`` holds ``module.name`` (never imports it: not loaded means not raised)."""
    loaded = sys.modules.get(module)
    return loaded is not None and excinfo.errisinstance(getattr(loaded, name))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """A judge that cannot be reached stops the session as a usage error (exit 4), named once: every
    later audit would meet the same open circuit, and a CI job must not read it as N findings."""
    try:
        return (yield)
    except Exception as error:
        unavailable = sys.modules.get("rt4chart.protocol")
        if unavailable is not None and isinstance(error, unavailable.JudgeUnavailable):
            message = f"rt4chart: the judge cannot be reached ({item.nodeid} met it first): {error}"
            if hasattr(item.config, "workerinput"):
                # pytest.exit in an xdist worker is an internal error of the controller: the worker stops
                # after this test and hands the message on (pytest_sessionfinish), the controller exits.
                item.session.shouldstop = message
                item.config.stash[_UNREACHABLE_KEY] = message
                pytest.skip(message)
            pytest.exit(message, returncode=pytest.ExitCode.USAGE_ERROR)
        raise


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    excinfo = call.excinfo
    if call.when != "call" or excinfo is None:
        return report
    if _raised(excinfo, "rt4chart.testing.asserts", "SessionBudgetStop"):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), (item.location[1] or 0) + 1, f"rt4chart budget: {excinfo.value}")
    elif _raised(excinfo, "rt4chart.testing.asserts", "JudgeFailed"):
        report.rt4_judge_error = True  # type: ignore[attr-defined]  # survives xdist's serialization
    return report


def pytest_report_teststatus(report: pytest.TestReport) -> tuple[str, str, tuple[str, dict[str, bool]]] | None:
    """A judge failure is an error of the test, not a finding: counted and shown as ``error``."""
    if getattr(report, "rt4_judge_error", False) and report.failed:
        return "error", "E", ("ERROR", {"red": True})
    return None


def _budget_skips_allowed(config: pytest.Config) -> bool:
    """Whether the user accepts a session whose budget stopped its audits (option, else ini)."""
    option: bool | None = config.getoption(ALLOW_BUDGET_SKIPS)
    return option if option is not None else bool(config.getini(ALLOW_BUDGET_SKIPS))


def _refused_audits(audits: AuditSession) -> int:
    """The audits the budget refused: the one it stopped plus every one after it (0: no stop)."""
    return 0 if audits.stopped is None else audits.skipped + 1


def _numbered(records: list[SessionAudit]) -> list[SessionAudit]:
    """Records in test order, each named by its test (``#2`` for a test's second audit), numbered
    1..N as the lines of one run."""
    ordered = sorted(records, key=lambda record: record.test)
    seen: dict[str, int] = {}
    numbered = []
    for line, record in enumerate(ordered, start=1):
        seen[record.test] = seen.get(record.test, 0) + 1
        name = record.test if seen[record.test] == 1 else f"{record.test}#{seen[record.test]}"
        report = record.report.model_copy(update={"id": name or record.report.id, "line": line})
        numbered.append(record.model_copy(update={"report": report}))
    return numbered


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    audits = _started(session.config)
    if audits is None:
        return
    audits.close()
    worker_output = getattr(session.config, "workeroutput", None)
    if worker_output is not None:
        sent = [record.model_dump(mode="json") for record in audits.records]
        payload = {"records": sent, "skipped": audits.skipped, "stopped": audits.stopped,
                   "unreachable": session.config.stash.get(_UNREACHABLE_KEY, None)}
        worker_output[_WORKER_OUTPUT] = json.dumps(payload)
        return
    if audits.stopped is not None and not _budget_skips_allowed(session.config) and session.exitstatus == 0:
        # pytest would exit 0 with the refused audits counted as skips: a gate green on nothing.
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    records = _numbered(audits.records)
    out, html = session.config.getoption("rt4_out"), session.config.getoption("rt4_report")
    if out:
        from rt4chart.records.io import dump_report, write_lines_atomically

        write_lines_atomically(Path(out), [dump_report(record.report) for record in records])
    if html:
        from rt4chart.report.audited import AuditedSample
        from rt4chart.report.html_report import write_html

        write_html(Path(html), [AuditedSample(r.report, r.sample) for r in records], "rt4chart: test session audits")


def pytest_unconfigure(config: pytest.Config) -> None:
    audits = config.stash.get(_SESSION_KEY, None)
    if audits is None:
        return
    from rt4chart.testing.asserts import activate

    activate(None)
    ledger_file = audits.settings.ledger_file
    if ledger_file is not None and not hasattr(config, "workerinput"):  # the controller made it; all are done
        shutil.rmtree(ledger_file.parent, ignore_errors=True)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    audits = _started(config)
    if audits is None or (not audits.records and audits.stopped is None):
        return
    from rt4chart.types import Label, Usage

    usage = sum((record.report.usage for record in audits.records), Usage())
    records = _numbered(audits.records)
    failing = [record for record in records if record.failing_claims]
    terminalreporter.section("rt4chart")
    write = terminalreporter.write_line
    write(f"{len(records)} answers audited, {len(failing)} with failing claims "
          f"({sum(record.failing_claims for record in failing)} claims); judge calls {usage.calls}, "
          f"cache hits {usage.cache_hits}, cost ${usage.cost_usd:.6f}")
    # Every audited answer with -v; by default the ones with failing claims, each claim named.
    for record in records if config.getoption("verbose") > 0 else failing:
        report = record.report
        write(f"  {report.id}: {report.label}, {len(report.claims)} claims, {record.failing_claims} failing, "
              f"{report.usage.calls} calls, {report.usage.cache_hits} cache hits, ${report.usage.cost_usd:.6f}")
        for claim in report.claims:
            if claim.label in (Label.CONTRADICTED, Label.BASELESS):
                write(f"    [{claim.index}] {claim.label}: {claim.text}")
    budget = audits.settings.budget_usd
    if budget is not None:
        write(f"budget: ${audits.spent_usd():.6f} spent of ${budget}")
    if audits.stopped is not None:
        write(f"stopped by the budget, {audits.skipped} audits skipped: {audits.stopped}")
        refused = _refused_audits(audits)
        if _budget_skips_allowed(config):
            write(f"{refused} audits refused by the budget were accepted as skips (--rt4-allow-budget-skips)")
        else:
            write(f"rt4chart: session FAILED: the budget refused {refused} audits, so their tests were skipped "
                  "unaudited; raise --rt4-budget, or accept the skips with --rt4-allow-budget-skips "
                  f"(ini: {ALLOW_BUDGET_SKIPS} = true)", red=True, bold=True)
    for flag, path in (("--rt4-out", config.getoption("rt4_out")), ("--rt4-report", config.getoption("rt4_report"))):
        if path:
            write(f"{flag}: wrote {path}")
