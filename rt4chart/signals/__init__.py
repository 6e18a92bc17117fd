"""White-box signals of a self-hosted model: token-level evidence from forward passes.

Only this package and ``backends/`` talk to models. The contract is :mod:`rt4chart.signals.base`;
the first signal is REFIND's context sensitivity ratio (:mod:`rt4chart.signals.csr`), computed
in process with transformers (:mod:`rt4chart.signals.transformers_backend`, the ``signals``
extra) or from a vLLM server's prompt log-probabilities (:mod:`rt4chart.signals.vllm_client`).
Importing this package imports neither torch nor transformers.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from rt4chart.signals.base import LogprobBackend, ScoreRequest, SignalError, TokenizedText, missing_extra


def open_backend(
    model: Path,
    *,
    server: str | None = None,
    server_model: str | None = None,
    batch_size: int | None = None,
) -> LogprobBackend:
    """The model at ``model`` in process, or, with ``server``, that server using ``model``'s tokenizer.

    Raises :class:`SignalError` when the ``signals`` extra is missing or the model cannot be read.
    """
    absent = missing_extra(model)
    if absent:
        raise SignalError(
            f"signals need the 'signals' extra ({', '.join(absent)} not installed): pip install 'rt4chart[signals]'"
        )
    from rt4chart.signals import transformers_backend

    if server is None:
        if batch_size is None:
            return transformers_backend.TransformersBackend(model)
        return transformers_backend.TransformersBackend(model, batch_size=batch_size)
    from rt4chart.signals.vllm_client import VllmPromptLogprobsBackend

    tokenizer = transformers_backend.load_tokenizer(model)
    identity = transformers_backend.model_identity(model)
    return VllmPromptLogprobsBackend(server, tokenizer, identity, model=server_model)


def require_sklearn() -> None:
    """Training probes needs scikit-learn (in the ``signals`` extra); applying them does not."""
    if importlib.util.find_spec("sklearn") is None:
        raise SignalError("training a probe needs scikit-learn (the 'signals' extra): pip install 'rt4chart[signals]'")


__all__ = [
    "LogprobBackend",
    "ScoreRequest",
    "SignalError",
    "TokenizedText",
    "missing_extra",
    "open_backend",
    "require_sklearn",
]
