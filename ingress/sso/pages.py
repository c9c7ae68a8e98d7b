"""The small HTML page a browser is shown when a sign-in cannot go on.

A person who clicked "Sign in" and comes back from the provider is in a browser tab, not a
script: they get a page saying what went wrong and what to do next (the status and a
machine-readable ``code`` are in it too, for whoever reads the logs or automates it).
Everything shown is escaped; the page runs no script and carries the dashboard's headers.
"""

from __future__ import annotations

import html

from fastapi import Response

from ingress.dashboard.routes import SECURITY_HEADERS


def failure_page(status: int, title: str, message: str, code: str) -> Response:
    body = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>otela: {html.escape(title)}</title>
<link rel="stylesheet" href="/ui/static/app.css"></head>
<body><main id="sso-failure" data-code="{html.escape(code)}" data-status="{status}">
<h1>{html.escape(title)}</h1>
<p id="sso-message">{html.escape(message)}</p>
<p><a id="sso-retry" href="/ui/login">Sign in again</a> &middot;
<a href="/ui#account">Back to the dashboard (an API key works there too)</a></p>
<p><small>{status} &middot; {html.escape(code)}</small></p>
</main></body></html>
"""
    return Response(body, status_code=status, media_type="text/html; charset=utf-8",
                    headers=SECURITY_HEADERS)
