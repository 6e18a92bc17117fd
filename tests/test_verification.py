"""The joins, span mapping, and local + adaptive global verification, judged by scripted rules."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from fixtures.spine.judges import (
    RecordingBackend,
    Rewrite,
    running_example_judge,
    running_example_sample,
    scripted,
)

import rt4chart
from rt4chart.method.tasks import VerifyInput, VerifyOutput
from rt4chart.method.text import chunk_sentences
from rt4chart.method.verification import and_join, answer_hallucinated, deciding_chunk, hallucinated_spans, or_join
from rt4chart.options import AuditOptions
from rt4chart.protocol import JudgeRequest, JudgeResponse
from rt4chart.types import AuditRecord, ClaimVerdict, Label, Sample, Span, Vote

ENT, CON, BAS = Label.ENTAILED, Label.CONTRADICTED, Label.BASELESS
LABELS_AND_MISSING: list[Label | None] = [ENT, CON, BAS, None]


def _strongest(labels: Sequence[Label], priority: Sequence[Label], empty: Label) -> Label:
    """The spec of a join: the label that comes first in ``priority``."""
    return min(labels, key=priority.index, default=empty)


@pytest.mark.parametrize(
    "labels",
    [combo for size in range(4) for combo in itertools.product(LABELS_AND_MISSING, repeat=size)],
    ids=str,
)
def test_or_join_over_every_label_combination(labels: tuple[Label | None, ...]) -> None:
    # Missing votes (failed or skipped chunks) say nothing, so they are ignored; when votes were cast
    # and none has a label, every judge call failed and the local label is unknown, not baseless.
    present = [label for label in labels if label is not None]
    expected = None if labels and not present else _strongest(present, [CON, ENT, BAS], empty=BAS)
    assert or_join(labels) == expected


@pytest.mark.parametrize(
    "labels",
    [combo for size in range(4) for combo in itertools.product(LABELS_AND_MISSING, repeat=size)],
    ids=str,
)
def test_and_join_over_every_label_combination(labels: tuple[Label | None, ...]) -> None:
    # An unjudged claim leaves the answer open unless a contradicted claim decides it; the answer is
    # hallucinated when a known claim is contradicted or baseless, unknown when that is not known.
    # No claims: nothing was verified, which is no basis either (an answer never passes for that).
    judged = [label for label in labels if label is not None]
    if CON in judged or None not in labels:
        assert and_join(labels) == _strongest(judged, [CON, BAS, ENT], empty=BAS)
    else:
        assert and_join(labels) is None
    if CON in judged or BAS in judged or not labels:
        assert answer_hallucinated(labels) is True
    else:
        assert answer_hallucinated(labels) is (None if None in labels else False)


def _verdict(index: int, span: tuple[int, int] | None, label: Label | None) -> ClaimVerdict:
    return ClaimVerdict(
        index=index,
        text=f"claim {index}",
        sentence_index=index,
        answer_span=Span(start=span[0], end=span[1]) if span else None,
        label=label,
    )


@pytest.mark.parametrize(
    ("claims", "expected"),
    [
        pytest.param([((0, 10), ENT), ((11, 20), ENT)], [], id="all-entailed"),
        pytest.param([((11, 20), CON), ((0, 10), BAS)], [(0, 10), (11, 20)], id="sorted"),
        pytest.param([((0, 10), CON), ((0, 10), BAS)], [(0, 10)], id="same-sentence-once"),
        pytest.param([((10, 20), CON), ((0, 10), BAS)], [(0, 20)], id="touching-merge"),
        pytest.param([((5, 15), CON), ((0, 10), BAS)], [(0, 15)], id="overlapping-merge"),
        pytest.param([((0, 20), CON), ((5, 10), BAS)], [(0, 20)], id="contained-merge"),
        pytest.param([((0, 10), CON), ((10, 12), ENT), ((12, 20), BAS)], [(0, 10), (12, 20)], id="entailed-gap"),
        pytest.param([((0, 10), None)], [(0, 10)], id="unjudged-counts"),
        pytest.param([(None, CON), ((3, 4), ENT)], [], id="no-span-no-output"),
        pytest.param(
            [((30, 40), BAS), ((0, 5), CON), ((20, 31), CON), ((4, 6), BAS)],
            [(0, 6), (20, 40)],
            id="chains",
        ),
    ],
)
def test_hallucinated_spans_merge_and_sort(
    claims: list[tuple[tuple[int, int] | None, Label | None]], expected: list[tuple[int, int]]
) -> None:
    verdicts = [_verdict(i, span, label) for i, (span, label) in enumerate(claims)]
    assert hallucinated_spans(verdicts) == [Span(start=s, end=e) for s, e in expected]


@pytest.mark.parametrize(
    ("votes", "local", "expected"),
    [
        ([BAS, ENT, ENT], ENT, 1),
        ([ENT, CON, CON], CON, 1),
        ([None, CON], CON, 1),
        ([BAS, BAS], BAS, None),
        ([ENT, BAS], BAS, None),
    ],
)
def test_deciding_chunk_is_the_first_chunk_voting_the_local_label(
    votes: list[Label | None], local: Label, expected: int | None
) -> None:
    assert deciding_chunk([Vote(chunk=k, label=label) for k, label in enumerate(votes)], local) == expected


@pytest.mark.parametrize(("window", "overlap"), [(2, 2), (2, 5)])
def test_options_reject_overlap_not_below_window(window: int, overlap: int) -> None:
    with pytest.raises(ValueError, match="overlap"):
        AuditOptions(window=window, overlap=overlap)


def _run_example(backend: RecordingBackend, **options: Any) -> AuditRecord:
    return rt4chart.verify(running_example_sample(), judge=backend, window=2, overlap=1, **options)


def _vote_labels(report: AuditRecord) -> list[list[Label | None]]:
    return [[vote.label for vote in claim.votes] for claim in report.claims]


def test_running_example_votes_local_and_final_labels() -> None:
    report = _run_example(running_example_judge())
    assert report.chunks == 3 and report.context_sentences == 4
    assert _vote_labels(report) == [
        [CON, None, None],
        [CON, None, None],
        [BAS, ENT, ENT],
        [BAS, BAS, BAS],
        [BAS, BAS, BAS],
    ]
    assert [c.local_label for c in report.claims] == [CON, CON, ENT, BAS, BAS]
    assert [c.hint_chunk for c in report.claims] == [0, 0, 1, None, None]
    assert [c.label for c in report.claims] == [CON, CON, ENT, ENT, BAS]
    assert report.label == CON and report.hallucinated is True
    assert all(claim.grounded and not claim.errors for claim in report.claims)


def test_contradicted_claims_are_skipped_in_later_chunks_and_not_asked() -> None:
    backend = running_example_judge()
    report = _run_example(backend)
    for claim in report.claims[:2]:
        skipped = claim.votes[1:]
        assert [(v.chunk, v.label, v.skipped) for v in skipped] == [
            (1, None, "contradicted in chunk 0"),
            (2, None, "contradicted in chunk 0"),
        ]
        asked_chunks = [p.chunk for p in backend.verify_payloads("local") if claim.text in p.claims]
        assert asked_chunks == [0]


def test_without_skipping_every_chunk_is_asked_about_every_claim() -> None:
    backend = running_example_judge()
    report = _run_example(backend, skip_decided=False)
    assert all(vote.skipped is None for claim in report.claims for vote in claim.votes)
    assert [claim.local_label for claim in report.claims] == [CON, CON, ENT, BAS, BAS]
    local = backend.verify_payloads("local")
    assert sorted((p.chunk, claim) for p in local for claim in p.claims) == sorted(
        itertools.product([0, 1, 2], [claim.text for claim in report.claims])
    )


def test_local_requests_show_only_their_chunk() -> None:
    backend = running_example_judge()
    report = _run_example(backend)
    sentence_ids = {0: [0, 1], 1: [1, 2], 2: [2, 3]}
    for payload in backend.verify_payloads("local"):
        assert payload.chunk is not None and payload.hint is None
        assert [s.index for s in payload.sentences] == sentence_ids[payload.chunk]
    assert len(backend.verify_payloads("local")) == report.chunks


@pytest.mark.parametrize("batch_claims", [1, 2, 8])
def test_global_rejudging_is_adaptive_by_local_label(batch_claims: int) -> None:
    backend = running_example_judge()
    report = _run_example(backend, batch_claims=batch_claims)
    for claim in report.claims:
        [request] = backend.requests_for_claim(claim.text, "global")
        payload = request.payload
        assert payload.chunk is None
        assert [s.index for s in payload.sentences] == [0, 1, 2, 3], "global sees the full context"
        if claim.local_label == BAS:
            assert payload.hint is None
        else:
            assert claim.hint_chunk is not None
            assert payload.hint == list(chunk_sentences(4, 2, 1)[claim.hint_chunk].sentence_ids)
            rendered = "\n".join(m.content for m in request.messages)
            assert f"S{payload.hint[0]}-S{payload.hint[-1]}" in rendered
    hints = {claim.text: backend.requests_for_claim(claim.text, "global")[0].payload.hint for claim in report.claims}
    assert list(hints.values()) == [[0, 1], [0, 1], [1, 2], None, None]


def test_hinted_and_unhinted_global_requests_use_different_prompts() -> None:
    backend = running_example_judge()
    _run_example(backend)
    by_hint = {
        request.payload.hint is None: request.prompt_version
        for request in backend.requests
        if request.task == "verify" and request.payload.stage == "global"
    }
    assert by_hint[True] != by_hint[False]


def test_batch_size_one_judges_one_claim_per_call_with_the_same_result() -> None:
    batched_backend, single_backend = running_example_judge(), running_example_judge()
    batched = _run_example(batched_backend, batch_claims=8)
    single = _run_example(single_backend, batch_claims=1)
    assert single.model_dump(exclude={"usage", "usage_by_judge"}) == batched.model_dump(
        exclude={"usage", "usage_by_judge"}
    )
    single_verify = [r for r in single_backend.requests if r.task == "verify"]
    assert all(len(r.payload.claims) == 1 for r in single_verify)
    # Local: 5 claims in chunk 0, then 3 undecided claims in chunks 1 and 2; global: 5 claims.
    assert len(single_verify) == 5 + 3 + 3 + 5
    # One decomposition, one call per chunk, one global call per location hint (0, 1, none).
    assert len(batched_backend.requests) == 1 + 3 + 3
    assert single.usage.calls == len(single_backend.requests)
    assert batched.usage.calls == len(batched_backend.requests)


def test_no_global_keeps_the_local_labels_and_the_deciding_votes_evidence() -> None:
    backend = running_example_judge()
    report = _run_example(backend, global_verification=False)
    assert backend.verify_payloads("global") == []
    assert [c.label for c in report.claims] == [CON, CON, ENT, BAS, BAS]
    assert report.label == CON
    for claim in report.claims:
        deciding = next((v for v in claim.votes if v.chunk == claim.hint_chunk), None)
        assert claim.evidence == (deciding.evidence if deciding else [])
    assert report.claims[3].evidence == [] and report.claims[4].evidence == []


@dataclass(frozen=True)
class LabelMatrix:
    """Scripted local votes (claims x chunks) and global labels for a synthetic sample."""

    n_sentences: int
    window: int
    overlap: int
    local: list[list[Label]]
    final: list[Label]

    @property
    def context_sentences(self) -> list[str]:
        return [f"Fact {i:02d} is on record." for i in range(self.n_sentences)]

    @property
    def claims(self) -> list[str]:
        return [f"Statement C{c:02d} holds." for c in range(len(self.final))]

    def sample(self) -> Sample:
        return Sample(id="matrix", context=" ".join(self.context_sentences), answer=" ".join(self.claims))

    def rules(self) -> dict[str, Any]:
        facts = self.context_sentences
        chunks = chunk_sentences(self.n_sentences, self.window, self.overlap)
        rules: list[dict[str, Any]] = []
        for c, row in enumerate(self.local):
            for chunk, label in zip(chunks, row, strict=True):
                if label != BAS:
                    rules.append({
                        "claim": f"C{c:02d}",
                        "stage": "local",
                        # The whole chunk text: unique, since no window lies inside another.
                        "chunk_contains": " ".join(facts[chunk.first : chunk.last + 1]),
                        "label": label,
                        "evidence": [facts[chunk.first]],
                    })
        for c, label in enumerate(self.final):
            evidence = [] if label == BAS else [facts[-1]]
            rules.append({"claim": f"C{c:02d}", "stage": "global", "label": label, "evidence": evidence})
        return {"verify": rules, "default": "baseless"}

    def expected_votes(self) -> list[list[Label | None]]:
        """Chunks after the first contradiction are skipped (no label)."""
        return [
            [None if CON in row[:k] else label for k, label in enumerate(row)] for row in self.local
        ]


def random_matrix(seed: int) -> LabelMatrix:
    rng = random.Random(seed)
    n_sentences = rng.randint(1, 7)
    window = rng.randint(1, 4)
    overlap = rng.randint(0, window - 1)
    n_chunks = len(chunk_sentences(n_sentences, window, overlap))
    n_claims = rng.randint(1, 6)
    labels = [ENT, CON, BAS]
    return LabelMatrix(
        n_sentences=n_sentences,
        window=window,
        overlap=overlap,
        local=[[rng.choice(labels) for _ in range(n_chunks)] for _ in range(n_claims)],
        final=[rng.choice(labels) for _ in range(n_claims)],
    )


@pytest.mark.parametrize("seed", range(25))
def test_random_label_matrices_give_the_scripted_verdicts_at_every_batch_size(seed: int) -> None:
    matrix = random_matrix(seed)
    reports = {
        batch: rt4chart.verify(
            matrix.sample(),
            judge=scripted(matrix.rules()),
            window=matrix.window,
            overlap=matrix.overlap,
            batch_claims=batch,
        )
        for batch in (1, 2, len(matrix.final))
    }
    for report in reports.values():
        assert [c.text for c in report.claims] == matrix.claims
        assert _vote_labels(report) == matrix.expected_votes()
        assert [c.local_label for c in report.claims] == [
            _strongest(row, [CON, ENT, BAS], empty=BAS) for row in matrix.local
        ]
        assert [c.hint_chunk for c in report.claims] == [
            None if c.local_label == BAS else next(k for k, v in enumerate(row) if v == c.local_label)
            for c, row in zip(report.claims, matrix.local, strict=True)
        ]
        assert [c.label for c in report.claims] == matrix.final
        assert report.label == _strongest(matrix.final, [CON, BAS, ENT], empty=ENT)
        assert all(c.grounded and not c.errors for c in report.claims)
    first, *others = [r.model_dump(exclude={"usage", "usage_by_judge"}) for r in reports.values()]
    assert all(other == first for other in others)


def _fail_when(predicate: Callable[[VerifyInput], bool]) -> Rewrite:
    """A judge that errs on the verification requests ``predicate`` picks."""

    def rewrite(request: JudgeRequest, response: JudgeResponse) -> JudgeResponse:
        if isinstance(request.payload, VerifyInput) and predicate(request.payload):
            return JudgeResponse(error="judge unavailable", usage=response.usage, judge=response.judge)
        return response

    return rewrite


def test_a_failed_local_call_is_a_missing_vote_with_an_error() -> None:
    backend = running_example_judge()
    backend.rewrite = _fail_when(lambda payload: payload.chunk == 1)
    report = _run_example(backend)
    lasts_14_days = report.claims[2]
    assert [v.label for v in lasts_14_days.votes] == [BAS, None, ENT]
    assert lasts_14_days.votes[1].error == "judge failed: judge unavailable"
    assert (lasts_14_days.local_label, lasts_14_days.hint_chunk) == (ENT, 2)
    assert "chunk 1: judge failed: judge unavailable" in lasts_14_days.errors
    assert [c.label for c in report.claims] == [CON, CON, ENT, ENT, BAS]


def test_a_failed_global_call_keeps_the_local_label_and_says_so() -> None:
    backend = running_example_judge()
    backend.rewrite = _fail_when(lambda payload: payload.stage == "global")
    report = _run_example(backend)
    assert [c.label for c in report.claims] == [c.local_label for c in report.claims]
    assert all(
        any(error.startswith("global verification failed") for error in claim.errors)
        for claim in report.claims
    )


def _drop_second_judgement(request: JudgeRequest, response: JudgeResponse) -> JudgeResponse:
    """A judge that forgets the second claim of every batch."""
    if not isinstance(response.parsed, VerifyOutput) or len(response.parsed.judgements) < 2:
        return response
    kept = [j for j in response.parsed.judgements if j.claim != 1]
    return response.model_copy(update={"parsed": VerifyOutput(judgements=kept)})


def test_a_batched_reply_that_leaves_a_claim_out_is_not_trusted() -> None:
    # Its judgements are not exactly the claims asked: every claim of the batch is asked alone,
    # and each claim's errors say so.
    backend = running_example_judge()
    backend.rewrite = _drop_second_judgement
    report = _run_example(backend)
    assert [c.label for c in report.claims] == [CON, CON, ENT, ENT, BAS]
    assert all(any("batched reply not used" in error for error in claim.errors) for claim in report.claims)
    for claim in (report.claims[0].text, report.claims[1].text):
        assert [len(r.payload.claims) for r in backend.requests_for_claim(claim, "local")][:2] == [5, 1]


@pytest.mark.parametrize("context", ["", "  \n ", [], ["", " "]], ids=repr)
def test_an_empty_context_makes_every_claim_baseless_without_asking(context: str | list[str]) -> None:
    # Even a judge that entails everything is never shown an empty context.
    backend = scripted({"default": "entailed"})
    sample = Sample(id="empty", context=context, answer="The sky is green. Grass is blue.")
    report = rt4chart.verify(sample, judge=backend)
    assert (report.context_sentences, report.chunks) == (0, 0)
    assert [(c.label, c.votes) for c in report.claims] == [(BAS, []), (BAS, [])]
    assert report.label == BAS
    assert [r.task for r in backend.requests] == ["decompose"]
