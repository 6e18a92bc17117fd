"""The data model: what goes into an audit and what comes out of it.

Offsets are Python string indices, end exclusive, everywhere.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class Label(StrEnum):
    """A verdict on a claim or an answer."""

    ENTAILED = "entailed"
    CONTRADICTED = "contradicted"
    BASELESS = "baseless"


class Span(BaseModel):
    """A half-open character range ``[start, end)`` of some text."""

    model_config = ConfigDict(frozen=True)

    start: int = Field(ge=0)
    """First character of the span."""
    end: int = Field(ge=0)
    """One past the last character of the span."""


class Gold(BaseModel):
    """Human labels that come with a benchmark sample; never shown to a judge."""

    hallucinated: bool | None = None
    """Whether annotators marked any part of the answer as hallucinated."""
    spans: list[Span] = Field(default_factory=list)
    """Hallucinated character spans of the answer."""
    task_type: str | None = None
    """Task family of the sample (e.g. ``QA``, ``Summary``), for per-task metrics."""
    evidence: list[Span] = Field(default_factory=list)
    """Context spans that annotators cite as evidence, when the dataset has them."""


class Sample(BaseModel):
    """One answer to audit, with the context it was generated from."""

    id: str
    """Caller's identifier, copied to the output record."""
    context: str | list[str]
    """The retrieved context: one string, or a list of passages."""
    question: str | None = None
    """The user question the answer responds to, if any."""
    answer: str
    """The generated answer under audit."""
    gold: Gold | None = None
    """Reference labels for evaluation; ignored by the verifier."""


class Sentence(BaseModel):
    """A sentence of a context or answer, with its offsets into that text."""

    index: int
    """Position of the sentence in its text, from 0."""
    start: int
    """Offset of the first character."""
    end: int
    """Offset one past the last character."""
    text: str
    """Exactly ``source[start:end]``."""
    passage: int = 0
    """Index of the passage that holds the sentence (0 for a single-string context)."""


class Chunk(BaseModel):
    """A window of consecutive context sentences."""

    index: int
    """Position of the chunk in the sliding window sequence, from 0."""
    first: int
    """Index of the first sentence in the chunk."""
    last: int
    """Index of the last sentence in the chunk (inclusive)."""

    @property
    def sentence_ids(self) -> range:
        return range(self.first, self.last + 1)


class Claim(BaseModel):
    """A self-contained factual statement taken from one answer sentence."""

    index: int
    """Position of the claim in the answer, from 0."""
    text: str
    """The claim, rewritten to stand on its own."""
    sentence_index: int | None
    """Index of the answer sentence the claim came from; ``None`` for holistic claims."""
    answer_span: Span | None
    """Offsets of that sentence in the answer; ``None`` when no span is known."""


class Evidence(BaseModel):
    """A context passage that supports or refutes a claim, anchored in the context."""

    start: int
    """Offset of the quote in the joined context."""
    end: int
    """Offset one past the quote's end."""
    text: str
    """Exactly ``context[start:end]``."""
    sentence_ids: list[int]
    """Context sentences the quote overlaps."""


class Vote(BaseModel):
    """The local verdict of one chunk on one claim."""

    chunk: int
    """Index of the chunk that was judged."""
    label: Label | None
    """The chunk's verdict; ``None`` when skipped or when the judge call failed."""
    evidence: list[Evidence] = Field(default_factory=list)
    """Provisional evidence inside the chunk."""
    rationale: str = ""
    """The judge's short explanation of the vote."""
    confidence: float | None = None
    """The judge's confidence in the vote, when it reports one."""
    grounded: bool = True
    """False when the vote's evidence was not found in the chunk, even after a re-ask."""
    judge: str | None = None
    """Judge that gave the vote (differs by claim in a cascade); ``None`` when skipped or failed."""
    skipped: str | None = None
    """Why no judge was asked (e.g. the claim was already contradicted); ``None`` if judged."""
    error: str | None = None
    """Why the vote is missing when the judge call failed."""


class ClaimVerdict(BaseModel):
    """Everything rt4chart concluded about one claim."""

    index: int
    """Position of the claim in the answer."""
    text: str
    """The claim text."""
    sentence_index: int | None
    """Answer sentence the claim came from."""
    answer_span: Span | None
    """Offsets of that sentence in the answer."""
    votes: list[Vote] = Field(default_factory=list)
    """Per-chunk local votes, in chunk order."""
    local_label: Label | None = None
    """OR-join of the votes (contradicted > entailed > baseless)."""
    hint_chunk: int | None = None
    """Chunk passed to global verification as a location hint (the deciding chunk)."""
    label: Label | None = None
    """Final label: the global verdict, or the local label with global verification off."""
    evidence: list[Evidence] = Field(default_factory=list)
    """Evidence for the final label, anchored in the context; empty for baseless."""
    rationale: str = ""
    """The judge's short explanation of the final label."""
    confidence: float | None = None
    """The judge's confidence in the final label, when it reports one."""
    grounded: bool = True
    """False when the judge's evidence could not be found in the context even after a re-ask."""
    judge: str | None = None
    """Judge that produced the final label (differs by claim in a cascade)."""
    calls: int = 0
    """Judge calls that judged this claim (a batched call counts for each of its claims)."""
    cost_usd: float = 0.0
    """This claim's share of the verification cost: each call's cost split evenly among its claims
    (the answer's decomposition is not included: it is in the record's ``usage``)."""
    errors: list[str] = Field(default_factory=list)
    """Problems met while judging this claim."""


class Usage(BaseModel):
    """Judge usage and cost, summed over calls."""

    calls: int = 0
    """Requests that reached the judge, re-asks and retries included; cache hits are not calls."""
    prompt_tokens: int = 0
    """Prompt tokens reported by the judge (0 for cache hits)."""
    completion_tokens: int = 0
    """Completion tokens reported by the judge (0 for cache hits)."""
    cost_usd: float = 0.0
    """Money spent, in US dollars (0 for cache hits)."""
    cache_hits: int = 0
    """Calls answered from the cache."""

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            calls=self.calls + other.calls,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
            cache_hits=self.cache_hits + other.cache_hits,
        )


class Report(BaseModel):
    """The output record of one input line."""

    id: str | None
    """Sample id, or ``None`` when the line could not be read."""
    line: int
    """1-based line number in the input file (or position in the input list)."""
    label: Label | None = None
    """AND-join of claim labels (contradicted > baseless > entailed); ``None`` on error."""
    hallucinated: bool | None = None
    """True when any claim is not entailed; ``None`` on error."""
    claims: list[ClaimVerdict] = Field(default_factory=list)
    """Claim-level verdicts in answer order."""
    spans: list[Span] = Field(default_factory=list)
    """Hallucinated answer spans: sentences holding non-entailed claims, merged and sorted."""
    context_sentences: int = 0
    """Number of context sentences the context was split into."""
    chunks: int = 0
    """Number of chunks the context was split into."""
    usage: Usage = Field(default_factory=Usage)
    """Judge usage for this sample."""
    usage_by_judge: dict[str, Usage] = Field(default_factory=dict)
    """Usage split by judge (one entry per cascade stage)."""
    judge: str | None = None
    """Judge that verified the sample."""
    prompt_version: str | None = None
    """Hash of the prompt templates used."""
    errors: list[str] = Field(default_factory=list)
    """Problems with the input or the audit; a record with errors and no label is invalid."""
    gold: Gold | None = None
    """Gold labels carried through from the input, for scoring."""
    input_hash: str | None = None
    """sha256 over the input line's bytes and the audit configuration (judge, prompt version,
    options); ``--resume`` keeps a record only when it matches. ``None`` for an unreadable line."""
