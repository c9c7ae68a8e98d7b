"""A ``multipart/form-data`` body (RFC 7578) read into its fields: what ``POST /v1/files``
receives from OpenAI's clients. Pure: no I/O.

The node's HTTP server has already read the whole body (within its size limit), so this
is a split on the boundary, not a streaming parser, and otela needs no multipart library
for one form with two fields.
"""

from __future__ import annotations

from dataclasses import dataclass
from email.message import Message


class FormError(ValueError):
    """Not a form otela can read (the message says why; the API answers 400)."""


@dataclass(frozen=True)
class Part:
    name: str
    filename: str | None
    content: bytes


def _params(value: str) -> tuple[str, dict[str, str]]:
    """A header's value and its parameters (quoted or not), as ``email`` reads them."""
    message = Message()
    message["content-type"] = value
    params = message.get_params() or []
    main = params[0][0].lower() if params else ""
    return main, {str(k).lower(): str(v) for k, v in params[1:]}


def boundary_of(content_type: str | None) -> bytes:
    """The boundary of a ``multipart/form-data`` content type; ``FormError`` otherwise."""
    if not content_type:
        raise FormError("expected a multipart/form-data body (no Content-Type)")
    kind, params = _params(content_type)
    if kind != "multipart/form-data":
        raise FormError(f"expected a multipart/form-data body, not {kind[:100]}")
    boundary = params.get("boundary", "")
    if not boundary or len(boundary) > 200:
        raise FormError("the multipart/form-data body has no boundary")
    return boundary.encode("latin-1")


def parse_form(body: bytes, content_type: str | None) -> dict[str, Part]:
    """Every field of the form, by name (a repeated name keeps its first part)."""
    delimiter = b"--" + boundary_of(content_type)
    sections = body.split(delimiter)
    if len(sections) < 3 or not sections[-1].startswith(b"--"):
        raise FormError("the multipart/form-data body is cut short (no closing boundary)")
    parts: dict[str, Part] = {}
    for section in sections[1:-1]:
        if not section.startswith(b"\r\n"):
            raise FormError("a part of the multipart/form-data body is malformed")
        head, separator, content = section[2:].partition(b"\r\n\r\n")
        if not separator or not content.endswith(b"\r\n"):
            raise FormError("a part of the multipart/form-data body is malformed")
        disposition = None
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-disposition":
                disposition = value.decode("utf-8", "replace").strip()
        if disposition is None:
            raise FormError("a part of the form has no Content-Disposition")
        kind, params = _params(disposition)
        field = params.get("name")
        if kind != "form-data" or not field:
            raise FormError("a part of the form has no name")
        if field not in parts:
            parts[field] = Part(field, params.get("filename"), content[:-2])
    return parts
