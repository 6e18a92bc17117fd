"""What ``rt4 verify`` does with a dangerous ``--out``, a second run on the same output, stale
records on ``--resume``, stdin, empty input, a damaged cache and a hung server: a clear one-line
error and exit 2, or the right result; never a traceback, never a lost input or record."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from audit_fixtures import read_records, write_rules, write_samples
from faults import Fault, fault_server, judge_every_claim
from typer.testing import CliRunner

from rt4chart.cli.app import app

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def verify(inputs: Path | str, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["verify", str(inputs), *args])
    return result.exit_code, result.output


def rt4_process(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return subprocess.run([sys.executable, "-m", "rt4chart", *args], input=stdin, capture_output=True,
                          text=True, env=environment, timeout=300)


@pytest.fixture
def audit_inputs(tmp_path: Path) -> tuple[Path, Path]:
    inputs, rules = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json")
    write_samples(inputs, 3)
    return inputs, rules


# --- --out --------------------------------------------------------------------------------------


@pytest.mark.parametrize("same", ["path", "relative", "symlink"])
def test_out_equal_to_the_input_is_refused_and_the_input_kept(
    audit_inputs: tuple[Path, Path], same: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    inputs, rules = audit_inputs
    before = inputs.read_bytes()
    monkeypatch.chdir(inputs.parent)
    out = {"path": inputs, "relative": Path("./in.jsonl"), "symlink": inputs.parent / "link.jsonl"}[same]
    if same == "symlink":
        out.symlink_to(inputs)
    code, output = verify(inputs, "--judge", f"scripted:{rules}", "--no-cache", "--out", str(out))
    assert code == 2 and "is the input file" in output and "Traceback" not in output
    assert inputs.read_bytes() == before


def test_out_through_a_symlink_writes_the_target_and_keeps_the_link(audit_inputs: tuple[Path, Path]) -> None:
    inputs, rules = audit_inputs
    target = inputs.parent / "results" / "out.jsonl"
    target.parent.mkdir()
    link = inputs.parent / "latest.jsonl"
    link.symlink_to(target)
    for resume in ([], ["--resume"]):
        code, output = verify(inputs, "--judge", f"scripted:{rules}", "--no-cache", "--out", str(link), *resume)
        assert code == 1, output
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert [r["id"] for r in read_records(target)] == ["s0", "s1", "s2"]


@pytest.mark.parametrize("kind", ["directory", "missing folder", "pipe"])
def test_an_unusable_out_is_a_clear_error(audit_inputs: tuple[Path, Path], kind: str) -> None:
    # Never a real device here: an implementation with the bug under test renames a regular file
    # over the path (it once replaced this machine's /dev/null). A FIFO is a non-regular file too.
    inputs, rules = audit_inputs
    out = {"directory": inputs.parent, "missing folder": inputs.parent / "nope" / "out.jsonl",
           "pipe": inputs.parent / "fifo"}[kind]
    if kind == "pipe":
        os.mkfifo(out)
    code, output = verify(inputs, "--judge", f"scripted:{rules}", "--no-cache", "--out", str(out))
    assert code == 2 and "--out" in output and "Traceback" not in output, output
    if kind == "pipe":
        assert stat.S_ISFIFO(os.stat(out).st_mode), "the pipe is still a pipe"


# --- one run per output -------------------------------------------------------------------------


def test_a_second_run_on_the_same_out_fails_fast_and_the_first_loses_nothing(tmp_path: Path) -> None:
    inputs = tmp_path / "in.jsonl"
    write_samples(inputs, 5)
    out = tmp_path / "out.jsonl"
    with fault_server(judge_every_claim("entailed")) as server:
        args = ["verify", str(inputs), "--judge", "openai/fault", "--api-base", server.base_url, "--decomposer",
                "rules", "--out", str(out), "--no-cache", "-q"]
        server.gate.clear()  # the first run's calls reach the server and wait there
        environment = {**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        first = subprocess.Popen([sys.executable, "-m", "rt4chart", *args], env=environment)
        deadline = time.monotonic() + 240
        while not server.requests and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.requests and first.poll() is None, "the first run is mid-audit"
        second = rt4_process(*args)
        server.gate.set()
        assert first.wait(timeout=240) in (0, 1)
    assert second.returncode == 2 and "another run is writing" in second.stderr, second.stderr
    assert [r["id"] for r in read_records(out)] == [f"s{i}" for i in range(5)]


# --- resume -------------------------------------------------------------------------------------


def test_resume_audits_again_an_edited_line_a_failed_record_and_everything_for_another_judge(
    tmp_path: Path,
) -> None:
    inputs, rules = tmp_path / "in.jsonl", write_rules(tmp_path / "rules.json")
    samples = write_samples(inputs, 4)
    out = tmp_path / "out.jsonl"
    args = ["--judge", f"scripted:{rules}", "--no-cache", "--out", str(out), "-q"]
    assert verify(inputs, *args)[0] == 1
    first = read_records(out)
    assert all(r["input_hash"] for r in first)

    # Line 2's answer is edited (same id), and line 3's record carries a judge error.
    samples[1]["answer"] = "Store 1 opens at 2 am."
    inputs.write_text("".join(json.dumps(s) + "\n" for s in samples), encoding="utf-8")
    first[2]["errors"] = ["chunk 0: RateLimitError after 5 attempts"]
    out.write_text("".join(json.dumps(r) + "\n" for r in first), encoding="utf-8")
    assert verify(inputs, *args, "--resume")[0] == 1
    resumed = read_records(out)
    assert resumed[0] == first[0] and resumed[3] == first[3], "untouched records are kept as written"
    assert resumed[1]["label"] == "entailed" and resumed[1]["input_hash"] != first[1]["input_hash"]
    assert resumed[2]["errors"] == []

    # Another judge (the rules changed): nothing of the old judge's survives.
    write_rules(rules, cost_per_call=0.001)
    assert verify(inputs, *args, "--resume")[0] == 1
    assert all(a["judge"] != b["judge"] for a, b in zip(resumed, read_records(out), strict=True))


# --- input --------------------------------------------------------------------------------------


def test_dash_reads_stdin(audit_inputs: tuple[Path, Path]) -> None:
    inputs, rules = audit_inputs
    done = rt4_process("verify", "-", "--judge", f"scripted:{rules}", "--no-cache", "-q",
                       stdin=inputs.read_text(encoding="utf-8"))
    assert done.returncode == 1, done.stderr
    assert [json.loads(line)["id"] for line in done.stdout.splitlines()] == ["s0", "s1", "s2"]


@pytest.mark.parametrize("content", ["", "\n  \n\r\n"])
def test_an_empty_input_is_a_clear_error(tmp_path: Path, content: str) -> None:
    inputs = tmp_path / "in.jsonl"
    inputs.write_text(content, encoding="utf-8")
    code, output = verify(inputs, "--judge", "embedded", "--no-cache")
    assert code == 2 and "holds no record" in output


# --- cache --------------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["corrupt database", "a file"])
def test_an_unusable_cache_is_a_clear_error_for_every_command(audit_inputs: tuple[Path, Path], damage: str) -> None:
    inputs, rules = audit_inputs
    cache = inputs.parent / "cache"
    if damage == "a file":
        cache.write_text("not a directory", encoding="utf-8")
    else:
        cache.mkdir()
        (cache / "cache.db").write_bytes(b"SQLite format 3\x00" + os.urandom(4096))
    for command in (["verify", str(inputs), "--judge", f"scripted:{rules}"], ["cache", "stats"], ["cache", "clear"],
                    ["estimate", str(inputs), "--judge", f"scripted:{rules}"]):
        done = rt4_process(*command, "--cache-dir", str(cache))
        assert done.returncode == 2, (command, done.stderr)
        assert "cannot use the cache" in done.stderr and "Traceback" not in done.stderr


# --- --timeout ----------------------------------------------------------------------------------


def test_timeout_shortens_a_hung_attempt(tmp_path: Path) -> None:
    inputs = tmp_path / "in.jsonl"
    write_samples(inputs, 1)
    with fault_server(judge_every_claim("entailed"), Fault("hang", hang_s=60)) as server:
        done = rt4_process("verify", str(inputs), "--judge", "openai/fault", "--api-base", server.base_url,
                           "--decomposer", "rules", "--no-cache", "-q", "--timeout", "1")
    assert done.returncode in (0, 1), done.stderr
    [record] = [json.loads(line) for line in done.stdout.splitlines()]
    # The hung first attempt timed out after a second and was retried; every claim got a verdict.
    assert record["usage"]["calls"] == len(server.requests) >= 2
    assert record["label"] is not None and not any("Timeout" in e for c in record["claims"] for e in c["errors"])


# --- one guard for every output of every command (issue 27, item 1) ------------------------------


@pytest.mark.parametrize(
    ("flags", "clobbered"),
    [
        (["--report", "{input}"], "input"),
        (["--junit", "{input}"], "input"),
        (["--out", "{out}", "--report", "{out}"], "out"),
        (["--out", "{out}", "--junit", "{out}"], "out"),
        (["--report", "{out}", "--junit", "{out}"], "out"),
    ],
)
def test_verify_refuses_any_output_that_is_an_input_or_another_output(
    audit_inputs: tuple[Path, Path], flags: list[str], clobbered: str
) -> None:
    inputs, rules = audit_inputs
    out = inputs.parent / "out.jsonl"
    out.write_text("earlier records\n", encoding="utf-8")
    before = {"input": inputs.read_bytes(), "out": out.read_bytes()}
    args = [flag.format(input=inputs, out=out) for flag in flags]
    code, output = verify(inputs, "--judge", f"scripted:{rules}", "--no-cache", *args)
    assert code == 2 and "Traceback" not in output, output
    assert ("is the input file" if clobbered == "input" else "one file cannot hold both outputs") in output
    assert inputs.read_bytes() == before["input"] and out.read_bytes() == before["out"]


def test_report_refuses_to_write_over_its_results(audit_inputs: tuple[Path, Path]) -> None:
    inputs, rules = audit_inputs
    results = inputs.parent / "out.jsonl"
    assert verify(inputs, "--judge", f"scripted:{rules}", "--no-cache", "--out", str(results), "-q")[0] == 1
    kept = results.read_bytes()
    for flag, target in (("--html", results), ("--junit", results), ("--html", inputs)):
        done = runner.invoke(app, ["report", str(results), "--input", str(inputs), flag, str(target)])
        assert done.exit_code == 2 and "is the input file" in done.output, done.output
    assert results.read_bytes() == kept


def test_repair_refuses_an_out_that_is_its_input_or_its_verify_records(audit_inputs: tuple[Path, Path]) -> None:
    inputs, rules = audit_inputs
    results = inputs.parent / "out.jsonl"
    assert verify(inputs, "--judge", f"scripted:{rules}", "--no-cache", "--out", str(results), "-q")[0] == 1
    before = inputs.read_bytes(), results.read_bytes()
    for target in (inputs, results):
        done = runner.invoke(app, ["repair", str(results), "--input", str(inputs), "--no-cache", "--out", str(target)])
        assert done.exit_code == 2 and "is the input file" in done.output, done.output
    assert (inputs.read_bytes(), results.read_bytes()) == before


def test_signals_refuse_an_out_that_is_the_input_before_loading_any_model(audit_inputs: tuple[Path, Path]) -> None:
    inputs, _ = audit_inputs
    before = inputs.read_bytes()
    link = inputs.parent / "link.jsonl"
    link.symlink_to(inputs)
    for out in (inputs, link):
        done = runner.invoke(app, ["signals", "csr", str(inputs), "--model", str(inputs.parent / "no-model"),
                                   "--out", str(out)])
        assert done.exit_code == 2 and "is the input file" in done.output, done.output
    assert inputs.read_bytes() == before and link.is_symlink()


def test_an_atomic_write_through_a_symlink_keeps_the_link(tmp_path: Path) -> None:
    from rt4chart.records.io import write_lines_atomically

    target, link = tmp_path / "records.jsonl", tmp_path / "latest.jsonl"
    target.write_text("old\n", encoding="utf-8")
    link.symlink_to(target)
    write_lines_atomically(link, ["new"])
    assert link.is_symlink() and target.read_text(encoding="utf-8") == "new\n"


def test_compare_refuses_an_out_dir_whose_judge_file_is_its_input(audit_inputs: tuple[Path, Path]) -> None:
    from rt4chart.judges.registry import judge_stack
    from rt4chart.runs.compare import output_name

    inputs, rules = audit_inputs
    other = write_rules(inputs.parent / "other.json", cost_per_call=0.001)
    judge_name = judge_stack(f"scripted:{rules}").name
    planted = inputs.parent / output_name(judge_name)
    planted.write_bytes(inputs.read_bytes())
    before = planted.read_bytes()
    done = runner.invoke(app, ["compare", str(planted), "--judges", f"scripted:{rules},scripted:{other}",
                               "--out-dir", str(inputs.parent), "--no-cache", "-q"])
    assert done.exit_code == 2 and "is the input file" in done.output, done.output
    assert planted.read_bytes() == before


def test_verify_dash_refuses_an_out_that_is_its_stdin(audit_inputs: tuple[Path, Path]) -> None:
    inputs, rules = audit_inputs
    before = inputs.read_bytes()
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    with open(inputs, "rb") as stdin:
        done = subprocess.run([sys.executable, "-m", "rt4chart", "verify", "-", "--judge", f"scripted:{rules}",
                               "--no-cache", "--out", str(inputs)], stdin=stdin, capture_output=True, text=True,
                              env=environment, timeout=300)
    assert done.returncode == 2 and "is the input file" in done.stderr, done.stderr
    assert inputs.read_bytes() == before


@pytest.mark.parametrize("kind", ["directory", "missing folder"])
def test_every_command_refuses_a_directory_or_missing_folder_before_any_work(
    audit_inputs: tuple[Path, Path], kind: str
) -> None:
    inputs, rules = audit_inputs
    results = inputs.parent / "out.jsonl"
    assert verify(inputs, "--judge", f"scripted:{rules}", "--no-cache", "--out", str(results), "-q")[0] == 1
    target = str(inputs.parent if kind == "directory" else inputs.parent / "nope" / "file")
    commands = [
        ["verify", str(inputs), "--judge", f"scripted:{rules}", "--no-cache", "--report", target],
        ["report", str(results), "--junit", target],
        ["repair", str(results), "--input", str(inputs), "--no-cache", "--out", target],
        ["signals", "csr", str(inputs), "--model", str(inputs.parent / "no-model"), "--out", target],
        ["agree", str(results), str(results), "--plot", target],
        ["score", str(results), "--out", target],
    ]
    for command in commands:
        done = runner.invoke(app, command)
        assert done.exit_code == 2, (command, done.output)
        assert ("is a directory" if kind == "directory" else "does not exist") in done.output, (command, done.output)


def test_agree_plot_writes_the_file_it_names(audit_inputs: tuple[Path, Path]) -> None:
    pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) draws --plot")
    inputs, rules = audit_inputs
    results = inputs.parent / "out.jsonl"
    assert verify(inputs, "--judge", f"scripted:{rules}", "--no-cache", "--out", str(results), "-q")[0] == 1
    plot = inputs.parent / "heatmap"
    done = runner.invoke(app, ["agree", str(results), str(results), "--plot", str(plot)])
    assert done.exit_code == 0, done.output
    assert plot.read_bytes().startswith(b"\x89PNG") and not plot.with_suffix(".png").exists()


def test_a_folder_that_cannot_be_written_is_refused_before_any_work(audit_inputs: tuple[Path, Path]) -> None:
    # /proc takes no new files, whoever asks (root included, for whom permission bits do not count).
    inputs, rules = audit_inputs
    out = inputs.parent / "out.jsonl"
    code, output = verify(inputs, "--judge", f"scripted:{rules}", "--no-cache", "--out", str(out),
                          "--report", "/proc/rt4chart-report.html")
    assert code == 2 and "cannot write in /proc" in output and "Traceback" not in output, output
    assert not out.exists(), "refused before any work"


def test_a_lone_surrogate_line_gets_its_error_record_and_the_lines_after_it_are_audited(
    audit_inputs: tuple[Path, Path],
) -> None:
    inputs, rules = audit_inputs
    lines = inputs.read_text(encoding="utf-8").splitlines()
    poisoned = '{"id": "bad", "context": "The sky is blue.", "answer": "The sky is blue \\ud800."}'
    inputs.write_text("\n".join([lines[0], poisoned, *lines[1:]]) + "\n", encoding="utf-8")
    out = inputs.parent / "out.jsonl"
    for resume in ([], ["--resume"]):
        code, output = verify(inputs, "--judge", f"scripted:{rules}", "--no-cache", "--out", str(out), "-q", *resume)
        assert code == 2 and "Traceback" not in output, output
        records = read_records(out)
        assert [r["line"] for r in records] == [1, 2, 3, 4]
        assert "lone surrogate" in records[1]["errors"][0] and records[1]["label"] is None
        assert all(r["label"] is not None for r in (records[0], records[2], records[3]))


def test_an_answer_with_too_many_sentences_gets_its_error_record(audit_inputs: tuple[Path, Path]) -> None:
    from rt4chart.runs.engine import MAX_ANSWER_SENTENCES

    inputs, rules = audit_inputs
    long_answer = " ".join(f"Store {i} opens at 9 am." for i in range(MAX_ANSWER_SENTENCES + 1))
    with open(inputs, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"id": "long", "context": "Store 1 opens at 9 am.", "answer": long_answer}) + "\n")
    out = inputs.parent / "out.jsonl"
    code, output = verify(inputs, "--judge", f"scripted:{rules}", "--no-cache", "--out", str(out), "-q")
    records = read_records(out)
    assert len(records) == 4 and "over the limit" in records[3]["errors"][0] and records[3]["usage"]["calls"] == 0
    assert code == 2, output


# --- hostile text in what is shown (issue 27, low items) -------------------------------------------


def test_escapes_controls_and_bidi_overrides_from_answers_never_reach_a_terminal_page_or_xml(
    audit_inputs: tuple[Path, Path],
) -> None:
    import xml.etree.ElementTree as ElementTree

    inputs, rules = audit_inputs
    samples = [json.loads(line) for line in inputs.read_text(encoding="utf-8").splitlines()]
    samples[0]["answer"] = "Store 0 opens at 1 am.\x1b[2J\x1b]0;pwned\x07 It also sells \u202ecakes\x01."
    inputs.write_text("".join(json.dumps(s) + "\n" for s in samples), encoding="utf-8")
    out, html, junit = (inputs.parent / name for name in ("out.jsonl", "report.html", "junit.xml"))
    code, _ = verify(inputs, "--judge", f"scripted:{rules}", "--no-cache", "--out", str(out), "--report", str(html),
                     "--junit", str(junit), "-q")
    assert code == 1
    shown = [
        runner.invoke(app, ["show", str(out), "--input", str(inputs)]).output,
        runner.invoke(app, ["report", str(out), "--input", str(inputs), "--github"]).output,
        verify(inputs, "--judge", f"scripted:{rules}", "--no-cache", "--format", "text", "-q")[1],
        html.read_text(encoding="utf-8"),
    ]
    for text in shown:
        assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text and "\x01" not in text
    assert "\u241b[2J" in shown[0], "the escape is shown, not dropped"
    ElementTree.parse(junit)  # well-formed XML: no control character left in it


def test_out_to_the_null_device_drops_the_records_and_keeps_the_device(audit_inputs: tuple[Path, Path]) -> None:
    # The run is still judged and published (the JUnit report holds every sample), its records go
    # nowhere (not to stdout either), and /dev gets no lock, temporary file or manifest beside null.
    inputs, rules = audit_inputs
    junit = inputs.parent / "junit.xml"
    before = set(os.listdir("/dev"))
    run = rt4_process("verify", str(inputs), "--judge", f"scripted:{rules}", "--no-cache", "-o", os.devnull,
                      "--junit", str(junit))
    assert run.returncode == 1, run.stderr  # the scripted rules flag a sample: the run's verdict
    assert run.stdout == "" and "Traceback" not in run.stderr
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode), "the null device is still a device"
    assert set(os.listdir("/dev")) == before
    assert junit.read_text().count("<testcase ") == 3
