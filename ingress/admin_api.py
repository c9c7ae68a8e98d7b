"""The ingress service's HTTP API (on the node's FastAPI app, off the request path).

Key holders (``Authorization: Bearer <API key>``):
- ``GET /v1/me``: their key's settings and the tokens it has used;
- ``GET /v1/me/usage?since&until&bucket``: their usage over time (the dashboard's chart).

Admins (``Authorization: Bearer <admin token>``, ``OTELA_ADMIN_TOKEN``):
- ``GET /v1/admin/keys``, ``POST /v1/admin/keys`` (the secret is in the answer, once),
  ``GET /v1/admin/keys/{id}``, ``PATCH /v1/admin/keys/{id}`` (change settings, checked
  as at creation), ``POST /v1/admin/keys/{id}/revoke`` (or ``DELETE``),
  ``POST /v1/admin/keys/{id}/rotate``, ``GET /v1/admin/keys/{id}/history`` (who changed
  what, when);
- ``GET /v1/admin/usage?since&until&by=key|model|provider|node|ingress|status``.

Every error is an OpenAI-style JSON error; nothing is written unless the whole request was
valid. A wrong admin token and a missing one get the same 401.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI, Request

from ingress import admin_input, keystore, usage
from ingress.keys import ApiKey, bearer, same_secret
from ingress.keystore import KeyNotFound, KeyRevoked
from ingress.service import IngressService
from ingress.sso.gate import signed_in
from otela.api.errors import read_json_object
from otela.dataplane.errors import RequestError

_ADMIN_UNAUTHORIZED = "Invalid admin token. Pass it as 'Authorization: Bearer <token>'."


def _admin(service: IngressService, request: Request) -> None:
    session = signed_in(request)  # the dashboard's single sign-on (ingress.sso.gate)
    if session is not None:
        if session.user.admin:
            return
        raise RequestError(403, "You are signed in to the dashboard, but not as an admin "
                           "(the identity provider does not put you in an admin group).",
                           code="admin_only")
    if service.admin_token is None:
        raise RequestError(403, "The admin API is off on this ingress (set "
                           "OTELA_ADMIN_TOKEN to turn it on).", code="admin_api_disabled")
    token = bearer(request.headers.get("authorization", "").encode("latin-1"))
    if token is None or not same_secret(token.decode("latin-1"), service.admin_token):
        raise RequestError(401, _ADMIN_UNAUTHORIZED, code="invalid_admin_token")


def _not_found() -> RequestError:
    return RequestError(404, "No such API key.", code="key_not_found", param="id")


def _revoked(doing: str) -> RequestError:
    return RequestError(409, f"This API key is revoked, for good: it cannot be {doing}. "
                        "Create a new key instead.", code="key_revoked", param="id")


def _actor(service: IngressService, request: Request) -> str:
    """Who made a change through the admin API, for the key's history: the admin token is
    one shared secret, so the history says where it came from and through which node."""
    client = request.client.host if request.client is not None else "unknown"
    session = signed_in(request)
    if session is not None:
        return f"{session.user.label()} ({session.user.id}, signed in) from {client} via " \
            f"{service.ingress_id}"
    return f"admin API from {client} via {service.ingress_id}"


def _teams(db: Any) -> list[dict[str, Any]]:
    weights = keystore.team_weights(db)
    named = {k.team for k in keystore.all_keys(db) if k.team}
    return [{"object": "team", "name": name, "weight": weights.get(name, 1.0),
             "keys": sum(1 for k in keystore.all_keys(db) if k.team == name)}
            for name in sorted(named | set(weights))]


def install(app: FastAPI, service: IngressService) -> None:
    db = service.db

    async def key_object(key: ApiKey) -> dict[str, Any]:
        used = await db.in_thread(keystore.used_tokens, db, [key.id])
        return key.to_dict(time.time(), used[key.id])

    def holder(request: Request) -> ApiKey:
        authorization = request.headers.get("authorization")
        key = service.access.authenticate(
            None if authorization is None else authorization.encode("latin-1"))
        assert key is not None
        return key

    @app.get("/v1/me")
    async def me(request: Request) -> dict[str, Any]:
        return await key_object(holder(request))

    @app.get("/v1/me/usage")
    async def my_usage(request: Request, since: str | None = None, until: str | None = None,
                       bucket: str | None = None) -> dict[str, Any]:
        key = holder(request)
        now = time.time()
        end = admin_input.time_param(until, "until") or now
        start = admin_input.time_param(since, "since") or end - 86400
        if start >= end:
            raise RequestError(400, "'since' must be before 'until'", param="since")
        step = admin_input.bucket_seconds(bucket, start, end)
        rows = await db.in_thread(usage.buckets, db, start, end, step, key.id)
        totals = await db.in_thread(usage.aggregate, db, "key", start, end, key.id)
        total = totals[0].to_dict() if totals else {
            "requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "errors": 0}
        total.pop("group", None)
        return {"object": "usage", "since": start, "until": end, "bucket": step,
                "buckets": rows, "totals": total}

    @app.get("/v1/admin/keys")
    async def list_keys(request: Request) -> dict[str, Any]:
        _admin(service, request)
        keys = await db.in_thread(keystore.all_keys, db)
        used = await db.in_thread(keystore.used_tokens, db, [k.id for k in keys])
        now = time.time()
        return {"object": "list", "data": [k.to_dict(now, used[k.id]) for k in keys]}

    @app.post("/v1/admin/keys")
    async def create_key(request: Request) -> dict[str, Any]:
        _admin(service, request)
        spec = admin_input.key_spec(await read_json_object(request))
        key, secret = await db.in_thread(keystore.create, db, spec, None,
                                         _actor(service, request))
        service.access.remember([key])
        return {**key.to_dict(time.time(), 0), "key": secret}

    async def on_key(request: Request, key_id: str, change: Any, *args: Any,
                     doing: str = "changed") -> Any:
        """``change(db, key_id, *args)`` for an admin, in a worker thread; 404 for no such
        key, 409 for a revoked one."""
        _admin(service, request)
        try:
            return await db.in_thread(change, db, admin_input.key_id(key_id), *args)
        except KeyNotFound:
            raise _not_found() from None
        except KeyRevoked:
            raise _revoked(doing) from None

    @app.get("/v1/admin/keys/{key_id}")
    async def show_key(request: Request, key_id: str) -> dict[str, Any]:
        return await key_object(await on_key(request, key_id, keystore.get))

    @app.patch("/v1/admin/keys/{key_id}")
    async def update_key(request: Request, key_id: str) -> dict[str, Any]:
        """Change a key's settings: the fields of creation, checked the same way; ``null``
        puts one back to its default. Its id, secret and usage stay."""
        _admin(service, request)
        change = admin_input.key_change(await read_json_object(request))
        key = await on_key(request, key_id, keystore.update, change, None,
                           _actor(service, request))
        service.access.remember([key])
        return await key_object(key)

    @app.get("/v1/admin/keys/{key_id}/history")
    async def key_history(request: Request, key_id: str) -> dict[str, Any]:
        changes = await on_key(request, key_id, keystore.history)
        return {"object": "list", "data": [c.to_dict() for c in changes]}

    async def revoke(request: Request, key_id: str) -> dict[str, Any]:
        key = await on_key(request, key_id, keystore.revoke, None, _actor(service, request))
        service.access.remember([key])
        return await key_object(key)

    app.post("/v1/admin/keys/{key_id}/revoke")(revoke)
    app.delete("/v1/admin/keys/{key_id}")(revoke)

    @app.get("/v1/admin/teams")
    async def list_teams(request: Request) -> dict[str, Any]:
        """Every team with a weight, and every team keys name (weight 1 unless set)."""
        _admin(service, request)
        return {"object": "list", "data": await db.in_thread(_teams, db)}

    @app.put("/v1/admin/teams/{team}")
    async def set_team(request: Request, team: str) -> dict[str, Any]:
        """A team's weight in fair sharing: ``{"weight": 3}``."""
        _admin(service, request)
        name, weight = admin_input.team_weight(team, await read_json_object(request))
        await db.in_thread(keystore.set_team_weight, db, name, weight)
        return {"object": "team", "name": name, "weight": weight}

    @app.post("/v1/admin/keys/{key_id}/rotate")
    async def rotate(request: Request, key_id: str) -> dict[str, Any]:
        key, secret = await on_key(request, key_id, keystore.rotate, None,
                                   _actor(service, request), doing="rotated")
        service.access.remember([key])
        return {**(await key_object(key)), "key": secret}

    @app.get("/v1/admin/usage")
    async def usage_report(request: Request, since: str | None = None,
                           until: str | None = None, by: str | None = None
                           ) -> dict[str, Any]:
        _admin(service, request)
        group = admin_input.group_by(by)
        start = admin_input.time_param(since, "since")
        end = admin_input.time_param(until, "until")
        if start is not None and end is not None and start >= end:
            raise RequestError(400, "'since' must be before 'until'", param="since")
        rows = await db.in_thread(usage.aggregate, db, group, start, end)
        return {"object": "list", "by": group, "since": start, "until": end,
                "data": [r.to_dict() for r in rows]}
