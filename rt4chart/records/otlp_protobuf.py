"""OTLP trace exports in the protobuf encoding: what an SDK sends over OTLP/HTTP and a Collector's file
exporter writes with ``format: proto``, read into the OTLP/JSON shape that :mod:`rt4chart.records.traces`
turns into RAG turns, so a binary export and its JSON twin give the same items.

A file holds one ``ExportTraceServiceRequest`` (``.pb`` / ``.binpb``), or several, each preceded by its
length as a 4-byte big-endian integer (the Collector's file exporter). The two cannot be confused: a
serialized request starts with its first field's tag, never a zero byte, and a length prefix under 16 MiB
always does. Decoding needs ``opentelemetry-proto`` (the ``otel`` extra), imported only when such a file
is read.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

PROTOBUF_SUFFIXES = frozenset({".pb", ".binpb", ".protobuf"})
"""File suffixes of a protobuf export; a file that is not UTF-8 text is read as one too."""
ID_FIELDS = frozenset({"traceId", "spanId", "parentSpanId"})
"""Bytes fields that OTLP/JSON writes as hex (protobuf's JSON mapping writes bytes as base64)."""
LENGTH_PREFIX = 4
"""Bytes of the big-endian length before each request of a length-delimited file."""


class ProtobufUnavailable(ImportError):
    """A protobuf export was given but ``opentelemetry-proto`` (the ``otel`` extra) is not installed."""


def is_protobuf(path: Path, data: bytes) -> bool:
    """Whether ``data`` (the file at ``path``) is read as protobuf: by its suffix, or because it is not
    UTF-8 text (random trace and span ids make a protobuf export so)."""
    if path.suffix.lower() in PROTOBUF_SUFFIXES:
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _frames(data: bytes) -> list[bytes] | None:
    """The requests of a length-delimited file; ``None`` when its lengths do not add up to the file."""
    frames, position = [], 0
    while position < len(data):
        size = int.from_bytes(data[position:position + LENGTH_PREFIX], "big")
        start = position + LENGTH_PREFIX
        if start > len(data) or start + size > len(data):
            return None
        frames.append(data[start:start + size])
        position = start + size
    return frames


def _hex_ids(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: base64.b64decode(item).hex() if key in ID_FIELDS and isinstance(item, str) else _hex_ids(item)
                for key, item in value.items()}
    if isinstance(value, list):
        return [_hex_ids(item) for item in value]
    return value


def protobuf_requests(data: bytes, source: str) -> list[dict[str, Any]]:
    """The export requests of a protobuf file as OTLP/JSON objects (ids in hex, 64-bit integers as strings,
    as the JSON encoding writes them); :class:`ValueError` naming ``source`` when the bytes are not OTLP
    protobuf, :class:`ProtobufUnavailable` without the ``otel`` extra."""
    try:
        from google.protobuf.json_format import MessageToDict
        from google.protobuf.message import DecodeError
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    except ImportError:
        raise ProtobufUnavailable(f"{source} is an OTLP protobuf export; reading one needs opentelemetry-proto: "
                                  "pip install 'rt4chart[otel]'") from None
    frames = _frames(data) if data[:1] == b"\x00" else [data]
    if frames is None:
        raise ValueError(f"{source} is not an OTLP protobuf trace export: its length prefixes do not add up")
    requests = []
    for number, frame in enumerate(frames, start=1):
        request = ExportTraceServiceRequest()
        try:
            request.ParseFromString(frame)
        except (DecodeError, RuntimeError) as error:  # RuntimeError: nested past protobuf's recursion limit
            where = f"request {number} of {source}" if len(frames) > 1 else source
            raise ValueError(f"{where} is not an OTLP protobuf trace export (ExportTraceServiceRequest): "
                             f"{error}") from None
        requests.append(_hex_ids(MessageToDict(request)))
    return requests
