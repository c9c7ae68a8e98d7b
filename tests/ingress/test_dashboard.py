"""The dashboard's routes and files, in process: right types and security headers, no
unknown names served, every file the page references ships, and nothing points off-site
(issue 15: no CDN or internet at runtime). The browser tests are test_dashboard_chromium."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from fastapi import FastAPI

from ingress.dashboard import install
from ingress.dashboard.assets import CONTENT_TYPES, assets
from ingress.dashboard.routes import CSP
from otela.api.errors import install_error_handlers

STATIC = Path(__file__).resolve().parents[2] / "ingress" / "dashboard" / "static"
# The one absolute URL allowed: the SVG namespace, an identifier that is never fetched.
SVG_NS = "http://www.w3.org/2000/svg"


def app() -> FastAPI:
    api = FastAPI()
    install_error_handlers(api)  # as on a node: errors are OpenAI-shaped
    install(api)
    return api


def get(path: str) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app())
        async with httpx.AsyncClient(transport=transport, base_url="http://node") as client:
            return await client.get(path)

    return trio.run(go)


@pytest.mark.parametrize("path", ["/ui", "/ui/"])
def test_index_is_html_with_a_csp_that_allows_only_this_origin(path: str) -> None:
    response = get(path)
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert response.text.startswith("<!doctype html>")
    csp = response.headers["content-security-policy"]
    assert csp == CSP
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'none'"
    for name in ("script-src", "style-src", "img-src", "connect-src"):
        assert directives[name] == "'self'", name  # no other origin, no inline code
    assert directives["frame-ancestors"] == "'none'"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert response.headers["cache-control"] == "no-store"


@pytest.mark.parametrize(("name", "content_type"), [
    ("app.js", "text/javascript; charset=utf-8"),
    ("app.css", "text/css; charset=utf-8"),
    ("favicon.svg", "image/svg+xml"),
])
def test_assets_are_served_with_their_types_and_the_csp(name: str, content_type: str) -> None:
    response = get(f"/ui/static/{name}")
    assert response.status_code == 200
    assert response.headers["content-type"] == content_type
    assert response.headers["content-security-policy"] == CSP
    assert response.content == (STATIC / name).read_bytes()


@pytest.mark.parametrize("name", ["nope.js", "index.html", "..%2Fassets.py", "app.JS",
                                  "%2e%2e%2f%2e%2e%2fpyproject.toml"])
def test_unknown_assets_are_openai_style_404s(name: str) -> None:
    response = get(f"/ui/static/{name}")
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] in ("not_found", None)
    assert set(error) == {"message", "type", "param", "code"}


def test_only_known_types_from_the_static_folder_are_servable() -> None:
    shipped = {p.name for p in STATIC.iterdir() if p.suffix in CONTENT_TYPES}
    assert set(assets()) == shipped
    assert {"index.html", "app.js", "app.css"} <= shipped


class _References(HTMLParser):
    """Every URL the page loads: scripts, stylesheets, icons, images."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.ids: list[str] = []
        self.inline_scripts = 0
        self.style_attrs = 0
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values: dict[str, Any] = dict(attrs)
        if values.get("id"):
            self.ids.append(values["id"])
        if "style" in values:
            self.style_attrs += 1
        if any(name.startswith("on") for name in values):
            self.inline_scripts += 1  # an inline handler would be blocked by the CSP
        if tag == "script":
            if values.get("src"):
                self.urls.append(values["src"])
            else:
                self._in_script = True
        elif tag in ("link", "img", "source") and (values.get("href") or values.get("src")):
            self.urls.append(values.get("href") or values["src"])

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.inline_scripts += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False


def test_every_file_the_page_references_exists_and_is_served() -> None:
    page = _References()
    page.feed((STATIC / "index.html").read_text())
    assert page.urls, "the page references no files?"
    for url in page.urls:
        assert url.startswith("/ui/static/"), url
        assert (STATIC / url.removeprefix("/ui/static/")).is_file(), url
        assert get(url).status_code == 200, url
    assert page.inline_scripts == 0  # the CSP forbids inline script: it would not run
    assert page.style_attrs == 0  # nor inline style
    assert len(page.ids) == len(set(page.ids)), "duplicate element ids"


def test_every_element_the_script_looks_up_is_in_the_page() -> None:
    """app.js finds elements by id; a typo would only show as a broken view in a browser."""
    page = _References()
    page.feed((STATIC / "index.html").read_text())
    script = (STATIC / "app.js").read_text()
    looked_up = set(re.findall(r'\$\("([\w-]+)"\)', script))
    # Tabs and views are looked up as `tab-${name}` / `view-${name}`.
    tabs = re.search(r"const TABS = \[([^\]]*)\]", script)
    assert tabs is not None
    for name in re.findall(r'"(\w+)"', tabs.group(1)):
        looked_up |= {f"tab-{name}", f"view-{name}"}
    assert looked_up - set(page.ids) == set()


def _without_comments(name: str, text: str) -> str:
    if name.endswith(".html") or name.endswith(".svg"):
        return re.sub(r"<!--.*?-->", "", text, flags=re.S)
    if name.endswith(".css"):
        return re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    # JS: block comments, then line comments that start a line or follow code after
    # whitespace (so "https://" inside a string is not mistaken for a comment).
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"(^|\s)//[^\n]*", r"\1", text)


@pytest.mark.parametrize("name", sorted(assets()))
def test_no_external_urls_outside_comments(name: str) -> None:
    text = _without_comments(name, (STATIC / name).read_text())
    found = [u for u in re.findall(r"(?:https?:)?//[\w.-]+\.[a-z]{2,}[^\s\"'`)]*", text)
             if not u.startswith(SVG_NS)]
    assert found == [], f"{name} points off-site: {found}"
    assert not re.search(r"https?://", text.replace(SVG_NS, "")), name
    assert "@import" not in text and "url(" not in text.replace("url(#", "")


def test_the_comment_stripper_keeps_strings() -> None:
    """The check above must not pass because it removed a URL in a string."""
    code = 'const a = "https://cdn.example.com/x.js"; // https://fine.example\n'
    assert "cdn.example.com" in _without_comments("x.js", code)
    assert "fine.example" not in _without_comments("x.js", code)


def test_admin_usage_offers_every_grouping_of_the_api() -> None:
    from ingress.usage import GROUPS

    page = (STATIC / "index.html").read_text()
    select = page[page.index('id="admin-usage-by"'):]
    select = select[:select.index("</select>")]
    assert set(re.findall(r'<option value="(\w+)"', select)) == set(GROUPS)


def test_the_package_data_ships_every_asset() -> None:
    """A wheel holds only the data files pyproject names: a new asset type not listed there
    would work in a checkout and be missing once installed (checked by building a wheel
    once; this keeps the list in step)."""
    import fnmatch
    import tomllib

    pyproject = tomllib.loads((STATIC.parents[2] / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["*"]
    for name in assets():
        assert any(fnmatch.fnmatch(name, p) for p in patterns), name
