"""Forward a routed request over libp2p (``otela.transport``) instead of plain HTTP.

Used for targets that advertise they are not publicly reachable (behind NAT, reachable via
a relay circuit or a hole-punched connection). Same contract as ``forward.forward``: raise
``UpstreamUnreachable`` only when the request provably never reached an engine.
"""

from __future__ import annotations

from collections.abc import Mapping

import trio
from fastapi.responses import Response, StreamingResponse

from otela.api.errors import APIError
from otela.registry.records import NodeRecord
from otela.routing.forward import (
    DEFAULT_FIRST_BYTE_TIMEOUT_S,
    HeaderList,
    UpstreamUnreachable,
    response_headers,
    upstream_timeout,
)
from otela.transport.client import EngineStreamClient, NotDelivered, ResponseLost


async def forward_p2p(
    client: EngineStreamClient,
    node: NodeRecord,
    path: str,
    body: bytes,
    headers: HeaderList,
    extra_response_headers: Mapping[str, str],
    first_byte_timeout: float = DEFAULT_FIRST_BYTE_TIMEOUT_S,
) -> Response:
    fields = {k.decode("latin-1"): v.decode("latin-1") for k, v in headers}
    try:
        with trio.fail_after(first_byte_timeout):
            upstream = await client.request(node, path, body, fields)
    except NotDelivered as exc:
        raise UpstreamUnreachable(f"peer {node.peer_id} over libp2p: {exc}") from exc
    except trio.TooSlowError:
        raise upstream_timeout(first_byte_timeout) from None
    except ResponseLost as exc:
        raise APIError(502, f"The node serving the request failed: {exc}",
                       code="upstream_failed") from exc
    out = response_headers(upstream.headers.items(), extra_response_headers)
    out["x-otela-path"] = "libp2p"
    if upstream.headers.get("content-type", "").startswith("text/event-stream"):
        return StreamingResponse(upstream.chunks(), status_code=upstream.status, headers=out)
    try:
        content = await upstream.read()
    except ResponseLost as exc:
        raise APIError(502, f"The node serving the request failed: {exc}",
                       code="upstream_failed") from exc
    return Response(content, status_code=upstream.status, headers=out)
