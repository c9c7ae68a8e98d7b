"""The dashboard's static files, read once from the package and kept in memory.

Read through ``importlib.resources`` so they are found in an installed wheel as well as in
a checkout; only files that ship in ``static/`` with a known type can ever be served, so a
request can name nothing else (no path is built from request input)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

# Types are set explicitly (never guessed from the system's mime database, which varies
# between hosts and would make ``nosniff`` refuse a script served as text/plain).
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
INDEX = "index.html"


@dataclass(frozen=True)
class Asset:
    name: str
    body: bytes
    content_type: str


@cache
def assets() -> dict[str, Asset]:
    """Every servable file under ``static/``, by file name."""
    out: dict[str, Asset] = {}
    for entry in resources.files(__package__).joinpath("static").iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1] if "." in entry.name else ""
        if not entry.is_file() or suffix not in CONTENT_TYPES:
            continue
        out[entry.name] = Asset(entry.name, entry.read_bytes(), CONTENT_TYPES[suffix])
    return out


def asset(name: str) -> Asset | None:
    return assets().get(name)
