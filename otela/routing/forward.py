"""Forward one HTTP request to an engine (directly or via its node) and relay the answer.

Server-sent events are relayed chunk by chunk as they arrive, never buffered whole;
other responses are read fully (they are small) and returned with their status.

Failures are classified for the router's retry rule, because a request must never run
twice: ``UpstreamUnreachable`` only when it provably never reached an engine (no
connection could be made, or the node answered that it did not deliver it); anything
after the request may have been delivered is a 502 (``upstream_failed``), and an
upstream that accepts the request but sends nothing for ``first_byte_timeout`` seconds
a 504 (``upstream_timeout``). Neither is retried.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping

import httpx
import trio
from fastapi.responses import Response, StreamingResponse

from otela.api.errors import APIError

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
DEFAULT_FIRST_BYTE_TIMEOUT_S = 300.0

HeaderList = list[tuple[bytes, bytes]]


class UpstreamUnreachable(Exception):
    """The request could not be delivered at all, so it is safe to try another node."""


def forwarded_headers(incoming: Mapping[str, str], extra: Mapping[str, str]) -> HeaderList:
    """The headers an engine may see, as the bytes the client sent (the HTTP layer decodes
    them as Latin-1, so this is an exact round trip, non-ASCII values included)."""
    headers = {k: incoming[k] for k in FORWARDED_REQUEST_HEADERS if k in incoming}
    headers.setdefault("content-type", "application/json")
    headers.update(extra)
    return [(k.encode("latin-1"), _header_bytes(v)) for k, v in headers.items()]


def _header_bytes(value: str) -> bytes:
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:  # from a peer's frame, not an HTTP client: any text
        return value.encode("utf-8", "replace")


def response_headers(upstream: Iterable[tuple[str, str]], extra: Mapping[str, str]
                     ) -> dict[str, str]:
    headers = {k: v for k, v in upstream if k.lower() not in _HOP_HEADERS}
    headers.update(extra)
    return headers


def upstream_failed(url: str, exc: BaseException) -> APIError:
    return APIError(502, f"The node serving the request failed before it answered "
                    f"({type(exc).__name__}); it may have run, so it was not retried.",
                    code="upstream_failed")


def upstream_timeout(timeout: float) -> APIError:
    return APIError(504, f"The serving engine accepted the request but sent nothing for "
                    f"{timeout:.0f} s.", code="upstream_timeout")


async def forward(
    client: httpx.AsyncClient,
    url: str,
    body: bytes,
    headers: HeaderList,
    extra_response_headers: Mapping[str, str],
    first_byte_timeout: float = DEFAULT_FIRST_BYTE_TIMEOUT_S,
) -> Response:
    """POST ``body`` to ``url``; raise ``UpstreamUnreachable`` if it never got there."""
    request = client.build_request("POST", url, content=body, headers=headers)
    try:
        with trio.fail_after(first_byte_timeout):
            upstream = await client.send(request, stream=True)
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
        raise UpstreamUnreachable(f"{url}: {exc}") from exc
    except trio.TooSlowError:
        raise upstream_timeout(first_byte_timeout) from None
    except httpx.HTTPError as exc:
        raise upstream_failed(url, exc) from exc
    if upstream.headers.get(NOT_DELIVERED_HEADER) == "1":
        await upstream.aclose()
        raise UpstreamUnreachable(f"{url}: the node did not deliver it")
    out_headers = response_headers(upstream.headers.multi_items(), extra_response_headers)
    if upstream.headers.get("content-type", "").startswith("text/event-stream"):
        return StreamingResponse(
            _relay(upstream), status_code=upstream.status_code, headers=out_headers
        )
    try:
        with trio.fail_after(first_byte_timeout):
            content = await upstream.aread()
    except trio.TooSlowError:
        raise upstream_timeout(first_byte_timeout) from None
    except httpx.HTTPError as exc:
        raise upstream_failed(url, exc) from exc
    finally:
        await upstream.aclose()
    return Response(content, status_code=upstream.status_code, headers=out_headers)


async def _relay(upstream: httpx.Response) -> AsyncIterator[bytes]:
    try:
        async for chunk in upstream.aiter_raw():
            yield chunk
    finally:
        await upstream.aclose()
