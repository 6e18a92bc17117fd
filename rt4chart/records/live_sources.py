"""Which tracing server an input names: a Phoenix project (``phoenix://HOST:PORT/PROJECT``,
:mod:`rt4chart.records.phoenix`) or a Langfuse project (``langfuse://HOST:PORT/PROJECT``,
:mod:`rt4chart.records.langfuse_server`); ``+https`` in the scheme for TLS."""

from __future__ import annotations

from rt4chart.records.langfuse_server import LangfuseSource, langfuse_source
from rt4chart.records.phoenix import PhoenixSource, phoenix_source

LiveSource = PhoenixSource | LangfuseSource
"""A tracing server's traces an audit reads."""
LIVE_SOURCES = "a phoenix://HOST:PORT/PROJECT or langfuse://HOST:PORT/PROJECT input"
"""How the live sources are named in messages."""


def live_source(text: str) -> LiveSource | None:
    """The live source an input names, else ``None``; :class:`rt4chart.records.traces.TraceError` for a
    Langfuse source's unknown filter or bad settling time."""
    return phoenix_source(text) or langfuse_source(text)
