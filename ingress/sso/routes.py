"""``/ui/login``, ``/ui/callback``, ``/ui/session`` and ``/ui/logout``: signing in to the
dashboard through the OpenID provider (installed by ``ingress.plugin`` only where
``sso_issuer`` is set).

1. ``GET /ui/login``: a new sign-in (state, nonce, PKCE verifier kept server side,
   ``ingress.sso.sessions``; the browser gets a cookie naming it) and a redirect to the
   provider.
2. ``GET /ui/callback?code&state``: the sign-in is taken (once), the state compared, the
   code exchanged and the ID token verified (``ingress.sso.oidc``); the user is created or
   updated from the claims (``ingress.sso.users``), a session opened, and the browser sent
   to the dashboard (the admin view for admins).
3. ``GET /ui/session``: who is signed in, and the CSRF token the page sends with its calls.
4. ``POST /ui/logout``: the session ends (on every ingress sharing the database).

Cookies are HttpOnly, SameSite=Lax (the provider's redirect back is a top-level GET, which
Lax lets through; another site's POST is not), and Secure when ``sso_redirect_base`` is
https. A failed sign-in is a page saying why (``pages``), never a traceback.
"""

from __future__ import annotations

import hmac
import logging
import time
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, RedirectResponse

from ingress import keystore
from ingress.database import Database
from ingress.sso import sessions, users
from ingress.sso.claims import profile
from ingress.sso.gate import SESSION_PATH, SessionGate, cookie_value, session_expired, signed_in
from ingress.sso.oidc import OpenIDClient, ProviderError
from ingress.sso.pages import failure_page
from ingress.sso.sessions import LOGIN_COOKIE, SESSION_COOKIE, PendingLogin
from ingress.sso.settings import CALLBACK_PATH, SsoSettings
from otela.dataplane.errors import RequestError

log = logging.getLogger("otela.ingress.sso")

# What the provider may say in ``error`` on the way back, in words (RFC 6749 4.1.2.1,
# OpenID Connect Core 3.1.2.6); anything else is shown as the provider named it.
_DECLINED = {"access_denied", "consent_required", "interaction_required", "login_required"}


def _cookie(response: Response, settings: SsoSettings, name: str, value: str,
            max_age: int, path: str) -> None:
    response.set_cookie(name, value, max_age=max_age, path=path, httponly=True,
                        secure=settings.secure_cookies, samesite="lax")


def _forget(response: Response, settings: SsoSettings, name: str, path: str) -> None:
    response.delete_cookie(name, path=path, httponly=True, secure=settings.secure_cookies,
                           samesite="lax")


def install(app: FastAPI, db: Database, settings: SsoSettings,
            client: OpenIDClient | None = None) -> None:
    provider = client or OpenIDClient(settings)
    app.add_middleware(SessionGate, db=db)

    def failed(exc: Exception, title: str) -> Response:
        """The page for a sign-in that cannot go on: the provider's fault, the user's
        choice, or the database's (any other exception here comes from the database
        calls: sqlite3's, psycopg's or ``DatabaseError``)."""
        if not isinstance(exc, ProviderError):
            log.warning("sso: the ingress database failed during a sign-in (%s: %s)",
                        type(exc).__name__, exc)
            page = failure_page(503, title, "This ingress cannot reach its database right "
                                "now. Try again in a moment.", "database_unavailable")
        else:
            log.warning("sso: %s (%s)", exc, exc.code)
            page = failure_page(exc.status, title, str(exc), exc.code)
        _forget(page, settings, LOGIN_COOKIE, CALLBACK_PATH)
        return page

    @app.get("/ui/login", include_in_schema=False)
    async def login() -> Response:
        pending = PendingLogin(sessions.new_secret(), sessions.new_secret(),
                               sessions.new_secret() + sessions.new_secret())
        try:
            url = await provider.authorization_url(pending)
            secret = await db.in_thread(sessions.begin_login, db, pending,
                                        settings.login_ttl, time.time())
        except sessions.TooManySignIns:
            log.warning("sso: %d sign-ins under way, refusing more for now",
                        sessions.MAX_PENDING_LOGINS)
            return failed(ProviderError(503, "Too many sign-ins are under way on this "
                                        "ingress. Try again in a few minutes.",
                                        "too_many_sign_ins"), "Cannot sign in right now")
        except Exception as exc:  # the provider's (ProviderError) or the database's
            return failed(exc, "Cannot sign in right now")
        response = RedirectResponse(url, status_code=303, headers={"cache-control": "no-store"})
        _cookie(response, settings, LOGIN_COOKIE, secret, int(settings.login_ttl),
                CALLBACK_PATH)
        return response

    @app.get(CALLBACK_PATH, include_in_schema=False)
    async def callback(request: Request) -> Response:
        params = request.query_params
        secret = cookie_value(request.headers.get("cookie"), LOGIN_COOKIE)
        try:
            pending = None if secret is None else await db.in_thread(
                sessions.take_login, db, secret, time.time())
        except Exception as exc:  # the database's
            return failed(exc, "Sign-in failed")
        if pending is None:
            return failed(ProviderError(
                400, "No sign-in is under way in this browser (it finished already, took "
                "more than 10 minutes, or was started in another browser). Start again.",
                "no_sign_in"), "Sign-in failed")
        state = params.get("state") or ""
        if not hmac.compare_digest(state.encode(), pending.state.encode()):
            return failed(ProviderError(
                400, "The sign-in's state does not match the one this ingress sent (an "
                "altered or foreign link). Start again from the dashboard.", "state_mismatch"),
                "Sign-in failed")
        issuer = params.get("iss")
        if issuer is not None and issuer.rstrip("/") != settings.issuer:
            # RFC 9207: an answer from another provider (a mix-up attack) is refused.
            return failed(ProviderError(
                400, "The sign-in came back from another identity provider than this "
                "ingress's.", "issuer_mismatch"), "Sign-in failed")
        error = params.get("error")
        if error is not None:
            said = (params.get("error_description") or "")[:200]
            if error in _DECLINED:
                return failed(ProviderError(
                    403, f"The identity provider did not sign you in ({error}"
                    f"{': ' + said if said else ''}). You can sign in again, or use an API "
                    "key.", "sign_in_declined"), "Sign-in declined")
            return failed(ProviderError(
                502, f"The identity provider returned an error: {error[:100]}"
                f"{': ' + said if said else ''}.", "provider_error"), "Sign-in failed")
        code = params.get("code")
        if not code:
            return failed(ProviderError(400, "The identity provider sent no code back.",
                                        "no_code"), "Sign-in failed")
        try:
            claims = await provider.sign_in(code, pending)
            who = profile(claims, settings)
        except ProviderError as exc:
            return failed(exc, "Sign-in failed")
        except ValueError as exc:
            return failed(ProviderError(502, str(exc), "id_token_invalid"), "Sign-in failed")
        previous = cookie_value(request.headers.get("cookie"), SESSION_COOKIE)
        try:
            now = time.time()
            if previous is not None:  # a sign-in replaces this browser's session
                await db.in_thread(sessions.close_session, db, previous)
            user = await db.in_thread(users.record_sign_in, db, settings.issuer, who, now)
            secret, _ = await db.in_thread(sessions.open_session, db, user,
                                                 settings.session_ttl, now)
        except Exception as exc:  # the database's
            return failed(exc, "Sign-in failed")
        log.info("sso: %s signed in (user %s, team %s%s)", user.label(), user.id,
                 user.team or "none", ", admin" if user.admin else "")
        response = RedirectResponse("/ui#admin" if user.admin else "/ui#account",
                                    status_code=303, headers={"cache-control": "no-store"})
        _cookie(response, settings, SESSION_COOKIE, secret, int(settings.session_ttl), "/")
        _forget(response, settings, LOGIN_COOKIE, CALLBACK_PATH)
        return response

    @app.get(SESSION_PATH, include_in_schema=False)
    async def session_info(request: Request) -> Response:
        """The dashboard asks this on load: signed in or not; if so who, their team's keys
        (read only, no secrets) and the CSRF token for the calls it makes."""
        session = signed_in(request)
        headers = {"cache-control": "no-store"}
        if session is None:
            return JSONResponse({"object": "ui_session", "sso": True, "signed_in": False,
                                 "expired": session_expired(request)}, headers=headers)
        team_keys: list[dict[str, Any]] = []
        if session.user.team:
            keys = await db.in_thread(keystore.all_keys, db)
            now = time.time()
            team_keys = [{"id": k.id, "name": k.name, "owner": k.owner,
                          "status": k.status(now)} for k in keys if k.team == session.user.team]
        return JSONResponse({"object": "ui_session", "sso": True, "signed_in": True,
                             "user": session.user.to_dict(), "csrf": session.csrf,
                             "expires_at": session.expires_at, "team_keys": team_keys},
                            headers=headers)

    @app.post("/ui/logout", include_in_schema=False)
    async def logout(request: Request) -> Response:
        secret = cookie_value(request.headers.get("cookie"), SESSION_COOKIE)
        if secret is not None and signed_in(request) is not None:
            try:
                await db.in_thread(sessions.close_session, db, secret)
            except Exception as exc:  # the database's
                log.warning("sso: cannot end a session (%s: %s)", type(exc).__name__, exc)
                raise RequestError(503, "Cannot sign out now: this ingress cannot reach its "
                                   "database. Try again in a moment.",
                                   code="database_unavailable") from None
        response = JSONResponse({"object": "ui_session", "signed_in": False},
                                headers={"cache-control": "no-store"})
        _forget(response, settings, SESSION_COOKIE, "/")
        return response
