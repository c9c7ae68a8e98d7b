"""``/v1/assignments``: the node's assignment endpoint (``otela.assignments.acceptor``).

- ``GET``: whether this node takes assignments, from whom and for which engine names;
- ``POST {"envelope": "<base64>"}``: 202 with what the node starts, or an OpenAI-style
  error (400 malformed, 403 not opted in / unauthorised / forged / not allowed, 409 replayed
  or busy, 410 expired). Every node has the route, so one that did not opt in says so (403)
  instead of looking like an old node (404).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from otela.api.errors import read_json_object
from otela.assignments.acceptor import Acceptor

PATH = "/v1/assignments"


def install(app: FastAPI, acceptor: Acceptor) -> None:
    @app.get(PATH)
    async def assignment_policy() -> dict[str, Any]:
        return acceptor.describe()

    @app.post(PATH)
    async def assign(request: Request) -> JSONResponse:
        answer = acceptor.submit(await read_json_object(request))
        return JSONResponse(answer.body, status_code=answer.status)
