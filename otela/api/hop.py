"""The engine hop over HTTP (``POST /v1/engine/v1/...``): how other members reach this
node's engine. The caller proves it is a member (``x-otela-hop``, ``hop_auth``); what
follows is the hop core's, the same as over libp2p (``otela.dataplane.hop_core``): the
gate, the engine, the load report, and an ``Outcome`` in the ``x-otela-outcome`` header
when the engine's reply cannot be relayed. It never re-routes: a request cannot bounce
between nodes."""

from __future__ import annotations

from otela.api.inference import request_id_of
from otela.dataplane import headers as header_rules
from otela.dataplane.headers import Headers
from otela.dataplane.hop_auth import HOP_HEADER, HopRefused, HopVerifier
from otela.dataplane.hop_core import HopCore, caller_refused
from otela.dataplane.http import Request, Response
from otela.dataplane.outcome import Outcome
from otela.dataplane.relay import relay, send_error
from otela.dataplane.upstream import Reply
from otela.names import ENGINE_PREFIX

_HOP = HOP_HEADER.encode()


class _HttpAnswer:
    def __init__(self, response: Response, request_id: bytes) -> None:
        self.response = response
        self.request_id = request_id

    async def outcome(self, outcome: Outcome) -> None:
        await send_error(self.response, outcome.error(),
                         [(header_rules.REQUEST_ID, self.request_id)])

    async def reply(self, reply: Reply, extra: Headers) -> None:
        await relay(reply, self.response, extra, end_client_streams=False)


class EngineHop:
    def __init__(self, verifier: HopVerifier, core: HopCore) -> None:
        self.verifier = verifier
        self.core = core

    @property
    def served(self) -> int:
        return self.core.served

    async def handle(self, request: Request, response: Response) -> None:
        request_id = request_id_of(request)
        answer = _HttpAnswer(response, request_id)
        token = header_rules.value(request.headers, _HOP)
        target = request.target.decode("latin-1")  # what the caller signed, query included
        try:
            self.verifier.verify(token.decode("latin-1") if token else None, "POST",
                                 target, request.body)
        except HopRefused as refused:
            await answer.outcome(caller_refused(refused.status, refused.code,
                                                refused.message))
            return
        await self.core.serve(target[len(ENGINE_PREFIX):], request.headers, request.body,
                              request_id, answer)
