"""Teacher-forced log-probabilities from a Hugging Face transformers causal LM, in process.

Loads a local model directory or a GGUF file (``gguf_file=``, needs the ``gguf`` package), never
from the hub (``local_files_only``). Dequantizing a GGUF takes a minute or more on a CPU, so the
dequantized model and its tokenizer are saved once under the conversion cache, keyed by the
GGUF's sha256, and loaded from there afterwards (same tensors, seconds instead of minutes).

Batching: sequences are sorted by length and padded on the LEFT with explicit ``position_ids``
(the running count of real tokens), so every real token keeps the position it has unpadded and
every row ends at the same index; the scored answer tokens then sit in the last columns of every
row, and ``logits_to_keep`` asks the model for those columns only instead of a
``[batch, length, vocabulary]`` tensor. fp32 on CPU, bf16 on a GPU; eager attention when attention
weights are wanted (SDPA does not return them), SDPA otherwise; ``torch.inference_mode`` always.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import platformdirs
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rt4chart.signals.base import ScoreRequest, SignalError, TokenizedText

DEFAULT_BATCH_SIZE = 4
"""Sequences per forward pass (a CSR sample is two sequences)."""


def default_conversion_dir() -> Path:
    """Where dequantized GGUF models are kept (``~/.cache/rt4chart/signal-models`` on Linux)."""
    return Path(platformdirs.user_cache_dir("rt4chart")) / "signal-models"


@cache
def content_sha256(path: Path) -> str:
    """sha256 of a file, or of a directory's files (names and bytes, sorted by name)."""
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        digest.update(str(file.relative_to(path) if file != path else file.name).encode())
        with open(file, "rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


def model_identity(path: Path) -> str:
    """``<name>#<first 16 hex digits of the content sha256>``."""
    return f"{path.name}#{content_sha256(path)[:16]}"


def _hf_sources(path: Path, conversion_dir: Path | None) -> tuple[Path, dict[str, Any], Path | None]:
    """Directory and keyword arguments to load from, and where to save a conversion (if needed)."""
    if not path.exists():
        raise SignalError(f"signal model not found: {path}")
    if path.is_dir():
        return path, {}, None
    if path.suffix != ".gguf":
        raise SignalError(f"signal model must be a model directory or a .gguf file: {path}")
    converted = (conversion_dir or default_conversion_dir()) / f"{path.stem}-{content_sha256(path)[:16]}"
    if (converted / "config.json").is_file():
        return converted, {}, None
    return path.parent, {"gguf_file": path.name}, converted


class HfTokenizer:
    """A fast tokenizer's ids and offset mapping, without special tokens added."""

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "is_fast", False):
            raise SignalError("signals need a fast tokenizer (one with an offset mapping)")
        self.hf = tokenizer

    def encode(self, text: str) -> TokenizedText:
        encoded = self.hf(text, add_special_tokens=False, return_offsets_mapping=True)
        return TokenizedText(list(encoded["input_ids"]), [tuple(pair) for pair in encoded["offset_mapping"]])


def load_tokenizer(path: Path, conversion_dir: Path | None = None) -> HfTokenizer:
    """The model's tokenizer alone (what the server path needs locally for offsets)."""
    source, kwargs, _ = _hf_sources(path, conversion_dir)
    try:
        return HfTokenizer(AutoTokenizer.from_pretrained(source, local_files_only=True, **kwargs))
    except (OSError, ValueError) as error:
        raise SignalError(f"cannot load the tokenizer of {path}: {error}") from None


@dataclass
class PaddedBatch:
    """Left-padded sequences ready for one forward pass."""

    order: list[int]
    """Index of each row's request in the caller's list."""
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    keep: int
    """Last columns whose logits are needed (longest scored tail + 1)."""
    real_tokens: int
    """Tokens that are not padding."""


class TransformersBackend:
    """A local causal LM as a :class:`~rt4chart.signals.base.LogprobBackend`."""

    def __init__(
        self,
        path: Path,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        device: str | None = None,
        attentions: bool = False,
        conversion_dir: Path | None = None,
    ) -> None:
        if batch_size < 1:
            raise SignalError("batch size must be at least 1")
        self.batch_size = batch_size
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        source, kwargs, save_to = _hf_sources(path, conversion_dir)
        model: Any
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=True, **kwargs)
            model = AutoModelForCausalLM.from_pretrained(
                source,
                local_files_only=True,
                dtype=dtype,
                attn_implementation="eager" if attentions else "sdpa",
                **kwargs,
            )
        except (OSError, ValueError) as error:
            raise SignalError(f"cannot load the signal model {path}: {error}") from None
        if save_to is not None:
            _save_conversion(model, tokenizer, save_to)
        self.tokenizer = HfTokenizer(tokenizer)
        self.model: Any = model.to(self.device).eval()
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self._identity = model_identity(path)
        self._max_positions = getattr(model.config, "max_position_embeddings", None)

    @property
    def identity(self) -> str:
        return self._identity

    @property
    def max_positions(self) -> int | None:
        return self._max_positions

    def encode(self, text: str) -> TokenizedText:
        return self.tokenizer.encode(text)

    def padded_batches(self, requests: Sequence[ScoreRequest]) -> Iterator[PaddedBatch]:
        """The forward passes :meth:`score` makes, longest sequences first."""
        for request in requests:
            if not 1 <= request.first <= len(request.ids):
                raise SignalError("a scored token needs at least one token before it")
        order = sorted(range(len(requests)), key=lambda index: -len(requests[index].ids))
        for begin in range(0, len(order), self.batch_size):
            rows = order[begin : begin + self.batch_size]
            width = max(len(requests[row].ids) for row in rows)
            ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for slot, row in enumerate(rows):
                sequence = requests[row].ids
                ids[slot, width - len(sequence) :] = torch.tensor(sequence, dtype=torch.long)
                mask[slot, width - len(sequence) :] = 1
            positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
            keep = max(len(requests[row].ids) - requests[row].first for row in rows) + 1
            yield PaddedBatch(rows, ids, mask, positions, keep, int(mask.sum()))

    def forward(self, batch: PaddedBatch) -> torch.Tensor:
        """Logits of the batch's last ``keep`` columns, ``[rows, keep, vocabulary]``, in fp32."""
        with torch.inference_mode():
            output = self.model(
                input_ids=batch.input_ids.to(self.device),
                attention_mask=batch.attention_mask.to(self.device),
                position_ids=batch.position_ids.to(self.device),
                logits_to_keep=batch.keep,
                use_cache=False,
            )
            logits: torch.Tensor = output.logits.float()
            return logits

    def score(self, requests: Sequence[ScoreRequest]) -> list[list[float]]:
        results: list[list[float]] = [[] for _ in requests]
        for batch in self.padded_batches(requests):
            logits = self.forward(batch)
            with torch.inference_mode():
                log_probs = torch.log_softmax(logits, dim=-1)
                for slot, row in enumerate(batch.order):
                    request = requests[row]
                    scored = len(request.ids) - request.first
                    # Column keep-1 predicts past the end; the scored tokens' predictions end just before it.
                    columns = torch.arange(batch.keep - 1 - scored, batch.keep - 1, device=log_probs.device)
                    targets = torch.tensor(request.ids[request.first :], device=log_probs.device)
                    results[row] = log_probs[slot, columns, targets].tolist()
        return results


def _save_conversion(model: Any, tokenizer: Any, target: Path) -> None:
    """Save the dequantized model atomically; a failure only costs the next run the conversion.

    transformers refuses to save a model loaded from GGUF (its GGUF quantizer is "not
    serializable"), but the legacy GGUF loader has already dequantized every weight into plain
    float tensors, so the model is saved without the quantizer and its ``quantization_config``.
    """
    staging = target.with_name(f".{target.name}.partial-{os.getpid()}")
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        staging.rename(target)
    except (OSError, ValueError):
        shutil.rmtree(staging, ignore_errors=True)
