"""Request errors that any part of the request path may raise, whatever protocol carries
the answer: the HTTP API turns them into OpenAI-style JSON errors, the libp2p hop into
error frames. Shape of the body: ``{"error": {"message", "type", "param", "code"}}``.
Messages never echo unbounded input back (``clip``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "upstream_timeout",
}


class RequestError(Exception):
    """Raise anywhere on the request path to answer with an OpenAI-style error."""

    def __init__(self, status: int, message: str, *, code: str | None = None,
                 param: str | None = None, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, code=self.code, param=self.param)


def error_body(status: int, message: str, *, code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    kind = _TYPE_BY_STATUS.get(status, "server_error" if status >= 500 else "api_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_json(status: int, message: str, code: str | None = None,
               param: str | None = None) -> bytes:
    """The error body, serialized."""
    return orjson.dumps(error_body(status, message, code=code, param=param))


class NotDelivered(Exception):
    """The request never reached an engine (no connection, or the node said so): another
    node may take it. Only this outcome is ever retried, so nothing runs twice.

    ``unreachable``: the node's address refused the connection (nothing listens there) or
    did not answer the connection attempt at all (the host is down or cut off): the router
    stops sending it requests at once. ``refused``: turned away at once (refused, or no
    route to the host), so the attempt cost nothing and does not use up the request's
    ``--route-attempts``. ``blameless``: the node declined for a reason that is not its
    fault, so it counts nothing against it (it does not know the caller as a member yet:
    after a partition heals, a rejoined ingress's new session reaches it a moment
    later)."""

    def __init__(self, message: str, *, unreachable: bool = False, refused: bool = False,
                 blameless: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable or refused
        self.refused = refused
        self.blameless = blameless


class UpstreamFailed(Exception):
    """The way to the engine broke after the request may have been delivered."""


class UpstreamTimeout(Exception):
    """The upstream took the request and sent nothing within the first-byte timeout."""


def clip(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters: errors never echo unbounded input back."""
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"
