"""The planner side: sign assignments and POST them to nodes (``POST URL/v1/assignments``).

Responses the node gives (docs/placer.md): 202 ``{"accepted": true, "assignment": id,
"command": "..."}``, or 4xx in the OpenAI error shape ``{"error": {"message", "type",
"param", "code"}}`` (400 malformed, 403 not opted in / unauthorised / forged / not allowed,
409 replayed or busy, 410 expired). A node without the endpoint answers 404; that is
reported, not retried.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx
from libp2p.crypto.keys import PrivateKey

from otela.assignments.message import Assignment, new_id, sign, to_http

PATH = "/v1/assignments"


@dataclass(frozen=True)
class SendResult:
    target: str
    url: str
    assignment_id: str
    status: int  # HTTP status, 0 when the node could not be reached
    accepted: bool
    detail: str
    code: str = ""  # the node's refusal code (not_opted_in, forged, replayed...)


def make(issuer: str, key: PrivateKey, *, target: str, engine: str, model: str, tp: int,
         ttl_s: float = 600.0, plan: str = "", params: dict[str, str] | None = None,
         now: float | None = None) -> tuple[Assignment, bytes]:
    """A fresh, signed assignment for `target`."""
    t = time.time() if now is None else now
    a = Assignment(id=new_id(), issuer=issuer, target=target, issued_at=t,
                   expires_at=t + ttl_s, engine=engine, model=model, tp=tp, plan=plan,
                   params=params or {})
    return a, sign(a, key)


def send(url: str, target: str, assignment: Assignment, envelope: bytes,
         client: httpx.Client | None = None, timeout_s: float = 10.0) -> SendResult:
    """POST one envelope; never raises for network or HTTP errors (they are the result)."""
    target_url = url.rstrip("/") + PATH
    own = client is None
    c = client or httpx.Client(timeout=timeout_s, trust_env=False)
    try:
        resp = c.post(target_url, json=to_http(envelope))
    except httpx.HTTPError as exc:
        return SendResult(target, target_url, assignment.id, 0, False, f"unreachable: {exc}")
    finally:
        if own:
            c.close()
    try:
        body = resp.json()
    except ValueError:
        body = {}
    if not isinstance(body, dict):
        body = {}
    accepted = resp.status_code == 202 and bool(body.get("accepted"))
    raw_error = body.get("error")
    error: dict[str, Any] = raw_error if isinstance(raw_error, dict) else {}
    if resp.status_code == 404:
        detail = "the node has no assignment endpoint (an otela older than assignments?)"
    elif accepted:
        detail = str(body.get("command"))
    else:
        detail = str(error.get("message") or body.get("reason") or resp.text[:200])
    return SendResult(target, target_url, assignment.id, resp.status_code, accepted, detail,
                      str(error.get("code") or body.get("code") or ""))
