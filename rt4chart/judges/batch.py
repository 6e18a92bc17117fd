"""A judge on OpenAI's Batch API (``/v1/files`` + ``/v1/batches``, half the online price): the same
requests, sent in rounds instead of one by one.

:class:`BatchSender` is the OpenAI-compatible sender with another way to send: each attempt's body
(the very body the online sender would POST) becomes a line of a batch input file. The method code
does not change: its calls wait on the :class:`BatchRounds` collector, which submits every request
held when the event loop has nothing else to run (every sample in flight is waiting on a reply),
polls the batch, and answers each waiting call from the output file. The stages therefore run
round by round across all samples in flight: decomposition, then the local windows, then the
global stage, then the re-asks; N samples in flight take as many rounds as the deepest sample has
stages, whatever N is.

Nothing is paid twice. A request's ``custom_id`` is a hash of its body, so a rerun asks for the
same ids. Before a round is uploaded, its ids are appended to the journal beside ``--out``
(:class:`BatchJournal`), and the batch id once it is created; the batch carries the submission's
id in its metadata, so a batch whose creation the journal missed (a kill between the two) is found
again by listing the provider's batches. A later run reads the journal and polls what was submitted
instead of submitting it again. A request whose batch failed, expired or was cancelled, or whose
line failed, is submitted once more; then its call fails as an online call that got no reply does
(the record is incomplete, the run exits 4).

Every reply goes through the transport policy as an online reply does (parsing, re-asks, the cache
under the online key), priced at the batch rate (:data:`BATCH_PRICE_FACTOR` of the profile's).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pydantic_core
from pydantic import BaseModel, ConfigDict, Field

from rt4chart.judges.bounded_http import DecodedBody
from rt4chart.judges.budget import Ledger, call_account
from rt4chart.judges.openai_compat import (
    EndpointError,
    ErrorResponse,
    MalformedResponse,
    OpenAICompatSender,
    completion_reply,
)
from rt4chart.judges.pacing import RateSignal
from rt4chart.judges.policy import Reply, attempt_max_cost_usd, status_code
from rt4chart.judges.replies import prompt_token_bound
from rt4chart.protocol import BudgetExhausted, JudgeRequest, Message, waiting_on_provider
from rt4chart.types import Usage

BATCH_PRICE_FACTOR = 0.5
"""What a batched token costs as a share of the online price (OpenAI's and Anthropic's batch discount)."""

POLL_ENV = "RT4_BATCH_POLL_S"
"""Environment variable: seconds between two polls of a batch (default :data:`DEFAULT_POLL_S`)."""

DEFAULT_POLL_S = 30.0
"""Seconds between two polls of a batch when neither ``--batch-poll`` nor :data:`POLL_ENV` says."""

MAX_SUBMISSIONS = 2
"""Times one request is submitted at most: once, and once more after its batch or line failed."""

MAX_BATCH_REQUESTS = 50_000
"""Requests one OpenAI batch may hold: a round of more is split."""

MAX_BATCH_BYTES = 200_000_000
"""Bytes one OpenAI batch input file may hold: a round of more is split."""

LINE_OVERHEAD_BYTES = 200
"""What a request's line adds to its body (custom id, method, URL, brackets), counted generously."""

BATCH_FILE_CAP_BYTES = 256 << 20
"""The most bytes read of one output or error file (above the providers' 200 MB input limit)."""

SETTLE_TICKS = 20
"""Event-loop turns with no new request before a round is submitted: a sample woken by a reply
reaches its next call within a few turns (its futures and gathers), CPU work in between does not
yield at all, so a round holds the calls of every sample that can make one."""

SUBMISSION_KEY = "rt4chart_submission"
"""The batch metadata key holding the journal's submission id."""

FAILED_STATES = frozenset({"failed", "expired", "cancelled"})
"""Batch states whose requests without an output line are submitted again (once)."""

FINISHED_STATES = FAILED_STATES | {"completed"}
"""Batch states after which the batch's output and error files are read."""


def poll_interval_s() -> float:
    """``$RT4_BATCH_POLL_S`` when it is a positive number, else :data:`DEFAULT_POLL_S`."""
    try:
        configured = float(os.environ.get(POLL_ENV, ""))
    except ValueError:
        return DEFAULT_POLL_S
    return configured if configured > 0 else DEFAULT_POLL_S


class BatchSettings(BaseModel):
    """How a run sends its calls through a Batch API (``--batch``); built by the run layer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    poll_s: float = Field(default_factory=poll_interval_s, gt=0.0)
    """Seconds between two polls of a batch."""
    journal: Path | None = None
    """The journal of submitted requests (beside ``--out``); ``None``: kept in memory only."""
    resume: bool = False
    """Poll what the journal says was submitted (``--resume``); else the journal starts afresh, as
    ``--out`` does."""


class BatchRequestFailed(Exception):
    """A batched request got no reply after :data:`MAX_SUBMISSIONS` submissions."""


def custom_id_of(body: bytes) -> str:
    """A request's ``custom_id``: the hash of the body it sends, so the same request asked again (a
    rerun, two samples asking the same) has the same id."""
    return "rt4-" + hashlib.sha256(body).hexdigest()[:40]


@dataclass
class Submission:
    """One batch as the journal knows it."""

    custom_ids: list[str]
    """The requests it holds."""
    batch_id: str | None = None
    """The provider's id once created (``None``: the journal saw no creation)."""
    intended_at: float | None = None
    """When it was journaled (Unix seconds): a batch created for it cannot be older (how a sender
    whose batches carry no metadata finds it again)."""


@dataclass
class BatchResults:
    """What a finished batch answered, whatever the provider's shapes."""

    status: str
    """How the batch ended, in the provider's words."""
    replies: dict[str, dict[str, Any]]
    """The response body of each request answered, by custom id."""
    reasons: dict[str, str]
    """Why each request that got a line but no reply has none, by custom id."""


class BatchJournal:
    """An append-only JSON-lines file of submissions: ``{"submission", "custom_ids"}`` written and
    flushed to disk before the upload, ``{"submission", "batch"}`` once the batch exists."""

    def __init__(self, path: Path | None, *, resume: bool) -> None:
        self.path = path
        self.submissions: dict[str, Submission] = {}
        # A fresh run replaces the file at its first submission (made under the output's lock).
        self._replace = not resume
        if resume and path is not None and path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                entry = json.loads(line) if line.strip() else {}
                name = entry.get("submission")
                if not isinstance(name, str):
                    continue
                if "custom_ids" in entry:
                    at = entry.get("at")
                    intended_at = float(at) if isinstance(at, int | float) else None
                    self.submissions[name] = Submission([str(i) for i in entry["custom_ids"]], intended_at=intended_at)
                elif name in self.submissions and isinstance(entry.get("batch"), str):
                    self.submissions[name].batch_id = entry["batch"]

    def _append(self, entry: dict[str, Any]) -> None:
        if self.path is None:
            return
        with self.path.open("w" if self._replace else "a", encoding="utf-8") as journal:
            self._replace = False
            journal.write(json.dumps(entry) + "\n")
            journal.flush()
            os.fsync(journal.fileno())

    def intend(self, custom_ids: list[str]) -> str:
        """Record a submission about to be uploaded; returns its id."""
        name, at = uuid.uuid4().hex, time.time()
        self.submissions[name] = Submission(list(custom_ids), intended_at=at)
        self._append({"submission": name, "at": at, "custom_ids": custom_ids})
        return name

    def created(self, name: str, batch_id: str) -> None:
        self.submissions[name].batch_id = batch_id
        self._append({"submission": name, "batch": batch_id})


@dataclass
class _Held:
    """A request waiting for its reply."""

    body: bytes
    reply: asyncio.Future[dict[str, Any]]
    worst_usd: float
    """What its line can cost at most, at batch prices (what a round reserves for it)."""
    reserved_usd: float = 0.0
    """What the budget holds reserved for its line until a call books the line or the line fails."""
    booked: bool = False
    """Whether a call has booked its line (the calls that share the line after it pay nothing)."""
    submissions: int = 0
    waiters: int = 0
    """Calls awaiting the reply: a request none awaits any more (its run stopped) is not submitted."""


@dataclass(frozen=True)
class Delivery:
    """An output line's response body, as one call receives it."""

    body: dict[str, Any]
    """The response body (a chat completion)."""
    shared: bool
    """Whether another call received the same line first and booked it (see :attr:`Reply.shared`)."""


@dataclass
class BatchRounds:
    """The collector: requests held until a round is submitted, the batches being polled, and what
    the journal says was submitted before. One per sender and event loop."""

    sender: BatchSender
    journal: BatchJournal
    pending: dict[str, _Held] = field(default_factory=dict)
    """Requests not yet in a batch, by custom id."""
    held: dict[str, _Held] = field(default_factory=dict)
    """Every request waiting for a reply, by custom id."""
    answered: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Output lines of earlier-submitted batches that no call has asked for yet."""
    submitted_before: dict[str, list[str]] = field(default_factory=dict)
    """Batch ids of the journal holding each custom id (resumed, not yet polled)."""
    polled: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    """The follower of each batch being polled, by batch id."""
    finished: dict[str, str] = field(default_factory=dict)
    """Batches followed to their end: why a request they held without an output line got none."""
    rounds: int = 0
    """Rounds submitted so far (a resubmission is a round; a round split by the caps is one)."""
    ledger: Ledger | None = None
    """The budget the calls are metered against (the first metered call's; ``None``: no meter)."""
    _arrivals: int = 0
    _settling: asyncio.Task[None] | None = None
    _resumed: asyncio.Task[None] | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def ask(self, body: bytes, worst_usd: float) -> Delivery:
        """The output line's response body for the request ``body``, whose line costs at most
        ``worst_usd``. The budget admits the line with its round; a line submitted before (resumed)
        when a call asks for it. The first call to receive a line books it (its reservation moves
        into the call's account), the others share it."""
        if self._resumed is None:
            self._resumed = asyncio.ensure_future(self._find_submitted())
        try:
            await asyncio.shield(self._resumed)
        except Exception:
            self._resumed = None  # the provider could not list its batches: the next call asks again
            raise
        account = call_account()
        if account is not None:
            self.ledger = account.ledger
        custom_id = custom_id_of(body)
        if custom_id in self.answered:
            self._reserve_submitted(worst_usd)
            if account is not None:
                account.take(worst_usd)
            return Delivery(self.answered.pop(custom_id), shared=False)
        held = self.held.get(custom_id)
        if held is None:
            held = _Held(body, asyncio.get_running_loop().create_future(), worst_usd)
            batches = self.submitted_before.get(custom_id, [])
            if batches:
                self._reserve_submitted(worst_usd)
                held.reserved_usd = worst_usd if self.ledger is not None else 0.0
                del self.submitted_before[custom_id]
            self.held[custom_id] = held
            held.submissions = len(batches)
            if batches and batches[-1] in self.finished:
                self._retry_or_fail(custom_id, self.finished[batches[-1]])
            elif batches:
                self._poll(batches[-1])
            else:
                self._hold(custom_id, held)
        held.waiters += 1
        try:
            answer = await asyncio.shield(held.reply)
        except asyncio.CancelledError:
            held.waiters -= 1
            if not held.waiters and self.pending.pop(custom_id, None) is not None:
                del self.held[custom_id]  # not yet submitted, and nobody waits for it: never paid
            raise
        shared = held.booked
        if not shared:
            held.booked = True
            if account is not None:
                account.take(held.reserved_usd)
                held.reserved_usd = 0.0
        return Delivery(answer, shared)

    def _reserve_submitted(self, worst_usd: float) -> None:
        """Reserve a line an earlier run submitted (its reply is paid whenever it comes back), or
        stop the run: nothing is submitted, and a later ``--resume`` polls the batch again."""
        if self.ledger is not None and not self.ledger.reserve(worst_usd):
            raise BudgetExhausted(
                f"a request submitted before, needing up to ${worst_usd:.6f} at batch prices, would cross the "
                f"budget (${self.ledger.spent_usd:.6f} spent of ${self.ledger.limit_usd})"
            )

    def _release(self, held: _Held) -> None:
        """Give back the reservation of a line that came back without a reply (not paid)."""
        if held.reserved_usd and self.ledger is not None:
            self.ledger.settle(held.reserved_usd, Usage())
        held.reserved_usd = 0.0

    def _hold(self, custom_id: str, held: _Held) -> None:
        self.pending[custom_id] = held
        self._arrivals += 1
        if self._settling is None:
            self._settling = self._start(self._submit_when_settled())

    def _start(self, work: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _find_submitted(self) -> None:
        """Read the journal: each request a created batch holds is polled, never submitted again.
        A submission whose batch id the journal lacks is looked up at the provider (the sender's
        :meth:`~BatchSender.find_lost`)."""
        missing = {name: sub for name, sub in self.journal.submissions.items() if sub.batch_id is None}
        if missing:
            known = {sub.batch_id for sub in self.journal.submissions.values() if sub.batch_id is not None}
            for name, batch_id in (await self.sender.find_lost(missing, known)).items():
                self.journal.created(name, batch_id)
        for submission in self.journal.submissions.values():
            if submission.batch_id is not None:
                for custom_id in submission.custom_ids:
                    self.submitted_before.setdefault(custom_id, []).append(submission.batch_id)

    async def _submit_when_settled(self) -> None:
        seen, idle = -1, 0
        while idle < SETTLE_TICKS:
            await asyncio.sleep(0)
            idle = idle + 1 if self._arrivals == seen else 0
            seen = self._arrivals
        self._settling = None
        pending, self.pending = self.pending, {}
        if not pending:
            return
        if not self._admit(pending):
            return
        self.rounds += 1
        chunks = self._chunks(pending)
        for number, custom_ids in enumerate(chunks, start=1):
            label = f"round {self.rounds}" + (f", batch {number} of {len(chunks)}" if len(chunks) > 1 else "")
            self._start(self._submit(custom_ids, label))

    def _chunks(self, pending: dict[str, _Held]) -> list[list[str]]:
        """The custom ids of ``pending`` in batches within the provider's request and byte limits (a single
        line over the byte cap goes alone)."""
        chunks: list[list[str]] = []
        size = 0
        for custom_id, held in pending.items():
            line = len(held.body) + LINE_OVERHEAD_BYTES
            full = len(chunks[-1]) >= self.sender.max_batch_requests if chunks else True
            if full or (chunks[-1] and size + line > self.sender.max_batch_bytes):
                chunks.append([])
                size = 0
            chunks[-1].append(custom_id)
            size += line
        return chunks

    def _admit(self, pending: dict[str, _Held]) -> bool:
        """Reserve the worst case of every line of a round, or fail every call of it with
        :class:`BudgetExhausted` (nothing of the round is journaled or submitted)."""
        worst = sum(held.worst_usd for held in pending.values())
        if self.ledger is None:
            return True
        if not self.ledger.reserve(worst):
            message = (
                f"a round of {len(pending)} {self.sender.name} requests needing up to ${worst:.6f} at batch prices "
                f"would cross the budget (${self.ledger.spent_usd:.6f} spent of ${self.ledger.limit_usd})"
            )
            for custom_id in pending:
                self._fail(custom_id, BudgetExhausted(message))
            return False
        for held in pending.values():
            held.reserved_usd = held.worst_usd
        return True

    async def _submit(self, custom_ids: list[str], label: str) -> None:
        for custom_id in custom_ids:
            self.held[custom_id].submissions += 1
        try:
            name = self.journal.intend(custom_ids)
            requests = [(custom_id, self.held[custom_id].body) for custom_id in custom_ids]
            batch_id = await self.sender.create_batch(requests, name)
            self.journal.created(name, batch_id)
        except Exception as error:  # the provider refused the round: each call fails as online
            for custom_id in custom_ids:
                self._fail(custom_id, error)
            return
        await self._follow(batch_id, label, len(custom_ids))

    def _poll(self, batch_id: str) -> None:
        if batch_id not in self.polled:
            self.polled[batch_id] = self._start(self._follow(batch_id, "a batch submitted before", None))

    async def _follow(self, batch_id: str, what: str, requests: int | None) -> None:
        """Poll ``batch_id`` until it finishes, then answer its requests; those without an output
        line are submitted once more or fail."""
        try:
            results = await self.sender.results(await self.sender.wait_for(batch_id, what, requests))
        except Exception as error:
            if status_code(error) == 404:  # a journaled batch the provider does not know: never ran
                self.finished[batch_id] = f"the provider knows no batch {batch_id}"
                for custom_id in self._waiting_on(batch_id):
                    self._retry_or_fail(custom_id, self.finished[batch_id])
                return
            for custom_id in self._waiting_on(batch_id):
                self._fail(custom_id, error)
            return
        for custom_id, body in results.replies.items():
            self._answer(custom_id, body)
        self.finished[batch_id] = f"the batch {batch_id} ended {results.status} without its line"
        for custom_id in self._waiting_on(batch_id):
            reason = results.reasons.get(custom_id, self.finished[batch_id])
            self._retry_or_fail(custom_id, reason)

    def _waiting_on(self, batch_id: str) -> list[str]:
        """The unanswered requests the journal puts in ``batch_id``."""
        held_in = {
            custom_id
            for submission in self.journal.submissions.values()
            if submission.batch_id == batch_id
            for custom_id in submission.custom_ids
        }
        return [custom_id for custom_id in held_in if custom_id in self.held and custom_id not in self.pending]

    def _answer(self, custom_id: str, body: dict[str, Any]) -> None:
        held = self.held.pop(custom_id, None)
        if held is None:
            self.answered[custom_id] = body  # a resumed batch's line nobody asked for yet
        elif not held.reply.done():
            held.reply.set_result(body)

    def _retry_or_fail(self, custom_id: str, reason: str) -> None:
        held = self.held[custom_id]
        self._release(held)  # a resubmission is admitted with its round
        if held.submissions < MAX_SUBMISSIONS:
            self._hold(custom_id, held)
        else:
            self._fail(custom_id, BatchRequestFailed(f"{reason} (submitted {held.submissions} times)"))

    def _fail(self, custom_id: str, error: BaseException) -> None:
        held = self.held.pop(custom_id, None)
        if held is not None:
            self._release(held)
            if not held.reply.done():
                held.reply.set_exception(error)

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()


def _line_error(line: dict[str, Any]) -> str:
    """Why an output or error line holds no reply, in the provider's words."""
    error = line.get("error")
    if isinstance(error, dict):
        return f"{error.get('code')}: {error.get('message')}"
    response = line.get("response") or {}
    body = response.get("body") or {}
    detail = body.get("error", body) if isinstance(body, dict) else body
    detail = detail.get("message", detail) if isinstance(detail, dict) else detail
    return f"HTTP {response.get('status_code')}: {detail}"


class BatchSender(OpenAICompatSender):
    """The OpenAI-compatible sender whose attempts go through the Batch API (see the module docstring)."""

    max_batch_requests = MAX_BATCH_REQUESTS
    """Requests one batch may hold."""
    max_batch_bytes = MAX_BATCH_BYTES
    """Bytes of request bodies one batch may hold."""

    budgeted_by_round = True

    def __init__(self, *args: Any, batch: BatchSettings, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batch = batch
        self._base = self._url.removesuffix("/chat/completions")
        self._rounds: dict[asyncio.AbstractEventLoop, BatchRounds] = {}
        self.journal = BatchJournal(batch.journal, resume=batch.resume)

    @property
    def rounds(self) -> BatchRounds:
        """This event loop's collector."""
        loop = asyncio.get_running_loop()
        if loop not in self._rounds:
            self._rounds = {loop: BatchRounds(self, self.journal)}
        return self._rounds[loop]

    def line_max_cost_usd(self, messages: list[dict[str, str]], request: JudgeRequest) -> float:
        """The most one line can cost at batch prices: its prompt bounded as the online reservation
        bounds it (:meth:`rt4chart.judges.policy.PolicyBackend.max_cost_usd`), a reply of ``max_tokens``."""
        bound = prompt_token_bound(Message.model_validate(message) for message in messages)
        prompt = max(self.count_prompt_tokens(request), bound)
        return attempt_max_cost_usd(prompt, request.params.max_tokens, self.settings.per_token_prices() or (0.0, 0.0))

    async def send(self, messages: list[dict[str, str]], request: JudgeRequest) -> Reply:
        body = self.body(messages, request, self.structured_output)
        delivery = await self.rounds.ask(body, self.line_max_cost_usd(messages, request))
        answer = delivery.body
        try:
            message = answer["choices"][0]["message"]
        except (KeyError, IndexError, TypeError) as error:
            raise MalformedResponse(f"a batch output line without a chat completion: {str(answer)[:200]}") from error
        reply = completion_reply(answer, message, RateSignal())
        return dataclasses.replace(reply, shared=True) if delivery.shared else reply

    def is_transient(self, error: BaseException) -> bool:
        # A request already submitted twice is not retried by the policy's backoff as well.
        return not isinstance(error, BatchRequestFailed) and super().is_transient(error)

    async def _call(
        self, method: str, path: str, *, data: Any = None, json_body: Any = None, headers: dict[str, str] | None = None
    ) -> bytes:
        client = await self._client()
        async with asyncio.timeout(self.settings.timeout_s):
            async with client.request(
                method, f"{self._base}{path}", data=data, json=json_body, headers=headers, allow_redirects=False
            ) as response:
                reader = DecodedBody(response.headers.get("Content-Encoding"), BATCH_FILE_CAP_BYTES)
                async for chunk in response.content.iter_any():
                    reader.feed(chunk)
                status, answered = response.status, response.headers
        body = reader.finish()
        if status >= 400:
            raise EndpointError(self._error_message(status, body), ErrorResponse(status, answered))
        return body

    async def _json(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        answer = pydantic_core.from_json(await self._call(method, path, **kwargs))
        if not isinstance(answer, dict):
            raise MalformedResponse(f"{path} answered {str(answer)[:200]}")
        return answer

    async def create_batch(self, requests: list[tuple[str, bytes]], submission: str) -> str:
        """Upload the ``(custom_id, body)`` requests as a batch input file and create its batch
        (``submission`` in its metadata); returns the batch id."""
        lines = b"".join(
            b'{"custom_id":"%s","method":"POST","url":"/v1/chat/completions","body":%s}\n' % (custom_id.encode(), body)
            for custom_id, body in requests
        )
        form = aiohttp.MultipartWriter("form-data")
        form.append("batch").set_content_disposition("form-data", name="purpose")
        form.append(lines, {"Content-Type": "application/jsonl"}).set_content_disposition(
            "form-data", name="file", filename="rt4chart-batch.jsonl"
        )
        # The session's JSON content type would otherwise label the upload.
        uploaded = await self._json("POST", "/files", data=form, headers={"Content-Type": form.headers["Content-Type"]})
        created = await self._json("POST", "/batches", json_body={
            "input_file_id": uploaded["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h",
            "metadata": {SUBMISSION_KEY: submission},
        })
        return str(created["id"])

    async def find_lost(self, missing: dict[str, Submission], known: set[str]) -> dict[str, str]:
        """The batch ids of ``missing`` submissions (journaled, their creation not), by submission:
        the provider's most recent batches whose metadata holds one's id. ``known``: batch ids the
        journal already names."""
        listed = await self._json("GET", "/batches?limit=100")
        found: dict[str, str] = {}
        for batch in listed.get("data") or []:
            name = (batch.get("metadata") or {}).get(SUBMISSION_KEY) if isinstance(batch, dict) else None
            if isinstance(name, str) and name in missing:
                found[name] = str(batch["id"])
        return found

    def batch_path(self, batch_id: str) -> str:
        """Where the batch ``batch_id`` is retrieved, below the base URL."""
        return f"/batches/{batch_id}"

    def has_ended(self, batch: dict[str, Any]) -> bool:
        """Whether a retrieved batch has finished (its results can be read)."""
        return batch.get("status") in FINISHED_STATES

    async def wait_for(self, batch_id: str, what: str, requests: int | None) -> dict[str, Any]:
        """The batch once it has finished, polled every ``poll_s`` seconds."""
        since = time.monotonic()
        held = f"{requests} requests, " if requests is not None else ""

        def note() -> str:
            return f"{what} waiting on the provider: {batch_id}, {held}{time.monotonic() - since:.0f} s"

        with waiting_on_provider(note):
            while True:
                batch = await self._json("GET", self.batch_path(batch_id))
                if self.has_ended(batch):
                    return batch
                await asyncio.sleep(self.batch.poll_s)

    async def results(self, batch: dict[str, Any]) -> BatchResults:
        """What a finished batch answered: its output file's replies, and why its error file's
        lines and the output lines that are not a 200 got none."""
        reasons: dict[str, str] = {}
        replies: dict[str, dict[str, Any]] = {}
        for line in await self.file_lines(batch.get("error_file_id")):
            reasons[str(line.get("custom_id"))] = _line_error(line)
        for line in await self.file_lines(batch.get("output_file_id")):
            custom_id = str(line.get("custom_id"))
            response = line.get("response") or {}
            if response.get("status_code") == 200 and isinstance(response.get("body"), dict):
                replies[custom_id] = response["body"]
            else:
                reasons[custom_id] = _line_error(line)
        return BatchResults(str(batch.get("status")), replies, reasons)

    async def file_lines(self, file_id: Any) -> list[dict[str, Any]]:
        """The JSON lines of an output or error file (none without a file)."""
        if not isinstance(file_id, str):
            return []
        content = await self._call("GET", f"/files/{file_id}/content")
        return [json.loads(line) for line in content.splitlines() if line.strip()]

    async def aclose(self) -> None:
        rounds = self._rounds.pop(asyncio.get_running_loop(), None)
        if rounds is not None:
            await rounds.aclose()
        await super().aclose()
