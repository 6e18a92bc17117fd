"""API keys out of every string a judge returns: configured keys and key-shaped tokens.

A server or a model can echo a key back (an error message quoting the Authorization header, a
rationale quoting a prompt); whatever leaves a backend (the parsed verdict, ``raw``, ``error``, the
circuit breaker's last error) goes through :func:`scrub` first.

A key is removed in every form it can take in a reply: as written, JSON-escaped (``\\u0053\\u004b``
for ``SK``, what the raw reply stored in the cache holds when a model escapes it), and in fragments
(a key echoed in halves): any run of :func:`fragment_length` or more of its characters. Credentials
inside URLs (``user:password@`` and query parameters named like a credential, ``?api_key=``,
``?password=``) are removed from text and from every URL shown or recorded (:func:`redact_url`:
judge names, cache locations).
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote_plus

_SECRET_PATTERNS = (
    re.compile(r"(Bearer\s+)[^\s'\"]+", re.IGNORECASE),
    re.compile(r"\bsk-[A-Za-z0-9_\-]{6,}"),
    re.compile(r"((?:api[_-]?key|x-api-key)[\"']?\s*[:=]\s*[\"']?)[^\s'\",}]+", re.IGNORECASE),
)
_SECRET_ENV_SUFFIXES = ("_API_KEY", "_KEY", "_TOKEN", "_SECRET")
_CREDENTIAL_NAMES = r"(?:[a-z0-9_.-]*(?:key|token|secret|password|passwd|pwd|signature|sig|auth|credential)s?)"
_URL_USERINFO = re.compile(r"(\b[a-z][a-z0-9+.-]*://)([^/@\s?#]*)@", re.IGNORECASE)
_CREDENTIAL_NAME = re.compile(_CREDENTIAL_NAMES, re.IGNORECASE)
_URL_PARAMETER = re.compile(r"([?&;])([^=?&#;\s'\"]+)(=)([^&#;\s'\"]*)")
"""A query parameter, name and value; its name is compared percent-decoded (``api%5Fkey`` is ``api_key``)."""
REDACTED = "***"


def secrets_in_environment() -> set[str]:
    """Values of environment variables named like keys, tokens and secrets."""
    return {
        value for name, value in os.environ.items()
        if name.upper().endswith(_SECRET_ENV_SUFFIXES) and len(value) >= 8
    }


def fragment_length(secret: str) -> int:
    """The shortest run of a secret's characters that counts as the secret: a third of it, at
    least 6 (a key split in two or three is caught; a shorter run could be ordinary text)."""
    return min(len(secret), max(6, len(secret) // 3))


@functools.lru_cache(maxsize=64)
def _escaped_form(secret: str) -> re.Pattern[str]:
    """``secret`` where any character may be written as a JSON ``\\uXXXX`` escape (either case)."""
    def one(character: str) -> str:
        hex_digits = "".join(f"[{d.lower()}{d.upper()}]" if d.isalpha() else d for d in f"{ord(character):04x}")
        escapes = [re.escape(character), rf"\\u{hex_digits}"] + ([r"\\/"] if character == "/" else [])
        return "(?:" + "|".join(escapes) + ")"

    return re.compile("".join(one(character) for character in secret))


@functools.lru_cache(maxsize=64)
def _fragments(secret: str) -> re.Pattern[str]:
    """Every run of :func:`fragment_length` characters of ``secret``, found where runs overlap."""
    size = fragment_length(secret)
    runs = {secret[start : start + size] for start in range(len(secret) - size + 1)}
    return re.compile("(?=(" + "|".join(re.escape(run) for run in sorted(runs)) + "))")


def _without_fragments(text: str, secret: str) -> str:
    spans: list[list[int]] = []
    for match in _fragments(secret).finditer(text):
        start, end = match.start(1), match.end(1)
        if spans and start <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], end)
        else:
            spans.append([start, end])
    for start, end in reversed(spans):
        text = text[:start] + REDACTED + text[end:]
    return text


def redact_url(url: str) -> str:
    """``url`` without credentials: the password of its userinfo (a user info without a password is
    itself a token and goes whole) and the values of query parameters named like a credential.
    Works on text that is not a valid URL (a non-numeric port, say) without raising."""
    def userinfo(match: re.Match[str]) -> str:
        user, colon, _ = match.group(2).partition(":")
        return match.group(1) + (f"{user}:{REDACTED}" if colon else REDACTED) + "@"

    def parameter(match: re.Match[str]) -> str:
        if not _CREDENTIAL_NAME.fullmatch(unquote_plus(match.group(2))):
            return match.group()
        return match.group(1) + match.group(2) + match.group(3) + REDACTED

    url = _URL_USERINFO.sub(userinfo, url)
    return _URL_PARAMETER.sub(parameter, url)


_MARKS = ("bearer", "sk-", "api", "://", "=", "\\")
"""What every key-shaped token, URL credential and JSON escape holds, in lower case: ``Bearer``,
``sk-``, ``api`` (``api_key``, ``x-api-key``), ``://`` (a URL's user info), ``=`` (a credential
parameter) and a backslash (a ``\\uXXXX`` or ``\\/`` escape, and in JSON any escape at all)."""


@functools.lru_cache(maxsize=64)
def _anchors(secret: str) -> tuple[str, ...]:
    """Blocks of ``secret`` (consecutive, half a fragment long) one of which every fragment holds
    whole: a run of ``n`` characters holds an aligned block of ``n // 2``."""
    size = max(1, fragment_length(secret) // 2)
    return tuple(secret[start : start + size] for start in range(0, len(secret) - size + 1, size))


def might_hold_secret(text: str, secrets: Iterable[str]) -> bool:
    """Whether :func:`scrub` could change ``text``; ``False`` means it would return it as it is.

    A judge's every reply goes through the scrubber: a few substring searches (the marks, and the
    anchors every fragment of a secret holds) settle most texts, instead of a dozen regex passes.
    Over JSON (a reply, a dumped verdict) a ``False`` also holds for every string inside it: with no
    backslash, each is written verbatim between its quotes, and a mark is no less a mark beside one.
    """
    lowered = text.lower()
    return any(mark in lowered for mark in _MARKS) or any(
        anchor in text for secret in secrets if secret for anchor in _anchors(secret)
    )


def scrub(text: str, secrets: Iterable[str] | None = None) -> str:
    """``text`` with API keys removed: ``secrets`` (default: :func:`secrets_in_environment`) as
    written, JSON-escaped or in fragments, key-shaped tokens, and credentials inside URLs."""
    candidates = secrets_in_environment() if secrets is None else secrets
    if not might_hold_secret(text, candidates):
        return text
    for secret in sorted(filter(None, candidates), key=len, reverse=True):
        text = _without_fragments(_escaped_form(secret).sub(REDACTED, text), secret)
    for pattern in _SECRET_PATTERNS:
        text = pattern.sub(lambda match: (match.group(1) if match.groups() else "") + REDACTED, text)
    return redact_url(text)


def scrub_value(value: Any, secrets: Iterable[str]) -> Any:
    """``value`` (JSON-like: dicts, lists, strings, scalars) with every string scrubbed."""
    if isinstance(value, str):
        return scrub(value, secrets)
    if isinstance(value, list):
        return [scrub_value(item, secrets) for item in value]
    if isinstance(value, dict):
        return {key: scrub_value(item, secrets) for key, item in value.items()}
    return value
