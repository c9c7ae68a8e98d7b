"""How the router classifies upstream failures (real sockets, in process): only a request
that provably never reached an engine is retried elsewhere; everything else is a clear
502 or 504 with an OpenAI error body, never a bare 500, and never run twice."""

from __future__ import annotations

import contextlib
import dataclasses
import random
import socket
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from typing import Any

import pytest
import trio

from otela.dataplane.deadline import FirstByteTimeouts
from otela.dataplane.errors import RequestError
from otela.dataplane.pool import HttpPool
from otela.dataplane.upstream import Upstreams
from otela.registry.crdt import Entry
from otela.registry.records import Lifecycle
from otela.registry.store import Registry
from otela.routing.ask import Ask
from otela.routing.router import Router, routing_settings
from otela.routing.trust import ANY

from .registry_helpers import entry

NOW = 1000.0
OK = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n"
      b'{"ok":true}')


class FirstChoice(random.Random):
    """With the random policy, picks candidates in the order given, so a test knows which
    one is tried first."""

    def randrange(self, *args: Any, **kwargs: Any) -> int:
        return 0


async def read_request(stream: trio.SocketStream) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some(65536)
        if not chunk:
            return
        data += chunk


Behaviour = Callable[[trio.SocketStream], Awaitable[None]]


async def answers(stream: trio.SocketStream) -> None:
    await read_request(stream)
    await stream.send_all(OK)


async def closes_without_answering(stream: trio.SocketStream) -> None:
    await read_request(stream)  # took it: the engine may be running it now


async def resets_after_reading(stream: trio.SocketStream) -> None:
    await read_request(stream)
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")


async def says_not_delivered(stream: trio.SocketStream) -> None:
    await read_request(stream)
    await stream.send_all(b"HTTP/1.1 503 Service Unavailable\r\nx-otela-not-delivered: 1\r\n"
                          b"content-length: 0\r\n\r\n")


def declines_until_it_knows_us(times: int) -> Behaviour:
    """A node that has not heard of the caller's session yet: 403 not-a-member (not
    delivered) ``times`` times, then it answers."""
    seen = [0]

    async def behaviour(stream: trio.SocketStream) -> None:
        await read_request(stream)
        seen[0] += 1
        if seen[0] <= times:
            await stream.send_all(b"HTTP/1.1 403 Forbidden\r\nx-otela-not-delivered: 1\r\n"
                                  b"content-length: 0\r\n\r\n")
        else:
            await stream.send_all(OK)

    return behaviour


async def never_answers(stream: trio.SocketStream) -> None:
    await read_request(stream)
    await trio.sleep_forever()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclasses.dataclass
class Trip:
    status: int  # the response's, or the RequestError's
    hits: list[int]  # connections each candidate accepted
    took: float  # seconds until the router had a reply or gave up
    ejected: int  # nodes the router ejected meanwhile


async def route_through(behaviours: list[Behaviour | int | None], timeout: float = 5.0,
                        retry_broken: bool = False, stream: bool = False,
                        connect_timeout: float = 5.0, suspect_first_after: float | None = None,
                        late_from: int | None = None, late_after: float = 0.0,
                        **settings: Any) -> Trip:
    """Route one request over candidates with these behaviours (``None``: nothing listens;
    a port number: whatever is at that port), tried in order. ``suspect_first_after``: the
    failure detector suspects the first candidate's node this many seconds in. The
    candidates from index ``late_from`` on join the registry ``late_after`` seconds in."""
    hits = [0] * len(behaviours)
    registry = Registry()
    late: list[Entry] = []
    async with trio.open_nursery() as nursery:
        for i, behaviour in enumerate(behaviours):
            if behaviour is None:
                port = closed_port()
            elif isinstance(behaviour, int):
                port = behaviour
            else:
                async def serve(stream: trio.SocketStream, i: int = i,
                                behaviour: Behaviour = behaviour) -> None:
                    hits[i] += 1
                    async with stream:
                        await behaviour(stream)

                listeners = await nursery.start(trio.serve_tcp, serve, 0)
                port = listeners[0].socket.getsockname()[1]
            late.append(serving_entry(f"node{i}", f"http://127.0.0.1:{port}"))
        for e in late[:late_from]:
            registry.apply(e, NOW)

        async def join_late() -> None:
            await trio.sleep(late_after)
            for e in late[late_from:] if late_from is not None else ():
                registry.apply(e, NOW)

        nursery.start_soon(join_late)
        pool = HttpPool(connect_timeout=connect_timeout)
        upstreams = Upstreams(pool, self_session=lambda: "me", local_engine=lambda: None,
                              hop_signer=None, p2p=None)
        started = trio.current_time()
        first = next(r for r in registry.snapshot() if r.peer_id == "peer-node0")

        def suspected() -> frozenset[str]:
            if suspect_first_after is None or \
                    trio.current_time() - started < suspect_first_after:
                return frozenset()
            return frozenset({first.peer_id})

        router = Router(registry, upstreams,
                        routing_settings(policy="random",
                                        timeouts=FirstByteTimeouts(timeout, ceiling_s=timeout),
                                        retry_broken=retry_broken,
                                        unanswered_budget=connect_timeout, **settings),
                        rng=FirstChoice(), suspected=suspected)
        nursery.start_soon(router.watch_failures)
        try:
            routed = await router.route("m", "/v1/chat/completions", [],
                                        Ask(ANY, body=b"{}", stream=stream))
            status = routed.reply.status
            await routed.reply.aclose()
        except RequestError as exc:
            status = exc.status
        took = trio.current_time() - started
        pool.close()
        nursery.cancel_scope.cancel()
    return Trip(status, hits, took, router.ejections.count(trio.current_time()))


def serving_entry(name: str, url: str) -> Entry:
    base = entry(name, 1, Lifecycle.SERVING, models=("m",))
    return dataclasses.replace(base, record=dataclasses.replace(base.record, http_url=url))


def run(behaviours: list[Behaviour | None], timeout: float = 5.0, retry_broken: bool = False,
        stream: bool = False) -> tuple[int, list[int]]:
    trip = trio.run(route_through, behaviours, timeout, retry_broken, stream)
    return trip.status, trip.hits


def test_a_refused_connection_is_retried_on_the_next_node():
    status, hits = run([None, answers])
    assert status == 200 and hits == [0, 1]


def test_refusals_do_not_use_up_the_attempts_so_a_live_node_is_always_reached():
    # Three dead nodes drawn first (--route-attempts is 3): the fourth still gets it.
    status, hits = run([None, None, None, answers])
    assert status == 200 and hits == [0, 0, 0, 1]
    # Each candidate is asked once: all dead is a 502, not a loop.
    status, hits = run([None, None, None, None])
    assert status == 502
    # Attempts that reached a node still count: two declines, then budget's end.
    status, hits = run([says_not_delivered, None, says_not_delivered, says_not_delivered,
                        answers])
    assert status == 502 and hits == [1, 0, 1, 1, 0]


def test_a_node_that_says_it_did_not_deliver_is_retried():
    status, hits = run([says_not_delivered, answers])
    assert status == 200 and hits == [1, 1]


def test_a_connection_closed_after_sending_is_a_502_and_never_retried():
    status, hits = run([closes_without_answering, answers])
    assert status == 502 and hits == [1, 0]


def test_a_reset_before_the_hop_answers_is_retried_since_the_request_was_never_read():
    """An engine hop reads a whole request before forwarding it and never aborts a
    connection; a process that dies having read it closes with an orderly end-of-file
    (above). A reset therefore means the request sat unread in the dying node's socket
    (its accept queue, typically, when it is SIGKILLed): another node gets it, streams
    too. (To an engine, whose server may abort after reading, a reset on a fresh
    connection stays ambiguous: ``tests/unit/test_pool.py``.)"""
    status, hits = run([resets_after_reading, answers])
    assert status == 200 and hits == [1, 1]
    status, hits = run([resets_after_reading, answers], stream=True)
    assert status == 200 and hits == [1, 1]


def test_with_retry_broken_a_request_whose_node_broke_before_answering_goes_on():
    behaviour = closes_without_answering
    status, hits = run([behaviour, answers], retry_broken=True)
    assert status == 200 and hits == [1, 1]
    # A stream too: its answer had not begun, so its client has seen nothing (once begun,
    # request migration continues it instead).
    status, hits = run([behaviour, answers], retry_broken=True, stream=True)
    assert status == 200 and hits == [1, 1]
    status, hits = run([behaviour, answers], stream=True)  # --no-retry-broken
    assert status == 502 and hits == [1, 0]
    status, hits = run([behaviour, behaviour, behaviour, answers], retry_broken=True)
    assert status == 502 and hits == [1, 1, 1, 0]  # --route-attempts (3) still bounds it


def test_with_retry_broken_a_silent_node_is_still_a_504_never_resent():
    status, hits = run([never_answers, answers], timeout=0.5, retry_broken=True)
    assert status == 504 and hits == [1, 0]  # it may still be working on it


def test_with_retry_broken_a_request_waiting_on_a_node_suspected_meanwhile_goes_on():
    # The node froze or was cut off after it took the request: once the failure detector
    # suspects it, the request is sent to another node instead of waiting it out.
    trip = trio.run(partial(route_through, [never_answers, answers], timeout=30.0,
                            retry_broken=True, suspect_first_after=0.3))
    assert trip.status == 200 and trip.hits == [1, 1]
    assert 0.3 <= trip.took < 5.0
    # With no other node to take it, it waits on the suspect (which may yet answer: a
    # suspicion can be wrong) rather than fail for certain.
    trip = trio.run(partial(route_through, [never_answers], timeout=1.5, retry_broken=True,
                            suspect_first_after=0.3))
    assert trip.status == 504 and trip.hits == [1]
    # Without --retry-broken it may be running, so it waits (here: the first-byte timeout).
    trip = trio.run(partial(route_through, [never_answers, answers], timeout=1.5,
                            suspect_first_after=0.3))
    assert trip.status == 504 and trip.hits == [1, 0]
    # A stream that has not begun goes on too.
    trip = trio.run(partial(route_through, [never_answers, answers], timeout=30.0,
                            retry_broken=True, stream=True, suspect_first_after=0.3))
    assert trip.status == 200 and trip.hits == [1, 1]


def test_an_upstream_that_never_answers_is_a_504_after_the_first_byte_timeout():
    status, hits = run([never_answers, answers], timeout=0.5)
    assert status == 504 and hits == [1, 0]


def test_a_node_that_does_not_know_us_yet_is_asked_again_after_the_others():
    # the only candidate: asked again after a pause (our new session reaches it meanwhile)
    status, hits = run([declines_until_it_knows_us(1)])
    assert status == 200 and hits == [2]
    # another candidate first; the budget (--route-attempts, 3) still bounds it all
    status, hits = run([declines_until_it_knows_us(1), None])
    assert status == 200 and hits == [2, 0]
    status, hits = run([declines_until_it_knows_us(5)])
    assert status == 502 and hits == [4]  # asked again three times, then given up


def test_candidates_are_looked_up_again_after_the_pause():
    # Right after a heal: the only candidate declines (it has not heard of our new session
    # yet); meanwhile a node rejoins under a new session and becomes SERVING: it takes it.
    trip = trio.run(partial(route_through, [declines_until_it_knows_us(9), answers],
                            late_from=1, late_after=0.2))
    assert trip.status == 200 and trip.hits[1] == 1


def test_nodes_that_do_not_know_us_yet_do_not_use_up_the_attempts():
    # Right after a heal, three rejoined nodes that have not heard of this ingress yet come
    # first (--route-attempts is 3): the node that never left still gets the request.
    status, hits = run([declines_until_it_knows_us(9)] * 3 + [answers])
    assert status == 200 and hits == [1, 1, 1, 1]


@contextlib.contextmanager
def unanswering_ports(count: int) -> Iterator[list[int]]:
    """Ports whose listener's accept queue is full: it drops connection requests, so an
    attempt gets no answer, as with a host that is down or cut off."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            full = stack.enter_context(socket.socket())
            full.bind(("127.0.0.1", 0))
            full.listen(0)
            stack.enter_context(socket.create_connection(full.getsockname(), timeout=1))
            with pytest.raises(OSError):  # the queue (one connection) is full
                socket.create_connection(full.getsockname(), timeout=0.5).close()
            ports.append(full.getsockname()[1])
        yield ports


def test_a_connection_nobody_answers_gives_way_to_the_next_node_early():
    with unanswering_ports(1) as ports:
        trip = trio.run(partial(route_through, [*ports, answers],
                                connect_timeout=30.0, failover_connect_timeout=0.3))
    assert trip.status == 200 and trip.hits == [0, 1]
    assert trip.took < 5.0  # given up after 0.3 s, not the 30 s connect timeout
    assert trip.ejected == 1  # and out of routing at once, as a refused one would be


def test_connections_nobody_answers_use_up_no_attempts_within_the_connect_timeout():
    # The first second of a partition: three cut-off nodes come first (--route-attempts
    # is 3), nobody suspects them yet, and a node on this side still serves.
    with unanswering_ports(3) as ports:
        trip = trio.run(partial(route_through, [*ports, answers],
                                connect_timeout=5.0, failover_connect_timeout=0.3))
    assert trip.status == 200 and trip.hits == [0, 0, 0, 1]
    # Past --connect-timeout of routing they count again: the wait stays bounded.
    with unanswering_ports(4) as ports:
        trip = trio.run(partial(route_through, [*ports, answers],
                                connect_timeout=0.5, failover_connect_timeout=0.3))
    assert trip.status == 502 and trip.hits == [0, 0, 0, 0, 0]
