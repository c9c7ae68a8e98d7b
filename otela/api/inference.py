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

import itertools
import os
import time

from otela.dataplane import headers as policy
from otela.dataplane.errors import RequestError
from otela.dataplane.headers import Headers
from otela.dataplane.http import Request, Response
from otela.dataplane.jsonbody import BodyError, parse_json_object
from otela.dataplane.relay import relay, send_error
from otela.routing.router import Router

_ID_PREFIX = os.urandom(6).hex()  # this process; ids are unique across a federation
_ID_COUNTER = itertools.count()


def request_id_of(request: Request) -> bytes:
    """The client's ``x-otela-request-id`` (or ``x-request-id``), else a new one."""
    given = policy.value(request.headers, policy.REQUEST_ID) or policy.value(
        request.headers, policy.ENGINE_REQUEST_ID)
    return given[:128] if given else b"%s%012x" % (_ID_PREFIX.encode(), next(_ID_COUNTER))


def _timing(lookup: float, upstream: float, total: float) -> bytes:
    return (b"route;dur=%.3f, upstream;dur=%.3f, total;dur=%.3f"
            % (lookup * 1e3, upstream * 1e3, total * 1e3))


class InferenceRoutes:
    def __init__(self, router: Router) -> None:
        self.router = router

    async def handle(self, request: Request, response: Response) -> None:
        started = time.perf_counter()
        request_id = request_id_of(request)
        extra: Headers = [(policy.REQUEST_ID, request_id)]
        try:
            try:
                model = parse_json_object(request.body).get("model")
            except BodyError as exc:
                raise RequestError(400, str(exc), code=exc.code) from None
            if not isinstance(model, str) or not model:
                raise RequestError(400, "'model' is required and must be a string",
                                   param="model")
            path = request.path if not request.query else \
                f"{request.path}?{request.query.decode('latin-1')}"
            before = time.perf_counter()
            routed = await self.router.route(model, path, request.body,
                                             policy.forwarded(request.headers, request_id))
        except RequestError as error:
            await send_error(response, error, extra)
            return
        head_at = time.perf_counter()
        node = routed.node
        extra += [(b"x-otela-session-id", node.session_id.encode()),
                  (b"x-otela-peer-id", node.peer_id.encode()),
                  (b"x-otela-provider-id", node.provider_id.encode()),
                  (b"server-timing", _timing(before - started, head_at - before,
                                             head_at - started))]
        if routed.path_kind == "libp2p":
            extra.append((b"x-otela-path", b"libp2p"))
        await relay(routed.reply, response, extra)
