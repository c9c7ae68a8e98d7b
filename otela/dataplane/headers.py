"""Which headers cross a hop, in which direction. One policy for every hop (ingress ->
node, node -> engine; over HTTP or libp2p).

Requests: only an allowlist reaches engines, as the bytes the client sent (non-ASCII
included): the body's type, what the client accepts, who it is, and the request id (as
otela's ``x-otela-request-id`` and the engines' ``x-request-id``, so engine logs carry the
same id). Credentials (``authorization``: the user's key is the ingress's business),
cookies and everything else stay behind.

Responses: everything but hop-by-hop headers (RFC 9110 §7.6.1), those the relaying
server sets itself (length, framing, date, server), and ``Location``: an engine that
redirects (Starlette answers ``/v1/x/`` with a 307 to its own ``http://127.0.0.1:8000/v1/x``)
would hand the client an internal address.
"""

from __future__ import annotations

from collections.abc import Sequence

Headers = list[tuple[bytes, bytes]]

REQUEST_ID = b"x-otela-request-id"
ENGINE_REQUEST_ID = b"x-request-id"
# Set by a node on its answer when it could not deliver the request to its own engine:
# the request never ran, so the ingress may safely try another node.
NOT_DELIVERED = b"x-otela-not-delivered"
# Set by a serving node on every answer it relays: its load, for the ingress (routing.load).
LOAD = b"x-otela-load"
FORWARDED_REQUEST = frozenset({b"content-type", b"accept", b"user-agent"})
DROPPED_RESPONSE = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
    b"trailer", b"transfer-encoding", b"upgrade", b"content-length", b"host", b"date",
    b"server", b"location",
    # otela's own between nodes: the serving node's load report is for the ingress, and
    # what became of a request (``outcome``) only means something to the hop that says it
    # (an engine cannot make an ingress re-send its answer elsewhere).
    LOAD, NOT_DELIVERED, b"x-otela-outcome",
})
JSON = (b"content-type", b"application/json")


def forwarded(incoming: Headers, request_id: bytes,
              extra: Sequence[tuple[bytes, bytes]] = ()) -> Headers:
    """The request headers an upstream gets."""
    out = [(k, v) for k, v in incoming if k in FORWARDED_REQUEST]
    if not any(k == b"content-type" for k, _ in out):
        out.append(JSON)
    out.append((REQUEST_ID, request_id))
    out.append((ENGINE_REQUEST_ID, request_id))
    out.extend(extra)
    return out


def relayed(upstream: Headers, extra: Sequence[tuple[bytes, bytes]] = ()) -> Headers:
    """The response headers the client gets: the upstream's, minus hop-by-hop ones and
    those ``extra`` sets (ours win: a serving node's request id is not said twice)."""
    ours = {k for k, _ in extra}
    return [(k, v) for k, v in upstream if k not in DROPPED_RESPONSE and k not in ours] + \
        list(extra)


def value(headers: Headers, name: bytes) -> bytes | None:
    for key, val in headers:
        if key == name:
            return val
    return None
