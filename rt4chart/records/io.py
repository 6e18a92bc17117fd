"""JSONL in and out. Every input line yields exactly one item: a sample or the reason it is bad.

Output files are guarded: :func:`resolve_output` refuses an output that is the input, a directory,
a device other than the null device (which drops what it gets: :func:`discards`) or sits in a
missing folder, and follows a symlink to the file it names (so temporary files and renames happen
beside the target, never replacing the link); :func:`output_lock` holds one advisory lock per
output file, so two runs never write one file at once.

A records output brings sidecar files beside it (:func:`sidecars`: its manifest, its lock, and the
temporary file every atomic write renames from); :func:`guard_outputs` holds them to the outputs'
rules, and refuses an output named as the sidecar of an existing file or of this run's files.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import re
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from rt4chart.types import AuditRecord, Sample, TraceSource, Usage, describe_validation_error


@dataclass(frozen=True)
class InputLine:
    """One line of an input file, parsed or not."""

    line: int
    """1-based line number."""
    sample: Sample | None
    """The sample, when the line is valid."""
    error: str | None = None
    """Why the line is not a valid sample."""
    raw_id: str | None = None
    """The line's ``id`` when one could be read, even from an invalid line."""
    digest: str | None = None
    """sha256 of the line's bytes (line break excluded): what :func:`record_key` binds a record to."""
    trace: TraceSource | None = None
    """The trace an item read from traces came from, kept on its record even when it is invalid."""


def line_digest(raw: str | bytes) -> str:
    """sha256 of one input line without its line break (LF or CRLF)."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    return hashlib.sha256(data.rstrip(b"\r\n")).hexdigest()


def parse_sample(record: Any, line: int) -> InputLine:
    """Validate one decoded JSON value as a sample."""
    if not isinstance(record, dict):
        return InputLine(line, None, f"line {line}: expected a JSON object, got {type(record).__name__}")
    raw_id = record.get("id")
    # bool is an int to Python, but `"id": true` is a mistake, not the id "True".
    if raw_id is not None and (isinstance(raw_id, bool) or not isinstance(raw_id, (str, int))):
        kind = type(raw_id).__name__
        return InputLine(line, None, f"line {line}: id: must be a string or an integer, got {kind}")
    raw_id = None if raw_id is None else str(raw_id)
    try:
        sample = Sample.model_validate({**record, "id": raw_id if raw_id is not None else f"line-{line}"})
    except ValidationError as error:
        return InputLine(line, None, f"line {line}: {describe_validation_error(error)}", raw_id)
    if not sample.answer.strip():
        return InputLine(line, None, f"line {line}: answer is empty", raw_id)
    if problem := _over_limits(sample):
        return InputLine(line, None, f"line {line}: {problem}", raw_id)
    return InputLine(line, sample, None, raw_id)


MAX_CONTEXT_CHARS = 500_000
"""Characters a sample's context may hold (passages together): about 125k tokens, the largest
common judge window, which the global stage's one prompt with the whole context must fit. Beyond
it a sample would cost thousands of calls (a 10 MB context once made 8,133) and still fail."""

MAX_ANSWER_CHARS = 50_000
"""Characters an answer may hold; its sentences are capped as well
(:data:`rt4chart.runs.engine.MAX_ANSWER_SENTENCES`)."""


def _over_limits(sample: Sample) -> str | None:
    context = sum(map(len, sample.context)) if isinstance(sample.context, list) else len(sample.context)
    if context > MAX_CONTEXT_CHARS:
        return f"context of {context:,} characters, over the limit of {MAX_CONTEXT_CHARS:,}"
    if len(sample.answer) > MAX_ANSWER_CHARS:
        return f"answer of {len(sample.answer):,} characters, over the limit of {MAX_ANSWER_CHARS:,}"
    return None


@dataclass(frozen=True)
class JsonLine:
    """One non-blank line of a JSONL file, decoded or not."""

    number: int
    """1-based line number."""
    text: str
    """The line as read (empty when it is not UTF-8)."""
    value: Any = None
    """The decoded JSON value, when the line is valid."""
    problem: str | None = None
    """Why the line could not be decoded (``not valid JSON (...)``), without the line number."""
    digest: str | None = None
    """sha256 of the line's bytes without its line break."""


def json_lines(lines: Iterable[str | bytes]) -> Iterator[JsonLine]:
    """Decode JSONL lines given as text or as UTF-8 bytes; blank lines are skipped.

    Every reader of JSONL in rt4chart (inputs, datasets, predictions) goes through this, so a line
    that is not UTF-8 or not JSON is reported the same way everywhere, and one bad line is one bad
    line, not a failed run.
    """
    for number, raw in enumerate(lines, start=1):
        try:
            text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        except UnicodeDecodeError as error:
            yield JsonLine(number, "", problem=f"not valid UTF-8 (byte {error.start + 1})")
            continue
        if number == 1:
            text = text.removeprefix("\ufeff")  # a byte order mark left by some editors
        if not text.strip():
            continue
        if len(text) > MAX_LINE_CHARS:
            size = f"line of {len(text):,} characters"
            yield JsonLine(number, "", problem=f"{size}, over the limit of {MAX_LINE_CHARS:,}")
            continue
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            yield JsonLine(number, text, problem=f"not valid JSON ({error.msg} at column {error.colno})")
            continue
        except RecursionError:
            yield JsonLine(number, text, problem=f"not valid JSON (nested deeper than {MAX_JSON_DEPTH} levels)")
            continue
        except ValueError:  # the one other ValueError of json.loads: an integer over Python's digit limit
            limit = sys.get_int_max_str_digits()
            yield JsonLine(number, text, problem=f"not valid JSON (an integer of more than {limit} digits)")
            continue
        # Records and samples hold thousands of strings: when the line's bytes can yield no lone
        # surrogate (strict UTF-8 holds none, and it has no \uD8xx-\uDFxx escape), only the
        # depth is left to check, over the containers alone.
        holds_no_surrogate = isinstance(raw, bytes) and not _SURROGATE_ESCAPE.search(text)
        if problem := (_too_deep(value) if holds_no_surrogate else _unreadable_value(value)):
            yield JsonLine(number, text, problem=problem)
            continue
        yield JsonLine(number, text, value=value, digest=line_digest(raw))


MAX_LINE_CHARS = 64 * 1024 * 1024
"""Characters one JSONL line may hold (a 64 MiB context is far beyond any judge's window)."""

MAX_JSON_DEPTH = 64
"""Nesting depth one JSONL line may reach (samples and records need fewer than ten levels)."""


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
"""The start of a JSON escape of a surrogate code point, the only way a UTF-8 line decodes to one."""


def _too_deep(value: Any) -> str | None:
    """:func:`_unreadable_value` for a value that holds no lone surrogate: the depth problem, or ``None``."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if not isinstance(item, (dict, list)):
            continue
        if depth > MAX_JSON_DEPTH:
            return f"not valid JSON (nested deeper than {MAX_JSON_DEPTH} levels)"
        members = item.values() if isinstance(item, dict) else item
        pending.extend((member, depth + 1) for member in members if isinstance(member, (dict, list)))
    return None


def _unreadable_value(value: Any) -> str | None:
    """Why a decoded line cannot travel downstream, or ``None``: nesting beyond :data:`MAX_JSON_DEPTH`,
    or a string holding a lone surrogate (``"\\ud800"``): valid JSON, but no UTF-8 encodes it, so
    cache keys, records and judges would crash on it. Walked without recursion."""
    pending: list[tuple[Any, int, str]] = [(value, 1, "line")]
    while pending:
        item, depth, where = pending.pop()
        if isinstance(item, (dict, list)):
            if depth > MAX_JSON_DEPTH:
                return f"not valid JSON (nested deeper than {MAX_JSON_DEPTH} levels)"
            entries = item.items() if isinstance(item, dict) else enumerate(item)
            for key, member in entries:
                if isinstance(key, str) and (problem := _unencodable(key, f"a key of {where}")):
                    return problem
                pending.append((member, depth + 1, str(key) if where == "line" else f"{where}.{key}"))
        elif isinstance(item, str) and (problem := _unencodable(item, where)):
            return problem
    return None


def _unencodable(text: str, where: str) -> str | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        code_point = f"\\u{ord(text[error.start]):04x}"
        return f"{where}: lone surrogate {code_point} at character {error.start + 1} (not a Unicode character)"
    return None


STDIN = "-"
"""The input path that means standard input."""


def read_json_lines(path: Path | str) -> Iterator[JsonLine]:
    """The lines of a JSONL file, ``-`` for standard input (see :func:`json_lines`)."""
    if str(path) == STDIN:
        yield from json_lines(sys.stdin.buffer)
        return
    with open(path, "rb") as handle:
        yield from json_lines(handle)


def read_jsonl(path: Path | str) -> Iterator[InputLine]:
    """Read an input file (``-``: standard input); blank lines are skipped, every other line yields
    one item."""
    return parse_lines(read_json_lines(path))


@dataclasses.dataclass(frozen=True)
class InputFile:
    """An input file read anew, one line at a time, each time it is iterated: what a long run
    streams, so no input line is held once its record is written (standard input cannot be read
    twice: read it into a list). Its length is its count of lines that yield an item."""

    path: Path
    """The JSONL file."""

    def __iter__(self) -> Iterator[InputLine]:
        return read_jsonl(self.path)

    def __len__(self) -> int:
        with open(self.path, "rb") as handle:
            # Blank as :func:`json_lines` decides it: a line that is not UTF-8 is an item (its error record).
            return sum(
                bool(raw.decode("utf-8", "replace").removeprefix("\ufeff" if number == 1 else "").strip())
                for number, raw in enumerate(handle, start=1)
            )


def parse_lines(lines: Iterable[JsonLine]) -> Iterator[InputLine]:
    """Turn decoded JSONL lines into input items, one per line (see :func:`read_jsonl`)."""
    for line in lines:
        if line.problem is not None:
            yield InputLine(line.number, None, f"line {line.number}: {line.problem}")
        else:
            yield dataclasses.replace(parse_sample(line.value, line.number), digest=line.digest)


def error_report(item: InputLine) -> AuditRecord:
    """The output record of an input line that could not be audited."""
    return AuditRecord(id=item.raw_id, line=item.line, errors=[item.error or "invalid input"], trace=item.trace)


def unaudited_report(item: InputLine, reason: str) -> AuditRecord:
    """The record of an input line the judge could not audit: verdict open, ``incomplete``."""
    if item.sample is None:
        return error_report(item)
    return AuditRecord(
        id=item.sample.id, line=item.line, errors=[reason], incomplete=True, gold=item.sample.gold,
        trace=item.sample.trace,
    )


class RunRecord(Protocol):
    """What the batch runner (:func:`rt4chart.runs.engine.run_audit`) reads and sets on an output
    record of any kind (an audit's :class:`AuditRecord`, a repair's)."""

    line: int
    id: str | None
    input_hash: str | None
    usage: Usage

    def model_dump_json(self) -> str: ...


R = TypeVar("R", bound=RunRecord)


@dataclass(frozen=True)
class RecordKind(Generic[R]):
    """What the batch runner needs to know of one kind of output record beyond :class:`RunRecord`."""

    parse: Callable[[Any], R]
    """A decoded JSON line as a record (raises ``ValidationError`` when it is not one)."""
    finished: Callable[[R], bool]
    """Whether a record is done: ``--resume`` keeps it, a baseline stands for its line; else the line runs again."""
    unaudited: Callable[[InputLine, str], R]
    """The record of a line a stop (the judge unavailable, given as text) left undone."""


def dump_report(report: RunRecord) -> str:
    """One output line (no trailing newline)."""
    return report.model_dump_json()


def audit_fingerprint(judge: str, prompt_version: str, options: BaseModel) -> str:
    """sha256 of the audit configuration: the judge, the prompt set and every option."""
    material = json.dumps(
        {"judge": judge, "prompt_version": prompt_version, "options": options.model_dump(mode="json")},
        sort_keys=True,
    )
    return hashlib.sha256(material.encode()).hexdigest()


def record_key(item: InputLine, fingerprint: str) -> str | None:
    """The ``input_hash`` of the record of ``item`` under the configuration ``fingerprint``."""
    if item.digest is None:
        return None
    return hashlib.sha256(f"{item.digest}:{fingerprint}".encode()).hexdigest()


def finished_audit(report: AuditRecord) -> bool:
    """Whether a record is a finished, clean audit: a label, nothing left open, and no error on the
    record or a claim (an outage may have shaped its verdicts: it is audited again)."""
    return (
        report.label is not None
        and not report.incomplete
        and not report.errors
        and not any(claim.errors for claim in report.claims)
    )


@dataclasses.dataclass(frozen=True)
class RecordLine:
    """One non-blank line of a file of output records: the record, or why the line is not one."""

    number: int
    """1-based line number."""
    report: AuditRecord | None
    """The record; ``None`` when the line is not one."""
    value: dict[str, Any] | None = None
    """The decoded line (fields the record model does not know included); ``None`` with no record."""
    problem: str | None = None
    """Why the line is not a record, without the line number."""
    torn: bool = False
    """The line has no line break: the last line of a file whose writer died mid-line."""


def read_records(path: Path | str) -> Iterator[RecordLine]:
    """Every non-blank line of a file of ``rt4 verify`` / ``rt4 eval`` records, in order.

    The one reader of output records: resume (:func:`read_completed`), scoring and agreement
    (:func:`read_predictions`), the reporting commands (:func:`rt4chart.report.audited.read_results`) and
    repair read through it, so a line that is not a record is named the same way everywhere.
    """
    for line in read_json_lines(path):
        torn = bool(line.text) and not line.text.endswith("\n")
        if line.problem is not None:
            yield RecordLine(line.number, None, problem=line.problem, torn=torn)
            continue
        try:
            report = AuditRecord.model_validate(line.value)
        except ValidationError as error:
            first = error.errors()[0]
            problem = f"not an rt4chart output record ({first['loc']}: {first['msg']})"
            yield RecordLine(line.number, None, problem=problem, torn=torn)
            continue
        yield RecordLine(line.number, report, line.value, torn=torn)


AUDIT_RECORDS: RecordKind[AuditRecord] = RecordKind(
    AuditRecord.model_validate, finished_audit, lambda item, stop: unaudited_report(item, f"not audited: {stop}")
)
"""The records of ``rt4 verify`` and ``rt4 eval``."""


def read_completed(path: Path, items: Iterable[InputLine], fingerprint: str | None = None) -> dict[int, AuditRecord]:
    """:func:`read_kept` for audit records."""
    return read_kept(AUDIT_RECORDS, path, items, fingerprint)


def _parsed(kind: RecordKind[R], line: JsonLine) -> R | None:
    if line.problem is not None:
        return None
    try:
        return kind.parse(line.value)
    except ValidationError:
        return None


def read_kept(
    kind: RecordKind[R], path: Path, items: Iterable[InputLine], fingerprint: str | None = None
) -> dict[int, R]:
    """Records of ``kind`` already complete in an output file, by input line number.

    A record counts only if it parses as a whole :class:`AuditRecord` and names an input line with the
    same id; a torn last line left by a killed run, or a record of some other input, does not.
    With ``fingerprint`` (the audit configuration, :func:`audit_fingerprint`) a record also counts
    only if its ``input_hash`` is that of the line's content under this configuration and it is
    finished (``kind.finished``): a record of an edited line, of another judge, prompt set or
    options, or one the judge failed on, is audited again.
    """
    expected: dict[int, str | None] = {}
    keys: dict[int, str | None] = {}
    for item in items:  # one pass: ``items`` may be a file read as it is iterated (:class:`InputFile`)
        expected[item.line] = item.sample.id if item.sample else item.raw_id
        if fingerprint:
            keys[item.line] = record_key(item, fingerprint)
    completed: dict[int, R] = {}
    if not path.exists():
        return completed
    for line in read_json_lines(path):
        if line.text and not line.text.endswith("\n"):
            break  # the run died while writing this line
        report = _parsed(kind, line)
        if report is None or report.line not in expected or expected[report.line] != report.id:
            continue
        if fingerprint and (report.input_hash != keys[report.line] or not kind.finished(report)):
            continue
        completed.setdefault(report.line, report)
    return completed


def read_reusable(kind: RecordKind[R], path: Path, items: list[InputLine], fingerprint: str) -> dict[int, R]:
    """Records of another audit file (``rt4 verify --baseline``) that stand for ``items`` as they are,
    by input line number of ``items``: a record counts when its ``input_hash`` is that of an item's
    line content under the configuration ``fingerprint`` (same line, same judge, prompt set and
    options, wherever the line sits in either file) and it is finished (``kind.finished``). Lines
    that do not parse are passed over: the baseline is an optimisation, never a source of errors.
    """
    waiting: dict[str, list[InputLine]] = {}
    for item in items:
        key = record_key(item, fingerprint)
        if key is not None and item.sample is not None:
            waiting.setdefault(key, []).append(item)
    reusable: dict[int, R] = {}
    for line in read_json_lines(path):
        if not waiting or (report := _parsed(kind, line)) is None:
            continue
        candidates = waiting.get(report.input_hash or "")
        if not candidates or not kind.finished(report):
            continue
        item = candidates.pop(0)
        if not candidates:
            del waiting[report.input_hash or ""]
        report.line = item.line  # parsed for this run alone
        reusable[item.line] = report
    return reusable


MANIFEST_SUFFIX = ".manifest.json"
"""What is appended to a records file's name for its manifest: ``audit.jsonl`` -> ``audit.jsonl.manifest.json``."""


def manifest_path(records: Path) -> Path:
    """Where the manifest of a records file lives."""
    return records.with_name(records.name + MANIFEST_SUFFIX)


def lock_path(out: Path) -> Path:
    """The advisory lock file of an output (:func:`output_lock`)."""
    return out.with_name(f".{out.name}.lock")


def temporary_path(out: Path) -> Path:
    """Where :func:`write_lines_atomically` writes before it renames over ``out``."""
    return out.with_name(f".{out.name}.tmp")


def sidecars(out: Path, *, records: bool) -> dict[str, Path]:
    """The files written beside ``out`` (by kind): the temporary file of its atomic write and, for a
    records file (``records``), its manifest and its lock."""
    files = {"temporary file": temporary_path(out)}
    if records:
        files |= {"manifest": manifest_path(out), "lock file": lock_path(out)}
    return files


def sidecar_owner(path: Path) -> tuple[str, Path] | None:
    """The kind of sidecar ``path`` is named as, and the file it would belong to; ``None`` when its
    name has no sidecar's form."""
    name = path.name
    if name.endswith(MANIFEST_SUFFIX) and len(name) > len(MANIFEST_SUFFIX):
        return "manifest", path.with_name(name.removesuffix(MANIFEST_SUFFIX))
    for kind, suffix in (("lock file", ".lock"), ("temporary file", ".tmp")):
        if name.startswith(".") and name.endswith(suffix) and len(name) > len(suffix) + 1:
            return kind, path.with_name(name[1 : -len(suffix)])
    return None


def discards(out: Path) -> bool:
    """Whether ``out`` is the null device (``-o /dev/null``): what is written there is dropped, so it
    gets no sidecars, no lock and no rename (renaming a file over it would replace the device)."""
    return os.path.realpath(out) == os.devnull


class OutputError(ValueError):
    """An output path that cannot be used safely (an input, another output of the same run, a
    directory, a device, a missing or unwritable folder, or a file another run is writing)."""


def _stdin_identity() -> tuple[int, int] | None:
    """(device, inode) of standard input when it is a file descriptor (``-`` inputs are compared by
    ``fstat``: ``rt4 verify - --out F < F`` must not truncate F)."""
    try:
        status = os.fstat(sys.stdin.fileno())
    except (AttributeError, OSError, ValueError):  # no stdin, or one that is not a descriptor (tests)
        return None
    return status.st_dev, status.st_ino


def _identity(path: Path | str) -> tuple[int, int] | None:
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def _check_folder_writable(flag: str, out: Path, folder: Path) -> None:
    """Create and remove a temporary file in ``folder``: permissions, a read-only mount and a full
    disk all show here, before any work, rather than after it (``os.access`` misses the last two
    and says yes to root)."""
    try:
        descriptor, probe = tempfile.mkstemp(prefix=".rt4chart-write-check-", dir=folder)
    except OSError as error:
        raise OutputError(f"{flag} {out}: cannot write in {folder} ({error.strerror})") from None
    os.close(descriptor)
    os.unlink(probe)


def guard_outputs(
    outputs: Mapping[str, Path | None],
    inputs: Iterable[Path | str | None] = (),
    *,
    records: Iterable[str] = (),
) -> dict[str, Path]:
    """The regular files that ``outputs`` (flag -> path; ``None`` entries are skipped) name,
    symlinks followed; raises :class:`OutputError` before any work is done.

    Every file any command writes goes through this one guard, with its sidecars (:func:`sidecars`;
    the outputs whose flags are in ``records`` are records files, with a manifest and a lock).
    Refused, for an output and each of its sidecars: one of ``inputs`` (the same file under any name,
    a hard link, or standard input for ``-``), two files of the run that are one file, a directory,
    anything that is not a regular file (a device, a FIFO), except the null device (:func:`discards`),
    which any output may name. Refused too: an output named as the
    sidecar of an existing file or of one of the run's files (``--out base.jsonl.manifest.json``,
    ``--report .out.jsonl.lock``), a path whose folder does not exist, and a folder (or an existing
    file) that cannot be written. The returned paths are the symlinks' targets: writers rename
    temporary files beside the target, never over the link.
    """
    record_flags = frozenset(records)
    sources = [str(source) for source in inputs if source is not None]
    input_identities = {
        identity: source
        for source in sources
        if (identity := _stdin_identity() if source == STDIN else _identity(source)) is not None
    }
    named = {flag: out for flag, out in outputs.items() if out is not None}
    targets = {flag: Path(os.path.realpath(out)) for flag, out in named.items()}
    own_files = {*targets.values(), *(Path(os.path.realpath(source)) for source in sources if source != STDIN)}
    claimed: dict[Path | tuple[int, int], str] = {}

    def claim(what: str, path: Path) -> tuple[int, int] | None:
        """Check ``path`` (an output or a sidecar, described by ``what``) and claim it for the run."""
        identity = _identity(path)
        if identity is not None:
            mode = os.stat(path).st_mode
            if stat.S_ISDIR(mode):
                raise OutputError(f"{what} is a directory; name a file")
            if not stat.S_ISREG(mode):
                raise OutputError(f"{what} is not a regular file (a device or a pipe); name a file")
            if identity in input_identities:
                source = input_identities[identity]
                raise OutputError(f"{what} is the input file {source}; writing it would destroy the input")
        for key in (path, identity):
            if key is not None and key in claimed:
                raise OutputError(f"{what} is also {claimed[key]}: one file cannot hold both outputs")
        claimed[path] = what
        if identity is not None:
            claimed[identity] = what
        return identity

    for flag, out in named.items():
        target = targets[flag]
        if discards(target):
            continue
        if not target.parent.is_dir():
            raise OutputError(f"{flag} {out}: folder {target.parent} does not exist")
        owned = sidecar_owner(target)
        if owned is not None and (owned[1].exists() or Path(os.path.realpath(owned[1])) in own_files):
            raise OutputError(
                f"{flag} {out} is named as the {owned[0]} of {owned[1]}, which rt4chart writes and reads; "
                "name the file otherwise"
            )
        if claim(f"{flag} {out}", target) is not None and not os.access(target, os.W_OK):
            raise OutputError(f"{flag} {out} is not writable")
        for kind, sidecar in sidecars(target, records=flag in record_flags).items():
            claim(f"{sidecar}, the {kind} of {flag} {out},", sidecar)
        _check_folder_writable(flag, out, target.parent)
    return targets


def resolve_output(out: Path, inputs: Path | str | None = None, flag: str = "--out") -> Path:
    """:func:`guard_outputs` for one output file."""
    return guard_outputs({flag: out}, [inputs])[flag]


@contextmanager
def output_lock(out: Path | None) -> Iterator[None]:
    """Hold the advisory lock of ``out`` (a ``.NAME.lock`` file beside it) while the block runs.

    A second holder fails at once with :class:`OutputError` instead of waiting: two runs on one
    output would rename over records the other one is still appending.
    """
    if out is None or discards(out):
        yield
        return
    lock = lock_path(out)
    try:
        descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise OutputError(f"cannot create the lock file {lock}: {error.strerror}") from None
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputError(f"another run is writing {out} (its lock {lock} is held)") from None
        yield
    finally:
        os.close(descriptor)  # closing releases the lock


def write_text_atomically(path: Path, pieces: Iterable[str]) -> None:
    """Replace ``path`` with the concatenated ``pieces`` via a temporary file and a rename.

    A write that fails (a full disk) leaves ``path`` as it was and no temporary file, and its
    ``OSError`` names ``path`` (a failed ``write`` names no file of its own).
    """
    path = Path(os.path.realpath(path))  # through a symlink to its target: the link stays a link
    if discards(path):
        return
    temporary = temporary_path(path)
    try:
        with open(temporary, "w", encoding="utf-8") as handle:
            for piece in pieces:
                handle.write(piece)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        raise OSError(error.errno, error.strerror, str(path)) from error


def write_lines_atomically(path: Path, lines: Iterable[str]) -> None:
    """Replace ``path`` with ``lines`` (JSONL records, or one indented JSON document; each without its
    final newline, which is added), as :func:`write_text_atomically` does."""
    write_text_atomically(path, (line + "\n" for line in lines))


def write_reports_atomically(path: Path, reports: Iterable[RunRecord]) -> None:
    """Replace ``path`` with ``reports``, one per line, via a temporary file and a rename."""
    write_lines_atomically(path, (dump_report(report) for report in reports))


class ReportAppender:
    """Appends records to an output file, one ``write`` per record.

    Each record goes out in a single ``os.write`` on an ``O_APPEND`` descriptor, so a killed run
    leaves at most one torn last line, which :func:`read_completed` ignores.
    """

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._synced = not discards(path)  # fsync of the null device fails (EINVAL)

    def append(self, report: RunRecord) -> None:
        data = (dump_report(report) + "\n").encode("utf-8")
        written = os.write(self._fd, data)
        while written < len(data):
            written += os.write(self._fd, data[written:])

    def close(self) -> None:
        if self._synced:
            os.fsync(self._fd)
        os.close(self._fd)


class PredictionsError(ValueError):
    """A predictions file cannot be scored (missing, or a line that is not an output record)."""


def read_predictions(path: Path) -> list[AuditRecord]:
    """Read ``rt4 verify`` / ``rt4 eval`` output records; raises :class:`PredictionsError` at the
    first line that is not one."""
    if not path.exists():
        raise PredictionsError(f"predictions file not found: {path}")
    if path.is_dir():
        raise PredictionsError(f"{path} is a directory; name a records file")
    if not path.is_file():
        raise PredictionsError(f"{path} is not a regular file (a device or a pipe); name a records file")
    reports = []
    for record in read_records(path):
        if record.report is None:
            raise PredictionsError(f"{path}:{record.number}: {record.problem}")
        reports.append(record.report)
    return reports


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes (as in the data folders' MANIFEST.md)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
