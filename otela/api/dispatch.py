"""What runs each request that reaches a node's HTTP port.

- ``POST /v1/engine/...``: the engine hop, for other members (``hop.py``);
- any other ``POST /v1/...`` but otela's own resources: an OpenAI request, routed to a
  node serving its model (``inference.py``);
- ``GET /metrics``: Prometheus metrics (``otela.metrics``);
- everything else: the node's API (FastAPI: models, health, inspection), run in process.
The first two count as in flight until their response is sent or their client is gone,
so a draining node waits for them (``otela.dataplane.inflight``).
"""

from __future__ import annotations

from otela.api.hop import EngineHop
from otela.api.inference import InferenceRoutes
from otela.dataplane.gate import ENGINE_PREFIX, inference_path
from otela.dataplane.http import Handler, Request, Response
from otela.dataplane.inflight import Inflight
from otela.metrics import CONTENT_TYPE, Registry

_HOP_PREFIX = ENGINE_PREFIX + "/"
# otela's own resources under /v1: never routed to engines, whatever the method (a POST to
# one is a 405 from the API, not an inference request).
OWN_PREFIXES = ("/v1/registry", "/v1/health", "/v1/network", "/v1/models",
                "/v1/assignments", "/v1/load-reports", "/v1/admin/", "/v1/me/")
OWN_PATHS = frozenset({"/v1/admin", "/v1/me"})  # (a prefix would take /v1/messages)


class Dispatch:
    def __init__(self, inference: InferenceRoutes, hop: EngineHop, fallback: Handler,
                 inflight: Inflight, metrics: Registry | None) -> None:
        self.inference = inference
        self.hop = hop
        self.fallback = fallback  # the node's API (in process, or a worker's control)
        self.inflight = inflight
        self.metrics = metrics  # None: metrics are served elsewhere (a worker's control)

    async def __call__(self, request: Request, response: Response) -> None:
        if request.method == "POST":
            path = request.path
            if path.startswith(_HOP_PREFIX):
                with self.inflight.track():
                    await self.hop.handle(request, response)
                return
            if inference_path(path) and not path.startswith(OWN_PREFIXES) and \
                    path not in OWN_PATHS:
                with self.inflight.track():
                    await self.inference.handle(request, response)
                return
        if (self.metrics is not None and request.path == "/metrics"
                and request.method in ("GET", "HEAD")):
            await response.send(200, [(b"content-type", CONTENT_TYPE)], self.metrics.render())
            return
        await self.fallback(request, response)
