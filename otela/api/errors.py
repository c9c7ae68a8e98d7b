"""OpenAI-style error responses, so every client library reports otela's errors properly.

Shape: ``{"error": {"message", "type", "param", "code"}}`` with the matching HTTP status.
The request path raises protocol-neutral ``RequestError`` (``otela.dataplane.errors``);
the handlers installed here answer it, and every other failure, as such JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from otela.dataplane.errors import RequestError, error_body
from otela.dataplane.jsonbody import BodyError, parse_json_object


def error_response(
    status: int,
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(
        error_body(status, message, code=code, param=param), status_code=status, headers=headers
    )


def install_error_handlers(app: FastAPI) -> None:
    """Make every failure, including unexpected ones, an OpenAI-style JSON error."""

    @app.exception_handler(RequestError)
    async def _api_error(_: Request, exc: RequestError) -> JSONResponse:
        return error_response(exc.status, exc.message, code=exc.code, param=exc.param,
                              headers=exc.headers or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(400, f"invalid request: {exc.errors()}", code="invalid_request")

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        return error_response(500, f"internal error: {type(exc).__name__}", code="internal_error")


async def read_json_object(request: Request) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 that says what is wrong with it."""
    try:
        return parse_json_object(await request.body())
    except BodyError as exc:
        raise RequestError(400, str(exc), code=exc.code, param=exc.param) from None


def require_model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError(400, "'model' is required and must be a string", param="model")
    return model
