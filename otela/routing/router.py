"""The ingress side of routing: choose a node, send it the request, learn from the answer,
and try another only when the request provably never reached an engine.

Which nodes may serve it: ``candidates.eligible`` (trust, suspicion, requirements,
ejections). Which of them: the policy (``policies``), fed load estimates
(``load.LoadBoard``). How to reach it: ``otela.dataplane.upstream``. What counts as "never
reached": ``NotDelivered`` alone, so no request is ever executed twice; a failure after
delivery is a 502 (``upstream_failed``), silence past the first-byte timeout a 504
(``upstream_timeout``). With ``retry_broken`` (``--retry-broken``) the operator accepts
that a request may run twice: one whose node broke the connection before
answering (it died, most likely, and its work with it) is then sent to another node too,
so that clients see no error while any other node serves the model; a request waiting for
the first byte of a node that the failure detector then suspects (it froze, or is cut off)
is given up there and sent on too (``abandon``). A stream is, too, until its answer
begins (its client has seen nothing yet); once it has begun, request migration continues
it on another node instead (``otela.dataplane.migration``).
Connection failures, 5xx answers and timeouts count towards the node's ejection
(``ejection``); 4xx answers are the client's business and do not.
A node that declined only because it does not know this ingress as a member yet (a 403
from its engine hop: after a partition heals, this ingress rejoins under a new session
that reaches the others a moment later) is tried again, after a short pause, once every
other candidate has been tried, within the same attempt budget; the candidates are looked
up again after each pause, since nodes rejoin under new sessions meanwhile.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import random
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

from otela.config.schema import NodeConfig
from otela.dataplane import headers as policy_headers
from otela.dataplane.deadline import FirstByteTimeouts
from otela.dataplane.errors import (
    NotDelivered,
    RequestError,
    UpstreamFailed,
    UpstreamTimeout,
    clip,
)
from otela.dataplane.headers import Headers
from otela.dataplane.upstream import Reply, Upstreams
from otela.kvcache.board import CacheBoard
from otela.kvcache.index import Summary
from otela.kvcache.tokenize import Tokenizers
from otela.registry.records import Lifecycle, NodeRecord
from otela.registry.store import Registry
from otela.routing.abandon import FailedWhileWaiting, NodeWatch, failed_sessions
from otela.routing.ask import Ask
from otela.routing.cache_aware import CacheContext
from otela.routing.candidates import TupleMemo, eligible
from otela.routing.ejection import Ejections
from otela.routing.load import LOAD_HEADER, LoadBoard, NodeLoad, parse_load
from otela.routing.policies import (
    LOAD_SAMPLE,
    Candidate,
    CandidateView,
    Pick,
    Policy,
    UnknownPolicy,
    load_policy,
    provider_share,
    sampled_mean_load,
)
from otela.routing.speed import Speeds
from otela.routing.trust import ANY, TrustSet

log = logging.getLogger("otela.routing")

DECLINED_PAUSE_S = 0.5  # before asking again the nodes that did not know us yet (x round)
ASK_AGAIN_ROUNDS = 3  # times those are asked again, once nobody else is left to ask
MEAN_LOAD_KEPT_S = 0.1  # a large federation's sampled mean load is reused this long

OK, CLIENT_ERROR, FAILED, NOT_DELIVERED = "ok", "client_error", "failed", "not_delivered"


@dataclass(frozen=True)
class RoutingSettings:
    """What an operator chooses about routing (``[routing]`` settings). No defaults here:
    ``routing_settings`` builds it from a resolved config (or the schema's defaults), so
    the declaration in ``otela.config.schema`` stays the only place a default is written.
    """

    policy: str
    trusted_providers: frozenset[str] | None
    max_attempts: int
    timeouts: FirstByteTimeouts
    eject_after: int
    eject_time: float
    eject_max_time: float
    eject_max_share: float
    # How long a node's last load report counts: three report intervals, at least 15 s (a
    # report lost or late must not make a busy node look idle at once). Derived, not set.
    load_ttl: float
    affinity_balance: float
    cache_balance: float  # cache_aware's load bound
    balance_providers: bool  # an equal share per provider, then per node
    retry_broken: bool  # re-send a request whose node broke off before answering
    stream_migrations: int  # continuations of a stream whose node broke off mid-answer
    failover_connect_timeout: float  # a connection attempt while others remain
    # Time a request may spend on connections nobody answers before they use up attempts
    # (--connect-timeout): nothing was sent, so only the client's wait bounds them.
    unanswered_budget: float
    # cache_aware: each model's tokenizer directory (--tokenizer MODEL=DIR)
    tokenizers: Mapping[str, str] = field(default_factory=dict)


LOAD_TTL_FLOOR_S = 15.0


def routing_settings(config: NodeConfig | None = None, **overrides: Any) -> RoutingSettings:
    """The routing settings of ``config`` (default: every setting at its default), with
    ``overrides`` (tests and tools that vary one field)."""
    config = config or NodeConfig()
    settings = RoutingSettings(
        policy=config.routing_policy,
        trusted_providers=frozenset(config.trusted_providers) or None,
        max_attempts=config.route_attempts,
        timeouts=first_byte_timeouts(config),
        eject_after=config.eject_after, eject_time=config.eject_time,
        eject_max_time=config.eject_max_time, eject_max_share=config.eject_max_share,
        load_ttl=max(LOAD_TTL_FLOOR_S, 3 * config.load_interval),
        affinity_balance=config.affinity_balance, cache_balance=config.cache_balance,
        retry_broken=config.retry_broken,
        stream_migrations=max(0, config.stream_migrations),
        balance_providers=config.balance_providers,
        failover_connect_timeout=config.failover_connect_timeout,
        unanswered_budget=config.connect_timeout, tokenizers=dict(config.tokenizers))
    return dataclasses.replace(settings, **overrides) if overrides else settings


def first_byte_timeouts(config: NodeConfig) -> FirstByteTimeouts:
    return FirstByteTimeouts(stream_s=config.first_byte_timeout,
                             ceiling_s=config.response_timeout)


@dataclass
class Routed:
    """A request on its way back: the reply, the node that answers, and what it took."""

    reply: Reply
    node: NodeRecord
    path_kind: str  # "local", "http" or "libp2p"
    attempts: int
    candidate: Candidate | None = None
    policy: Policy | None = None
    pick: Pick | None = None
    outcome: str = OK


@dataclass
class _Policies:
    """The ingress's policy, and one instance of each other policy a request asked for by
    name (a policy may keep state, e.g. round robin's turn)."""

    default: Policy
    affinity_balance: float = 2.0
    cache: CacheContext | None = None
    named: dict[str, Policy] = field(default_factory=dict)

    def get(self, name: str | None) -> Policy:
        if name is None or name == self.default.name:
            return self.default
        policy = self.named.get(name)
        if policy is None:
            try:
                policy = load_policy(name, self.affinity_balance, self.cache)
            except UnknownPolicy as exc:
                raise RequestError(400, str(exc), code="unknown_policy",
                                   param="X-Otela-Policy") from None
            self.named[name] = policy
        return policy


class Miss(enum.Enum):
    """Why an attempt gave no reply to return, and so what the router does next."""

    NEXT = "try another node"
    # Turned away at once (nothing listens: the node is down): try another without using
    # up an attempt. After a crash every dead candidate may come first; while any node
    # still serves the model the request must reach it.
    REFUSED = "refused at once"
    # Declined only because the node has not heard of this ingress's session yet: worth
    # asking again once the other candidates have been tried, and no attempt used up
    # (right after a partition heals, every rejoined node may decline for a moment while
    # the nodes that never left could serve).
    ASK_AGAIN = "ask again later"
    # Nobody answered the connection attempt (the host is down or cut off): nothing was
    # sent, so it uses up no attempt while the request has spent less than
    # ``unanswered_budget`` routing. In the first second of a partition, before anyone
    # suspects the cut-off nodes, a request could draw three of them and fail while half
    # the federation served.
    UNANSWERED = "connection not answered"


def _never() -> bool:
    return False


class Router:
    def __init__(
        self,
        registry: Registry,
        upstreams: Upstreams,
        settings: RoutingSettings,
        rng: random.Random | None = None,
        suspected: Callable[[], frozenset[str]] = frozenset,
        clock: Callable[[], float] = trio.current_time,
        own_load: Callable[[], NodeLoad | None] = lambda: None,
        plausible: Callable[[NodeRecord], float] | None = None,
    ) -> None:
        self.registry = registry
        self.upstreams = upstreams
        self.settings = settings
        self.rng = rng or random.Random()
        self.suspected = suspected  # peers the failure detector currently suspects
        self.clock = clock
        self.trust = ANY.narrowed(settings.trusted_providers, "--trusted-providers")
        # What cache_aware reads: the engines' cache summaries (on their load reports)
        # and this ingress's own recent dispatches, and the models' tokenizers.
        self.cache = CacheContext(CacheBoard(), Tokenizers(
            {model: Path(d) for model, d in settings.tokenizers.items()}), clock,
            settings.cache_balance)
        self.cache.tokenizers.preload()
        if settings.policy == "cache_aware" and not settings.tokenizers:
            log.warning("cache_aware without a --tokenizer for any model: every request "
                        "routes as prefix_affinity (docs/routing.md, cache_aware)")
        self.policies = _Policies(load_policy(settings.policy, settings.affinity_balance,
                                              self.cache),
                                  settings.affinity_balance, self.cache)
        self.ejections = Ejections(settings.eject_after, settings.eject_time,
                                   settings.eject_max_time, settings.eject_max_share)
        self.loads = LoadBoard(settings.load_ttl)
        # What is worked out once per tuple of nodes (the registry hands out the same one
        # until a node changes): the filters' answers, where each session is, the
        # rendezvous tree.
        self.per_tuple = TupleMemo()
        # The sampled mean load per candidate set: (the set, when, the mean).
        self._means: dict[tuple[int, str, bool], tuple[Sequence[NodeRecord], float, float]] = {}
        self.retries = 0  # attempts after a first one that was not delivered
        self.resent = 0  # of those, after a node broke off before answering (retry_broken)
        self.migrated = 0  # chat streams continued on another node after theirs broke off
        # Requests this router has running on each session (load-aware policies read it;
        # with data-path workers the control process adds up every worker's).
        self.busy: Counter[str] = Counter()
        # With data-path workers: every worker's requests per session, as last added up
        # by the control process (a worker sets it; ours are in it, a moment late).
        self.shared_busy: Mapping[str, int] = {}
        self.own_load = own_load  # our own engine's, when we serve (no hop: no header)
        # With --retry-broken: requests waiting on a node, given up there if it fails.
        self.watch = NodeWatch()
        # What a node's capacity claim is checked against (``speed``): the capacity its
        # record's hardware can serve (per session, with the record version it came from),
        # and how fast it answers here.
        self.plausible = plausible
        self._plausible: dict[str, tuple[int, float]] = {}
        self.speeds = Speeds()

    def node_gone(self, session_id: str) -> bool:
        """The node is suspected, evicted or gone: not merely draining (DOWN), whose
        requests in flight still finish."""
        record = self.registry.get(session_id)
        return record is None or record.state is Lifecycle.LEFT or \
            record.peer_id in self.suspected()

    async def watch_failures(self) -> None:
        """Give up waiting on nodes that fail (``--retry-broken``); run as one task. It
        polls only while a request waits on a node."""
        await self.watch.run(
            lambda sessions: failed_sessions(sessions, self.registry, self.suspected()))

    def base_trust(self, key_trust: frozenset[str] | None = None) -> TrustSet:
        """The trust set before the request's own statement: the ingress default,
        narrowed by the caller's API key's set when it has one."""
        return self.trust.narrowed(key_trust, "API key")

    def policy_for(self, name: str | None) -> Policy:
        return self.policies.get(name)

    def release(self, routed: Routed) -> None:
        """``routed``'s response is over (sent, failed, or its client left)."""
        self._unbusy(routed.node.session_id)
        if routed.policy is not None and routed.candidate is not None and \
                routed.pick is not None:
            routed.policy.on_end(routed.candidate, routed.pick, routed.outcome)

    def take_cache(self, session: str, cache: Summary | tuple[int, int],
                   ttl: float) -> bool:
        """A serving node's cache summary (or, as (epoch, seq), word that ours is still
        current) from its load report; ``False``: it needs to send its whole set."""
        board, now = self.cache.board, self.clock()
        if isinstance(cache, Summary):
            return board.take(session, cache, now, ttl)
        return board.touch(session, cache[0], cache[1], now, ttl)

    async def route(self, model_id: str, path: str, headers: Headers, ask: Ask,
                    affinity_key: Callable[[], str | None] | None = None,
                    first_byte_timeout: float | None = None,
                    avoid: Collection[str] = (),
                    body: Mapping[str, Any] | None = None) -> Routed:
        """Send ``ask.body`` to ``path`` on a node serving ``model_id`` that ``ask``
        allows, waiting ``first_byte_timeout`` for its first byte (default: the longest,
        ``otela.dataplane.deadline``), never one of the sessions in ``avoid``; raises
        ``RequestError`` (400 bad policy, 404/503 no node, 502 unreachable or failed, 504
        timed out)."""
        timeout = first_byte_timeout or self.settings.timeouts.ceiling_s
        policy = self.policies.get(ask.policy)
        now = self.clock()
        nodes = self.nodes_for(model_id, ask, now)
        pick = Pick(model_id, affinity_key() if policy.uses_affinity_key and affinity_key
                    else None, ask.stream,
                    body if getattr(policy, "uses_body", False) else None)
        tried: set[str] = set(avoid)
        declined: set[str] = set()  # did not know us yet: worth asking again
        attempts = 0  # nodes asked
        # Of those, the ones that use up --route-attempts: a refused connection (nothing
        # listens) or a node that does not know our session yet (it just rejoined, or we
        # did) answered at once and says nothing against the others, and a connection
        # nobody answered sent nothing (within ``unanswered_budget``); each candidate is
        # still asked at most once per round, so the loop is bounded.
        counted = 0
        rounds = 0  # times the declined were asked again
        declines = 0  # answers that did not know our session yet, for the 502's message
        resend = self.settings.retry_broken  # streams too: nothing has reached the client
        began = now
        while counted < self.settings.max_attempts:
            remaining = [r for r in nodes if r.session_id not in tried] if tried else nodes
            if not remaining and declined and rounds < ASK_AGAIN_ROUNDS:
                rounds += 1
                await trio.sleep(DECLINED_PAUSE_S * rounds)
                tried -= declined
                declined.clear()
                nodes = self._refreshed(nodes, model_id, ask)
                remaining = [r for r in nodes if r.session_id not in tried]
            if not remaining:
                break
            candidate = self.choose(remaining, policy, pick, now)
            node = candidate.record
            if attempts:
                self.retries += 1
            attempts += 1
            counted += 1
            tried.add(node.session_id)
            # While another node could still take it, a slow connection is given up early.
            last = counted == self.settings.max_attempts or len(remaining) == 1
            connect_timeout = None if last else self.settings.failover_connect_timeout
            # Given up on a node that fails while the request waits only if another could
            # take it, within the attempts left.
            another_serves = partial(self._another_serves, model_id, ask, tried) \
                if resend and counted < self.settings.max_attempts else _never
            result = await self._attempt(node, candidate, policy, pick, path, headers,
                                         ask.body, attempts, timeout, resend,
                                         connect_timeout, another_serves)
            if isinstance(result, Routed):
                return result
            if result is not Miss.NEXT and (
                    result is not Miss.UNANSWERED
                    or self.clock() - began < self.settings.unanswered_budget):
                counted -= 1
            if result is Miss.ASK_AGAIN:
                declines += 1
                declined.add(node.session_id)
            now = self.clock()
        why = (f" ({declines} of them did not know this node's session yet)" if declines
               else "")
        raise RequestError(
            502, f"All {len(tried)} candidate node(s) for `{clip(model_id)}` were "
            f"unreachable{why}.", code="all_nodes_unreachable")

    def choose(self, nodes: Sequence[NodeRecord], policy: Policy, pick: Pick, now: float
               ) -> Candidate:
        """The routing decision proper, among ``nodes`` (eligible, not tried yet, never
        empty): each as the policy sees it (load estimate, capacity), made only when the
        policy looks at it, then the policy's pick. Synchronous: measured on its own by
        ``benchmarks/routing_decision.py``."""
        own = self.upstreams.self_session()

        def make(record: NodeRecord) -> Candidate:
            return self._candidate(record, now, pick, own)

        if len(nodes) <= LOAD_SAMPLE or not isinstance(nodes, tuple):
            # a small federation (every policy reads them all) or a retry's remaining
            # nodes: nothing worth keeping across requests
            view = CandidateView(nodes, make)
        else:  # the registry's tuple (or a filter's), the same until a node changes
            view = CandidateView(nodes, make, partial(self.per_tuple.get, nodes),
                                 lambda: self._mean_load(view, pick, now))
        candidates: Sequence[Candidate] = view
        if self.settings.balance_providers:
            candidates = provider_share(candidates, self.rng)
        return policy.pick(candidates, pick, self.rng)

    def _mean_load(self, view: CandidateView, pick: Pick, now: float) -> float:
        """A large federation's mean load: a sample's, kept ``MEAN_LOAD_KEPT_S`` (the
        reports it is made of are seconds old anyway), one per candidate set and kind of
        request (capacities depend on the model and on streaming)."""
        slot = (id(view.records), pick.model, pick.stream)
        kept = self._means.get(slot)
        if kept is not None and kept[0] is view.records and now - kept[1] < MEAN_LOAD_KEPT_S:
            return kept[2]
        mean = sampled_mean_load(view, self.rng)
        if len(self._means) >= 256:
            self._means.clear()
        self._means[slot] = (view.records, now, mean)
        return mean

    def room(self, model_id: str, ask: Ask, reserved: int = 0, held_back: float = 0.0
             ) -> bool:
        """Whether a node ``ask`` may use has room for one more request beyond
        ``reserved`` already granted (``otela.routing.admission``), leaving ``held_back``
        of each node's slots free (for the best class). True at once where no node
        declares a concurrency, and where none serves (routing then says why)."""
        own = self.own_load()  # None unless this node serves
        if not self.loads.limited and (own is None or own.slots is None):
            return True
        now = self.clock()
        try:
            nodes = self.nodes_for(model_id, ask, now)
        except RequestError:
            return True
        free = 0.0
        own_session = self.upstreams.self_session()
        for record in nodes:
            session = record.session_id
            ours = max(self.busy.get(session, 0), self.shared_busy.get(session, 0))
            if session == own_session and own is not None:
                free += own.room(max(ours, own.in_flight), held_back)
            else:
                load = self.loads.latest(session, now)
                if load is None:
                    return True  # no report yet: nothing says it is full
                free += load.room(self.loads.in_flight(session, ours, now), held_back)
            if free > reserved:
                return True
        return False

    def _refreshed(self, nodes: tuple[NodeRecord, ...], model_id: str, ask: Ask
                   ) -> tuple[NodeRecord, ...]:
        """The candidates now, after a pause (right after a heal, nodes rejoin under new
        sessions meanwhile: the only candidate at first may be one that declined); the
        earlier ones if none serves now."""
        try:
            return self.nodes_for(model_id, ask, self.clock())
        except RequestError:
            return nodes

    def nodes_for(self, model_id: str, ask: Ask, now: float) -> tuple[NodeRecord, ...]:
        """The nodes ``ask`` may go to now (``candidates.eligible`` with this router's
        suspects and ejections)."""
        ejected = (lambda sessions: self.ejections.ejected(sessions, now)) \
            if self.ejections.any_in_force(now) else None
        return eligible(self.registry, model_id, trust=ask.trust, clauses=ask.clauses,
                        suspected=self.suspected(), ejected=ejected, memo=self.per_tuple)

    def _another_serves(self, model_id: str, ask: Ask, tried: set[str]) -> bool:
        """Whether a node not tried yet, and not suspected, could take the request now."""
        try:
            nodes = eligible(self.registry, model_id, trust=ask.trust, clauses=ask.clauses)
        except RequestError:
            return False
        suspected = self.suspected()
        return any(r.session_id not in tried and r.peer_id not in suspected for r in nodes)

    def _candidate(self, record: NodeRecord, now: float, pick: Pick, own: str | None
                   ) -> Candidate:
        session = record.session_id
        ours = self.busy.get(session, 0)
        if self.shared_busy:
            ours = max(ours, self.shared_busy.get(session, 0))
        if session == own:
            mine = self.own_load()
            if mine is not None:
                return Candidate(record, float(max(ours, mine.outstanding)), mine.capacity)
        load, claimed = self.loads.estimate_and_capacity(session, ours, now)
        return Candidate(record, load, self._weight(record, claimed, pick))

    def capacity(self, record: NodeRecord, now: float, pick: Pick) -> float:
        """A node's capacity weight as routing uses it: what it claims, at most what its
        hardware can serve, scaled down when it answers more slowly than its peers here
        (``speed``)."""
        return self._weight(record, self.loads.capacity(record.session_id, now), pick)

    def _weight(self, record: NodeRecord, claimed: float, pick: Pick) -> float:
        """``claimed`` capped by what the record's hardware can serve (worked out once
        per record version), times the node's speed factor here."""
        session = record.session_id
        if self.plausible is not None:
            cached = self._plausible.get(session)
            if cached is None or cached[0] != record.version:
                cached = self._plausible[session] = (record.version, self.plausible(record))
            claimed = min(claimed, cached[1])
        return claimed * self.speeds.factor(session, pick.model, pick.stream)

    async def _attempt(self, node: NodeRecord, candidate: Candidate, policy: Policy,
                       pick: Pick, path: str, headers: Headers, body: bytes, attempt: int,
                       timeout: float, resend: bool = False,
                       connect_timeout: float | None = None,
                       another_serves: Callable[[], bool] = _never,
                       ) -> Routed | Miss:
        """One try: the node's reply, or why to go on without it (it did not take the
        request, or broke off before answering and ``resend`` lets another node run it; or,
        with ``resend``, it failed while the request waited and ``another_serves``)."""
        session = node.session_id
        policy.on_start(candidate, pick)
        self.busy[session] += 1
        self.loads.sent(session)
        sent_at = self.clock()
        try:
            if resend:  # a node that fails while we wait is given up, and another asked
                with self.watch.guard(session, another_serves) as guard:
                    reply = await self.upstreams.send(node, path, body, headers, timeout,
                                                      connect_timeout)
                if guard.failed:
                    raise FailedWhileWaiting
            else:
                reply = await self.upstreams.send(node, path, body, headers, timeout,
                                                  connect_timeout)
        except FailedWhileWaiting:
            self._failed(node, candidate, policy, pick, FAILED)
            self.resent += 1
            self.watch.abandoned += 1
            log.warning("node %s failed (suspected or no longer serving) while a request "
                        "waited for its answer; sending it to another node (--retry-broken)",
                        session)
            return Miss.NEXT
        except NotDelivered as exc:
            self._failed(node, candidate, policy, pick, NOT_DELIVERED, exc.unreachable,
                         counts=not exc.blameless)
            log.warning("node %s did not take the request, trying another: %s",
                        session, exc)
            if exc.refused:
                return Miss.REFUSED
            if exc.blameless:
                return Miss.ASK_AGAIN
            return Miss.UNANSWERED if exc.unreachable else Miss.NEXT
        except UpstreamTimeout:
            self._failed(node, candidate, policy, pick, FAILED)
            raise RequestError(
                504, f"The serving engine accepted the request but sent nothing for "
                f"{timeout:.0f} s.", code="upstream_timeout") from None
        except UpstreamFailed as exc:
            self._failed(node, candidate, policy, pick, FAILED)
            if resend:
                self.resent += 1
                log.warning("node %s broke off before answering (%s); sending the request "
                            "to another node (--retry-broken)", session, exc)
                return Miss.NEXT
            raise RequestError(
                502, f"The node serving the request failed before it answered ({exc}); "
                "it may have run, so it was not retried.", code="upstream_failed") from None
        except BaseException:  # cancelled: the client left before an answer
            self._unbusy(session)
            policy.on_end(candidate, pick, FAILED)
            raise
        now = self.clock()
        self.speeds.observe(session, pick.model, pick.stream, now - sent_at)
        report = policy_headers.value(reply.headers, LOAD_HEADER)
        if report is not None:
            load = parse_load(report)
            if load is not None:
                self.loads.report(session, load, now)
        if reply.status >= 500:
            outcome = FAILED
            if self.ejections.failure(session, now):
                log.warning("ejecting node %s (provider %s) from routing after repeated "
                            "failures (last: HTTP %d)", session, node.provider_id,
                            reply.status)
        else:
            outcome = CLIENT_ERROR if reply.status >= 400 else OK
            self.ejections.success(session)
        return Routed(reply, node, self.upstreams.path_kind(node), attempt, candidate,
                      policy, pick, outcome)

    def _failed(self, node: NodeRecord, candidate: Candidate, policy: Policy, pick: Pick,
                outcome: str, unreachable: bool = False, counts: bool = True) -> None:
        """``counts``: whether the failure counts towards ejecting the node."""
        self._unbusy(node.session_id)
        if counts and self.ejections.failure(node.session_id, self.clock(), unreachable):
            log.warning("ejecting node %s (provider %s) from routing after repeated "
                        "failures (last: %s)", node.session_id, node.provider_id, outcome)
        policy.on_end(candidate, pick, outcome)

    def _unbusy(self, session: str) -> None:
        self.busy[session] -= 1
        if self.busy[session] <= 0:
            del self.busy[session]

    def prune(self) -> None:
        """Forget ejection and load state of sessions no longer in the registry."""
        live = {r.session_id for r in self.registry.snapshot()}
        self.ejections.forget_except(live)
        self.loads.forget_except(live)
        self.speeds.forget_except(live)
        self.cache.board.prune({r.session_id for r in self.registry.snapshot()
                                if r.state is not Lifecycle.LEFT})
        self.cache.board.expire(self.clock())
        self._plausible = {s: v for s, v in self._plausible.items() if s in live}
