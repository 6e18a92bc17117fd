"""Disk cache of judge calls, so an audit never pays twice for the same call.

The key is a sha256 over everything that can change a reply: the judge's identity, the task, the
output schema, every generation parameter, the prompt template hash and the full rendered
messages. Only schema-valid replies are stored. diskcache keeps entries in SQLite, which makes a
cache directory safe to share between concurrent runs; an entry that cannot be read or no longer
validates is treated as a miss and dropped, never as an error. A cache that cannot be opened at
all (a corrupt ``cache.db``, a path that is a file) raises :class:`CacheError` before any work.
A cache server shared by many machines (``redis://...``, :mod:`rt4chart.judges.redis_cache`) keeps the
same keys and the same rules; :func:`open_cache` picks the backend from the location.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import logging
import os
import sqlite3
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import diskcache
import platformdirs
from pydantic import BaseModel

from rt4chart.method.tasks import VerifyInput
from rt4chart.protocol import Backend, BackendWrapper, JudgeRequest, JudgeResponse, output_json_schema
from rt4chart.types import Usage

if TYPE_CHECKING:
    from rt4chart.judges.redis_cache import RedisStore

CACHE_FORMAT = 1
"""Bumped when the stored value format changes; part of every key."""


def default_cache_dir() -> Path:
    """Per-user cache directory (``~/.cache/rt4chart/judge-calls`` on Linux)."""
    return Path(platformdirs.user_cache_dir("rt4chart")) / "judge-calls"


def cache_location(
    cache_dir: Path | None, cache_url: str | None, *, per_user_default: bool = True
) -> Path | str | None:
    """The judge cache a command uses: the Redis server of --cache-url, else --cache-dir, else the
    per-user cache directory (or none, for a command whose runs are independent by default)."""
    if cache_dir is not None and cache_url is not None:
        raise CacheError("--cache-dir and --cache-url are alternatives: give one")
    return cache_url or cache_dir or (default_cache_dir() if per_user_default else None)


@cache
def _schema_digest(schema: type[BaseModel]) -> str:
    encoded = json.dumps(output_json_schema(schema), sort_keys=True).encode()
    return hashlib.sha256(encoded).hexdigest()


def request_key(judge: str, request: JudgeRequest) -> str:
    """The cache key of ``request`` sent to the judge named ``judge``."""
    material = {
        "format": CACHE_FORMAT,
        "judge": judge,
        "task": request.task,
        "schema": _schema_digest(request.output_schema),
        "params": request.params.model_dump(),
        "prompt_version": request.prompt_version,
        "messages": [m.model_dump() for m in request.messages],
    }
    if isinstance(request.payload, VerifyInput) and request.payload.answer is not None:
        # A judge that reads the answer (VerifyInput.answer) judges it, which no message holds; every
        # other judge's requests carry none, so their keys stay what they were.
        material["answer"] = request.payload.answer.model_dump()
    if request.template_kwargs is not None:
        # Only where set: the keys of every request without them stay what they were.
        material["template_kwargs"] = request.template_kwargs
    encoded = json.dumps(material, sort_keys=True, ensure_ascii=False).encode()
    return hashlib.sha256(encoded).hexdigest()


class CacheError(ValueError):
    """The cache directory cannot be used (not a directory, a corrupt database, no permission)."""


_STORE_FAILURES = (sqlite3.Error, OSError)
"""What diskcache (and, as ``ConnectionError``, an ``OSError``, the Redis store) raises for a cache
it cannot use."""


log = logging.getLogger(__name__)


def _disk_full(directory: Path, error: Exception) -> bool:
    """Whether ``error`` opening the cache at ``directory`` comes from a full disk (SQLite says "disk
    full", or "disk I/O error" when it cannot create its WAL files there)."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    try:
        return os.statvfs(directory).f_bavail == 0
    except OSError:
        return False


class ReadOnlyStore:
    """The entries of a diskcache directory read through SQLite alone, writing nothing: a cache on
    a full disk still answers what it holds (diskcache itself writes its settings on open)."""

    def __init__(self, directory: Path) -> None:
        database: Path = (directory / str(diskcache.core.DBNAME)).resolve()
        if not database.is_file():
            raise sqlite3.OperationalError(f"no cache database in {directory}")
        try:
            self._db = sqlite3.connect(f"{database.as_uri()}?mode=ro", uri=True, check_same_thread=False)
            self._db.execute("SELECT count(*) FROM Cache").fetchone()
        except sqlite3.Error:
            # A database in WAL mode needs its -shm file, which a full disk cannot create: read the
            # file as it stands (entries still in a WAL file left by a killed run are misses).
            self._db = sqlite3.connect(f"{database.as_uri()}?mode=ro&immutable=1", uri=True, check_same_thread=False)
            self._db.execute("SELECT count(*) FROM Cache").fetchone()
        self._disk = diskcache.Disk(str(directory))
        self._file = database

    def get(self, key: str) -> str | None:
        rows = self._db.execute(
            "SELECT mode, filename, value FROM Cache WHERE key = ? AND raw = 1"
            " AND (expire_time IS NULL OR expire_time > ?)", (key, time.time())
        ).fetchall()
        if not rows:
            return None
        mode, filename, value = rows[0]
        stored: str = self._disk.fetch(mode, filename, value, False)
        return stored

    def set(self, key: str, value: str) -> None:
        raise OSError(errno.ENOSPC, "the cache's disk is full: this run stores nothing in it")

    def delete(self, key: str) -> None:
        return None  # a damaged entry stays: nothing is written

    def __len__(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM Cache").fetchone()[0])

    def volume(self) -> int:
        return self._file.stat().st_size

    def clear(self) -> int:
        raise sqlite3.OperationalError("the cache's disk is full: nothing can be removed while it is")

    def close(self) -> None:
        self._db.close()


def _unusable(directory: Path | str, error: Exception) -> CacheError:
    return CacheError(
        f"cannot use the cache at {directory}: {error}; pass another --cache-dir, remove the "
        "damaged directory, or run with --no-cache"
    )


@dataclass(frozen=True)
class CacheStats:
    """What a cache directory holds."""

    directory: Path | str
    """The cache directory, or the cache server's URL without its password."""
    entries: int
    size_bytes: int


class JudgeCache:
    """A diskcache directory (or a Redis server) of schema-valid judge replies."""

    def __init__(self, directory: Path | str | None = None, *, server: RedisStore | None = None) -> None:
        self.directory: Path | str
        """The cache directory, or the cache server's URL without its password (``server``)."""
        self._store: diskcache.Cache | RedisStore | ReadOnlyStore
        self.unstored = 0
        """Replies this cache could not store (its disk full, or read-only): counted, warned once."""
        if server is not None:
            self.directory, self._store = server.location, server
            return
        self.directory = Path(directory) if directory else default_cache_dir()
        try:
            self._store = diskcache.Cache(str(self.directory))
        except _STORE_FAILURES as error:
            if not _disk_full(self.directory, error):
                raise _unusable(self.directory, error) from None
            try:
                self._store = ReadOnlyStore(self.directory)
            except _STORE_FAILURES:
                raise _unusable(self.directory, error) from None
            log.warning("warning: the cache at %s is on a full disk: this run reads it and stores nothing",
                        self.directory)

    def get(self, key: str, schema: type[BaseModel]) -> JudgeResponse | None:
        """The stored reply, its ``parsed`` object validated against ``schema``; ``None`` on a miss
        or an unreadable entry."""
        try:
            stored = self._store.get(key)
            if stored is None:
                return None
            response = JudgeResponse.model_validate_json(stored)
            return response.model_copy(update={"parsed": schema.model_validate(json.loads(stored)["parsed"])})
        except Exception:  # any damaged entry is a miss by contract
            self._forget(key)
            return None

    async def aget(self, key: str, schema: type[BaseModel]) -> JudgeResponse | None:
        """:meth:`get` from the event loop: a cache server is read in a worker thread, so a slow or
        frozen server delays the calls that wait for it, never the loop and every other call."""
        if self._remote:
            return await asyncio.to_thread(self.get, key, schema)
        return self.get(key, schema)

    async def aput(self, key: str, response: JudgeResponse) -> None:
        """:meth:`put` from the event loop (a cache server in a worker thread, as :meth:`aget`)."""
        if self._remote:
            await asyncio.to_thread(self.put, key, response)
        else:
            self.put(key, response)

    @property
    def _remote(self) -> bool:
        return not isinstance(self._store, diskcache.Cache | ReadOnlyStore)

    def put(self, key: str, response: JudgeResponse) -> None:
        """Store a reply if it is schema-valid; failures are never cached."""
        if response.parsed is None or response.error is not None:
            return
        try:
            self._store.set(key, response.model_dump_json())
        except Exception as error:  # a full or read-only disk must not stop an audit
            self.unstored += 1
            if self.unstored == 1 and not isinstance(self._store, ReadOnlyStore):
                log.warning("warning: the cache at %s cannot store replies (%s): the run goes on without "
                            "storing them", self.directory, error)
            return

    def _forget(self, key: str) -> None:
        try:
            self._store.delete(key)
        except Exception:  # best effort on an already damaged entry
            return

    def stats(self) -> CacheStats:
        try:
            return CacheStats(self.directory, len(self._store), int(self._store.volume()))
        except _STORE_FAILURES as error:
            raise _unusable(self.directory, error) from None

    def clear(self) -> int:
        """Remove every entry; returns how many there were."""
        try:
            return int(self._store.clear())
        except _STORE_FAILURES as error:
            raise _unusable(self.directory, error) from None

    def close(self) -> None:
        if self.unstored:
            log.warning("the cache at %s did not store %d replies", self.directory, self.unstored)
        self._store.close()


CACHE_SERVER_SCHEMES = ("redis://", "rediss://", "unix://")
"""Locations that name a cache server (:mod:`rt4chart.judges.redis_cache`) rather than a directory."""


def open_cache(location: Path | str | None) -> JudgeCache:
    """The judge cache at ``location``: a Redis URL (``redis://HOST:PORT/DB``) opens the shared
    cache server, anything else a diskcache directory (``None``: :func:`default_cache_dir`)."""
    if isinstance(location, str) and location.startswith(CACHE_SERVER_SCHEMES):
        from rt4chart.judges.redis_cache import RedisStore

        try:
            server = RedisStore(location)
        except OSError as error:
            raise CacheError(f"cannot use the cache server: {error}; check --cache-url or use --no-cache") from None
        return JudgeCache(server=server)
    return JudgeCache(location)


def cache_stats(location: Path | str | None) -> CacheStats:
    """What the cache at ``location`` holds, without creating a directory that is not there
    (``rt4 cache stats --cache-dir TYPO`` must not leave an empty cache behind)."""
    directory = location if isinstance(location, Path) else None
    if location is None:
        directory = default_cache_dir()
    if directory is not None and not directory.exists():
        return CacheStats(directory=directory, entries=0, size_bytes=0)
    cache = open_cache(location)
    try:
        return cache.stats()
    finally:
        cache.close()


class CachedBackend(BackendWrapper):
    """Puts a :class:`JudgeCache` in front of a backend."""

    def __init__(self, inner: Backend, cache: JudgeCache) -> None:
        super().__init__(inner)
        self.cache = cache

    async def complete(self, request: JudgeRequest) -> JudgeResponse:
        key = request_key(self.inner.name, request)
        started = time.perf_counter()
        hit = await self.cache.aget(key, request.output_schema)
        if hit is not None:
            return hit.model_copy(
                update={
                    "cached": True,
                    "usage": Usage(cache_hits=1),
                    "latency_s": time.perf_counter() - started,
                }
            )
        response = await self.inner.complete(request)
        await self.cache.aput(key, response)
        return response
