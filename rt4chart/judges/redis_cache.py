"""The judge cache on a Redis server, for audits that run on many machines (``--cache-url``).

:class:`RedisStore` gives :class:`rt4chart.judges.cache.JudgeCache` the few operations it uses on its
diskcache directory (get, set, delete, count, size, clear), so the keys, what is stored (only
schema-valid replies) and what a damaged entry becomes (a miss, dropped) are the cache module's,
whichever store holds them. Keys live under one prefix, so a Redis shared with other software
(litellm's own cache, say) is counted and cleared only for rt4chart's entries. The ``redis``
client (the ``redis`` extra) is imported only when a server cache is asked for.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from rt4chart.scrubbing import redact_url

KEY_PREFIX = "rt4chart:judge-calls:"
"""Namespace of rt4chart's entries on a shared server."""

_SCAN_BATCH = 1000
"""Keys fetched per SCAN round trip when counting or clearing."""

OPERATION_TIMEOUT_S = 1.0
"""Seconds one get or set may wait for the server: a cache that answers slower than a judge is no
cache, and a frozen server must not hold a run's calls for long."""

FAILURES_THAT_OPEN = 3
"""Failed operations in a row after which the server is left alone (every get a miss, every set
skipped) for :data:`REOPEN_AFTER_S`: the store's own circuit, apart from the judge's."""

REOPEN_AFTER_S = 30.0
"""Seconds a store whose circuit opened waits before trying the server again."""

_Result = TypeVar("_Result")


class RedisStore:
    """rt4chart's entries on one Redis server. Raises ``ConnectionError`` (an ``OSError``) when the
    server cannot be reached when opened, so a bad ``--cache-url`` stops a run before any work; later
    failures surface as exceptions of the calls, which the judge cache treats as misses."""

    def __init__(self, url: str, *, timeout_s: float = 5.0) -> None:
        self.location = redact_url(url)
        """The server's URL without its password."""
        self._failures = 0
        self._closed_until = 0.0
        self._lock = threading.Lock()
        try:
            import redis
        except ImportError as error:
            raise ConnectionError(
                f"{self.location} needs the redis client ({error}); pip install 'rt4chart[redis]'"
            ) from None
        try:
            self._client: Any = redis.Redis.from_url(
                url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
            )
            self._client.ping()
            # Opened with the patient timeout; every later operation gets the short one.
            self._client.connection_pool.connection_kwargs["socket_timeout"] = min(timeout_s, OPERATION_TIMEOUT_S)
            self._client.connection_pool.reset()
        except (redis.RedisError, ValueError) as error:
            # redis-py's messages hold the host and port, never the password of the URL.
            raise ConnectionError(f"{self.location}: {error}") from None

    def _guarded(self, operation: Callable[..., _Result], *arguments: Any) -> _Result:
        """``operation(*arguments)`` unless the store's circuit is open (then ``ConnectionError`` at
        once); operations run in worker threads, so the counters are locked."""
        with self._lock:
            if self._failures >= FAILURES_THAT_OPEN and time.monotonic() < self._closed_until:
                raise ConnectionError(f"{self.location}: left alone after {self._failures} failed operations")
        try:
            result = operation(*arguments)
        except Exception as error:
            with self._lock:
                self._failures += 1
                if self._failures >= FAILURES_THAT_OPEN:
                    self._closed_until = time.monotonic() + REOPEN_AFTER_S
            raise ConnectionError(f"{self.location}: {error}") from None
        with self._lock:
            self._failures = 0
        return result

    def get(self, key: str) -> bytes | None:
        value: bytes | None = self._guarded(self._client.get, KEY_PREFIX + key)
        return value

    def set(self, key: str, value: str) -> None:
        self._guarded(self._client.set, KEY_PREFIX + key, value)

    def delete(self, key: str) -> None:
        self._guarded(self._client.delete, KEY_PREFIX + key)

    def _keys(self) -> list[bytes]:
        return list(self._client.scan_iter(match=KEY_PREFIX + "*", count=_SCAN_BATCH))

    def __len__(self) -> int:
        return len(self._keys())

    def volume(self) -> int:
        """Bytes of the stored values (Redis' own overhead not included)."""
        keys = self._keys()
        if not keys:
            return 0
        pipeline = self._client.pipeline(transaction=False)
        for key in keys:
            pipeline.strlen(key)
        return int(sum(pipeline.execute()))

    def clear(self) -> int:
        """Remove rt4chart's entries (nothing else on the server); returns how many there were."""
        keys = self._keys()
        for start in range(0, len(keys), _SCAN_BATCH):
            self._client.delete(*keys[start : start + _SCAN_BATCH])
        return len(keys)

    def close(self) -> None:
        self._client.close()
