"""What a dashboard session cookie may do, checked before the route runs.

Only these paths ever look at the cookie: the admin API (``/v1/admin/...``: for users the
provider puts in an admin group; others get 403), a user's own keys (``/ui/keys...``,
``ingress.sso.own_keys``), ``/ui/session`` and ``/ui/logout``.
Everything else, the OpenAI routes first of all, takes API keys only, so a session cannot
spend anyone's tokens and the request path never reads the session table.

A request that carries an ``Authorization`` header is judged by it alone (a key or the
admin token, exactly as without SSO) and its cookie is ignored. One that carries only the
cookie must also carry the session's CSRF token in ``x-otela-csrf`` (except the read of
``/ui/session`` that hands the token out): another site can make a browser send the
cookie, but not set a header (a cross-origin custom header needs a CORS preflight, which
this node never grants), and cannot read the token.

The session found is left in the request's state for the route (``signed_in``).
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import CookieError, SimpleCookie
from typing import Any

import orjson

from ingress.database import Database
from ingress.sso.sessions import CSRF_HEADER, SESSION_COOKIE, Session, find_session
from otela.dataplane.errors import error_body

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("otela.ingress.sso")

ADMIN_PREFIX = "/v1/admin"
OWN_KEYS_PATH = "/ui/keys"
SESSION_PATH = "/ui/session"
LOGOUT_PATH = "/ui/logout"
_STATE_KEY = "ui_session"
_EXPIRED_KEY = "ui_session_expired"


def cookie_value(header: str | None, name: str) -> str | None:
    if not header:
        return None
    try:
        jar: SimpleCookie = SimpleCookie(header)
    except CookieError:
        return None
    morsel = jar.get(name)
    return morsel.value if morsel is not None and morsel.value else None


def signed_in(request: Any) -> Session | None:
    """The session a cookie-only request was made with (``None``: none, or a request
    that carried an ``Authorization`` header)."""
    return getattr(request.state, _STATE_KEY, None)


def session_expired(request: Any) -> bool:
    """A cookie came with the request but names no live session (signed out elsewhere,
    expired, or from a database that was reset)."""
    return bool(getattr(request.state, _EXPIRED_KEY, False))


class SessionGate:
    """ASGI middleware on the node's API app (see the module docstring)."""

    def __init__(self, app: App, db: Database) -> None:
        self.app = app
        self.db = db

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        # Paths that need a live session: a cookie naming none is a 401 there.
        admin = _under(path, ADMIN_PREFIX) or _under(path, OWN_KEYS_PATH)
        if not (admin or path in (SESSION_PATH, LOGOUT_PATH)):
            await self.app(scope, receive, send)
            return
        headers: dict[str, str] = {}
        for raw_name, raw_value in scope.get("headers", []):
            name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
            # HTTP/2 may split the cookies over several headers: one string again.
            headers[name] = f"{headers[name]}; {value}" if name == "cookie" and \
                name in headers else value
        secret = cookie_value(headers.get("cookie"), SESSION_COOKIE)
        if secret is None or "authorization" in headers:
            await self.app(scope, receive, send)
            return
        try:
            session = await self.db.in_thread(find_session, self.db, secret, time.time())
        except Exception as exc:  # the database's: say so, as JSON, and keep serving
            log.warning("sso: cannot read a dashboard session (%s: %s)",
                        type(exc).__name__, exc)
            await _refuse(send, 503, "This ingress cannot reach its database to check your "
                          "dashboard session. Try again in a moment.", "database_unavailable")
            return
        state = scope.setdefault("state", {})
        if session is None:
            if admin:
                await _refuse(send, 401, "Your dashboard session has expired or was signed "
                              "out: sign in again.", "session_expired")
                return
            state[_EXPIRED_KEY] = True
            await self.app(scope, receive, send)
            return
        if path != SESSION_PATH or scope.get("method") != "GET":
            given = headers.get(CSRF_HEADER, "")
            if not hmac.compare_digest(given.encode(), session.csrf.encode()):
                await _refuse(send, 403, f"A call made with the dashboard's session cookie "
                              f"must carry its CSRF token in the {CSRF_HEADER} header (from "
                              f"GET {SESSION_PATH}).", "csrf_token_invalid")
                return
        state[_STATE_KEY] = session
        await self.app(scope, receive, send)


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


async def _refuse(send: Send, status: int, message: str, code: str) -> None:
    body = orjson.dumps(error_body(status, message, code=code))
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": body})
