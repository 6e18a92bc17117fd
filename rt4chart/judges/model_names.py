"""Which bare model names litellm routes, known without importing litellm (seconds of start-up): its
shipped table of models read as data, so a mistyped ``--judge`` is refused at once (the registry asks)."""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path

LITELLM_MODEL_TABLE = "model_prices_and_context_window_backup.json"
"""litellm's shipped table of models (the one it reads: rt4chart sets ``LITELLM_LOCAL_MODEL_COST_MAP``)."""


@functools.cache
def litellm_model_names() -> frozenset[str] | None:
    """Every model name of litellm's table, each also without its provider path (``vertex_ai/veo-3``
    gives ``veo-3`` too), read as data: importing litellm takes seconds. ``None`` when the table cannot
    be read (no litellm, or a release without it): then litellm itself decides."""
    found = importlib.util.find_spec("litellm")
    if found is None or found.origin is None:
        return None
    try:
        table = json.loads((Path(found.origin).parent / LITELLM_MODEL_TABLE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return frozenset(name for key in table for name in (key, key.rsplit("/", 1)[-1]))


def surely_no_model(model: str) -> bool:
    """Whether litellm routes no model named ``model``, decided without importing it: a bare name (no
    provider prefix) in no form of litellm's table. Names litellm also knows from lists of its own
    (Bedrock's dotted ids ``anthropic.claude-v2``, versions ``...-v1:0``, ``amazon_nova...``, ``*``) and
    every provider prefix are left to litellm (tests/test_judge_rejection.py checks this against it)."""
    if "/" in model or any(mark in model for mark in ".:*") or model.startswith("amazon_nova"):
        return False
    names = litellm_model_names()
    return names is not None and model not in names
