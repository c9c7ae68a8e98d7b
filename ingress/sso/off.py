"""``GET /ui/session`` on an ingress without single sign-on: the dashboard asks it on every
load, and is told there is none (rather than getting a 404 that a browser logs as an
error)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI


def install(app: FastAPI) -> None:
    @app.get("/ui/session", include_in_schema=False)
    async def no_sso() -> dict[str, Any]:
        return {"object": "ui_session", "sso": False, "signed_in": False}
