"""The engine hop over HTTP (``POST /v1/engine/v1/...``): how other members reach this
node's engine. The caller proves it is a member (``x-otela-hop``, ``hop_auth``), the gate
decides what may run (``gate``), and every refusal is marked not delivered
(``x-otela-not-delivered: 1``) so the caller may try another node. It never re-routes:
a request cannot bounce between nodes."""

from __future__ import annotations

from otela.api.inference import request_id_of
from otela.dataplane import headers as policy
from otela.dataplane.errors import NotDelivered, RequestError, UpstreamFailed, UpstreamTimeout
from otela.dataplane.gate import ENGINE_PREFIX, EngineGate, Refusal
from otela.dataplane.hop_auth import HOP_HEADER, HopRefused, HopVerifier
from otela.dataplane.http import Request, Response
from otela.dataplane.pool import HttpPool
from otela.dataplane.relay import relay, send_error
from otela.dataplane.upstream import engine_address
from otela.load.source import LoadSource
from otela.routing.load import LOAD_HEADER

_HOP = HOP_HEADER.encode()
_NOT_DELIVERED = {policy.NOT_DELIVERED.decode(): "1"}


class EngineHop:
    def __init__(self, verifier: HopVerifier, gate: EngineGate, pool: HttpPool,
                 load: LoadSource) -> None:
        self.verifier = verifier
        self.gate = gate  # also says how long the engine may take (``deadline``)
        self.pool = pool
        self.load = load  # counts what we relay; its report rides on every answer
        self.served = 0

    async def handle(self, request: Request, response: Response) -> None:
        request_id = request_id_of(request)
        try:
            await self._handle(request, response, request_id)
        except RequestError as error:
            await send_error(response, error, [(policy.REQUEST_ID, request_id)])

    async def _handle(self, request: Request, response: Response, request_id: bytes) -> None:
        token = policy.value(request.headers, _HOP)
        target = request.target.decode("latin-1")  # what the caller signed, query included
        try:
            self.verifier.verify(token.decode("latin-1") if token else None, "POST",
                                 target, request.body)
        except HopRefused as refused:
            raise RequestError(refused.status, refused.message, code=refused.code,
                               headers=_NOT_DELIVERED) from None
        verdict = self.gate.check(target[len(ENGINE_PREFIX):], request.body)
        if isinstance(verdict, Refusal):
            raise RequestError(verdict.status, verdict.message, code=verdict.code,
                               headers=_NOT_DELIVERED)
        host, port, prefix = engine_address(verdict.engine)
        self.load.start()
        try:
            await self._relay(request, response, request_id, host, port,
                              prefix + verdict.target, verdict.first_byte_s)
        finally:
            self.load.end()

    async def _relay(self, request: Request, response: Response, request_id: bytes,
                     host: str, port: int, target: str, timeout: float) -> None:
        try:
            reply = await self.pool.request(
                host, port, b"POST", target.encode("latin-1"),
                policy.forwarded(request.headers, request_id), request.body, timeout)
        except NotDelivered as exc:
            raise RequestError(502, f"engine unreachable: {exc}", code="engine_unreachable",
                               headers=_NOT_DELIVERED) from None
        except UpstreamTimeout:
            raise RequestError(504, f"the engine sent nothing for {timeout:.0f} s",
                               code="upstream_timeout") from None
        except UpstreamFailed as exc:
            raise RequestError(502, f"the engine failed: {exc}",
                               code="upstream_failed") from None
        self.served += 1
        await relay(reply, response, [(policy.REQUEST_ID, request_id),
                                      (LOAD_HEADER, self.load.header())])
