"""What became of a request a node did not answer with its engine's reply: one codec for
every way it travels back. Pure.

Three transports carry a request to a serving node's engine and bring the answer back:
the HTTP engine hop (``/v1/engine/...``), HTTP over libp2p (``/otela/http/2``, nodes
behind NAT) and, with ``--workers``, a worker's relay through its control process. When
the node cannot relay an engine's reply, the caller must learn the same facts whichever
way the request went, because its retry rule depends on them (``otela.routing.router``):

- ``delivered``: whether the engine may have seen the request (if so it is never sent
  again, unless the operator accepts that with ``--retry-broken``);
- ``refused``: turned away at once (nothing listens): costs the request no attempt;
- ``unreachable``: the node's address did not answer: it leaves routing at once;
- ``blameless``: declined for a reason that is not the node's failing (it does not know
  the caller as a member yet): asked again later, counts nothing against it;
- ``timeout``: the engine took the request and sent nothing in time: a 504, never re-sent.

``Outcome`` holds them with the status and error code the client would see; it travels as
the ``x-otela-outcome`` header of an HTTP answer (beside ``x-otela-not-delivered: 1``,
which a node's HTTP server writes itself when it refuses a connection unread), as the
fields of a libp2p ERROR frame, and it converts to and from the exceptions the ingress's
router acts on (``NotDelivered``, ``UpstreamFailed``, ``UpstreamTimeout``). Before there was
one codec, an engine's first-byte timeout was a 504 over HTTP but a 502 over libp2p (and
re-sent under ``--retry-broken``), and a worker's relay lost every flag but "not
delivered".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from otela.dataplane.errors import (
    NotDelivered,
    RequestError,
    UpstreamFailed,
    UpstreamTimeout,
    clip,
)
from otela.dataplane.headers import Headers, value

OUTCOME = b"x-otela-outcome"
NOT_DELIVERED = b"x-otela-not-delivered"
_FLAGS = ("not-delivered", "refused", "unreachable", "blameless", "timeout")


@dataclass(frozen=True)
class Outcome:
    status: int
    code: str
    message: str
    delivered: bool
    refused: bool = False
    unreachable: bool = False
    blameless: bool = False
    timeout: bool = False

    # -- the ways it travels -------------------------------------------------------------

    def headers(self) -> dict[str, str]:
        """The headers of an HTTP answer that carries it (a ``RequestError``'s)."""
        flags = [name for name, on in zip(_FLAGS, (
            not self.delivered, self.refused, self.unreachable, self.blameless,
            self.timeout), strict=True) if on]
        out = {OUTCOME.decode(): " ".join(flags) or "failed"}
        if not self.delivered:
            out[NOT_DELIVERED.decode()] = "1"
        return out

    def error(self) -> RequestError:
        """The HTTP answer that carries it."""
        return RequestError(self.status, self.message, code=self.code,
                            headers=self.headers())

    def fields(self) -> dict[str, Any]:
        """The fields of a libp2p ERROR frame (``p2p_frames``) that carries it."""
        return {"message": self.message, "status": self.status, "code": self.code,
                "not_delivered": not self.delivered, "refused": self.refused,
                "unreachable": self.unreachable, "blameless": self.blameless,
                "timeout": self.timeout}

    def exception(self, who: str = "") -> NotDelivered | UpstreamFailed | UpstreamTimeout:
        """What the router acts on."""
        message = f"{who}: {self.message}" if who else self.message
        if not self.delivered:
            return NotDelivered(message, refused=self.refused, unreachable=self.unreachable,
                                blameless=self.blameless)
        if self.timeout:
            return UpstreamTimeout(message)
        return UpstreamFailed(message)

    # -- and back ------------------------------------------------------------------------

    @classmethod
    def of_exception(cls, exc: BaseException) -> Outcome:
        """The outcome an exception of the way to an engine stands for."""
        reason = clip(str(exc) or type(exc).__name__, 512)
        if isinstance(exc, NotDelivered):
            return cls(502, "engine_unreachable", f"engine unreachable: {reason}",
                       delivered=False, refused=exc.refused, unreachable=exc.unreachable,
                       blameless=exc.blameless)
        if isinstance(exc, UpstreamTimeout):
            return cls(504, "upstream_timeout", f"the engine sent nothing in time: {reason}",
                       delivered=True, timeout=True)
        return cls(502, "upstream_failed", f"the engine failed: {reason}", delivered=True)

    @staticmethod
    def carried_by(headers: Headers) -> bool:
        """Whether an HTTP answer carries an outcome rather than an engine's reply."""
        return value(headers, OUTCOME) is not None or value(headers, NOT_DELIVERED) == b"1"

    @classmethod
    def of_headers(cls, status: int, headers: Headers, body: bytes = b"") -> Outcome | None:
        """The outcome an HTTP answer carries, or ``None`` for an engine's own reply; its
        message and code from ``body`` (the answer's OpenAI-style error) when given."""
        flags = value(headers, OUTCOME)
        if flags is None:
            if value(headers, NOT_DELIVERED) != b"1":
                return None
            # A node's HTTP server refusing a connection unread (its connection limit), or
            # a node that says only that: a 403 is a caller it does not know yet.
            return cls(status, "not_delivered", f"not delivered (HTTP {status})",
                       delivered=False, blameless=status == 403)
        words = set(flags.decode("latin-1").split())
        code, message = _error_of(body)
        return cls(status, code, message or f"HTTP {status}",
                   delivered="not-delivered" not in words,
                   refused="refused" in words, unreachable="unreachable" in words,
                   blameless="blameless" in words or (
                       # a hop refusing a caller it does not know as a member (yet)
                       status == 403 and "not-delivered" in words),
                   timeout="timeout" in words)

    @classmethod
    def of_fields(cls, fields: Mapping[str, Any]) -> Outcome:
        """The outcome an ERROR frame's fields carry (a malformed one: delivered, so never
        re-sent: we cannot tell whether it ran)."""
        status = fields.get("status")
        status = status if isinstance(status, int) and not isinstance(status, bool) and \
            100 <= status <= 599 else 502
        not_delivered = fields.get("not_delivered") is True
        return cls(status, str(fields.get("code") or ""),
                   clip(str(fields.get("message")), 512), delivered=not not_delivered,
                   refused=fields.get("refused") is True,
                   unreachable=fields.get("unreachable") is True,
                   blameless=fields.get("blameless") is True or (
                       not_delivered and status == 403),
                   timeout=fields.get("timeout") is True)


def _error_of(body: bytes) -> tuple[str, str]:
    """(code, message) of an OpenAI-style error body; empty strings if it is not one."""
    try:
        error = orjson.loads(body)["error"]
        return str(error.get("code") or ""), clip(str(error.get("message") or ""), 512)
    except Exception:
        return "", ""
