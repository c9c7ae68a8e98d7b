"""The public ingress service as the node runs it: the database, the key gate on the
request path, usage accounting, and the tasks that keep them going.

``IngressService.open`` connects and migrates before the node opens its port (a database
it cannot use stops the node with a clear message rather than serving without keys).
``run`` is the service's background work, in the node's nursery: flushing usage rows,
refreshing keys and others' usage, running batches (once the node says where its port is:
``serving_at``). The same object works in a data-path worker
(``--workers``), each process with its own connection and its own ``ingress_id``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import trio

from ingress import retention
from ingress.access import Access
from ingress.audience import IngressAudience
from ingress.batch_runner import BatchRunner, RunnerSettings
from ingress.database import Database, DatabaseUrl
from ingress.internal_auth import InternalCredentials
from ingress.keys import ApiKey
from ingress.metrics import KeyMetrics
from ingress.migrations import migrate
from ingress.sso.settings import SsoSettings
from ingress.usage import UsageWriter
from otela.api.observe import Observer
from otela.metrics import Registry


class IngressService:
    def __init__(self, db: Database, ingress_id: str, *, open_access: bool = False,
                 admin_token: str | None = None, refresh_interval: float = 1.0,
                 flush_interval: float = 0.025,
                 visibility: dict[str, str] | None = None,
                 batch_max_file_bytes: int = 32 * 1024 * 1024,
                 batch_runner: RunnerSettings | None = None,
                 internal_secret: bytes | None = None, log_prompts: bool = False,
                 usage_retention: float | None = None,
                 sso: SsoSettings | None = None,
                 priority_classes: tuple[str, ...] | None = None,
                 default_priority: str | None = None) -> None:
        self.db = db
        self.sso = sso  # the dashboard's single sign-on (ingress.sso); None: off
        self.ingress_id = ingress_id
        self.open_access = open_access
        self.admin_token = admin_token
        self.access = Access(db, ingress_id, refresh_interval, priority_classes,
                             default_priority)
        self.usage = UsageWriter(db, ingress_id, flush_interval, context=self.access,
                                 log_prompts=log_prompts)
        self.usage_retention = usage_retention  # past it, rows become per-day totals
        # The Batch API (``ingress.batch_api``): its runner sends lines to this node's own
        # port as their batch's key, with a credential only this node's processes can
        # check (``internal_secret``: shared by a node's data-path workers; none: this
        # process's own).
        self.internal = InternalCredentials(internal_secret)
        self.access.internal = self.internal
        self.batch_max_file_bytes = batch_max_file_bytes
        self.batches = BatchRunner(db, ingress_id, self.internal, batch_runner)
        # The node's other processes with a copy of the keys (data-path workers), told of
        # a change made here: ``changed_keys``, ``changed_settings``.
        self._tell_others: Callable[[], Awaitable[object]] | None = None
        # Who sees which inspection endpoint (``otela.api.visibility``).
        self.audience = IngressAudience(self.access, admin_token, visibility)
        # The request path calls these (``otela.api.inference.KeyGate``): bound straight
        # to ``Access`` where nothing is added, one call less per request.
        self.admit: Callable[[ApiKey, str], Any] = self.access.admit
        self.finished: Callable[[Any, int], None] = self.access.finished
        # After a 429 budget_reserved: wait for the budget lease being taken, once.
        self.lease_taken = self.access.lease_taken
        if not open_access:
            self.authenticate: Callable[[bytes | None], ApiKey | None] = \
                self.access.authenticate
            self.screen: Callable[[bytes | None], None] = self.access.screen
        else:
            self.authenticate = self._authenticate_open
            self.screen = self._screen_open

    @classmethod
    def open(cls, url: str, home: Path, ingress_id: str, **options: Any) -> IngressService:
        """Connect, migrate, load the keys; ``DatabaseError`` says why it cannot."""
        db = Database.connect(DatabaseUrl.parse("" if url == "default" else url, home))
        try:
            migrate(db)
            service = cls(db, ingress_id, **options)
            service.access.load()
        except BaseException:
            db.close()
            raise
        return service

    # -- the request path (``otela.api.inference.KeyGate``) -----------------------------

    def _authenticate_open(self, authorization: bytes | None) -> ApiKey | None:
        if authorization is None:
            return None  # anonymous, allowed by --open
        return self.access.authenticate(authorization)

    def _screen_open(self, authorization: bytes | None) -> None:
        if authorization is not None:  # a key, when given, is checked (--open or not)
            self.access.screen(authorization)

    def observers(self, metrics: Registry) -> list[Observer]:
        """What watches the request path for the service: usage rows and per-key metrics."""
        return [self.usage, KeyMetrics(metrics, self.audience)]

    # -- changes made through this process (admin API, a user's own keys) -------------------

    def tell_others_with(self, tell: Callable[[], Awaitable[object]]) -> None:
        self._tell_others = tell

    async def changed_keys(self, keys: list[ApiKey]) -> None:
        """These keys were created or changed here: in force in this process at once, and
        in the node's other processes when this returns (other ingress nodes sharing the
        database take them at their next refresh)."""
        self.access.remember(keys)
        if self._tell_others is not None:
            await self._tell_others()

    async def changed_settings(self) -> None:
        """A team or a price was changed here: every key as its team now holds it, and
        the prices, here and in the node's other processes, when this returns."""
        await self.refresh_keys()
        if self._tell_others is not None:
            await self._tell_others()

    async def refresh_keys(self) -> None:
        """Read what changed now, not at the next periodic refresh; a database that fails
        is left to it (the copy serves meanwhile)."""
        await self.access.refresh_now()

    # -- background ---------------------------------------------------------------------

    def serving_at(self, url: str) -> None:
        """The node's HTTP port is open at ``url``, reachable from this process (loopback)
        and served by it: the batch runner may send its lines there. A process that never
        hears this (a data-path worker) runs no batches."""
        self.batches.serving_at(url)

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.usage.run)
                await nursery.start(self.access.run)
                await nursery.start(self.batches.run)
                if self.usage_retention is not None:
                    await nursery.start(partial(retention.keep, self.db,
                                                self.usage_retention))
                task_status.started()
        finally:
            self.db.close()

    def report(self) -> dict[str, Any]:
        """For ``/v1/health``: is accounting keeping up? The database by its kind only
        (``sqlite``/``postgresql``): its path, host, port and user are nobody's business
        over HTTP, not even the admin's (the operator has them in the config)."""
        healthy = self.access.last_refresh_ok and self.usage.last_write_ok
        return {"database": self.db.dialect,
                "database_status": "ok" if healthy else "failing",
                "keys": len(self.access.by_id), "usage_written": self.usage.written,
                "usage_pending": self.usage.pending(),
                "usage_write_failures": self.usage.failures,
                "usage_rows_dropped": self.usage.dropped,
                "key_refreshes": self.access.refreshes,
                "key_refresh_failures": self.access.refresh_failures,
                **self.batches.report(),
                "open": self.open_access}
