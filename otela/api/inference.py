"""The OpenAI routes: every ``POST /v1/...`` whose JSON body names a ``model`` goes to a
node serving that model, and its answer comes back as that node's engine gave it.

Chat and text completions, embeddings, and whatever else engines serve under ``/v1``
(``/v1/responses``, ``/v1/rerank``, ``/v1/score``, ``/v1/tokenize``...) take the same path:
the body is read once (bounded, ``otela.dataplane.jsonbody``), only ``model`` is looked at,
and the body is sent on as the bytes the client sent. Answers carry who served them
(``x-otela-session-id``, ``-peer-id``, ``-provider-id``, ``x-otela-request-id``, and
``x-otela-path: libp2p`` when it went over libp2p) and ``Server-Timing`` (route lookup,
upstream first byte, total).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import orjson

from otela.api.keygate import KeyGate
from otela.api.observe import Observer
from otela.config.schema import default_of
from otela.dataplane import headers as header_rules
from otela.dataplane.errors import RequestError
from otela.dataplane.exchange import Exchange, UsageTap, prompt_text
from otela.dataplane.headers import Headers
from otela.dataplane.http import Request, Response
from otela.dataplane.jsonbody import BodyError
from otela.dataplane.jsonfields import BodyReader, materialized
from otela.dataplane.migration import (
    CHAT_ROUTE,
    CONTINUABLE_ROUTES,
    Splice,
    continuation_body,
    partial_of,
)
from otela.dataplane.relay import Continuation, Resume, relay, send_error
from otela.dataplane.sse_usage import UsageChunkFilter, ask_for_usage
from otela.routing.admission import AdmissionQueue, flow_of
from otela.routing.ask import Ask, AskError, read_ask
from otela.routing.fairshare import Waiter
from otela.routing.hold import HoldRoom, route_or_hold
from otela.routing.router import Routed, Router

log = logging.getLogger("otela.api")

MIGRATIONS_HEADER = b"x-otela-migrations"

LEASE_WAIT_S = 2.0  # a request refused for want of a budget lease waits this long, once
_ID_PREFIX = os.urandom(6).hex()  # this process; ids are unique across a federation
_ID_COUNTER = itertools.count()


def request_id_of(request: Request) -> bytes:
    """The client's ``x-otela-request-id`` (or ``x-request-id``), else a new one."""
    given = header_rules.value(request.headers, header_rules.REQUEST_ID) or header_rules.value(
        request.headers, header_rules.ENGINE_REQUEST_ID)
    return given[:128] if given else b"%s%012x" % (_ID_PREFIX.encode(), next(_ID_COUNTER))


def _migrations_asked(headers: Headers, allowed: int) -> int:
    """``X-Otela-Migrations: N``: at most N continuations of this request's stream (never
    more than the node allows)."""
    for name, value in headers:
        if name == MIGRATIONS_HEADER:
            try:
                return max(0, min(allowed, int(value)))
            except ValueError:
                return allowed
    return allowed


def _timing(lookup: float, upstream: float, total: float, queued: float = 0.0) -> bytes:
    timing = (b"route;dur=%.3f, upstream;dur=%.3f, total;dur=%.3f"
              % (lookup * 1e3, upstream * 1e3, total * 1e3))
    return timing + b", queue;dur=%.3f" % (queued * 1e3) if queued else timing


class InferenceRoutes:
    def __init__(self, router: Router, observers: Sequence[Observer] = (),
                 keep_prompts: bool = False,
                 affinity_chars: int = default_of("affinity_prefix"),
                 keys: KeyGate | None = None, hold: HoldRoom | None = None,
                 warming: Callable[[], bool] | None = None,
                 queue: AdmissionQueue | None = None) -> None:
        self.router = router
        # Requests wait here for room on a node, in priority and fair-share order.
        self.queue = queue
        self.hold = hold  # --hold-models: wait for a first serving node (scale to zero)
        self.warming = warming  # a replica catching up after a start: no 404 yet
        self.bodies = BodyReader()  # a long body's fields without parsing its prompt
        self.observers = list(observers)
        self.keep_prompts = keep_prompts  # for trace recording with --record-prompts
        self.affinity_chars = affinity_chars  # prefix_affinity: the prompt's first N
        # API keys (``--ingress-db``): every request needs one, and its streams are asked
        # for usage, so the tokens of every answer are counted.
        self.keys = keys

    async def handle(self, request: Request, response: Response, target: str) -> None:
        """Route ``request`` to ``target``: its canonical path and query
        (``otela.dataplane.gate.canonical_path``), which is what the engine gets."""
        request_id = request_id_of(request)
        exchange = Exchange(route=target.partition("?")[0],
                            request_id=request_id.decode("latin-1"))
        try:
            await self._handle(request, response, exchange, request_id, target)
        finally:
            exchange.finished_at = time.perf_counter()
            exchange.status = exchange.status or response.status or 499  # 499: client left
            for observer in self.observers:
                observer.finished(exchange)

    async def _handle(self, request: Request, response: Response, exchange: Exchange,
                      request_id: bytes, path: str) -> None:
        extra: Headers = [(header_rules.REQUEST_ID, request_id)]
        grant: Any = None
        waiter: Waiter | None = None
        try:
            key = None
            if self.keys is not None:  # before anything else: strangers learn nothing
                key = self.keys.authenticate(header_rules.credential(request.headers))
                exchange.api_key = None if key is None else key.id
            try:  # a long body's prompt is not parsed (otela.dataplane.jsonfields)
                body = self.bodies.read(request.body)
            except BodyError as exc:
                raise RequestError(400, str(exc), code=exc.code) from None
            model = body.get("model")
            if not isinstance(model, str) or not model:
                raise RequestError(400, "'model' is required and must be a string",
                                   param="model")
            exchange.model = model
            max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or \
                body.get("max_output_tokens")
            exchange.max_tokens = max_tokens if isinstance(max_tokens, int) and \
                not isinstance(max_tokens, bool) else None
            raw = request.body
            hide_usage = None
            if key is not None:
                assert self.keys is not None
                grant = await self._admit(key, model, exchange.max_tokens, len(raw))
                if ask_for_usage(body, exchange.route):
                    hide_usage, raw = UsageChunkFilter(), orjson.dumps(materialized(body))
            if self.keep_prompts:
                exchange.prompt = prompt_text(body)
            exchange.stream = body.get("stream") is True
            try:
                ask = read_ask(request.headers, body, raw, self.router.base_trust(
                    None if grant is None else grant.providers))
            except AskError as exc:
                raise RequestError(400, str(exc), code="invalid_routing_request",
                                   param=exc.param) from None

            def affinity_key() -> str | None:
                user = body.get("user")
                if isinstance(user, str) and user:
                    return user
                prompt = exchange.prompt or prompt_text(body)
                return prompt[:self.affinity_chars] if prompt else None

            if self.queue is not None:
                waiter = await self._turn(self.queue, model, ask, key, exchange, len(raw))
            before = time.perf_counter()
            routed = await route_or_hold(self.hold, model, lambda: self.router.route(
                model, path, header_rules.forwarded(request.headers, request_id), ask,
                affinity_key, self.router.settings.timeouts.for_body(body), body=body),
                self.warming)
        except (RequestError, BodyError) as caught:
            # BodyError: a long body's prompt, parsed in full to rewrite the body
            error = caught if isinstance(caught, RequestError) else RequestError(
                400, str(caught), code=caught.code)
            exchange.status, exchange.error = error.status, error.code
            if grant is not None and self.keys is not None:
                self.keys.finished(grant, 0)
            if waiter is not None:
                self._ended(exchange, waiter, 0)
            await send_error(response, error, extra)
            return
        exchange.head_at = time.perf_counter()
        node = routed.node
        exchange.node_peer, exchange.node_provider = node.peer_id, node.provider_id
        exchange.node_session = node.session_id
        exchange.path_kind, exchange.attempts = routed.path_kind, routed.attempts
        exchange.status = routed.reply.status
        extra += [(b"x-otela-session-id", node.session_id.encode()),
                  (b"x-otela-peer-id", node.peer_id.encode()),
                  (b"x-otela-provider-id", node.provider_id.encode()),
                  (b"server-timing", _timing(before - exchange.started - exchange.queued_s,
                                             exchange.head_at - before,
                                             exchange.head_at - exchange.started,
                                             exchange.queued_s))]
        if exchange.priority is not None:
            extra.append((b"x-otela-priority", exchange.priority.encode()))
        if routed.path_kind == "libp2p":
            extra.append((b"x-otela-path", b"libp2p"))
        exchange.tap = tap = UsageTap(exchange.stream)
        continued: list[Routed] = []  # nodes that continued the stream (migration)
        resume = self._resume(request, exchange, ask, path, request_id, continued,
                              affinity_key) if exchange.stream else None
        try:
            exchange.bytes_out = await relay(routed.reply, response, extra, tap, hide_usage,
                                             resume=resume, watched=self._watched(routed)
                                             if resume is not None else None)
        finally:
            self.router.release(routed)
            for later in continued:
                self.router.release(later)
            if grant is not None and self.keys is not None:
                prompt = tap.prompt_tokens or 0
                self.keys.finished(grant, prompt + tap.output_tokens, prompt,
                                   exchange.node_provider)
            if self.queue is not None:
                self._ended(exchange, waiter, (tap.prompt_tokens or 0) + tap.output_tokens)

    async def _admit(self, key: Any, model: str, max_tokens: int | None,
                     prompt_bound: int) -> Any:
        """The key gate's grant; where it refused for want of a budget lease that it is
        taking from the database (several ingresses share a budget), after waiting once
        for that take (at most ``LEASE_WAIT_S``), instead of a 429 to the client."""
        assert self.keys is not None
        try:
            return self.keys.admit(key, model, max_tokens, prompt_bound)
        except RequestError as refused:
            wait = getattr(self.keys, "lease_taken", None)
            if refused.code != "budget_reserved" or wait is None or \
                    not await wait(LEASE_WAIT_S):
                raise
        return self.keys.admit(key, model, max_tokens, prompt_bound)

    async def _turn(self, queue: AdmissionQueue, model: str, ask: Ask, key: Any,
                    exchange: Exchange, body_bytes: int) -> Waiter | None:
        """Wait for room on a node, in the request's class and fair share (at once,
        without waiting, when nothing waits for the model and a node has room); the
        charged waiter when it waited, to be settled when it ends."""
        klass = queue.class_of(ask.priority, getattr(key, "priority", None))
        if ask.priority is not None:
            exchange.priority = queue.settings.classes[klass]
        held_back = queue.held_back(klass)
        if queue.idle(model) and self.router.room(model, ask, queue.reserved.get(model, 0),
                                                  held_back):
            return None
        exchange.priority = queue.settings.classes[klass]
        queued = time.perf_counter()
        waiter = await queue.wait_turn(
            model, klass, flow_of(key), queue.estimate(model, body_bytes, exchange.max_tokens),
            queue.timeout_of(ask.queue_timeout, getattr(key, "queue_wait", None)),
            lambda reserved: self.router.room(model, ask, reserved, held_back),
            # room depends on these alone: the same nodes, the same share of their slots
            group=(held_back, ask.trust, ask.clauses))
        exchange.queued_s = time.perf_counter() - queued
        return waiter

    def _ended(self, exchange: Exchange, waiter: Waiter | None, used_tokens: int) -> None:
        """A request ended: its share is charged what it used, and whoever waits for the
        room it held may go."""
        assert self.queue is not None
        if waiter is not None:
            self.queue.settle(exchange.model, waiter, used_tokens)
        self.queue.released()

    def _resume(self, request: Request, exchange: Exchange, ask: Ask, path: str,
                request_id: bytes, continued: list[Routed],
                affinity_key: Callable[[], str | None]) -> Resume | None:
        """How this request's stream (chat or completions) is continued on another node if
        its node breaks off mid-answer (request migration, ``otela.dataplane.migration``),
        as many times as allowed; ``None`` where it never is (other routes, migrations
        off)."""
        if exchange.route not in CONTINUABLE_ROUTES:
            return None
        chat = exchange.route == CHAT_ROUTE
        left = _migrations_asked(request.headers, self.router.settings.stream_migrations)
        if left <= 0:
            return None
        model, broken = exchange.model or "", {exchange.node_session}
        headers = header_rules.forwarded(request.headers, request_id)

        async def resume(relayed: bytes) -> Continuation | None:
            nonlocal left
            partial = partial_of(relayed, chat) if left > 0 else None
            body = None if partial is None else continuation_body(ask.body, partial)
            if partial is None or body is None:
                return None
            left -= 1
            try:
                routed = await self.router.route(
                    model, path, headers, dataclasses.replace(ask, body=body), affinity_key,
                    self.router.settings.timeouts.for_request(True, None),
                    avoid=frozenset(s for s in broken if s))
            except RequestError as error:
                log.info("stream %s: no node could continue it (%s)", request_id.decode(),
                         error.code)
                return None
            continued.append(routed)
            broken.add(routed.node.session_id)
            if routed.reply.status != 200:  # e.g. an engine without continue_final_message
                await routed.reply.aclose()
                return None
            self.router.migrated += 1
            exchange.migrations += 1
            log.info("stream %s: continued on %s after %d content chunks",
                     request_id.decode(), routed.node.session_id[:12], partial.tokens)
            return Continuation(routed.reply, Splice(partial), self._watched(routed))

        return resume

    def _watched(self, routed: Routed) -> AbstractContextManager[Any] | None:
        """While a stream that may be continued is relayed: if its node is suspected or
        stops serving, close the connection (the stream breaks off, and is continued)."""
        abort = getattr(routed.reply, "abort", None)  # HTTP and libp2p replies have one
        if abort is None:
            return None
        session = routed.node.session_id
        return self.router.watch.watching(session, abort,
                                          lambda: self.router.node_gone(session))
