"""The serving side of the engine hop, once for every transport.

A member's request reaches this node's engine over HTTP (``otela.api.hop``) or over
libp2p (``p2p_server``); either way, once the transport has established who the caller is
(``hop_auth``'s token, or the stream's peer id) and that it is a member, the same steps
follow, here: the gate decides what may run (``gate``: canonical route, body, served
model, serving at all), the engine gets the request on a pooled connection within the
request's first-byte timeout, the node's load counts it, and the answer goes back as the
engine gave it, with this node's load report and the request id, or as an ``Outcome``
(``outcome``) that says what became of it in terms every transport carries alike. The
transports only say how an outcome and a reply are written (``Answer``).
"""

from __future__ import annotations

from typing import Protocol

from otela.dataplane import headers as header_rules
from otela.dataplane.errors import NotDelivered, UpstreamFailed, UpstreamTimeout
from otela.dataplane.gate import EngineGate, Refusal
from otela.dataplane.headers import Headers
from otela.dataplane.outcome import Outcome
from otela.dataplane.pool import HttpPool
from otela.dataplane.upstream import Reply, engine_address


class LoadCounter(Protocol):
    """Counts engine requests and says the node's load (``otela.load.source.LoadSource``)."""

    def start(self) -> None: ...

    def end(self) -> None: ...

    def header(self) -> bytes: ...


class Answer(Protocol):
    """How a transport answers its caller: with an outcome, or with the engine's reply
    (plus ``extra`` headers: the load report and the request id)."""

    async def outcome(self, outcome: Outcome) -> None: ...

    async def reply(self, reply: Reply, extra: Headers) -> None: ...


def caller_refused(status: int, code: str, message: str) -> Outcome:
    """A caller the transport did not admit: not delivered; blameless when it is only not
    known as a member yet (403: it may have joined a moment ago)."""
    return Outcome(status, code, message, delivered=False, blameless=status == 403)


class HopCore:
    def __init__(self, gate: EngineGate, pool: HttpPool, load: LoadCounter) -> None:
        self.gate = gate
        self.pool = pool
        self.load = load  # counts what we relay; its report rides on every answer
        self.served = 0

    async def serve(self, target: str, headers: Headers, body: bytes, request_id: bytes,
                    answer: Answer) -> None:
        """Run a member's request for ``target`` (path and query as asked) and answer."""
        verdict = self.gate.check(target, body)
        if isinstance(verdict, Refusal):
            await answer.outcome(Outcome(verdict.status, verdict.code, verdict.message,
                                         delivered=False))
            return
        host, port, prefix = engine_address(verdict.engine)
        self.load.start()
        try:
            try:
                reply = await self.pool.request(
                    host, port, b"POST", (prefix + verdict.target).encode("latin-1"),
                    header_rules.forwarded(headers, request_id), body, verdict.first_byte_s)
            except (NotDelivered, UpstreamFailed, UpstreamTimeout) as exc:
                await answer.outcome(Outcome.of_exception(exc))
                return
            self.served += 1
            await answer.reply(reply, [(header_rules.REQUEST_ID, request_id),
                                       (header_rules.LOAD, self.load.header())])
        finally:
            self.load.end()
