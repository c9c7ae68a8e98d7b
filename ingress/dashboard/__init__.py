"""The ingress dashboard at ``/ui``: a static page (vanilla JS, no external origin) that
reads the node's own API from the browser — the federation's models and nodes, a key
holder's usage and chat playground, and the admin's keys and usage.

Nothing here computes anything: the page is a client of the public API, so what it shows
is exactly what an OpenAI client or ``curl`` would get (``routes.install`` serves it)."""

from ingress.dashboard.routes import install

__all__ = ["install"]
