"""The judge steps of the method, each declared once: what it sends, what it expects back, which
prompt template renders it and how.

The transport contract (:mod:`rt4chart.protocol`) knows no step: a request carries a payload,
messages and an output schema. This registry is where a step gets them. Backends that read
payloads (scripted, embedded, cascade), the pipeline, the tests and the prompt version all use it,
so the prompt format is written down in one place.

Adding a judge step: declare its input and output models here, a renderer from input to template
fields, one :class:`TaskSpec` in :data:`TASKS`, and a template file in ``prompts/``; then build
requests with :func:`build_request` (or a :class:`rt4chart.method.session.JudgeSession`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache, partial
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StringConstraints, WithJsonSchema, create_model
from pydantic.json_schema import SkipJsonSchema

from rt4chart.method.grounding import sentence_marker
from rt4chart.method.prompts import PromptTemplate, load_templates
from rt4chart.protocol import GenerationParams, JudgeRequest, Message
from rt4chart.types import JudgeScore, Label, Sentence, Span

# --- inputs and reply schemas ---------------------------------------------------------------------


class DecomposeInput(BaseModel):
    """What the decomposer sees: the answer's sentences and the question, never the context."""

    question: str | None
    """The user question, if any."""
    sentences: list[str]
    """Answer sentences, numbered by position."""


class DecomposeSentenceInput(BaseModel):
    """Decomposition of one answer sentence (the paper's reference decomposer): the rest of the
    answer is shown read-only, so pronouns can be resolved, and never decomposed here."""

    question: str | None
    """The user question, when the decomposer is allowed to see it."""
    sentences: list[str]
    """All answer sentences, numbered by position."""
    target: int = Field(ge=0)
    """The sentence to decompose."""


class SentenceClaims(BaseModel):
    """Judge reply schema for the decomposition of one sentence."""

    claims: list[str]
    """Self-contained claims the sentence states (empty when it states no fact)."""


class DecomposedSentence(BaseModel):
    """Claims drawn from one answer sentence."""

    sentence: int = Field(ge=0)
    """Index of the answer sentence."""
    claims: list[str]
    """Self-contained claims stated by that sentence (empty when it states no fact)."""


class DecomposeOutput(BaseModel):
    """Judge reply schema for decomposition."""

    sentences: list[DecomposedSentence]
    """One entry per answer sentence."""


class AnswerSpans(BaseModel):
    """The answer under audit and where each claim of a verify request sits in it."""

    text: str
    """The answer as given (citation markers included: the claims' spans are offsets into it)."""
    spans: list[Span | None]
    """Per claim of the request, in order: the span of its answer sentence in :attr:`text`; ``None``
    where none is known (a holistic claim)."""


class VerifyInput(BaseModel):
    """What a verifier sees for one call: claims and the context sentences in view."""

    stage: Literal["local", "global"]
    """Local (one chunk) or global (full context) verification."""
    claims: list[str]
    """Claims to judge, numbered by position in this list."""
    sentences: list[Sentence]
    """Context sentences in view: the chunk's for local, all for global."""
    chunk: int | None = None
    """Index of the chunk under judgement (local stage only)."""
    hint: list[int] | None = None
    """Sentence ids of the deciding local chunk, passed as a location hint (global stage only)."""
    question: str | None = None
    """The user question, if any."""
    local_labels: list[Label | None] | None = None
    """The first pass's label of each claim (global stage only); ``None`` in the list where every
    local call about the claim failed."""
    answer: AnswerSpans | None = None
    """The answer and each claim's span in it, for a judge that reads the answer itself (a token
    classifier: :attr:`~rt4chart.protocol.Capabilities.reads_answer`); ``None`` for every other judge,
    whose prompts, requests and cache keys do not hold it."""


class ClaimJudgement(BaseModel):
    """Judge reply for one claim."""

    claim: int = Field(ge=0)
    """Index of the claim in the request."""
    label: Label
    """entailed, contradicted or baseless."""
    evidence: list[str] = Field(default_factory=list)
    """Verbatim quotes from the context that support or refute the claim."""
    rationale: str = ""
    """One or two sentences explaining the label."""
    confidence: float | None = Field(default=None, ge=0.0, le=1.0)
    """Judge's confidence in the label, when it reports one."""
    score: SkipJsonSchema[JudgeScore | None] = None
    """A scoring judge's numbers (the embedded judge's); left out of the schema models are shown."""


class VerifyOutput(BaseModel):
    """Judge reply schema for verification: one judgement per claim of the request."""

    judgements: list[ClaimJudgement]
    """Verdicts, one per claim."""


class HolisticDecomposeInput(BaseModel):
    """Holistic decomposition (ablation): the whole answer at once, no sentence numbering."""

    question: str | None
    """The user question, if any."""
    answer: str
    """The whole answer."""
    sentences: list[str]
    """The answer's sentences (not shown to a language model; rule-reading judges use them)."""


class HolisticDecomposeOutput(BaseModel):
    """Judge reply schema for holistic decomposition."""

    claims: list[str]
    """Self-contained claims of the answer, not tied to any answer sentence."""


class DirectInput(BaseModel):
    """The direct baseline (ablation): one call over the whole context and answer."""

    question: str | None
    """The user question, if any."""
    context: str
    """The whole context (passages joined)."""
    answer: str
    """The whole answer."""
    sentences: list[str]
    """The answer's sentences (not shown to a language model; rule-reading judges use them)."""


class DirectSpan(BaseModel):
    """One hallucinated part of the answer, as the direct baseline reports it."""

    text: str
    """Verbatim quote of the answer."""
    label: Label
    """contradicted or baseless (a span labelled entailed is not a hallucination and is ignored)."""
    evidence: list[str] = Field(default_factory=list)
    """Verbatim context quotes that refute a contradicted span (the paper's direct baseline asks
    for them); empty for baseless spans."""
    rationale: str = ""
    """One sentence explaining the label."""
    confidence: float | None = Field(default=None, ge=0.0, le=1.0)
    """Judge's confidence that the span is hallucinated, when it reports one."""


class DirectOutput(BaseModel):
    """Judge reply schema for the direct baseline: the hallucinated spans (empty when faithful)."""

    spans: list[DirectSpan]
    """Hallucinated answer spans."""


class RepairItem(BaseModel):
    """One answer sentence to repair: which of its claims stay, and which go or get fixed."""

    sentence: int = Field(ge=0)
    """Position of the item in the request."""
    text: str
    """The answer sentence as it stands."""
    keep: list[str] = Field(default_factory=list)
    """Supported claims of the sentence: the rewrite must still state them."""
    fix: list[str] = Field(default_factory=list)
    """Unsupported claims to rewrite so that the context supports them (or leave out if it cannot)."""
    drop: list[str] = Field(default_factory=list)
    """Unsupported claims the rewrite must no longer state."""


class RepairInput(BaseModel):
    """What a repairing judge sees: the context and the flagged sentences of one answer."""

    question: str | None
    """The user question, if any."""
    context: list[Sentence]
    """All context sentences (a fix may draw on any of them)."""
    items: list[RepairItem]
    """The sentences to rewrite, in answer order."""


class RepairedSentence(BaseModel):
    """Judge reply for one sentence to repair."""

    sentence: int = Field(ge=0)
    """Position of the item in the request."""
    text: str
    """The rewritten sentence; empty to delete the sentence."""


class RepairOutput(BaseModel):
    """Judge reply schema for repair: one rewritten sentence per item of the request."""

    sentences: list[RepairedSentence]
    """Rewritten sentences."""


# --- rendering ------------------------------------------------------------------------------------

NO_QUESTION = "(none)"
"""What a prompt shows when the sample has no question (or the step may not see it)."""


def render_context(sentences: list[Sentence]) -> str:
    """Context sentences, one per line, each behind its marker (the one grounding strips from quotes)."""
    return "\n".join(f"{sentence_marker(s.index)} {s.text}" for s in sentences)


def render_numbered(items: list[str]) -> str:
    """Items (claims, answer sentences) one per line, behind their position: ``[i] text``."""
    return "\n".join(f"[{position}] {item}" for position, item in enumerate(items))


def _question(question: str | None) -> str:
    return question or NO_QUESTION


def _decompose_fields(payload: DecomposeInput) -> dict[str, str]:
    return {"question": _question(payload.question), "sentences": render_numbered(payload.sentences)}


def _decompose_sentence_fields(payload: DecomposeSentenceInput) -> dict[str, str]:
    return {
        "question": _question(payload.question),
        "sentences": render_numbered(payload.sentences),
        "target": str(payload.target),
        "sentence": payload.sentences[payload.target],
    }


def render_claims(claims: list[str], local_labels: list[Label | None] | None = None) -> str:
    """Claims behind their positions; in the global stage each followed by the first pass's label."""
    if local_labels is None:
        return render_numbered(claims)
    return "\n".join(
        f"[{position}] {claim}\n    first pass: {label or 'no verdict (every call failed)'}"
        for position, (claim, label) in enumerate(zip(claims, local_labels, strict=True))
    )


def _verify_template(payload: VerifyInput) -> str:
    if payload.stage == "local":
        return "verify_local"
    return "verify_global_hint" if payload.hint else "verify_global"


def _verify_fields(payload: VerifyInput) -> dict[str, str]:
    return {
        "context": render_context(payload.sentences),
        "question": _question(payload.question),
        "claims": render_claims(payload.claims, payload.local_labels),
        "hint": f"S{payload.hint[0]}-S{payload.hint[-1]}" if payload.hint else "",
    }


def _holistic_fields(payload: HolisticDecomposeInput) -> dict[str, str]:
    return {"question": _question(payload.question), "answer": payload.answer}


def _direct_fields(payload: DirectInput) -> dict[str, str]:
    return {"context": payload.context, "question": _question(payload.question), "answer": payload.answer}


REPAIR_GROUPS = ("keep", "fix", "drop")
"""The claim groups of a repair item, in the order the prompt lists them."""


def _repair_items(items: list[RepairItem]) -> str:
    def group(name: str, claims: list[str]) -> str:
        lines = "".join(f"\n  - {claim}" for claim in claims)
        return f"  {name}:{lines or ' (none)'}"

    return "\n".join(
        "\n".join([f"[{item.sentence}] {item.text}", *(group(name, getattr(item, name)) for name in REPAIR_GROUPS)])
        for item in items
    )


def _repair_fields(payload: RepairInput) -> dict[str, str]:
    return {
        "context": render_context(payload.context),
        "question": _question(payload.question),
        "items": _repair_items(payload.items),
    }


# --- bounded reply schemas (for decoding grammars) ---------------------------------------------------

BOUNDED_CLAIMS_PER_SENTENCE = 4
"""Most claims a bounded decomposition reply may draw from one sentence."""
BOUNDED_CLAIM_CHARS = 200
"""Longest claim a bounded decomposition reply may write."""
BOUNDED_EVIDENCE_QUOTES = 2
"""Most evidence quotes per judgement in a bounded verification reply."""
BOUNDED_RATIONALE_CHARS = 120
"""Longest rationale a bounded verification reply may write."""

_ClaimText = Annotated[str, StringConstraints(max_length=BOUNDED_CLAIM_CHARS)]
# Field types handed to create_model, which takes them as values (hence Any).
_RATIONALE: Any = Annotated[str, StringConstraints(max_length=BOUNDED_RATIONALE_CHARS)]
_QUOTED_LABEL: Any = Literal[Label.ENTAILED, Label.CONTRADICTED]
_BASELESS_LABEL: Any = Literal[Label.BASELESS]
_NO_CONFIDENCE: Any = Annotated[float | None, SkipJsonSchema()]  # type: ignore[type-arg]


def _position(position: int) -> Any:
    """An integer that must equal ``position``, written as a one-value enum (what grammar
    compilers such as llama.cpp's turn into a fixed token)."""
    return Annotated[int, Field(ge=position, le=position), WithJsonSchema({"type": "integer", "enum": [position]})]


def _exactly(models: Sequence[type[BaseModel]]) -> Any:
    """A fixed-length array whose i-th item is ``models[i]`` (JSON schema ``prefixItems``)."""
    return tuple.__class_getitem__(tuple(models))


def _bounded_judgement(position: int, quote: Any) -> Any:
    """The judgement of claim ``position``: either a supported or refuted verdict quoting one or two
    context sentences, or ``baseless`` with no quote (the evidence rule of the prompt, which a
    grammar then enforces: the model cannot say "entailed" and quote nothing)."""
    common: dict[str, Any] = {
        "claim": (_position(position), ...),
        "rationale": (_RATIONALE, ""),
        "confidence": (_NO_CONFIDENCE, None),
    }
    quoted = create_model(
        f"QuotedJudgement{position}",
        __base__=ClaimJudgement,
        label=(_QUOTED_LABEL, ...),
        evidence=(Annotated[list[quote], Field(min_length=1, max_length=BOUNDED_EVIDENCE_QUOTES)], ...),
        **common,
    )
    unquoted = create_model(
        f"BaselessJudgement{position}",
        __base__=ClaimJudgement,
        label=(_BASELESS_LABEL, ...),
        evidence=(Annotated[list[str], Field(max_length=0)], []),
        **common,
    )
    return quoted | unquoted


@lru_cache(maxsize=64)
def bounded_verify_output(n_claims: int, quotes: tuple[str, ...]) -> type[VerifyOutput]:
    """:class:`VerifyOutput` for exactly ``n_claims`` judgements, numbered 0.., each quoting at most
    :data:`BOUNDED_EVIDENCE_QUOTES` of the context sentences ``quotes`` (verbatim, so a grammar
    cannot produce an ungrounded quote), with a short rationale and no confidence."""
    quote = Annotated[str, WithJsonSchema({"type": "string", "enum": list(quotes)})] if quotes else str
    judgements = [_bounded_judgement(position, quote) for position in range(n_claims)]
    return create_model(f"VerifyOutput{n_claims}", __base__=VerifyOutput, judgements=(_exactly(judgements), ...))


@lru_cache(maxsize=64)
def bounded_decompose_output(n_sentences: int) -> type[DecomposeOutput]:
    """:class:`DecomposeOutput` for exactly ``n_sentences`` entries, numbered 0.., each with at most
    :data:`BOUNDED_CLAIMS_PER_SENTENCE` short claims."""
    claims = Annotated[list[_ClaimText], Field(max_length=BOUNDED_CLAIMS_PER_SENTENCE)]
    sentences = [
        create_model(
            f"DecomposedSentence{position}",
            __base__=DecomposedSentence,
            sentence=(_position(position), ...),
            claims=(claims, ...),
        )
        for position in range(n_sentences)
    ]
    return create_model(f"DecomposeOutput{n_sentences}", __base__=DecomposeOutput, sentences=(_exactly(sentences), ...))


class BoundedSentenceClaims(SentenceClaims):
    """:class:`SentenceClaims` with at most :data:`BOUNDED_CLAIMS_PER_SENTENCE` short claims."""

    claims: Annotated[list[_ClaimText], Field(max_length=BOUNDED_CLAIMS_PER_SENTENCE)]
    """Self-contained claims the sentence states (empty when it states no fact)."""


def _bounded_verify(payload: VerifyInput) -> type[BaseModel]:
    return bounded_verify_output(len(payload.claims), tuple(sentence.text for sentence in payload.sentences))


def _bounded_decompose(payload: DecomposeInput) -> type[BaseModel]:
    return bounded_decompose_output(len(payload.sentences))


def _bounded_sentence_claims(payload: DecomposeSentenceInput) -> type[BaseModel]:
    return BoundedSentenceClaims


# --- the registry ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskSpec:
    """One judge step of the method."""

    name: str
    """The task name requests carry (part of every cache key)."""
    input_model: type[BaseModel]
    """The structured payload of its requests."""
    output_model: type[BaseModel]
    """The schema its replies are validated against."""
    templates: tuple[str, ...]
    """Every prompt template the step may use."""
    template_for: Callable[[Any], str]
    """Which template renders a given payload."""
    fields: Callable[[Any], dict[str, str]]
    """The template fields of a payload."""
    bounded: Callable[[Any], type[BaseModel]] | None = None
    """The reply schema fixed by a payload, for judges that decode under a grammar
    (:attr:`~rt4chart.protocol.JudgeRequest.build_bounded_schema`); ``None``: the plain one only."""


TASKS: dict[str, TaskSpec] = {
    spec.name: spec
    for spec in (
        TaskSpec(
            "decompose",
            DecomposeInput,
            DecomposeOutput,
            ("decompose",),
            lambda _: "decompose",
            _decompose_fields,
            _bounded_decompose,
        ),
        TaskSpec(
            "verify",
            VerifyInput,
            VerifyOutput,
            ("verify_local", "verify_global", "verify_global_hint"),
            _verify_template,
            _verify_fields,
            _bounded_verify,
        ),
        TaskSpec(
            "decompose_holistic",
            HolisticDecomposeInput,
            HolisticDecomposeOutput,
            ("decompose_holistic",),
            lambda _: "decompose_holistic",
            _holistic_fields,
        ),
        TaskSpec("direct", DirectInput, DirectOutput, ("direct",), lambda _: "direct", _direct_fields),
        TaskSpec("repair", RepairInput, RepairOutput, ("repair",), lambda _: "repair", _repair_fields),
        TaskSpec(
            "decompose_sentence",
            DecomposeSentenceInput,
            SentenceClaims,
            ("decompose_sentence",),
            lambda _: "decompose_sentence",
            _decompose_sentence_fields,
            _bounded_sentence_claims,
        ),
    )
}
"""Every judge step, by task name."""

_BY_INPUT = {spec.input_model: spec for spec in TASKS.values()}

TEMPLATE_NAMES = tuple(name for spec in TASKS.values() for name in spec.templates)
"""Every template the method uses."""


def spec_for(payload: BaseModel) -> TaskSpec:
    """The step a payload belongs to."""
    return _BY_INPUT[type(payload)]


@cache
def _rendering_digest() -> str:
    # The renderers live in this module: any change to it may change what a judge reads, so it is
    # part of every prompt version (and so of every cache key and output record).
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def template_version(template: PromptTemplate) -> str:
    """Version of what a template renders: its file and the rendering code, hashed together."""
    return hashlib.sha256((template.version + _rendering_digest()).encode()).hexdigest()[:12]


def prompt_set_version(prompts: dict[str, PromptTemplate]) -> str:
    """One hash over every template and the rendering code: the ``prompt_version`` of a record."""
    digest = hashlib.sha256("".join(template_version(p) for p in prompts.values()).encode())
    return digest.hexdigest()[:12]


def load_prompts(directory: Path | None = None) -> dict[str, PromptTemplate]:
    """The templates of every step, from ``directory`` (default: the shipped ``prompts`` folder)."""
    return load_templates(TEMPLATE_NAMES, directory)


def build_request(
    payload: BaseModel,
    prompts: dict[str, PromptTemplate],
    params: GenerationParams | None = None,
    follow_up: list[Message] | None = None,
) -> JudgeRequest:
    """The request of the step ``payload`` belongs to, rendered with its template.

    ``follow_up`` messages (a re-ask) are appended after the rendered prompt.
    """
    spec = spec_for(payload)
    template = prompts[spec.template_for(payload)]
    return JudgeRequest(
        task=spec.name,
        payload=payload,
        output_schema=spec.output_model,
        build_bounded_schema=partial(spec.bounded, payload) if spec.bounded else None,
        messages=template.render(**spec.fields(payload)) + (follow_up or []),
        params=params or GenerationParams(),
        prompt_version=template_version(template),
    )


def narrow_verify_request(
    request: JudgeRequest, positions: list[int], prompts: dict[str, PromptTemplate] | None = None
) -> tuple[JudgeRequest, list[int]]:
    """A verify request for only the claims at ``positions``, re-rendered from its payload, and for
    each of its claims the original position.

    A request that carries a conversation (a re-ask holds an earlier reply that refers to claim
    positions) cannot be narrowed: the whole request comes back, with identity positions.
    """
    payload = request.payload
    if not isinstance(payload, VerifyInput):
        raise TypeError(f"only verify requests can be narrowed, not {request.task!r}")
    whole = list(range(len(payload.claims)))
    if positions == whole or any(m.role == "assistant" for m in request.messages):
        return request, whole
    kept: dict[str, Any] = {"claims": [payload.claims[p] for p in positions]}
    if payload.local_labels is not None:
        kept["local_labels"] = [payload.local_labels[p] for p in positions]
    if payload.answer is not None:
        kept["answer"] = payload.answer.model_copy(update={"spans": [payload.answer.spans[p] for p in positions]})
    narrowed = build_request(
        payload.model_copy(update=kept),
        prompts or load_prompts(),
        request.params,
    )
    if narrowed.prompt_version != request.prompt_version:
        # Rendered from other templates than these prompts: narrowing would change the prompt.
        return request, whole
    return narrowed, positions
