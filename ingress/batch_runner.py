"""The batch runner: a background task of the ingress service that runs batches' lines
through this node's own OpenAI endpoint.

Each line is an ordinary request to the node's HTTP port over loopback, so it takes the
whole request path: routing to any node serving its model, the key's limits and budget,
usage rows. It is sent as the batch's key (``ingress.internal_auth``), in the lowest
priority class (``X-Otela-Priority: batch``) with an hour to wait in the ingress's queue
(``X-Otela-Queue-Timeout: 3600``): the scheduler runs it only on capacity nothing else
wants (a node without that scheduler ignores both headers).

How a batch runs (``docs/scheduling.md#the-batch-api``):
- ``claim`` (every ``poll_s``, or at once when a batch is made or cancelled here) takes the
  unfinished batches nobody holds, and renews this runner's lease on its own;
- a batch being validated has its input file read into lines (``ingress.batch_lines``);
- its lines without a result are sent, at most ``per_batch`` at once per batch and
  ``per_ingress`` at once over all; a 429, 502, 503 or 504 (or no answer) is tried again
  after a backoff that honours ``Retry-After``, up to ``attempts`` times;
- each answer is recorded (``batch_store.record``: the result and its count in one
  transaction) before the line counts as done; a line in flight when the process dies has
  no result, so it runs again after the restart;
- a cancel stops new lines (those in flight finish); past the completion window the batch
  expires; when no line is left the output and error files are made.
Nothing here raises out of ``run``: a failing database or batch is logged and tried again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import trio

from ingress import batch_store, batches, files
from ingress.batch_lines import (
    InputUnusable,
    decode_body,
    error_line,
    error_of,
    output_line,
    parse_input,
)
from ingress.batches import Batch, line_request_id
from ingress.database import Database
from ingress.internal_auth import InternalCredentials

log = logging.getLogger("otela.ingress.batches")

RETRY_STATUSES = frozenset({429, 502, 503, 504})
UNKNOWN_KEY_TRIES = 4  # 401s retried (0.5 + 1 + 2 + 4 s: a key refresh is every second)
PRIORITY_HEADER = "x-otela-priority"
QUEUE_TIMEOUT_HEADER = "x-otela-queue-timeout"
_PAGE = 256  # pending lines read at once
_MAX_BACKOFF_S = 60.0
_MAX_RETRY_AFTER_S = 600.0


@dataclass(frozen=True)
class RunnerSettings:
    per_batch: int = 16  # lines of one batch in flight at once
    per_ingress: int = 64  # lines of all batches in flight at once
    attempts: int = 8  # tries of a line that gets 429/502/503/504 or no answer
    queue_timeout_s: int = 3600  # X-Otela-Queue-Timeout
    lease_s: float = 30.0  # a runner that stops renewing loses its batches after this
    poll_s: float = 1.0  # how often batches made elsewhere, and cancels, are looked for
    backoff_s: float = 0.5  # the first retry's wait (doubling)


def retry_delay(attempt: int, retry_after: str | None, base: float = 0.5) -> float:
    """How long to wait before attempt ``attempt + 1``: the answer's ``Retry-After`` (in
    seconds; capped) when it gave one, else ``base`` doubled per attempt (capped)."""
    if retry_after is not None:
        try:
            return min(_MAX_RETRY_AFTER_S, max(0.0, float(retry_after)))
        except ValueError:
            pass  # an HTTP date: rare here (otela sends seconds); back off instead
    return min(_MAX_BACKOFF_S, base * 2 ** (attempt - 1))


@dataclass
class _Run:
    """A batch this runner is running now."""

    batch_id: str
    stop: trio.Event = field(default_factory=trio.Event)  # cancelled, or taken over


class BatchRunner:
    def __init__(self, db: Database, runner_id: str, credentials: InternalCredentials,
                 settings: RunnerSettings | None = None) -> None:
        self.db = db
        self.runner_id = runner_id
        self.credentials = credentials
        self.settings = settings or RunnerSettings()
        self.limiter = trio.CapacityLimiter(self.settings.per_ingress)
        self.running: dict[str, _Run] = {}
        self._wake = trio.Event()
        self._url: str | None = None
        self._serving = trio.Event()
        self.sent = 0  # requests sent (retries included)
        self.recorded = 0

    # -- what the API and the service tell it ----------------------------------------------

    def serving_at(self, url: str) -> None:
        """The node's HTTP port is open at ``url`` (loopback): lines may be sent."""
        self._url = url.rstrip("/")
        self._serving.set()

    def wake(self) -> None:
        """A batch was made or cancelled here: look at once, not at the next poll."""
        self._wake.set()

    def stop(self, batch_id: str) -> None:
        """A batch was cancelled here: send no more of its lines (those in flight finish)."""
        run = self.running.get(batch_id)
        if run is not None:
            run.stop.set()
        self._wake.set()

    # -- the task ----------------------------------------------------------------------------

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await self._serving.wait()
        settings = self.settings
        timeout = httpx.Timeout(10.0, read=settings.queue_timeout_s + 600.0, pool=None)
        limits = httpx.Limits(max_connections=settings.per_ingress,
                              max_keepalive_connections=settings.per_ingress)
        async with httpx.AsyncClient(timeout=timeout, limits=limits, trust_env=False) as client, \
                trio.open_nursery() as nursery:
            while True:
                await self._look(nursery, client)
                with trio.move_on_after(settings.poll_s):
                    await self._wake.wait()
                self._wake = trio.Event()

    async def _look(self, nursery: trio.Nursery, client: httpx.AsyncClient) -> None:
        """Claim and renew; start what is not running; stop what was cancelled elsewhere
        or taken over."""
        try:
            held = await self.db.in_thread(batch_store.claim, self.db, self.runner_id,
                                           time.time(), self.settings.lease_s)
        except Exception as exc:  # the database is away: try again at the next poll
            log.warning("batches: could not claim batches (%s)", exc)
            return
        ids = {batch_id for batch_id, _ in held}
        for batch_id, status in held:
            run = self.running.get(batch_id)
            if run is None:
                run = self.running[batch_id] = _Run(batch_id)
                nursery.start_soon(self._run_batch, client, run)
            elif status == batches.CANCELLING:
                run.stop.set()
        for batch_id, run in self.running.items():
            if batch_id not in ids:
                run.stop.set()  # another runner has it now (or it is over)

    async def _run_batch(self, client: httpx.AsyncClient, run: _Run) -> None:
        try:
            await self._drive(client, run)
        except Exception:
            log.exception("batches: running batch %s failed; it is tried again",
                          run.batch_id)
            await trio.sleep(self.settings.poll_s)
        finally:
            self.running.pop(run.batch_id, None)
            self._wake.set()

    async def _drive(self, client: httpx.AsyncClient, run: _Run) -> None:
        """One batch from where it is to its end (or until it is stopped)."""
        db = self.db
        batch = await db.in_thread(batch_store.held, db, self.runner_id, run.batch_id)
        if batch is None:
            return
        if batch.status == batches.VALIDATING:
            started = await self._validate(batch)
            if started is None:
                return
            batch = started
        while batch.status in (batches.IN_PROGRESS, batches.CANCELLING, batches.FINALIZING):
            if batch.status == batches.IN_PROGRESS and not run.stop.is_set():
                await self._send_lines(client, batch, run)
            done = await db.in_thread(batch_store.finish, db, batch.id, time.time(),
                                      time.time() >= batch.expires_at)
            if done is not None:
                if done.status in batches.TERMINAL:
                    log.info("batches: %s %s (%d of %d lines failed)", done.id, done.status,
                             done.failed, done.total)
                return
            # Lines left without a result (their results could not be recorded): again.
            await trio.sleep(self.settings.poll_s)
            current = await db.in_thread(batch_store.held, db, self.runner_id, batch.id)
            if current is None:
                return
            batch = current

    async def _validate(self, batch: Batch) -> Batch | None:
        """Read the input file into lines; the batch in progress, or ``None`` when it
        ended there (failed, expired, cancelled)."""
        db, now = self.db, time.time()
        if now >= batch.expires_at:
            await db.in_thread(batch_store.expire_unvalidated, db, batch.id, now)
            return None
        text = await db.in_thread(files.upload_content, db, batch.key_id,
                                  batch.input_file_id)
        if text is None:
            await db.in_thread(batch_store.fail, db, batch.id, "file_not_found",
                               "The input file was deleted before the batch started.", now)
            return None
        try:
            # In a worker thread: 50,000 lines take ~1.5 s to parse on a small machine,
            # which on the event loop would stall every request through this ingress.
            parsed = await trio.to_thread.run_sync(parse_input, text, batch.endpoint)
        except InputUnusable as unusable:
            await db.in_thread(batch_store.fail, db, batch.id, unusable.code,
                               unusable.message, time.time())
            return None
        started: Batch = await db.in_thread(batch_store.start, db, batch.id, parsed,
                                            time.time())
        return started if started.status == batches.IN_PROGRESS else None

    async def _send_lines(self, client: httpx.AsyncClient, batch: Batch, run: _Run) -> None:
        """Send the batch's lines that have no result, ``per_batch`` at a time, until none
        is left, the batch is stopped, or its window ends."""
        send, receive = trio.open_memory_channel[tuple[int, str | None, str]](0)
        async with trio.open_nursery() as nursery:
            for _ in range(self.settings.per_batch):
                nursery.start_soon(self._line_worker, client, batch, run, receive.clone())
            receive.close()
            async with send:
                after = 0
                while self._going(batch, run):
                    page = await self.db.in_thread(batch_store.pending_lines, self.db,
                                                   batch.id, after, _PAGE)
                    if not page:
                        break
                    for line in page:
                        if not self._going(batch, run):
                            break
                        await send.send(line)
                    after = page[-1][0]

    @staticmethod
    def _going(batch: Batch, run: _Run) -> bool:
        return not run.stop.is_set() and time.time() < batch.expires_at

    async def _line_worker(self, client: httpx.AsyncClient, batch: Batch, run: _Run,
                           lines: trio.MemoryReceiveChannel[tuple[int, str | None, str]]
                           ) -> None:
        async with lines:
            async for line, custom_id, body in lines:
                if not self._going(batch, run):
                    continue  # stopped while it waited: left unsent, without a result
                async with self.limiter:
                    result = await self._send(client, batch, run, line, custom_id, body)
                if result is not None:
                    await self._record(batch.id, line, *result)

    async def _send(self, client: httpx.AsyncClient, batch: Batch, run: _Run, line: int,
                    custom_id: str | None, body: str) -> tuple[str, str] | None:
        """Send one line (with retries); its (outcome, result line), or ``None`` when the
        batch was stopped while the line waited to be tried again (left unsent)."""
        assert self._url is not None
        request_id = line_request_id(batch.id, line)
        headers = {"authorization": self.credentials.header(batch.key_id),
                   "content-type": "application/json",
                   PRIORITY_HEADER: "batch",
                   QUEUE_TIMEOUT_HEADER: str(self.settings.queue_timeout_s),
                   "x-otela-request-id": request_id}
        url = self._url + batch.endpoint
        content = body.encode()
        attempts = max(1, self.settings.attempts)
        for attempt in range(1, attempts + 1):
            if attempt > 1 and not self._going(batch, run):
                return None
            self.sent += 1
            try:
                answer = await client.post(url, content=content, headers=headers)
            except httpx.HTTPError as exc:
                if attempt == attempts:
                    return files.ERROR, error_line(
                        batch.id, line, custom_id,
                        {"code": "request_failed",
                         "message": f"No answer from the ingress ({type(exc).__name__})."})
                await trio.sleep(retry_delay(attempt, None, self.settings.backoff_s))
                continue
            status = answer.status_code
            # A 401 for a key that made the batch: the process that took the line may not
            # have the key yet (one made through another ingress sharing the database is
            # known here after the next refresh, every second); a few tries cover that, a
            # revoked key still fails the line.
            unknown_key = status == 401 and attempt <= UNKNOWN_KEY_TRIES
            if (status in RETRY_STATUSES or unknown_key) and attempt < attempts:
                await trio.sleep(retry_delay(attempt, answer.headers.get("retry-after"),
                                             self.settings.backoff_s))
                continue
            answered = decode_body(answer.content)
            served_id = answer.headers.get("x-otela-request-id", request_id)
            if 200 <= status < 300:
                return files.OK, output_line(batch.id, line, custom_id, status, served_id,
                                             answered)
            return files.ERROR, error_line(batch.id, line, custom_id,
                                           error_of(status, answered), status, served_id,
                                           answered)
        raise AssertionError("unreachable")  # the last attempt always returns

    async def _record(self, batch_id: str, line: int, outcome: str, result: str) -> None:
        """Record a line's result; while the database refuses, keep trying (the result is
        lost only if the process dies first, and then the line runs again)."""
        failures = 0
        while True:
            try:
                await self.db.in_thread(batch_store.record, self.db, batch_id, line,
                                        outcome, result)
                self.recorded += 1
                return
            except Exception as exc:
                failures += 1
                log.warning("batches: could not record line %d of %s (%s)", line, batch_id,
                            exc)
                await trio.sleep(min(5.0, 0.1 * 2 ** min(failures, 6)))

    def report(self) -> dict[str, Any]:
        return {"batches_running": len(self.running), "batch_requests_sent": self.sent,
                "batch_results_recorded": self.recorded}
