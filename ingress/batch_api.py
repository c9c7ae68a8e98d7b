"""The OpenAI Files and Batch APIs on the node's API app (``docs/scheduling.md``):

- ``POST /v1/files`` (a multipart upload, ``purpose=batch``, JSONL), ``GET /v1/files``,
  ``GET /v1/files/{id}``, ``GET /v1/files/{id}/content``, ``DELETE /v1/files/{id}``;
- ``POST /v1/batches``, ``GET /v1/batches`` (``after``/``limit``), ``GET
  /v1/batches/{id}``, ``POST /v1/batches/{id}/cancel``.

Callers authenticate with their API key, as on the OpenAI routes; a key sees only its own
files and batches (another's is a 404, as one that does not exist). Every error is an
OpenAI-style JSON error with its HTTP status; nothing is written unless the request was
valid. The work is done by the batch runner (``ingress.batch_runner``); this module only
records what was asked.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request, Response

from ingress import batch_store, batches, files, paging
from ingress.keys import ApiKey
from ingress.multipart import FormError, parse_form
from ingress.service import IngressService
from otela.api.errors import read_json_object
from otela.dataplane.errors import RequestError, clip

_FORM_OVERHEAD = 64 * 1024  # a form's bytes besides the file: boundaries, headers, purpose
_MAX_FILENAME = 255


def _file_not_found(file_id: str, param: str | None = None) -> RequestError:
    return RequestError(404, f"No such file: {clip(file_id, 64)!r}.", code="not_found",
                        param=param)


def _batch_not_found(batch_id: str) -> RequestError:
    return RequestError(404, f"No such batch: {clip(batch_id, 64)!r}.", code="not_found")


def _too_large(limit: int) -> RequestError:
    return RequestError(413, f"The file is larger than this ingress accepts ({limit} "
                        "bytes); split it into several batches.", code="file_too_large",
                        param="file")


def _text_of(raw: bytes) -> str:
    """An uploaded file as text: UTF-8 (JSONL is), without NUL characters (no JSON line
    holds one, and PostgreSQL's text refuses them)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RequestError(400, "The file is not UTF-8 text (a batch input file is JSONL).",
                           code="invalid_file", param="file") from None
    if "\x00" in text:
        raise RequestError(400, "The file holds NUL characters (a batch input file is "
                           "JSONL).", code="invalid_file", param="file")
    return text


def _string(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise RequestError(400, f"'{name}' is required and must be a string", param=name,
                           code="invalid_request")
    return value


def _limit(text: str | None) -> int:
    try:
        return paging.limit_of(text)
    except ValueError as exc:
        raise RequestError(400, str(exc), param="limit", code="invalid_request") from None


def install(app: FastAPI, service: IngressService) -> None:
    db = service.db
    runner = service.batches
    max_file = service.batch_max_file_bytes

    def holder(request: Request) -> ApiKey:
        """The caller's key: the same check as the OpenAI routes'. The Batch API needs a
        key even on an ``--open`` ingress (a batch belongs to a key)."""
        authorization = request.headers.get("authorization")
        key = service.authenticate(
            None if authorization is None else authorization.encode("latin-1"))
        if key is None:
            raise RequestError(401, "The Batch API needs an API key: pass it as "
                               "'Authorization: Bearer <key>'.", code="invalid_api_key")
        return key

    # -- files -------------------------------------------------------------------------------

    @app.post("/v1/files")
    async def upload(request: Request) -> dict[str, Any]:
        key = holder(request)
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > max_file + _FORM_OVERHEAD:
            raise _too_large(max_file)
        body = await request.body()
        try:
            form = parse_form(body, request.headers.get("content-type"))
        except FormError as exc:
            raise RequestError(400, str(exc), code="invalid_request") from None
        purpose = form.get("purpose")
        purpose_text = purpose.content.decode("utf-8", "replace") if purpose else ""
        if purpose_text != files.UPLOAD_PURPOSE:
            raise RequestError(400, f"'purpose' must be {files.UPLOAD_PURPOSE!r} (the only "
                               f"purpose this ingress stores files for), not "
                               f"{clip(purpose_text, 40)!r}.", param="purpose",
                               code="invalid_purpose")
        upload = form.get("file")
        if upload is None:
            raise RequestError(400, "'file' is required (the JSONL input file).",
                               param="file", code="invalid_request")
        if len(upload.content) > max_file:
            raise _too_large(max_file)
        text = _text_of(upload.content)
        name = (upload.filename or "upload.jsonl")[:_MAX_FILENAME]
        made = await db.in_thread(files.create, db, key.id, name, text)
        return made.to_dict()

    async def page(key: ApiKey, after: str | None, limit: str | None,
                   anchor_of: Callable[..., Any], listed_after: Callable[..., Any],
                   not_found: Callable[[], RequestError]) -> dict[str, Any]:
        """One page of the key's files or batches, newest first, after the one named by
        ``after`` (404 when the key has no such one), as OpenAI's list objects."""
        count = _limit(limit)
        anchor = None
        if after:
            anchor = await db.in_thread(anchor_of, db, key.id, after)
            if anchor is None:
                raise not_found()
        found, more = await db.in_thread(listed_after, db, key.id, anchor, count)
        return paging.list_object([item.to_dict() for item in found], more)

    @app.get("/v1/files")
    async def list_files(request: Request, purpose: str | None = None,
                         after: str | None = None, limit: str | None = None
                         ) -> dict[str, Any]:
        return await page(
            holder(request), after, limit, files.anchor,
            lambda db, key_id, anchor, count: files.list_files(db, key_id, purpose, anchor,
                                                               count),
            lambda: _file_not_found(after or "", "after"))

    @app.get("/v1/files/{file_id}")
    async def show_file(request: Request, file_id: str) -> dict[str, Any]:
        key = holder(request)
        found = await db.in_thread(files.get, db, key.id, file_id)
        if found is None:
            raise _file_not_found(file_id)
        return found.to_dict()

    @app.get("/v1/files/{file_id}/content")
    async def file_content(request: Request, file_id: str) -> Response:
        key = holder(request)
        data = await db.in_thread(files.content, db, key.id, file_id)
        if data is None:
            raise _file_not_found(file_id)
        return Response(data, media_type="application/jsonl")

    @app.delete("/v1/files/{file_id}")
    async def delete_file(request: Request, file_id: str) -> dict[str, Any]:
        key = holder(request)
        if not await db.in_thread(files.delete, db, key.id, file_id):
            raise _file_not_found(file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    # -- batches -----------------------------------------------------------------------------

    @app.post("/v1/batches")
    async def create_batch(request: Request) -> dict[str, Any]:
        key = holder(request)
        body = await read_json_object(request)
        input_file_id = _string(body, "input_file_id")
        endpoint = _string(body, "endpoint")
        if endpoint not in batches.ENDPOINTS:
            raise RequestError(400, f"'endpoint' must be one of {', '.join(batches.ENDPOINTS)}",
                               param="endpoint", code="invalid_request")
        window = _string(body, "completion_window")
        if window not in batches.COMPLETION_WINDOWS:
            raise RequestError(400, "'completion_window' must be \"24h\"",
                               param="completion_window", code="invalid_request")
        try:
            metadata = batches.metadata_of(body.get("metadata"))
        except ValueError as exc:
            raise RequestError(400, str(exc), param="metadata", code="invalid_request") \
                from None
        source = await db.in_thread(files.get, db, key.id, input_file_id)
        if source is None:
            raise _file_not_found(input_file_id, "input_file_id")
        if source.purpose != files.UPLOAD_PURPOSE:
            raise RequestError(400, f"The input file must have purpose "
                               f"{files.UPLOAD_PURPOSE!r}, not {source.purpose!r}.",
                               param="input_file_id", code="invalid_request")
        made = await db.in_thread(batch_store.create, db, key.id, endpoint, input_file_id,
                                  window, metadata, time.time())
        runner.wake()
        return made.to_dict()

    @app.get("/v1/batches")
    async def list_batches(request: Request, after: str | None = None,
                           limit: str | None = None) -> dict[str, Any]:
        return await page(holder(request), after, limit, batch_store.anchor,
                          batch_store.list_batches, lambda: _batch_not_found(after or ""))

    @app.get("/v1/batches/{batch_id}")
    async def show_batch(request: Request, batch_id: str) -> dict[str, Any]:
        key = holder(request)
        found = await db.in_thread(batch_store.get, db, key.id, batch_id)
        if found is None:
            raise _batch_not_found(batch_id)
        return found.to_dict()

    @app.post("/v1/batches/{batch_id}/cancel")
    async def cancel_batch(request: Request, batch_id: str) -> dict[str, Any]:
        key = holder(request)
        found = await db.in_thread(batch_store.request_cancel, db, key.id, batch_id,
                                   time.time())
        if found is None:
            raise _batch_not_found(batch_id)
        if found.status in (batches.COMPLETED, batches.FAILED, batches.EXPIRED):
            raise RequestError(409, f"This batch is {found.status}: it cannot be "
                               "cancelled.", code="batch_not_cancellable")
        runner.stop(batch_id)
        return found.to_dict()
