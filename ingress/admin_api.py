"""The ingress service's HTTP API (on the node's FastAPI app, off the request path).

Key holders (``Authorization: Bearer <API key>``):
- ``GET /v1/me``: their key's settings, the tokens it has used, and its user;
- ``GET /v1/me/usage?since&until&bucket``: their usage over time (the dashboard's chart).

Admins (``Authorization: Bearer <admin token>``, ``OTELA_ADMIN_TOKEN``):
- ``GET /v1/admin/keys``, ``POST /v1/admin/keys`` (the secret is in the answer, once),
  ``GET /v1/admin/keys/{id}``, ``PATCH /v1/admin/keys/{id}`` (change settings, checked
  as at creation), ``POST /v1/admin/keys/{id}/revoke`` (or ``DELETE``),
  ``POST /v1/admin/keys/{id}/rotate``, ``GET /v1/admin/keys/{id}/history`` (who changed
  what, when);
- ``GET /v1/admin/usage?since&until&by=key|team|user|owner|model|provider|node|ingress|``
  ``status`` and filters (``key``, ``team``, ``user``: an id or an email, ``model``,
  ``provider``, ``node``, ``ingress``, ``status``): requests, tokens, errors, latency and
  spend per group;
- ``GET /v1/admin/requests`` (and ``GET /v1/me/requests``, a key holder's own): the
  request log, newest first, with the same window and filters, paged (``limit``,
  ``after``) or exported whole (``format=csv`` or ``jsonl``);
- ``GET /v1/admin/prices``, ``PUT /v1/admin/prices`` (a model's price per million tokens,
  for one provider or all), ``DELETE /v1/admin/prices?model&provider``.

Every error is an OpenAI-style JSON error; nothing is written unless the whole request was
valid. A wrong admin token and a missing one get the same 401.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ingress import admin_input, export, keystore, prices, usage
from ingress.keys import ApiKey, bearer, same_secret
from ingress.keystore import KeyNotFound, KeyRevoked, UserNotFound
from ingress.paging import limit_of, list_object
from ingress.service import IngressService
from ingress.sso.gate import signed_in
from ingress.standing import described
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


def _no_user(exc: UserNotFound) -> RequestError:
    return RequestError(400, str(exc)[0].upper() + str(exc)[1:] + ".",
                        code="user_ambiguous" if exc.ambiguous else "user_not_found",
                        param="user")


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
    known = keystore.teams(db)
    keys = keystore.all_keys(db)
    named = {k.team for k in keys if k.team}
    return [{**known.get(name, keystore.Team(name)).to_dict(),
             "keys": sum(1 for k in keys if k.team == name)}
            for name in sorted(named | set(known))]


def install(app: FastAPI, service: IngressService) -> None:
    db = service.db

    async def key_object(key: ApiKey) -> dict[str, Any]:
        found: list[dict[str, Any]] = await db.in_thread(described, db, [key], time.time())
        return found[0]

    async def by_user_id(filters: dict[str, Any]) -> dict[str, Any]:
        """Usage filters with a user named by email taken to the user's id (400 for
        none)."""
        if "user" not in filters:
            return filters
        try:
            return {**filters, "user": await db.in_thread(keystore.user_id_of, db,
                                                          filters["user"])}
        except UserNotFound as exc:
            raise _no_user(exc) from None

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
        return {"object": "list", "data": await db.in_thread(described, db, keys, time.time())}

    @app.post("/v1/admin/keys")
    async def create_key(request: Request) -> dict[str, Any]:
        _admin(service, request)
        spec = admin_input.key_spec(await read_json_object(request))
        try:
            key, secret = await db.in_thread(keystore.create, db, spec, None,
                                             _actor(service, request))
        except UserNotFound as exc:
            raise _no_user(exc) from None
        await service.changed_keys([key])
        return {**(await key_object(key)), "key": secret}

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
        except UserNotFound as exc:
            raise _no_user(exc) from None

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
        await service.changed_keys([key])
        return await key_object(key)

    @app.get("/v1/admin/keys/{key_id}/history")
    async def key_history(request: Request, key_id: str) -> dict[str, Any]:
        changes = await on_key(request, key_id, keystore.history)
        return {"object": "list", "data": [c.to_dict() for c in changes]}

    async def revoke(request: Request, key_id: str) -> dict[str, Any]:
        key = await on_key(request, key_id, keystore.revoke, None, _actor(service, request))
        await service.changed_keys([key])
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
        """A team's weight in fair sharing and its budget: ``{"weight": 3,
        "budget_spend": 100, "budget_period": "month"}`` (fields given change; null puts
        one back to its default)."""
        _admin(service, request)
        name, change = admin_input.team_change(team, await read_json_object(request))
        result: keystore.Team = await db.in_thread(keystore.set_team, db, name, change)
        await service.changed_settings()  # here at once, other ingress nodes within 1 s
        return result.to_dict()

    @app.post("/v1/admin/keys/{key_id}/rotate")
    async def rotate(request: Request, key_id: str) -> dict[str, Any]:
        key, secret = await on_key(request, key_id, keystore.rotate, None,
                                   _actor(service, request), doing="rotated")
        await service.changed_keys([key])
        return {**(await key_object(key)), "key": secret}

    @app.get("/v1/admin/usage")
    async def usage_report(request: Request, since: str | None = None,
                           until: str | None = None, by: str | None = None
                           ) -> dict[str, Any]:
        """Usage per group (``by``), in a window, of the rows the filters keep."""
        _admin(service, request)
        group = admin_input.group_by(by)
        start, end = admin_input.window(since, until)
        filters = await by_user_id(admin_input.usage_filters(request.query_params))
        rows = await db.in_thread(usage.aggregate, db, group, start, end, None, filters)
        return {"object": "list", "by": group, "since": start, "until": end,
                "filters": filters, "data": [r.to_dict() for r in rows]}

    async def request_log(request: Request, key_id: str | None) -> Response:
        """A page of the request log (``format=json``: ``limit``, ``after``), or all of
        it as a file (``csv``, ``jsonl``), streamed a page at a time."""
        query = request.query_params
        start, end = admin_input.window(query.get("since"), query.get("until"))
        filters = await by_user_id(admin_input.usage_filters(query))
        fmt = admin_input.export_format(query.get("format"))
        if fmt == "json":
            try:
                limit = limit_of(query.get("limit"), 100, 1000)
                entries, more = await db.in_thread(
                    usage.request_log, db, start, end, key_id, filters, limit,
                    query.get("after") or None)
            except ValueError as exc:
                param = "limit" if "limit" in str(exc) else "after"
                raise RequestError(400, str(exc), param=param) from None
            return JSONResponse(list_object(entries, more))

        async def pages() -> AsyncIterator[bytes]:
            after: str | None = None
            while True:
                entries, more = await db.in_thread(
                    usage.request_log, db, start, end, key_id, filters, export.PAGE, after)
                yield export.render(entries, fmt, header=after is None)
                if not more or not entries:
                    return
                after = entries[-1]["id"]

        name = f"requests.{fmt}"
        return StreamingResponse(pages(), media_type=export.CONTENT_TYPES[fmt], headers={
            "content-disposition": f'attachment; filename="{name}"'})

    @app.get("/v1/admin/requests")
    async def admin_requests(request: Request) -> Response:
        """The request log of every key (filters: key, team, user, model, provider, node,
        ingress, status; a window; ``format``)."""
        _admin(service, request)
        return await request_log(request, None)

    @app.get("/v1/me/requests")
    async def my_requests(request: Request) -> Response:
        """The request log of the caller's own key."""
        return await request_log(request, holder(request).id)

    @app.get("/v1/admin/prices")
    async def list_prices(request: Request) -> dict[str, Any]:
        _admin(service, request)
        found = await db.in_thread(prices.all_prices, db)
        return {"object": "list", "data": [p.to_dict() for p in found]}

    @app.put("/v1/admin/prices")
    async def set_price(request: Request) -> dict[str, Any]:
        """Set a model's price per million prompt and completion tokens, for one provider
        or (``provider`` null) every provider without its own; usage rows made from now on
        are priced with it (within a refresh interval on every ingress)."""
        _admin(service, request)
        price = admin_input.price(await read_json_object(request))
        stamped = await db.in_thread(prices.set_price, db, price)
        await service.changed_settings()  # here and on the node's workers: at once
        return stamped.to_dict()

    @app.delete("/v1/admin/prices")
    async def remove_price(request: Request, model: str = "",
                           provider: str | None = None) -> dict[str, Any]:
        _admin(service, request)
        if not model:
            raise RequestError(400, "'model' is required", param="model")
        if not await db.in_thread(prices.remove_price, db, model, provider):
            raise RequestError(404, "No price is set for this model and provider.",
                               code="price_not_found", param="model")
        await service.changed_settings()
        return {"object": "price", "model": model, "provider": provider or None,
                "deleted": True}
