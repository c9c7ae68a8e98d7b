"""How a routed request reaches the node chosen for it, decided in one place.

- This node's own engine: straight to it over HTTP.
- Another node that plain HTTP reaches: its engine hop (``/v1/engine/...``), over a
  pooled keep-alive connection, with our membership token (``hop_auth``).
- A node behind NAT (its record says it needs a relayed path): HTTP over libp2p
  (``p2p_client``), through a relay circuit or a hole-punched connection.
Whichever way, the caller gets a ``Reply`` (status and headers now, the body as it
arrives) or one of ``NotDelivered`` / ``UpstreamFailed`` / ``UpstreamTimeout``
(``errors.py``), and only ``NotDelivered`` may be retried elsewhere.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable
from typing import Protocol
from urllib.parse import urlsplit

import trio

from otela.dataplane.errors import UpstreamTimeout
from otela.dataplane.headers import Headers
from otela.dataplane.hop_auth import HOP_HEADER, HopSigner
from otela.dataplane.outcome import Outcome
from otela.dataplane.pool import HttpPool
from otela.names import ENGINE_PREFIX
from otela.registry.records import NodeRecord

_HOP = HOP_HEADER.encode()


class Reply(Protocol):
    """An upstream's answer: its head, and its body to come."""

    status: int
    headers: Headers

    @property
    def content_length(self) -> int | None: ...

    @property
    def complete(self) -> bool:
        """Whether the whole body is already here (``take_buffered`` has it)."""
        ...

    def take_buffered(self) -> bytes: ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The rest of the body as it arrives; ends by closing the reply."""
        ...

    async def aclose(self) -> None: ...


@functools.lru_cache(maxsize=4096)
def engine_address(url: str) -> tuple[str, int, str]:
    """``http://host:port/prefix`` -> (host, port, prefix); engines speak plain HTTP."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"not an http:// URL: {url!r}")
    return parts.hostname, parts.port or 80, parts.path.rstrip("/")


class RelayedSender(Protocol):
    """Sends a request to a node behind NAT: over libp2p (``EngineStreamClient``), or, in
    a data-path worker, through the control process that owns the libp2p host."""

    async def request(self, record: NodeRecord, path: str, body: bytes,
                      headers: Headers) -> Reply: ...


class Upstreams:
    def __init__(self, pool: HttpPool, *, self_session: Callable[[], str],
                 local_engine: Callable[[], str | None], hop_signer: HopSigner | None,
                 p2p: RelayedSender | None) -> None:
        self.pool = pool
        self.self_session = self_session  # ours changes if we rejoin after an eviction
        self.local_engine = local_engine  # our engine's URL, None unless we serve
        self.hop_signer = hop_signer
        self.p2p = p2p

    def path_kind(self, node: NodeRecord) -> str:
        """How ``node`` is reached: "local", "http" or "libp2p"."""
        if node.session_id == self.self_session() and self.local_engine() is not None:
            return "local"
        if self.p2p is not None and node.needs_relayed_path():
            return "libp2p"
        return "http"

    async def send(self, node: NodeRecord, path: str, body: bytes, headers: Headers,
                   first_byte_timeout: float, connect_timeout: float | None = None) -> Reply:
        """``connect_timeout``: how long a new connection may take before the node counts
        as unreachable (default: the pool's)."""
        kind = self.path_kind(node)
        if kind == "local":
            engine = self.local_engine()
            assert engine is not None
            host, port, prefix = engine_address(engine)
            return await self.pool.request(host, port, b"POST", (prefix + path).encode(),
                                           headers, body, first_byte_timeout)
        if kind == "libp2p":
            assert self.p2p is not None
            try:
                with trio.fail_after(first_byte_timeout):
                    return await self.p2p.request(node, path, body, headers)
            except trio.TooSlowError:
                raise UpstreamTimeout(f"no answer within {first_byte_timeout:.0f} s") from None
        hop_path = ENGINE_PREFIX + path
        if self.hop_signer is not None:
            token = self.hop_signer.token(node.peer_id, "POST", hop_path, body)
            headers = [*headers, (_HOP, token.encode())]
        host, port, prefix = engine_address(node.http_url)
        # An engine hop reads the whole request before it forwards it and never aborts a
        # connection: a reset before its answer means the request was never read.
        reply = await self.pool.request(host, port, b"POST", (prefix + hop_path).encode(),
                                        headers, body, first_byte_timeout, connect_timeout,
                                        unread_if_reset=True)
        return await unless_outcome(reply, f"node {node.peer_id}")


async def unless_outcome(reply: Reply, who: str) -> Reply:
    """``reply``, unless it is a hop's ``Outcome`` rather than an engine's answer: then
    the exception that stands for it (``outcome``), the reply closed."""
    if not Outcome.carried_by(reply.headers):
        return reply
    body = reply.take_buffered() if reply.complete else b""  # its error, when it came whole
    await reply.aclose()
    outcome = Outcome.of_headers(reply.status, reply.headers, body)
    assert outcome is not None
    raise outcome.exception(who)
