"""``rt4 verify`` end to end: real JSONL files in, real JSONL out, exit codes, the paper's example."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fixtures.spine.judges import copy_running_example, read_jsonl_records, write_jsonl
from typer.testing import CliRunner, Result

from rt4chart.cli.app import app
from rt4chart.method.text import segment_context, split_sentences

EXIT_OK, EXIT_HALLUCINATED, EXIT_USAGE = 0, 1, 2


def rt4_verify(input_path: Path, *args: str, cache: Path | None = None) -> Result:
    """Run ``rt4 verify`` in-process, with a cache of its own so runs never share replies."""
    cache_args = ["--cache-dir", str(cache or input_path.parent / "cache")]
    return CliRunner().invoke(app, ["verify", str(input_path), *cache_args, *args], catch_exceptions=False)


def _squashed(text: str) -> str:
    """Text without whitespace: rich wraps long error lines when stderr is not a terminal."""
    return "".join(text.split())


@pytest.fixture
def example(tmp_path: Path) -> tuple[Path, Path]:
    """The shipped running example (input and rules), copied into a fresh directory."""
    return copy_running_example(tmp_path)


def _run_example(example: tuple[Path, Path], *args: str) -> tuple[Result, list[dict[str, Any]]]:
    input_path, rules = example
    out = input_path.parent / "out.jsonl"
    result = rt4_verify(input_path, "--judge", f"scripted:{rules}", "--window", "2", "--overlap", "1",
                        "--out", str(out), *args)
    return result, read_jsonl_records(out)


def test_the_running_example_through_the_cli(example: tuple[Path, Path]) -> None:
    result, [record] = _run_example(example)
    assert result.exit_code == EXIT_HALLUCINATED, result.stderr
    sample = json.loads(example[0].read_text(encoding="utf-8"))
    assert len(segment_context(sample["context"])[1]) == record["context_sentences"] == 4
    assert record["chunks"] == 3
    claims = record["claims"]
    assert len(claims) == 5
    votes = [[(vote["chunk"], vote["label"]) for vote in claim["votes"]] for claim in claims]
    assert votes == [
        [(0, "contradicted"), (1, None), (2, None)],  # settled in chunk 0, later chunks skipped
        [(0, "contradicted"), (1, None), (2, None)],
        [(0, "baseless"), (1, "entailed"), (2, "entailed")],  # entailed where s2 is in view
        [(0, "baseless"), (1, "baseless"), (2, "baseless")],
        [(0, "baseless"), (1, "baseless"), (2, "baseless")],
    ]
    assert all(v["skipped"] == "contradicted in chunk 0" for c in claims[:2] for v in c["votes"][1:])
    assert [c["local_label"] for c in claims] == ["contradicted", "contradicted", "entailed", "baseless", "baseless"]
    assert [c["label"] for c in claims] == ["contradicted", "contradicted", "entailed", "entailed", "baseless"]
    assert (record["label"], record["hallucinated"]) == ("contradicted", True)
    answer_sentences = [s.text for s in split_sentences(sample["answer"])]
    spans = [sample["answer"][span["start"] : span["end"]] for span in record["spans"]]
    assert spans == [answer_sentences[0], answer_sentences[2]]
    for claim in claims:
        answer_span = claim["answer_span"]
        assert sample["answer"][answer_span["start"] : answer_span["end"]] == answer_sentences[claim["sentence_index"]]
    # One decomposition, one local call per chunk, one global call per location hint (chunk 0, chunk 1, none).
    assert record["usage"]["calls"] == 1 + 3 + 3
    assert record["judge"].startswith("scripted:free_trial.rules.json")
    assert isinstance(record["prompt_version"], str) and record["prompt_version"]
    assert record["errors"] == []


def test_every_output_field_named_in_the_issue_is_present(example: tuple[Path, Path]) -> None:
    _, [record] = _run_example(example)
    assert {"id", "label", "hallucinated", "claims", "spans", "usage", "judge", "prompt_version", "errors"} <= set(
        record
    )
    assert set(record["usage"]) >= {"calls", "prompt_tokens", "completion_tokens", "cost_usd", "cache_hits"}
    for claim in record["claims"]:
        assert {"text", "answer_span", "local_label", "votes", "label", "evidence"} <= set(claim)
        for evidence in claim["evidence"] + [e for vote in claim["votes"] for e in vote["evidence"]]:
            assert set(evidence) >= {"start", "end", "text", "sentence_ids"}
    context = json.loads(example[0].read_text(encoding="utf-8"))["context"]
    evidence = [e for claim in record["claims"] for e in claim["evidence"]]
    assert evidence and all(context[e["start"] : e["end"]] == e["text"] for e in evidence)


def test_no_global_keeps_the_local_labels(example: tuple[Path, Path]) -> None:
    result, [record] = _run_example(example, "--no-global")
    assert result.exit_code == EXIT_HALLUCINATED
    assert [c["label"] for c in record["claims"]] == [c["local_label"] for c in record["claims"]]
    assert record["claims"][3]["label"] == "baseless", "only global verification finds the 21 days"
    assert record["usage"]["calls"] == 1 + 3


def test_batch_claims_one_gives_the_same_verdicts(example: tuple[Path, Path]) -> None:
    _, [batched] = _run_example(example)
    (example[0].parent / "cache").rename(example[0].parent / "cache-batched")
    _, [single] = _run_example(example, "--batch-claims", "1")
    assert single["claims"] == batched["claims"]
    assert single["usage"]["calls"] == 1 + (5 + 3 + 3) + 5


def test_the_installed_console_script_writes_stdout_and_a_summary(example: tuple[Path, Path]) -> None:
    input_path, rules = example
    rt4 = Path(sys.executable).with_name("rt4")
    assert rt4.exists(), "the package must be installed (pip install -e .)"
    completed = subprocess.run(
        [str(rt4), "verify", str(input_path), "--judge", f"scripted:{rules}", "--window", "2", "--overlap", "1",
         "--cache-dir", str(input_path.parent / "cache")],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert completed.returncode == EXIT_HALLUCINATED, completed.stderr
    [record] = [json.loads(line) for line in completed.stdout.splitlines()]
    assert record["id"] == "free-trial" and record["label"] == "contradicted"
    assert "rt4chart audit" in completed.stderr


def _entailing_rules(directory: Path) -> Path:
    rules = {"verify": [{"claim": "lasts 14 days", "label": "entailed", "evidence": ["The trial lasts 14 days."]}]}
    path = directory / "entailing.rules.json"
    path.write_text(json.dumps(rules), encoding="utf-8")
    return path


def _sample(sample_id: str, answer: str = "The trial lasts 14 days.", **extra: Any) -> dict[str, Any]:
    return {"id": sample_id, "context": "Plans vary. The trial lasts 14 days.", "answer": answer, **extra}


def test_an_all_entailed_run_exits_zero(tmp_path: Path) -> None:
    input_path = write_jsonl(tmp_path / "in.jsonl", [_sample("a"), _sample("b", question="How long?")])
    result = rt4_verify(input_path, "--judge", f"scripted:{_entailing_rules(tmp_path)}")
    assert result.exit_code == EXIT_OK, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["id"], r["label"], r["hallucinated"], r["spans"]) for r in records] == [
        ("a", "entailed", False, []),
        ("b", "entailed", False, []),
    ]


BAD_LINES = [
    ("not JSON", "{this is not json"),
    ("missing answer", json.dumps({"id": "no-answer", "context": "c"})),
    ("missing context", json.dumps({"id": "no-context", "answer": "a"})),
    ("wrong types", json.dumps({"id": "types", "context": 5, "answer": ["a"]})),
    ("empty answer", json.dumps({"id": "empty", "context": "c", "answer": "  "})),
    ("not an object", json.dumps(["id", "context", "answer"])),
]


def test_bad_lines_get_error_records_in_input_order_and_exit_two(tmp_path: Path) -> None:
    lines = [json.dumps(_sample("first"))] + [line for _, line in BAD_LINES] + ["", json.dumps(_sample("last"))]
    input_path = tmp_path / "in.jsonl"
    input_path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    result = rt4_verify(input_path, "--judge", f"scripted:{_entailing_rules(tmp_path)}", "--out", str(out))
    assert result.exit_code == EXIT_USAGE
    records = read_jsonl_records(out)
    # Line 8 is blank: no record; every other line has exactly one, in order.
    assert [r["line"] for r in records] == [1, 2, 3, 4, 5, 6, 7, 9]
    assert [r["id"] for r in records] == ["first", None, "no-answer", "no-context", "types", "empty", None, "last"]
    assert records[0]["label"] == records[-1]["label"] == "entailed"
    for record, (problem, _) in zip(records[1:-1], BAD_LINES, strict=True):
        assert record["label"] is None and record["hallucinated"] is None, problem
        [error] = record["errors"]
        assert error.startswith(f"line {record['line']}: "), problem


@pytest.mark.parametrize(("window", "overlap"), [("2", "2"), ("2", "3"), ("0", "0"), ("3", "-1")])
def test_overlap_not_below_window_is_a_usage_error(example: tuple[Path, Path], window: str, overlap: str) -> None:
    input_path, rules = example
    out = input_path.parent / "out.jsonl"
    result = rt4_verify(input_path, "--judge", f"scripted:{rules}", "--window", window, "--overlap", overlap,
                        "--out", str(out))
    assert result.exit_code == EXIT_USAGE
    assert "--overlap" in result.stderr
    assert not out.exists(), "no work starts on a usage error"


@pytest.mark.parametrize(
    ("judge", "message"),
    [
        ("no-such-judge-anywhere", "unknown judge"),
        ("scripted:", "needs a rules file"),
        ("scripted:{missing}", "missing.rules.json"),
        ("scripted:{not_json}", "not_json.rules.json"),
    ],
)
def test_unusable_judges_are_usage_errors(example: tuple[Path, Path], judge: str, message: str) -> None:
    input_path, _ = example
    not_json = input_path.parent / "not_json.rules.json"
    not_json.write_text("{", encoding="utf-8")
    spec = judge.format(missing=input_path.parent / "missing.rules.json", not_json=not_json)
    result = rt4_verify(input_path, "--judge", spec)
    assert result.exit_code == EXIT_USAGE
    assert _squashed(message) in _squashed(result.stderr)
    assert result.stdout == ""


def test_a_missing_input_file_is_a_usage_error(tmp_path: Path) -> None:
    result = rt4_verify(tmp_path / "nowhere.jsonl", "--judge", f"scripted:{_entailing_rules(tmp_path)}")
    assert result.exit_code == EXIT_USAGE
    assert "input file not found" in result.stderr


def test_out_file_and_stdout_carry_the_same_records(example: tuple[Path, Path]) -> None:
    input_path, rules = example
    out = input_path.parent / "out.jsonl"
    to_file = rt4_verify(input_path, "--judge", f"scripted:{rules}", "--out", str(out), cache=input_path.parent / "c1")
    to_stdout = rt4_verify(input_path, "--judge", f"scripted:{rules}", cache=input_path.parent / "c2")
    assert to_file.stdout == ""
    assert out.read_text(encoding="utf-8") == to_stdout.stdout
    assert to_file.exit_code == to_stdout.exit_code == EXIT_HALLUCINATED


def test_quiet_suppresses_the_summary(example: tuple[Path, Path]) -> None:
    input_path, rules = example
    loud = rt4_verify(input_path, "--judge", f"scripted:{rules}", cache=input_path.parent / "c1")
    quiet = rt4_verify(input_path, "--judge", f"scripted:{rules}", "--quiet", cache=input_path.parent / "c2")
    assert "rt4chart audit" in loud.stderr
    assert quiet.stderr == ""
    assert quiet.stdout == loud.stdout


def test_many_samples_come_out_in_input_order(tmp_path: Path) -> None:
    # Longer answers need more judge calls, so later samples finish first unless order is kept.
    samples = [
        _sample(f"s{i:02d}", answer=" ".join(["The trial lasts 14 days."] * (30 - i)))
        for i in range(30)
    ]
    rules = json.loads(_entailing_rules(tmp_path).read_text(encoding="utf-8")) | {"latency_s": 0.001}
    rules_path = tmp_path / "slow.rules.json"
    rules_path.write_text(json.dumps(rules), encoding="utf-8")
    input_path = write_jsonl(tmp_path / "in.jsonl", samples)
    result = rt4_verify(input_path, "--judge", f"scripted:{rules_path}", "--batch-claims", "1")
    assert result.exit_code == EXIT_OK, result.stderr
    assert [json.loads(line)["id"] for line in result.stdout.splitlines()] == [s["id"] for s in samples]


def test_passage_contexts_anchor_evidence_in_the_joined_text(tmp_path: Path) -> None:
    passages = ["Plans vary by region.", "The trial lasts 14 days."]
    input_path = write_jsonl(tmp_path / "in.jsonl", [_sample("p", context=passages)])
    result = rt4_verify(input_path, "--judge", f"scripted:{_entailing_rules(tmp_path)}")
    assert result.exit_code == EXIT_OK, result.stderr
    [record] = [json.loads(line) for line in result.stdout.splitlines()]
    joined, _ = segment_context(passages)
    [evidence] = record["claims"][0]["evidence"]
    assert joined[evidence["start"] : evidence["end"]] == evidence["text"] == "The trial lasts 14 days."
    assert evidence["sentence_ids"] == [1]


@pytest.mark.parametrize(
    "impossible", [["--method", "direct"], ["--decomposer", "holistic"], ["--decomposer", "judge"]]
)
def test_a_method_the_embedded_judge_cannot_serve_is_a_usage_error_before_any_work(
    example: tuple[Path, Path], impossible: list[str]
) -> None:
    input_path, rules = example
    out = input_path.parent / "out.jsonl"
    result = rt4_verify(input_path, "--judge", "embedded", *impossible, "-o", str(out))
    assert result.exit_code == EXIT_USAGE
    message = " ".join(result.stderr.split())
    assert impossible[1] in message and "scripted:" in message and "only verifies claims" in message
    assert not out.exists()
    # A judge that writes text is given the same options.
    served = rt4_verify(input_path, "--judge", f"scripted:{rules}", *impossible, "-o", str(out))
    assert served.exit_code != EXIT_USAGE, served.stderr
    assert out.exists()


def test_exit_0_and_exit_1_say_why(example: tuple[Path, Path]) -> None:
    input_path, rules = example
    out = str(input_path.parent / "o.jsonl")
    judge = ["--judge", f"scripted:{rules}", "--window", "2", "--overlap", "1", "-o", out]
    failed = rt4_verify(input_path, *judge)
    passed = rt4_verify(input_path, *judge, "--fail-on", "never")
    assert (failed.exit_code, passed.exit_code) == (EXIT_HALLUCINATED, EXIT_OK)
    assert "failed: 1 of 1 answers hallucinated (100%) > --max-rate 0.00" in " ".join(failed.stderr.split())
    assert "passed: --fail-on never" in " ".join(passed.stderr.split())


def test_small_traps_of_the_first_hour(tmp_path: Path) -> None:
    runner = CliRunner()
    missing = tmp_path / "typo-cache"
    stats = runner.invoke(app, ["cache", "stats", "--cache-dir", str(missing)], catch_exceptions=False)
    assert stats.exit_code == 0 and "0 entries" in " ".join(stats.stdout.split())
    assert not missing.exists(), "cache stats must not create the directory it was asked about"
    empty = runner.invoke(app, ["verify", "/dev/null"], catch_exceptions=False)
    assert empty.exit_code == EXIT_USAGE and "not found" not in empty.stderr and "holds no record" in empty.stderr
    folder = runner.invoke(app, ["verify", str(tmp_path)], catch_exceptions=False)
    assert folder.exit_code == EXIT_USAGE and "is a directory" in folder.stderr
    version = runner.invoke(app, ["--version"], catch_exceptions=False)
    assert version.exit_code == 0 and version.stdout.startswith("rt4chart ")


def test_verify_help_is_grouped_into_panels_readable_at_80_columns() -> None:
    from rich.text import Text

    completed = subprocess.run(
        [str(Path(sys.executable).with_name("rt4")), "verify", "--help"], capture_output=True, text=True,
        env={**os.environ, "COLUMNS": "80", "TERMINAL_WIDTH": "80"}, timeout=120, check=False,
    )
    assert completed.returncode == 0
    text = Text.from_ansi(completed.stdout).plain
    assert max(len(line) for line in text.splitlines()) <= 80
    for panel in ("Judge and cost", "Method", "Outputs and CI", "Resume", "Scale-out", "Signals"):
        assert f"─ {panel} ─" in text, panel
    options_panel = text.split("─ Options ─", 1)[1].split("╰", 1)[0]
    assert "--judge" not in options_panel, "every audit option sits in a named panel"
    flat = " ".join(text.split())
    assert "vote:A,B,C" in flat and "FILE.toml" in flat
    # A flag takes no value, so no type is printed beside it (typer 0.29 prints ``<bool>``), in every command.
    assert "<bool>" not in text and "--resume" in text and "--github" in text
    for command in (["--help"], ["cache", "clear", "--help"], ["show", "--help"]):
        assert "<bool>" not in CliRunner().invoke(app, command, catch_exceptions=False).stdout, command
