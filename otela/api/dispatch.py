"""What runs each request that reaches a node's HTTP port.

- ``POST /v1/engine/...``: the engine hop, for other members (``hop.py``);
- ``POST`` to an inference route (``otela.dataplane.gate``: an allowlist, decided on the
  canonical path, which is also the path sent on): an OpenAI request, routed to a node
  serving its model (``inference.py``); a ``/v1/...`` target with no canonical path is a
  400;
- ``GET /metrics``: Prometheus metrics (``otela.metrics``);
- everything else: the node's API (FastAPI: models, health, inspection), run in process.
The first two count as in flight until their response is sent or their client is gone,
so a draining node waits for them (``otela.dataplane.inflight``).
"""

from __future__ import annotations

from otela.api.hop import EngineHop
from otela.api.inference import InferenceRoutes
from otela.dataplane import headers as header_rules
from otela.dataplane.errors import RequestError
from otela.dataplane.gate import DEFAULT_ROUTES, PathError, Routes, canonical_path
from otela.dataplane.http import Handler, Headers, Request, Response
from otela.dataplane.inflight import Inflight
from otela.dataplane.relay import send_error
from otela.metrics import CONTENT_TYPE, Registry
from otela.names import ENGINE_PREFIX

_HOP_PREFIX = ENGINE_PREFIX + "/"


class Dispatch:
    def __init__(self, inference: InferenceRoutes, hop: EngineHop, fallback: Handler,
                 inflight: Inflight, metrics: Registry | None,
                 routes: Routes = DEFAULT_ROUTES) -> None:
        self.inference = inference
        self.routes = routes
        self.hop = hop
        self.fallback = fallback  # the node's API (in process, or a worker's control)
        self.inflight = inflight
        self.metrics = metrics  # None: metrics are served elsewhere (a worker's control)

    def screen(self, method: str, target: bytes, headers: Headers) -> RequestError | None:
        """The HTTP server's screen (``otela.dataplane.http.Screen``): with API keys on, an
        inference request whose key is missing, wrong or over its limits is refused from
        its headers, before its body is read (a keyless 30 MB upload costs nothing, a
        keyless body that never comes holds nothing)."""
        keys = self.inference.keys
        if keys is None or method != "POST":
            return None
        try:
            canonical = canonical_path(target.decode("latin-1"))
        except PathError:
            return None  # the handler answers it
        if not self.routes.inference(canonical):
            return None
        try:
            keys.screen(header_rules.credential(headers))
        except RequestError as refused:
            return refused
        return None

    async def __call__(self, request: Request, response: Response) -> None:
        if request.method == "POST":
            path = request.path
            if path.startswith(_HOP_PREFIX):
                with self.inflight.track():
                    await self.hop.handle(request, response)
                return
            try:
                target = canonical_path(request.target.decode("latin-1"))
            except PathError as exc:
                if path.startswith("/v1/"):
                    await send_error(response, RequestError(400, str(exc), code="invalid_path"))
                    return
                target = ""
            if self.routes.inference(target):
                with self.inflight.track():
                    await self.inference.handle(request, response, target)
                return
        if (self.metrics is not None and request.path == "/metrics"
                and request.method in ("GET", "HEAD")):
            # Per-key series only for whom the ingress service shows them (``viewer``).
            credential = header_rules.credential(request.headers)
            await response.send(200, [(b"content-type", CONTENT_TYPE)], self.metrics.render(
                None if credential is None else credential.decode("latin-1")))
            return
        await self.fallback(request, response)
