"""``POST /v1/load-reports``: where serving nodes send an ingress their load
(``otela.load.reports``). Members only (the engine hop's ``x-otela-hop`` token); 204 when
taken, else an OpenAI-style error. Every node has the route, so a node that is not an
ingress says so (403 ``not_an_ingress``) instead of looking like an old node (404)."""

from __future__ import annotations

from fastapi import FastAPI, Request, Response

from otela.dataplane.hop_auth import HOP_HEADER
from otela.load.reports import PATH, LoadReports


def install(app: FastAPI, reports: LoadReports) -> None:
    @app.post(PATH, status_code=204, include_in_schema=True)
    async def take_load_report(request: Request) -> Response:
        reports.take(request.headers.get(HOP_HEADER), await request.body())
        return Response(status_code=204)
