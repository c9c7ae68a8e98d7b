"""Forward a routed request over libp2p (``otela.transport``) instead of plain HTTP.

Used for targets that advertise they are not publicly reachable (behind NAT, reachable via
a relay circuit or a hole-punched connection). Same contract as ``forward.forward``: raise
``UpstreamUnreachable`` only when the request provably never reached an engine.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx
from fastapi.responses import Response, StreamingResponse

from otela.api.errors import APIError
from otela.registry.records import NodeRecord
from otela.routing.forward import UpstreamUnreachable, response_headers
from otela.transport.client import EngineStreamClient, NotDelivered, ResponseLost


async def forward_p2p(
    client: EngineStreamClient,
    node: NodeRecord,
    path: str,
    body: bytes,
    headers: Mapping[str, str],
    extra_response_headers: Mapping[str, str],
) -> Response:
    try:
        upstream = await client.request(node, path, body, dict(headers))
    except NotDelivered as exc:
        raise UpstreamUnreachable(f"peer {node.peer_id} over libp2p: {exc}") from exc
    except ResponseLost as exc:
        raise APIError(502, f"The node serving the request failed: {exc}",
                       code="upstream_failed") from exc
    out = response_headers(httpx.Headers(upstream.headers), extra_response_headers)
    out["x-otela-path"] = "libp2p"
    if upstream.headers.get("content-type", "").startswith("text/event-stream"):
        return StreamingResponse(upstream.chunks(), status_code=upstream.status, headers=out)
    try:
        content = await upstream.read()
    except ResponseLost as exc:
        raise APIError(502, f"The node serving the request failed: {exc}",
                       code="upstream_failed") from exc
    return Response(content, status_code=upstream.status, headers=out)
