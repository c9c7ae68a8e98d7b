"""``GET /ui`` and ``GET /ui/static/<name>`` on the node's API app (ingress nodes only).

Served by plain routes rather than starlette's ``StaticFiles`` so that every answer carries
the same security headers, the content types are fixed, and an unknown name gets the
API's OpenAI-style 404 instead of a bare HTML page.
"""

from __future__ import annotations

from fastapi import FastAPI, Response

from ingress.dashboard.assets import INDEX, Asset, asset
from otela.dataplane.errors import RequestError, clip

# Everything from this origin, nothing from anywhere else: no CDN, no inline script or
# style (the page sets none), no framing by other sites, and fetch() only to this node.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")
SECURITY_HEADERS = {
    "content-security-policy": CSP,
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "x-frame-options": "DENY",
    # Never reuse a cached copy (the files are small): an upgraded node must not pair new
    # HTML with an old script. No ETag/304: otela's HTTP server gives every response
    # without a body a ``content-length: 0``, which a 304 must not carry.
    "cache-control": "no-store",
}


def _serve(item: Asset) -> Response:
    return Response(item.body, media_type=item.content_type, headers=SECURITY_HEADERS)


def install(app: FastAPI) -> None:
    """Add the dashboard's routes to ``app`` (the node's API)."""

    @app.get("/ui", include_in_schema=False)
    @app.get("/ui/", include_in_schema=False)
    async def index() -> Response:
        item = asset(INDEX)
        if item is None:  # a broken install, not a client error
            raise RequestError(500, "the dashboard's files are missing from this install",
                               code="internal_error")
        return _serve(item)

    @app.get("/ui/static/{name}", include_in_schema=False)
    async def static(name: str) -> Response:
        item = asset(name) if name != INDEX else None
        if item is None:
            raise RequestError(404, f"no dashboard asset named {clip(name)!r}",
                               code="not_found", param="name")
        return _serve(item)
