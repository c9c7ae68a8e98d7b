"""OpenAI-style error bodies, so every client library reports otela's errors properly.

Shape: ``{"error": {"message", "type", "param", "code"}}`` with the matching HTTP status.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from otela.dataplane.jsonbody import BodyError, parse_json_object

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "upstream_timeout",
}


class APIError(Exception):
    """Raise anywhere in a handler to answer with an OpenAI-style error."""

    def __init__(
        self, status: int, message: str, *, code: str | None = None, param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param


def error_body(
    status: int, message: str, *, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": _TYPE_BY_STATUS.get(status, "server_error" if status >= 500 else "api_error"),
            "param": param,
            "code": code,
        }
    }


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

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.message, code=exc.code, param=exc.param)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(400, f"invalid request: {exc.errors()}", code="invalid_request")

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        return error_response(500, f"internal error: {type(exc).__name__}", code="internal_error")


def clip(text: str, limit: int = 200) -> str:
    """``text`` cut to ``limit`` characters: errors never echo unbounded input back."""
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


async def read_json_object(request: Request) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 that says what is wrong with it."""
    try:
        return parse_json_object(await request.body())
    except BodyError as exc:
        raise APIError(400, str(exc), code=exc.code, param=exc.param) from None


def require_model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise APIError(400, "'model' is required and must be a string", param="model")
    return model
