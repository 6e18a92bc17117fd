"""Pair-classifier verifiers from the hub as judges: claim vs context window -> P(supported).

MiniCheck (RoBERTa-large, DeBERTa-v3-large, Flan-T5-large) and Vectara's HHEM-2.1-open each read one
(context, claim) pair and say how likely the claim is supported. This backend runs them exactly as
their authors do (:class:`~rt4chart.judges.hub.VerifierModel` says how, per family) on the sentences
the method puts in view: the sentences are packed, whole and in order, into windows of
``window_tokens`` (a sentence longer than a window is cut at a token boundary), every input is kept
within ``max_tokens``, and a claim's support is its best window's (MiniCheck's max over chunks).

The label is binary: entailed at or above the profile's threshold, else baseless (these models do not
tell a contradiction from a missing fact). The evidence of an entailed claim is the sentences of the
window that supported it (the model judged them together); ``confidence`` is the probability of the
label given, and ``score`` carries P(not supported) against the threshold, so ``rt4 calibrate``
and cascades read it as they read the embedded judge's.

HHEM-2.1-open ships its head as remote code (``trust_remote_code``); that code is never run here. Its
head is ten lines (a ``T5ForTokenClassification`` over flan-t5-base's config, the first token's
class 1), rebuilt in :func:`_load_hhem` from the checkpoint's weights and its foundation's config and
tokenizer, which ``rt4 models pull`` fetches at pinned revisions (the remote code would download them
on every load).

torch and transformers are imported when the first request arrives (the ``verifiers`` extra).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

from rt4chart.judges.hub import PullRecord, VerifierModel, pull_command, snapshot_dir
from rt4chart.judges.packing import pack_sentences
from rt4chart.method.tasks import ClaimJudgement, VerifyInput, VerifyOutput
from rt4chart.protocol import Capabilities, JudgeRequest, JudgeResponse, loading
from rt4chart.types import JudgeScore, Label, Usage

INSTALL_HINT = "pip install 'rt4chart[verifiers]'"
"""What installs torch and transformers for these judges."""

MINICHECK_T5_LABEL_TOKENS = (3, 209)
"""Flan-T5 vocabulary ids MiniCheck reads after one decoder step: ``▁`` (unsupported) and ``▁1`` (supported)."""

HHEM_PROMPT = "<pad> Determine if the hypothesis is true given the premise?\n\nPremise: {text1}\n\nHypothesis: {text2}"
"""HHEM-2.1-open's input template (its configuration's ``prompt``): premise = context, hypothesis = claim."""

JOIN_TOKENS = 4
"""Tokens kept free in every input besides the window's and the template's own counts: a word at the
join of window and separator may split into more tokens than either side counted alone, and the input
is cut from its end (the claim's) if it ever runs over."""

BATCH_SIZE = 8
"""Windows per forward pass."""


@dataclass(frozen=True)
class Window:
    """Context sentences judged together: their positions in the request and their text as the model reads it."""

    sentences: tuple[int, ...]
    text: str


def cut_to_tokens(tokenizer: Any, text: str, tokens: int) -> str:
    """``text`` up to its first ``tokens`` tokens of ``tokenizer``, cut at a token boundary."""
    offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    return text if len(offsets) <= tokens else text[: offsets[tokens - 1][1]]


class PairClassifier:
    """A loaded checkpoint: builds each family's inputs and returns P(supported) per (window, claim)."""

    def __init__(self, model: VerifierModel, record: PullRecord, directory: Path | None = None) -> None:
        import torch
        from transformers import AutoTokenizer

        weights = snapshot_dir(record.repos[0], directory)
        tokenizer_dir = snapshot_dir(record.repos[-1], directory)
        self.spec = model
        self.tokenizer: Any = AutoTokenizer.from_pretrained(tokenizer_dir)
        if model.family == "minicheck-t5":
            label_tokens = tuple(self.tokenizer.convert_tokens_to_ids(token) for token in ("▁", "▁1"))
            if label_tokens != MINICHECK_T5_LABEL_TOKENS:
                raise ValueError(f"not MiniCheck's Flan-T5 vocabulary: '▁' and '▁1' are ids {label_tokens}, "
                                 f"not {MINICHECK_T5_LABEL_TOKENS}")
        self.network: Any = _LOADERS[model.family](weights, tokenizer_dir)
        self.network.eval()
        self._torch = torch
        self._lock = threading.Lock()

    def count(self, text: str) -> int:
        """Tokens of ``text`` without special tokens."""
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def render(self, window: str, claim: str) -> str:
        """The model input for one pair, as the checkpoint's authors build it."""
        family = self.spec.family
        if family == "hhem":
            return HHEM_PROMPT.format(text1=window, text2=claim)
        joined = f"{window}{self.tokenizer.eos_token}{claim}"
        return f"predict: {joined}" if family == "minicheck-t5" else joined

    def overhead(self, claim: str) -> int:
        """Tokens an input for ``claim`` holds besides its window (template, separators, specials)."""
        return len(self.tokenizer(self.render("", claim))["input_ids"])

    def cut(self, text: str, tokens: int) -> str:
        """``text`` up to its first ``tokens`` tokens, cut at a token boundary."""
        return cut_to_tokens(self.tokenizer, text, tokens)

    def windows(self, sentences: list[str], claim: str) -> list[Window]:
        """The sentences packed into windows that keep every input for ``claim`` within ``max_tokens``."""
        # A claim too long for any context beside it still gets one token of context per window.
        room = self.spec.max_tokens - self.overhead(claim) - JOIN_TOKENS
        budget = max(1, min(self.spec.window_tokens, room))
        return [Window(chunk, self.cut(" ".join(sentences[i] for i in chunk), budget))
                for chunk in pack_sentences(sentences, budget, self.count)]

    def support(self, pairs: list[tuple[str, str]]) -> list[float]:
        """P(supported) of each (window, claim) pair."""
        probabilities: list[float] = []
        with self._lock, self._torch.inference_mode():
            for start in range(0, len(pairs), BATCH_SIZE):
                texts = [self.render(window, claim) for window, claim in pairs[start:start + BATCH_SIZE]]
                inputs = self.tokenizer(texts, padding=True, truncation=True, max_length=self.spec.max_tokens,
                                        return_tensors="pt")
                probabilities.extend(self._forward(inputs).tolist())
        return probabilities

    def _forward(self, inputs: Any) -> Any:
        """P(supported) of each input of the batch (a tensor)."""
        torch = self._torch
        family = self.spec.family
        if family == "sequence-classification":
            return torch.softmax(self.network(**inputs).logits, dim=-1)[:, 1]
        if family == "minicheck-t5":
            start = torch.zeros((inputs["input_ids"].shape[0], 1), dtype=torch.long)
            logits = self.network(**inputs, decoder_input_ids=start).logits[:, 0, :]
            return torch.softmax(logits[:, list(MINICHECK_T5_LABEL_TOKENS)], dim=-1)[:, 1]
        return torch.softmax(self.network(**inputs).logits[:, 0, :], dim=-1)[:, 1]


def _load_sequence_classifier(weights: Path, tokenizer_dir: Path) -> Any:
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(weights, num_labels=2)


def _load_seq2seq(weights: Path, tokenizer_dir: Path) -> Any:
    from transformers import AutoModelForSeq2SeqLM

    return AutoModelForSeq2SeqLM.from_pretrained(weights)


def _load_hhem(weights: Path, tokenizer_dir: Path) -> Any:
    """HHEM's head without its remote code: its weights are a ``T5ForTokenClassification`` saved under
    the attribute ``t5``, over the config of its foundation (flan-t5-base, pulled with the tokenizer)."""
    from safetensors.torch import load_file
    from transformers import T5Config, T5ForTokenClassification

    config = T5Config.from_dict(json.loads((tokenizer_dir / "config.json").read_text(encoding="utf-8")))
    config.num_labels = 2
    network = T5ForTokenClassification(config)
    state = {name.removeprefix("t5."): tensor for name, tensor in load_file(weights / "model.safetensors").items()}
    missing, unexpected = network.load_state_dict(state, strict=False)
    # T5 ties the encoder's embedding to the shared one: only that copy may be absent from the file.
    if unexpected or any(name != "transformer.encoder.embed_tokens.weight" for name in missing):
        raise ValueError(f"not an HHEM-2.1 checkpoint: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return network


_LOADERS = {"sequence-classification": _load_sequence_classifier, "minicheck-t5": _load_seq2seq, "hhem": _load_hhem}


Loaded = TypeVar("Loaded")
"""A loaded checkpoint (:class:`PairClassifier`, or a token classifier)."""


class Unjudgeable(ValueError):
    """A request the checkpoint cannot judge within its limits (its claims alone fill the token limit)."""


class CheckpointUnreadable(RuntimeError):
    """The pulled files cannot be loaded as the profile's checkpoint (damaged, or another model's)."""


class HubVerifierBackend(Generic[Loaded]):
    """A pulled hub checkpoint as a judge: loaded on the first request (:meth:`load`), each verify request
    judged in a worker thread (:meth:`judge`). The pair and token classifiers differ only in those two."""

    capabilities = Capabilities(can_write_text=False, languages=frozenset({"en"}))
    """It verifies claims and writes no text; the published checkpoints are English."""

    def __init__(self, profile: str, model: VerifierModel, record: PullRecord, directory: Path | None = None) -> None:
        self.model = model
        self._record = record
        self._directory = directory
        self._profile = profile
        self._classifier: Loaded | None = None
        self._load_lock = threading.Lock()

    @property
    def name(self) -> str:
        # The pulled commit is in the name: records and cached replies say which weights judged.
        return f"{self._profile}#{self._record.repos[0].commit[:8]}"

    def load(self) -> Loaded:
        """The checkpoint read from its pulled files."""
        raise NotImplementedError

    @property
    def classifier(self) -> Loaded:
        """The checkpoint, loaded on first use."""
        with self._load_lock:
            if self._classifier is None:
                from safetensors import SafetensorError

                with loading(f"{self._profile} ({self._record.repos[0].repo})"):
                    try:
                        self._classifier = self.load()
                    except (OSError, ValueError, RuntimeError, SafetensorError) as error:
                        # A damaged or foreign checkpoint: every request would fail alike, each saying why.
                        raise CheckpointUnreadable(
                            f"cannot load the verifier {self._profile!r} ({type(error).__name__}: {error}); "
                            f"pull it again: {pull_command(self._profile)}"
                        ) from error
            return self._classifier

    async def complete(self, request: JudgeRequest) -> JudgeResponse:
        started = time.perf_counter()
        payload = request.payload
        if not isinstance(payload, VerifyInput):
            return JudgeResponse(error=f"the verifier {self._profile} cannot decompose answers; use the rule-based "
                                 "decomposer", usage=Usage(calls=1), latency_s=time.perf_counter() - started,
                                 judge=self.name)
        try:
            parsed = await asyncio.to_thread(self.judge, payload)
        except (CheckpointUnreadable, Unjudgeable) as error:
            return JudgeResponse(error=str(error), usage=Usage(calls=1), latency_s=time.perf_counter() - started,
                                 judge=self.name)
        return JudgeResponse(parsed=parsed, raw=parsed.model_dump_json(), usage=Usage(calls=1),
                             latency_s=time.perf_counter() - started, judge=self.name)

    def judge(self, payload: VerifyInput) -> VerifyOutput:
        """Verdicts for every claim of one request."""
        raise NotImplementedError

    def max_cost_usd(self, request: JudgeRequest) -> float:
        return 0.0

    def call_cost_usd(self, request: JudgeRequest, completion_tokens: int) -> float:
        return 0.0

    async def aclose(self) -> None:
        self._classifier = None


class PairClassifierBackend(HubVerifierBackend[PairClassifier]):
    """A pair-classifier verifier as a judge (see the module docstring)."""

    def load(self) -> PairClassifier:
        return PairClassifier(self.model, self._record, self._directory)

    def judge(self, payload: VerifyInput) -> VerifyOutput:
        """Verdicts for every claim of one request."""
        classifier = self.classifier
        texts = [sentence.text for sentence in payload.sentences]
        windows = {claim: classifier.windows(texts, claim) for claim in payload.claims}
        pairs = [(window.text, claim) for claim in payload.claims for window in windows[claim]]
        supports = iter(classifier.support(pairs))
        judgements = []
        for position, claim in enumerate(payload.claims):
            # No sentence in view: nothing supports the claim.
            scored = [(next(supports), window) for window in windows[claim]] or [(0.0, Window((), ""))]
            support, best = max(scored, key=lambda pair: pair[0])
            entailed = support >= self.model.threshold
            judgements.append(ClaimJudgement(
                claim=position,
                label=Label.ENTAILED if entailed else Label.BASELESS,
                evidence=[texts[i] for i in best.sentences] if entailed else [],
                rationale=f"P(supported) {support:.3f} in the best of {len(scored)} window(s)",
                confidence=support if entailed else 1.0 - support,
                score=JudgeScore(p_unsupported=1.0 - support, threshold=1.0 - self.model.threshold, decided_by="head"),
            ))
        return VerifyOutput(judgements=judgements)
