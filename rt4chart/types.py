"""The data model: what goes into an audit and what comes out of it.

Offsets are Python string indices, end exclusive, everywhere.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from enum import StrEnum
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    computed_field,
    field_validator,
    model_serializer,
    model_validator,
)

from rt4chart.conversations import ChatMessage, UserStatements, conversation_fields
from rt4chart.documents import Document, UnitAnchor, render_document
from rt4chart.languages import normalize_language


def describe_validation_error(error: ValidationError) -> str:
    """A pydantic error as one line: ``field.path: problem; ...`` (a check of the whole object: the problem
    alone), without pydantic's ``Value error,`` prefix."""
    problems = []
    for item in error.errors():
        message = item["msg"].removeprefix("Value error, ")
        where = ".".join(str(part) for part in item["loc"])
        problems.append(f"{where}: {message}" if where else message)
    return "; ".join(problems)


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


def merge_spans(spans: Iterable[Span]) -> list[Span]:
    """Sort spans, drop empty ones, and merge those that overlap or touch."""
    merged: list[Span] = []
    for span in sorted((s for s in spans if s.end > s.start), key=lambda s: (s.start, s.end)):
        if merged and span.start <= merged[-1].end:
            merged[-1] = Span(start=merged[-1].start, end=max(merged[-1].end, span.end))
        else:
            merged.append(span)
    return merged


GoldKind = Literal["contradiction", "baseless"]
"""The paper's two kinds of hallucination: conflicts with the context, or information it lacks."""


class GoldAnnotation(BaseModel):
    """One annotated hallucination with the type the benchmark gives it."""

    span: Span | None = None
    """Where it is in the answer; ``None`` when the annotator gave no offsets."""
    label: str
    """The benchmark's own label (``Evident Conflict``, ``Subtle Baseless Info``,
    ``Unwanted.Intrinsic``, ...)."""
    kind: GoldKind | None = None
    """``contradiction`` (RAGTruth Conflict, FaithBench intrinsic) or ``baseless`` (RAGTruth
    Baseless Info, FaithBench extrinsic); ``None`` when the benchmark gives no such type."""
    evidence: Span | None = None
    """The context span the annotator cited for it, when there is one."""


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
    typed: bool = False
    """Whether the dataset types its annotations (contradiction vs baseless); the
    contradiction and baseless detection metrics count only such samples."""
    annotations: list[GoldAnnotation] = Field(default_factory=list)
    """The hallucination annotations behind ``spans`` with their types (typed datasets only)."""

    def has_kind(self, kind: GoldKind) -> bool | None:
        """Whether annotators marked a ``kind`` hallucination; ``None`` when unknown (an untyped
        dataset, or an annotation of this sample without a type)."""
        if not self.typed or self.hallucinated is None or any(a.kind is None for a in self.annotations):
            return None
        return any(a.kind == kind for a in self.annotations)


class TraceSource(BaseModel):
    """Where a sample read from a trace came from (:mod:`rt4chart.records.traces`, :mod:`rt4chart.records.langfuse`,
    :mod:`rt4chart.records.phoenix`): the ids that find the turn again in the tracing backend. Ids are as the
    source spells them (hex in OTLP/JSON and Phoenix; Langfuse's trace and observation ids)."""

    trace_id: str
    """The trace that recorded the turn."""
    root_span_id: str | None = None
    """The trace's root span (no parent in the trace), when it has exactly one."""
    answer_span_id: str | None = None
    """The LLM span whose output is the audited answer (in an error record: the LLM span that gave none)."""
    question_span_id: str | None = None
    """The span whose input is the question."""
    retriever_span_ids: list[str] = Field(default_factory=list)
    """The retriever spans whose documents are the context, in the context's order."""
    tool_span_ids: list[str] = Field(default_factory=list, exclude_if=lambda value: not value)
    """The tool spans (an agent's tool calls) whose results are documents of the context, in its order."""


class Sample(BaseModel):
    """One answer to audit, with the context it was generated from."""

    id: str
    """Caller's identifier, copied to the output record."""
    context: str | list[str]
    """The retrieved context: one string, or a list of passages (in the input, a passage may be an
    object ``{"id": "doc-7", "text": "..."}``: its text is kept here, its id in ``passage_ids``).
    A sample given ``documents`` instead has their rendered texts here."""
    documents: list[Document] | None = Field(default=None, exclude_if=lambda value: value is None)
    """The input's ``documents`` (:mod:`rt4chart.documents`: prose, JSON values, tables), each one passage
    of ``context`` and named in ``passage_ids``; a conversation's own documents (its tool results and
    messages) come first. ``None`` when the input gave ``context``."""
    messages: list[ChatMessage] | None = Field(default=None, exclude_if=lambda value: value is None)
    """An agent's conversation, OpenAI-style (:mod:`rt4chart.conversations`): its last assistant message is
    ``answer``, the last user message before it ``question``, its tool results and messages documents."""
    user_statements: UserStatements = Field(default="evidence", exclude_if=lambda value: value == "evidence")
    """In a conversation: whether the user's own messages may ground a claim (``evidence``) or not (``ignore``)."""
    answer_message: int | None = Field(default=None, ge=0, exclude_if=lambda value: value is None)
    """In a conversation: the 0-based index of the assistant message to audit; ``None``: the last one with text."""
    earlier_turns: list[str] = Field(default_factory=list, exclude=True)
    """The documents that are the assistant's earlier turns of a conversation: support found only there
    never grounds a claim (derived from ``messages``, never written)."""
    passage_ids: list[str] | None = Field(default=None, exclude_if=lambda value: value is None)
    """The passages' own ids when the input named them (citation markers may cite them); ``None``
    when passages are cited by their 1-based position."""
    question: str | None = None
    """The user question the answer responds to, if any."""
    answer: str
    """The generated answer under audit."""
    language: str | None = None
    """The answer's language as an ISO 639-1 code (``"de"``, ``"ja"``) when the input line gives one;
    ``None``: ``--language``, else detected (:func:`rt4chart.languages.detect_language`)."""

    @field_validator("language")
    @classmethod
    def _language_code(cls, language: str | None) -> str | None:
        return None if language is None else normalize_language(language)
    gold: Gold | None = None
    """Reference labels for evaluation; ignored by the verifier."""
    trace: TraceSource | None = Field(default=None, exclude_if=lambda value: value is None)
    """The trace and spans the sample was read from (``rt4 verify --input-format otlp``); copied to the
    record."""

    @model_serializer(mode="wrap")
    def _documents_stand_for_their_passages(self, handler: SerializerFunctionWrapHandler) -> Any:
        # A sample read from documents is written back as documents, so that it reads back the same.
        data = handler(self)
        if self.documents is not None and isinstance(data, dict):
            data.pop("context", None)
            data.pop("passage_ids", None)
        if self.messages is not None and isinstance(data, dict):
            # A conversation is written back as its messages, beside the documents it was given.
            derived = len(conversation_fields(self.messages, self.user_statements, self.answer_message)["documents"])
            for key in ("answer", "question"):
                data.pop(key, None)
            given = data.get("documents", [])[derived:]
            if given:
                data["documents"] = given
            else:
                data.pop("documents", None)
        return data

    @model_validator(mode="before")
    @classmethod
    def _rendered_documents(cls, data: Any) -> Any:
        # `documents` is the context's other shape: each document becomes one named passage. A
        # conversation's tool results and messages become documents first.
        if isinstance(data, dict) and data.get("messages") is not None:
            data = _conversation_documents(data)
        elif isinstance(data, dict) and "earlier_turns" in data:
            raise ValueError("earlier_turns: derived from messages, not an input field")
        if not isinstance(data, dict) or data.get("documents") is None:
            return data
        if "context" in data:
            raise ValueError("give either context or documents, not both")
        given = data["documents"]
        if not isinstance(given, list) or not given:
            raise ValueError('documents: a non-empty list of {"id", "text" | "data" | "table"} objects')
        documents: list[Document] = []
        context: list[str] = []
        for position, document in enumerate(given):
            try:
                documents.append(Document.model_validate(document))
                context.append(render_document(documents[-1]).text)
            except ValidationError as error:
                raise ValueError(f"documents[{position}]: {describe_validation_error(error)}") from None
            except ValueError as error:  # a table that does not parse
                raise ValueError(f"documents[{position}]: {error}") from None
        ids = [document.id for document in documents]
        if len(set(ids)) != len(ids):
            raise ValueError(f"documents: ids must be unique, got {ids}")
        return {**data, "documents": documents, "context": context, "passage_ids": ids}

    @model_validator(mode="before")
    @classmethod
    def _named_passages(cls, data: Any) -> Any:
        # Passages given as {"id", "text"} objects: the text is the passage, the id is how it is cited.
        context = data.get("context") if isinstance(data, dict) else None
        if not isinstance(context, list) or not any(isinstance(passage, dict) for passage in context):
            return data
        if not all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in context):
            raise ValueError('context: a context that names its passages gives each as {"id": ..., "text": "..."}')
        ids = [str(p["id"]) if p.get("id") is not None else str(position + 1) for position, p in enumerate(context)]
        if len(set(ids)) != len(ids):
            raise ValueError(f"context: passage ids must be unique, got {ids}")
        return {**data, "context": [p["text"] for p in context], "passage_ids": ids}


def _conversation_documents(data: dict[str, Any]) -> dict[str, Any]:
    """An input line with ``messages`` as one with ``answer``, ``question`` and ``documents``."""
    if given := [key for key in ("answer", "question", "context") if key in data]:
        raise ValueError(f"a conversation's answer, question and context come from its messages: "
                         f"give messages without {', '.join(given)}")
    if not isinstance(data["messages"], list):
        raise ValueError("messages: a list of OpenAI-style chat messages")
    messages = []
    for position, message in enumerate(data["messages"]):
        try:
            messages.append(ChatMessage.model_validate(message))
        except ValidationError as error:
            raise ValueError(f"messages[{position}]: {describe_validation_error(error)}") from None
    answer_message = data.get("answer_message")
    if answer_message is not None and (isinstance(answer_message, bool) or not isinstance(answer_message, int)):
        raise ValueError("answer_message: the 0-based index of an assistant message")
    fields = conversation_fields(messages, data.get("user_statements", "evidence"), answer_message)
    documents = [*fields.pop("documents"), *(data.get("documents") or [])]
    if not documents:
        raise ValueError("messages: nothing to check the answer against (no tool result, document or statement)")
    return {**data, **fields, "messages": messages, "documents": documents}


class Sentence(BaseModel):
    """A sentence of a context or answer, with its offsets into that text."""

    index: int
    """Position of the sentence in its text, from 0."""
    start: int
    """Offset of the first character."""
    end: int
    """Offset one past the last character."""
    text: str
    """Exactly ``source[start:end]`` (an answer sentence that carries citation markers: that text
    with its markers taken out, :mod:`rt4chart.method.citations`)."""
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


class EvidenceSource(BaseModel):
    """Where a piece of evidence sits in the sample's own inputs: which document (or named passage),
    where in its text, and, for a structured document, which fields or cells it quotes."""

    document: str
    """The document's id (a passage without one: its 1-based position)."""
    start: int
    """Offset of the quote in that document's text (a structured document: its rendered text)."""
    end: int
    """Offset one past the quote's end in that document's text (a quote that runs into the next
    document ends with this one: its source is the document it starts in)."""
    units: list[UnitAnchor] = Field(default_factory=list, exclude_if=lambda value: not value)
    """The fields (JSON path) or cells (row and column) the quote overlaps, in text order; empty for prose."""

    def describe(self) -> str:
        """``kb-1 · characters 0\u201330`` or ``sales · characters 36\u201370 · row 2, column revenue ($[1].revenue)``
        (an en dash between the offsets; the HTML report writes the same words)."""
        units = [f"row {u.row}, column {u.column} ({u.path})" if u.row is not None else u.path for u in self.units]
        return " \u00b7 ".join([self.document, f"characters {self.start}\u2013{self.end}", *units])


EvidenceMatch = Literal["exact", "whitespace", "folded", "case"]
"""How a quote was found in the context (see :attr:`Evidence.match`)."""


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
    match: EvidenceMatch = "exact"
    """How the judge's quote matched: ``exact`` (verbatim), ``whitespace`` (after whitespace runs
    were compared as one space), ``folded`` (typographic punctuation too: curly quotes, dashes,
    ``…``, odd spaces, full-width forms) or ``case`` (letter case too, the last resort)."""
    source: EvidenceSource | None = Field(default=None, exclude_if=lambda value: value is None)
    """The document (and field or cell) the quote comes from, for a context of passages or documents;
    ``None`` (and left out of the record) for a single-string context."""


DecidedBy = Literal["head", "number_guard", "contradiction_guard", "substitution_guard", "clause_guard",
                    "no_content_overlap", "short_claim", "absent_numbers", "no_content"]
"""What decided an embedded verdict: the calibrated head against its threshold, or a guard rule
that overrides it (see :class:`JudgeScore`)."""


class JudgeScore(BaseModel):
    """The numbers behind a scoring judge's verdict (the embedded judge), each named for what it is."""

    p_unsupported: float
    """The head's calibrated probability that the claim is NOT entailed (what the ECE figures
    measure). The head labels a claim entailed only when this is below ``threshold``."""
    threshold: float
    """The decision threshold on ``p_unsupported``, chosen on dev data for recall: often well below
    0.5, so a baseless verdict can carry a ``p_unsupported`` below 0.5. A calibrated profile's
    ``claim_thresholds`` (``rt4 calibrate``) replaces it."""
    decided_by: DecidedBy
    """``head`` when ``p_unsupported`` against ``threshold`` decided; else the guard rule that did
    (``number_guard``: a number the context states differently; ``contradiction_guard``: a negation
    or antonym on a near-identical sentence; ``substitution_guard``: a sentence in view copied with one
    word changed, where the change reverses it, names another name, month or unit, or states a hedge
    as certain; ``clause_guard``: a sentence in view copied word for word with ", and" and a clause
    the context does not mention appended; ``no_content_overlap``: none of the claim's content
    words in view; ``short_claim``: a short claim with a word not in view; ``absent_numbers``:
    numbers the context never states in a claim mostly not in view; ``no_content``: nothing to
    check), whatever ``p_unsupported`` says."""

    def describe(self) -> str:
        """One line a reader cannot misread: ``P(not entailed) 0.05 (threshold 0.145) · decided by head``."""
        return (
            f"P(not entailed) {self.p_unsupported:.4g} (entailed below {self.threshold:.4g}) "
            f"\u00b7 decided by {self.decided_by.replace('_', ' ')}"
        )


class Verdict(BaseModel):
    """What a judge concluded about a claim, once checked against the context: the fields that a
    chunk's vote and a claim's final verdict share."""

    label: Label | None = None
    """The verdict; ``None`` when there is none (skipped, or the judge call failed)."""
    evidence: list[Evidence] = Field(default_factory=list)
    """Evidence for the label, anchored in the context (inside the chunk for a vote); empty for baseless."""
    rationale: str = ""
    """The judge's short explanation of the label."""
    confidence: float | None = None
    """The judge's confidence in the label, when it reports one: an LLM's own figure; for the
    embedded judge the head's probability of the label's side (``1 - p_unsupported`` for entailed,
    ``p_unsupported`` otherwise), which falls below 0.5 whenever the threshold or a guard, not the
    head's majority, decided (see ``score``)."""
    score: JudgeScore | None = None
    """For a scoring judge (the embedded one): the calibrated probability, the threshold and what
    decided the verdict; ``None`` for LLM judges."""
    grounded: bool = True
    """False when the judge's evidence could not be found in the context even after a re-ask."""
    judge: str | None = None
    """Judge that gave the label (differs by claim in a cascade); ``None`` when there is no label."""

    def verdict_fields(self) -> dict[str, Any]:
        """The shared verdict fields only, to carry a verdict from one model to another."""
        return {name: getattr(self, name) for name in Verdict.model_fields}


class Vote(Verdict):
    """The local verdict of one chunk on one claim."""

    chunk: int
    """Index of the chunk that was judged."""
    skipped: str | None = None
    """Why no judge was asked (e.g. the claim was already contradicted); ``None`` if judged."""
    error: str | None = None
    """Why the vote is missing when the judge call failed."""


CitationVerdict = Literal["supported", "misattributed", "unsupported", "uncited"]
"""How a claim's citation stands (see :class:`ClaimCitation`)."""


class CitationMarker(BaseModel):
    """One citation marker of an answer (``[1]``, ``[1, 3]``, ``[^2]``, ``(Source 2)``, ...),
    taken out of the claim text the judge sees and kept here with its place in the answer."""

    start: int
    """Offset of the marker in the answer as given."""
    end: int
    """Offset one past the marker."""
    text: str
    """Exactly ``answer[start:end]``."""
    refs: list[str]
    """What the marker cites, as written (``1``, ``doc-7``)."""
    passages: list[int]
    """The context passages those refs name, 0-based (a ref that names no passage is left out)."""
    sentence_index: int
    """The answer sentence the marker belongs to: the last one that starts before it."""


class SubsetCheck(BaseModel):
    """A claim judged against some of its cited passages only (for ALCE citation precision)."""

    passages: list[int]
    """The passages the judge saw, 0-based."""
    label: Label | None
    """The verdict against them; ``None`` when the judge call failed."""


class ClaimCitation(BaseModel):
    """A claim's citations checked against where its support really lies."""

    cited: list[int] = Field(default_factory=list)
    """Passages its answer sentence cites, 0-based, in order of first citation."""
    unresolved: list[str] = Field(default_factory=list)
    """Refs of its markers that name no passage of the context (``[7]`` of a 3-passage context)."""
    evidence_passages: list[int] = Field(default_factory=list)
    """Passages that hold the evidence of the claim's final verdict."""
    supporting: list[int] = Field(default_factory=list)
    """Passages shown to support the claim: its cited passages that hold its evidence (or the cited
    check's), else, when the claim is entailed, the passages its evidence comes from."""
    verdict: CitationVerdict | None = None
    """``supported`` (entailed, and a cited passage holds its evidence), ``misattributed``
    (entailed, but only by passages it does not cite), ``unsupported`` (cited, but not entailed by
    the context), ``uncited`` (entailed, no citation, in an answer that cites elsewhere); ``None``
    for a claim with no verdict, or not entailed and citing nothing."""
    cited_check: Verdict | None = None
    """The extra verification of the claim against its cited passages only (run for an entailed
    claim whose evidence is not all inside the passages it cites); ``None`` when it did not run."""
    relevant: list[int] = Field(default_factory=list)
    """Cited passages that count for ALCE citation precision (ALCE's eval.py): the one citation of
    a claim its cited passages support; of several, each that alone supports the claim, or without
    which the rest no longer do; none for a claim citing a ref that names no passage."""
    subset_checks: list[SubsetCheck] = Field(default_factory=list)
    """The judge's verdicts on the claim against subsets of its cited passages (one passage alone,
    or all but one) that ALCE precision needed and the evidence could not settle."""


class AnswerCitations(BaseModel):
    """The citation audit of one answer that carries citation markers."""

    markers: list[CitationMarker] = Field(default_factory=list)
    """Every marker found in the answer, in answer order."""
    passage_ids: list[str] | None = None
    """The context passages' ids when the input named them."""
    verdicts: dict[str, int] = Field(default_factory=dict)
    """Claims per citation verdict (``supported``, ``misattributed``, ``unsupported``, ``uncited``)."""
    precision: float | None = None
    """ALCE citation precision: citations that count (:attr:`ClaimCitation.relevant`) over the
    citations of the answer's claims (a claim citing a ref that names no passage adds none), 0 when
    none counts as a citation; ``None`` when no claim has a verdict."""
    recall: float | None = None
    """ALCE citation recall: claims supported by the passages they cite (every ref naming one) over
    claims with a verdict; ``None`` when no claim has a verdict."""
    checks: int = 0
    """Claims verified again against their cited passages only (the extra verification)."""


class RunCitations(BaseModel):
    """The citation figures of a run, over its answers that carry citation markers; filled one
    record at a time (:meth:`add`), so a streamed run holds no records for it."""

    answers: int = 0
    """Answers with citation markers."""
    verdicts: dict[str, int] = Field(default_factory=dict)
    """Claims per citation verdict, summed over those answers."""
    answers_with: dict[str, int] = Field(default_factory=dict)
    """Answers with at least one claim of each citation verdict."""
    miscited_answers: int = 0
    """Answers with a claim misattributed, unsupported or uncited (``--fail-on miscited``)."""
    precision_sum: float = 0.0
    """Sum of the answers' ALCE citation precision (over ``precision_answers`` answers)."""
    precision_answers: int = 0
    """Answers with a citation precision (some claim cites)."""
    recall_sum: float = 0.0
    """Sum of the answers' ALCE citation recall (over ``recall_answers`` answers)."""
    recall_answers: int = 0
    """Answers with a citation recall (some claim has a verdict)."""
    checks: int = 0
    """Extra verifications against cited passages only."""
    uncited_answers: int = 0
    """Answers to a list-of-passages context that cite nothing: each scores ALCE precision and
    recall 0 in the run's means, as in ALCE's eval.py."""

    def add_uncited(self) -> None:
        """Count an answer to a list-of-passages context that carries no citation marker."""
        self.uncited_answers += 1
        self.precision_answers += 1
        self.recall_answers += 1

    def add(self, audit: AnswerCitations) -> None:
        """Count one answer's citation audit."""
        self.answers += 1
        for name, count in audit.verdicts.items():
            self.verdicts[name] = self.verdicts.get(name, 0) + count
            self.answers_with[name] = self.answers_with.get(name, 0) + (count > 0)
        miscited = ("misattributed", "unsupported", "uncited")
        self.miscited_answers += any(audit.verdicts.get(name, 0) for name in miscited)
        if audit.precision is not None:
            self.precision_sum += audit.precision
            self.precision_answers += 1
        if audit.recall is not None:
            self.recall_sum += audit.recall
            self.recall_answers += 1
        self.checks += audit.checks

    @computed_field  # type: ignore[prop-decorator]
    @property
    def precision(self) -> float | None:
        """ALCE citation precision averaged over the answers to list-of-passages contexts, those
        citing nothing at 0 (ALCE averages over outputs)."""
        return self.precision_sum / self.precision_answers if self.precision_answers else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def recall(self) -> float | None:
        """ALCE citation recall averaged over the answers to list-of-passages contexts, those
        citing nothing at 0."""
        return self.recall_sum / self.recall_answers if self.recall_answers else None


class ClaimVerdict(Verdict):
    """Everything rt4chart concluded about one claim: its final label (the global verdict, or the
    local label with global verification off) with the evidence and rationale behind it."""

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
    calls: int = 0
    """Judge calls that judged this claim (a batched call counts for each of its claims)."""
    cost_usd: float = 0.0
    """This claim's share of the verification cost: each call's cost split evenly among its claims
    (the answer's decomposition is not included: it is in the record's ``usage``)."""
    errors: list[str] = Field(default_factory=list)
    """Problems met while judging this claim."""
    signals: dict[str, float] = Field(default_factory=dict)
    """White-box signals of the claim, by name, when ``rt4 verify --signals`` asked for them: a
    signal ``S`` over the answer tokens inside the claim's answer span gives ``S_mean`` and ``S_max``
    (``csr_mean``/``csr_max``: REFIND's context sensitivity ratio, :mod:`rt4chart.signals.csr`;
    ``probe_mean``/``probe_max``: an AggTruth probe's scores, :mod:`rt4chart.signals.aggtruth`).
    A new signal adds keys here, never a field."""
    earlier_turn_only: bool = Field(default=False, exclude_if=lambda value: not value)
    """True when the judge's evidence lay only in the assistant's earlier turns of a conversation
    (:mod:`rt4chart.conversations`): such support never grounds a claim, so the claim is baseless and the
    judge's own verdict is in ``judge_verdict``. Left out of the record when false."""
    citation: ClaimCitation | None = Field(default=None, exclude_if=lambda value: value is None)
    """Its citations checked (an answer with citation markers only; left out of the record otherwise)."""
    judge_verdict: Verdict | None = Field(default=None, exclude_if=lambda value: value is None)
    """The judge's own final verdict (label, confidence, evidence, rationale) when a calibrated profile's
    ``claim_threshold`` changed its label (:func:`rt4chart.method.settlement.settle_at_threshold`); the fields
    above are then the threshold's. Left out of the record when the threshold did not act."""

    @model_validator(mode="before")
    @classmethod
    def _signal_fields_of_older_records(cls, data: Any) -> Any:
        # Records written before the open map kept each signal in its own field.
        if isinstance(data, dict) and any(key in data for key in _OLD_CLAIM_SIGNALS):
            data = dict(data)
            moved = {key: data.pop(key) for key in _OLD_CLAIM_SIGNALS if key in data}
            data["signals"] = {**{k: v for k, v in moved.items() if v is not None}, **(data.get("signals") or {})}
        return data


_OLD_CLAIM_SIGNALS = ("csr_mean", "csr_max", "probe_mean", "probe_max")
"""The per-claim signal fields of records written before :attr:`ClaimVerdict.signals`."""


class Usage(BaseModel):
    """Judge usage and cost, summed over calls."""

    calls: int = 0
    """Requests that reached the judge, re-asks and retries included; cache hits are not calls."""
    prompt_tokens: int = 0
    """Prompt tokens reported by the judge (0 for cache hits)."""
    cached_prompt_tokens: int = 0
    """Of :attr:`prompt_tokens`, those the provider read from its prompt cache
    (``prompt_tokens_details.cached_tokens``, Anthropic's ``cache_read_input_tokens``), priced at
    the judge's cached-input rate."""
    cache_write_prompt_tokens: int = 0
    """Of :attr:`prompt_tokens`, those written to the provider's prompt cache (Anthropic's
    ``cache_creation_input_tokens``), priced at the judge's cache-write rate."""
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
            cached_prompt_tokens=self.cached_prompt_tokens + other.cached_prompt_tokens,
            cache_write_prompt_tokens=self.cache_write_prompt_tokens + other.cache_write_prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
            cache_hits=self.cache_hits + other.cache_hits,
        )


class DecompositionStats(BaseModel):
    """How an answer was split into claims."""

    mode: str
    """``rules``, ``judge`` (one call for the answer), ``judge-per-sentence`` or ``holistic``."""
    sentences: int = 0
    """Answer sentences."""
    without_claims: int = 0
    """Sentences the decomposer found no fact in (greetings, questions, statements of not knowing)."""
    reasked: int = 0
    """Sentences asked again alone because the batched reply numbered them wrongly or left them out."""
    rule_fallback: int = 0
    """Sentences whose claims came from the rule decomposer because the judge could not decompose them."""
    rejected_claims: int = 0
    """Claims the judge gave that are not a piece of their answer sentence (a template placeholder
    such as ``<claim>``, a number or name the answer does not state, words it does not say): each
    rejection is a decomposition failure, so the sentence is asked again, then given its clauses."""


class TokenSignal(BaseModel):
    """One answer token's white-box signal values, anchored to answer characters."""

    start: int
    """Offset of the token's first answer character (clipped to the answer when the token straddles it)."""
    end: int
    """Offset one past the token's last answer character."""
    logprob_with_context: float
    """log p(token | context, question, earlier answer tokens), by teacher forcing."""
    logprob_without_context: float
    """log p(token | question, earlier answer tokens), by teacher forcing."""
    csr: float
    """Context sensitivity ratio: ``logprob_with_context / (logprob_without_context + 1e-8)``."""
    flagged: bool
    """True when ``csr >= delta``."""


class SignalReport(BaseModel):
    """A model's token-level signals for one answer."""

    signal: str
    """Which signal (``csr``)."""
    model: str
    """Identity of the model that produced it (name and content hash, or server and model)."""
    template_version: str
    """Hash of the prompt template that placed the context and question."""
    delta: float
    """Flagging threshold applied to the signal."""
    tokens: list[TokenSignal] = Field(default_factory=list)
    """Per-answer-token values, in answer order."""
    spans: list[Span] = Field(default_factory=list)
    """Flagged tokens merged into answer character spans (whitespace at their edges trimmed)."""
    flagged: bool = False
    """True when any token is flagged."""
    cached: bool = False
    """True when the token values came from the signal cache."""


class ProbeTokenScore(BaseModel):
    """One answer token's score from a trained attention probe, anchored to answer characters."""

    start: int
    """Offset of the token's first answer character."""
    end: int
    """Offset one past the token's last answer character."""
    score: float
    """Largest P(hallucinated) of the windows that hold the token."""
    flagged: bool
    """True when ``score`` reaches the probe's threshold."""


class ProbeWindowScore(BaseModel):
    """One window of answer tokens and the probe's P(hallucinated) for it."""

    start: int
    """Offset of the window's first answer character."""
    end: int
    """Offset one past the window's last answer character."""
    score: float
    """The probe's P(hallucinated) of the window's averaged features."""


class AttentionSignalReport(BaseModel):
    """A trained attention probe's verdict on one answer (AggTruth features of a self-hosted model)."""

    signal: str = "aggtruth"
    """Which signal."""
    model: str
    """Identity of the model whose attention was read (name and content hash)."""
    template_version: str
    """Hash of the prompt template that placed the context and question."""
    probe: str
    """The probe: feature, selector and the sha256 of its file."""
    threshold: float
    """Windows and tokens scoring at or above it are flagged."""
    score: float
    """Answer-level score: the largest window score."""
    windows: list[ProbeWindowScore] = Field(default_factory=list)
    """Window scores, in answer order (8 tokens sliding by one)."""
    tokens: list[ProbeTokenScore] = Field(default_factory=list)
    """Per-answer-token scores, in answer order."""
    spans: list[Span] = Field(default_factory=list)
    """Flagged tokens merged into answer character spans (whitespace at their edges trimmed)."""
    flagged: bool = False
    """True when any window is flagged."""
    cached: bool = False
    """True when the attention features came from the signal cache."""


def answer_sha256(answer: str) -> str:
    """sha256 of an answer's text (UTF-8): what a record keeps of the answer it audited."""
    return hashlib.sha256(answer.encode("utf-8", "surrogatepass")).hexdigest()


def context_sha256(context: str | list[str]) -> str:
    """sha256 of a sample's context (its JSON: one string, or the list of passage texts): what tells
    the answers given one context (``rt4 calibrate`` keeps them in one fold)."""
    return hashlib.sha256(json.dumps(context).encode()).hexdigest()


class AuditRecord(BaseModel):
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
    """Problems with the input or the audit."""
    incomplete: bool = False
    """True when the input was fine but judge failures left the verdict open (``label`` is then
    ``None`` unless a contradicted claim decides it); a record with errors, no label and this false
    is invalid input."""
    decomposition: DecompositionStats | None = None
    """How the answer was split into claims (``None`` for the direct baseline and invalid input)."""
    global_stage: str | None = None
    """``full``, ``off``, or ``skipped: one chunk`` (``--global-auto``: the local verdicts stand)."""
    gold: Gold | None = None
    """Gold labels carried through from the input, for scoring."""
    trace: TraceSource | None = Field(default=None, exclude_if=lambda value: value is None)
    """The trace and spans of the sample (:class:`TraceSource`), when it was read from traces; left out
    of the record otherwise."""
    signals: dict[str, float] = Field(default_factory=dict)
    """White-box signals of the whole answer, by name (``S_max``: the largest token value of signal
    ``S``), when ``rt4 verify --signals`` asked for them; a new signal adds keys, never a field."""
    signal_tokens: dict[str, SignalReport | AttentionSignalReport] = Field(default_factory=dict)
    """Each signal's token-level scores and flagged spans, by the signal's name (``csr``:
    :class:`SignalReport`; ``aggtruth``: :class:`AttentionSignalReport`)."""
    passages: int | None = Field(default=None, exclude_if=lambda value: value is None)
    """Passages of a list-of-passages context (what an answer may cite); left out of the record for
    a single-string context. A run's ALCE citation means count such answers citing nothing as 0."""
    citations: AnswerCitations | None = Field(default=None, exclude_if=lambda value: value is None)
    """The citation audit of an answer with citation markers (:mod:`rt4chart.method.citations`); left out
    of the record for an answer without any."""

    @model_validator(mode="before")
    @classmethod
    def _signal_fields_of_older_records(cls, data: Any) -> Any:
        # Records written before the open maps held CSR under "signals" and the probe under "attention".
        if not isinstance(data, dict):
            return data
        old_csr, old_probe = data.get("signals"), data.get("attention")
        if not (isinstance(old_csr, dict) and "tokens" in old_csr) and "attention" not in data:
            return data
        data = dict(data)
        data.pop("attention", None)
        tokens = dict(data.get("signal_tokens") or {})
        if isinstance(old_csr, dict) and "tokens" in old_csr:
            tokens["csr"] = old_csr
        if old_csr is None or "csr" in tokens:
            # The old CSR field (null when no signal ran) is not the new per-record map.
            data["signals"] = {}
        if old_probe is not None:
            tokens["aggtruth"] = old_probe
        data["signal_tokens"] = tokens
        return data
    input_hash: str | None = None
    """sha256 over the input line's bytes and the audit configuration (judge, prompt version,
    options); ``--resume`` keeps a record only when it matches. ``None`` for an unreadable line."""
    answer_sha256: str | None = None
    """sha256 of the audited answer text: ``rt4 diff`` tells an answer that changed between two runs
    from one judged differently. ``None`` for an unreadable line (and in records made before it)."""
    context_sha256: str | None = None
    """sha256 of the sample's context (:func:`context_sha256`): answers to one context share it, so
    ``rt4 calibrate`` keeps them in one fold. ``None`` for an unreadable line (and in records made
    before it)."""
    language: str | None = None
    """The language the answer was audited as (ISO 639-1: given by the line or ``--language``, else
    detected); ``None`` for an unreadable line and in records made before it."""


Report = AuditRecord
"""Deprecated: the old name of :class:`AuditRecord`, importable for one release; write ``AuditRecord`` in
new code (``Report`` also named ``report.py``, now ``progress.py``, and ``rt4 report``, which writes HTML)."""
