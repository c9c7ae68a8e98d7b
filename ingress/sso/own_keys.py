"""A signed-in user's own API keys: ``GET /ui/keys``, ``POST /ui/keys``,
``POST /ui/keys/{id}/revoke`` (installed with the other single sign-on routes).

What a user may do without being an admin, and why:

- **List** the keys that belong to them (``api_keys.user_id``; made by an admin with
  ``--user``, or by themselves), with their standing and never a secret: always.
- **Revoke** one of them: always. Revoking only takes access away, and someone who fears
  a key leaked must not have to find an admin first.
- **Create** one: only where the operator turned it on (``sso_user_keys``). Such a key
  belongs to the user, is named after them (``owner``: their email) and is in their team
  as the provider's claims put them at their last sign-in, so the team's limits, budgets,
  models, providers and priority hold it; it sets nothing of its own but a name and an
  expiry (its own limits are an admin's to set). A user in no team cannot make one:
  nothing would bound it. At most ``MAX_LIVE_KEYS`` live keys each.

Everything else about keys (limits, budgets, other people's keys, rotation) stays with
the admin API. Every change is in the key's history under the user's email and id, as an
admin's is. A request judged by an ``Authorization`` header never gets here as a user
(``ingress.sso.gate``): an API key cannot manage keys.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from fastapi import FastAPI, Request

from ingress import admin_input, keystore
from ingress.database import Database
from ingress.keys import ApiKey
from ingress.keystore import KeyNotFound, KeySpec
from ingress.sso.gate import OWN_KEYS_PATH, signed_in
from ingress.sso.sessions import Session
from ingress.sso.settings import SsoSettings
from ingress.standing import described
from otela.api.errors import read_json_object
from otela.dataplane.errors import RequestError

MAX_LIVE_KEYS = 10  # a user's keys neither revoked nor expired, at most (self-made)
_FIELDS = ("name", "expires_in", "expires_at")  # what a user sets on a key of their own


def _session(request: Request) -> Session:
    session = signed_in(request)
    if session is None:
        raise RequestError(401, "Sign in to the dashboard with single sign-on to manage "
                           "your keys (an API key cannot).", code="not_signed_in")
    return session


def _actor(session: Session, request: Request, ingress_id: str) -> str:
    client = request.client.host if request.client is not None else "unknown"
    return (f"{session.user.label()} ({session.user.id}, signed in, own key) from {client} "
            f"via {ingress_id}")


def own_key_spec(session: Session, body: dict[str, Any], now: float) -> KeySpec:
    """The key a user may make for themselves from ``body`` (``name``, ``expires_in`` or
    ``expires_at``); 400 for anything else, 403 for a user in no team."""
    other = sorted(set(body) - set(_FIELDS))
    if other:
        raise RequestError(400, f"'{other[0][:40]}' of a key is set by an admin; a key of "
                           f"your own takes {', '.join(_FIELDS)}.", code="invalid_request",
                           param=other[0][:40])
    user = session.user
    if not user.team:
        raise RequestError(403, "You are in no team, so a key of your own would have no "
                           "limits or budget: ask an admin for a key.", code="no_team")
    checked = admin_input.key_spec({**body, "owner": user.label()}, now)
    return KeySpec(owner=checked.owner, name=checked.name, expires_at=checked.expires_at,
                   team=user.team, user_id=user.id)


def install(app: FastAPI, db: Database, settings: SsoSettings, ingress_id: str,
            remember: Callable[[list[ApiKey]], Awaitable[None]]) -> None:
    """Add the routes; ``remember`` takes a changed key into this node's key cache, its
    data-path workers' included (the other ingress nodes see it within their refresh
    interval)."""

    creating = trio.Lock()

    async def listing(user_id: str) -> list[dict[str, Any]]:
        keys = await db.in_thread(keystore.keys_of_user, db, user_id)
        found: list[dict[str, Any]] = await db.in_thread(described, db, keys, time.time())
        return found

    @app.get(OWN_KEYS_PATH, include_in_schema=False)
    async def my_keys(request: Request) -> dict[str, Any]:
        """The signed-in user's keys, oldest first, and whether they may make one."""
        session = _session(request)
        return {"object": "list", "data": await listing(session.user.id),
                "can_create": settings.user_keys and bool(session.user.team),
                "max_live_keys": MAX_LIVE_KEYS}

    @app.post(OWN_KEYS_PATH, include_in_schema=False)
    async def create_my_key(request: Request) -> dict[str, Any]:
        session = _session(request)
        if not settings.user_keys:
            raise RequestError(403, "On this ingress an admin makes the keys (sso_user_keys "
                               "is off).", code="user_keys_disabled")
        now = time.time()
        spec = own_key_spec(session, await read_json_object(request), now)
        # Counted and made under one lock: two creates at once on this ingress cannot
        # both pass the count (two ingresses at once could: one key over, at most).
        async with creating:
            live = [k for k in await db.in_thread(keystore.keys_of_user, db,
                                                  session.user.id) if k.usable(now)]
            if len(live) >= MAX_LIVE_KEYS:
                raise RequestError(403, f"You have {len(live)} live keys, the most a user "
                                   "may have: revoke one first.", code="too_many_keys")
            key, secret = await db.in_thread(keystore.create, db, spec, now,
                                             _actor(session, request, ingress_id))
        await remember([key])
        found: list[dict[str, Any]] = await db.in_thread(described, db, [key], now)
        return {**found[0], "key": secret}

    @app.post(OWN_KEYS_PATH + "/{key_id}/revoke", include_in_schema=False)
    async def revoke_my_key(request: Request, key_id: str) -> dict[str, Any]:
        """Revoke a key of one's own; another's is "no such key", as an unknown one is
        (a user learns nothing of other people's keys)."""
        session = _session(request)
        admin_input.key_id(key_id)
        try:
            key = await db.in_thread(keystore.get, db, key_id)
        except KeyNotFound:
            key = None
        if key is None or key.user_id != session.user.id:
            raise RequestError(404, "No such API key among yours.", code="key_not_found",
                               param="id")
        revoked = await db.in_thread(keystore.revoke, db, key_id, None,
                                     _actor(session, request, ingress_id))
        await remember([revoked])
        found: list[dict[str, Any]] = await db.in_thread(described, db, [revoked],
                                                         time.time())
        return found[0]
