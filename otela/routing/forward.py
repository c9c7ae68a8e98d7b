"""Forward one HTTP request to an engine (directly or via its node) and relay the answer.

Server-sent events are relayed chunk by chunk as they arrive, never buffered whole;
other responses are read fully (they are small) and returned with their status.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

import httpx
from fastapi.responses import Response, StreamingResponse

# Headers that describe one hop, not the message (RFC 9110 §7.6.1), plus length/encoding,
# which the relaying server recomputes.
_HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "content-encoding",
        "host",
        "date",
        "server",
    }
)
FORWARDED_REQUEST_HEADERS = ("content-type", "accept", "user-agent", "x-otela-request-id")
# Set by a node on its answer when it could not deliver the request to its own engine:
# the request never ran, so the ingress may safely try another node.
NOT_DELIVERED_HEADER = "x-otela-not-delivered"


class UpstreamUnreachable(Exception):
    """The request could not be delivered at all, so it is safe to try another node."""


def request_headers(incoming: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    headers = {k: incoming[k] for k in FORWARDED_REQUEST_HEADERS if k in incoming}
    headers.setdefault("content-type", "application/json")
    headers.update(extra)
    return headers


def response_headers(upstream: httpx.Headers, extra: Mapping[str, str]) -> dict[str, str]:
    headers = {k: v for k, v in upstream.items() if k.lower() not in _HOP_HEADERS}
    headers.update(extra)
    return headers


async def forward(
    client: httpx.AsyncClient,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    extra_response_headers: Mapping[str, str],
) -> Response:
    """POST ``body`` to ``url``; raise ``UpstreamUnreachable`` if it never got there."""
    request = client.build_request("POST", url, content=body, headers=dict(headers))
    try:
        upstream = await client.send(request, stream=True)
    except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
        raise UpstreamUnreachable(f"{url}: {exc}") from exc
    if upstream.headers.get(NOT_DELIVERED_HEADER) == "1":
        await upstream.aclose()
        raise UpstreamUnreachable(f"{url}: the node could not reach its engine")
    out_headers = response_headers(upstream.headers, extra_response_headers)
    if upstream.headers.get("content-type", "").startswith("text/event-stream"):
        return StreamingResponse(
            _relay(upstream), status_code=upstream.status_code, headers=out_headers
        )
    try:
        content = await upstream.aread()
    finally:
        await upstream.aclose()
    return Response(content, status_code=upstream.status_code, headers=out_headers)


async def _relay(upstream: httpx.Response) -> AsyncIterator[bytes]:
    try:
        async for chunk in upstream.aiter_raw():
            yield chunk
    finally:
        await upstream.aclose()
