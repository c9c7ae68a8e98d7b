"""The dashboard in a real browser (the system's headless Chromium, driven by Selenium)
against a live local federation: an ingress node and a node serving the echo engine, each
its own OS process.

Without the ingress back end (no key database) the page must already work: it loads with
no console error, lists the federation's models and nodes, streams a chat from the echo
engine, and shows the API's errors when someone signs in. With it (``--ingress-db`` and
``OTELA_ADMIN_TOKEN``), an admin creates a key in the page, a chat streams with that key, and
after the admin revokes it the playground shows the 401.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from otela.testing.localfed import (
    LocalFederation,
    LocalNode,
    echo_engine_command,
    free_port,
    wait_for,
)

pytest.importorskip("selenium", reason="selenium is not installed")
from dashboard_browser import (
    WAIT,
    assert_streams,
    console_errors,
    create_key_in_page,
    key_action,
    model_row,
    open_page,
    send_chat,
    shown_error,
    sign_in_admin,
    sign_in_key,
    visible_text,
    wait,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import Select

pytestmark = pytest.mark.slow

MODEL = "echo-dashboard"
PROVIDER = "prov-echo"
TOKEN_DELAY = 0.25  # seconds per generated token: slow enough to watch the stream arrive
ADMIN_TOKEN = "dashboard-test-admin-token"


@functools.cache
def ingress_backend_available() -> bool:
    """Whether ``otela start`` runs the ingress service (``--ingress-db``, issue 15)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTELA_")}
    help_text = subprocess.run([sys.executable, "-m", "otela", "start", "--help"],
                               capture_output=True, text=True, timeout=60,
                               env={**env, "COLUMNS": "250", "NO_COLOR": "1"}).stdout
    return "--ingress-db" in help_text


# A string condition is evaluated when such a test is about to run, not at collection.
needs_backend = pytest.mark.skipif(
    "not ingress_backend_available()",
    reason="needs the ingress back end: `otela start` has no --ingress-db "
           "(API keys, /v1/me, /v1/admin/*)")


def wait_serving(observer: LocalNode, target: LocalNode) -> None:
    wait_for(lambda: observer.states().get(target.session_id) == "SERVING", 30,
             f"{observer.name} to see {target.name} SERVING")


def start_federation(root: Path, *ingress_args: str, env: dict[str, str] | None = None,
                     ) -> tuple[LocalFederation, LocalNode, LocalNode]:
    federation = LocalFederation(root)
    try:
        ingress = federation.start_node("ingress", ingress=True, extra_args=list(ingress_args),
                                        extra_env=env)
        engine = echo_engine_command(free_port(), [MODEL], "--token-delay", str(TOKEN_DELAY))
        server = federation.start_node("server", bootstrap=[ingress], process=engine,
                                       provider_id=PROVIDER)
        wait_serving(ingress, server)
    except BaseException:
        federation.close()
        raise
    return federation, ingress, server


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalNode, LocalNode]]:
    """Today's ingress: no key database, so the OpenAI routes need no key."""
    federation, ingress, server = start_federation(tmp_path_factory.mktemp("dash"))
    with federation:
        yield ingress, server


def test_ui_is_only_on_ingress_nodes(fed: tuple[LocalNode, LocalNode]) -> None:
    ingress, server = fed
    page = httpx.get(f"{ingress.http_url}/ui", timeout=5, trust_env=False)
    assert page.status_code == 200
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert httpx.get(f"{server.http_url}/ui", timeout=5, trust_env=False).status_code == 404


def test_page_loads_without_console_errors_and_lists_the_federation(
        browser: WebDriver, fed: tuple[LocalNode, LocalNode]) -> None:
    ingress, server = fed
    open_page(browser, ingress.http_url)
    row = model_row(browser, MODEL)
    wait(browser).until(lambda _: PROVIDER in row.text and "SERVING" in row.text)
    assert "echo" in row.text  # the engine
    assert "CPU only" in row.text  # the echo nodes have no GPU
    # Both nodes, with their roles, states and reachability.
    ingress_row = browser.find_element(
        By.CSS_SELECTOR, f'#nodes-body tr[data-session="{ingress.session_id}"]')
    server_row = browser.find_element(
        By.CSS_SELECTOR, f'#nodes-body tr[data-session="{server.session_id}"]')
    assert "ingress" in ingress_row.text and "this node" in ingress_row.text
    assert "engine: echo" in server_row.text and "SERVING" in server_row.text
    assert re.search(r"public|private-relayed|unreachable|unknown", server_row.text)
    assert "node " in browser.find_element(By.ID, "node-summary").text
    # It refreshes by itself: the "updated" stamp changes without any action.
    stamp = browser.find_element(By.ID, "fed-updated").text
    wait(browser, 15).until(lambda d: d.find_element(By.ID, "fed-updated").text != stamp)
    assert not browser.find_element(By.ID, "fed-error").is_displayed()
    assert console_errors(browser) == []


def test_page_fits_a_narrow_screen(browser: WebDriver, fed: tuple[LocalNode, LocalNode]
                                   ) -> None:
    ingress, _ = fed
    browser.set_window_size(375, 800)
    try:
        open_page(browser, ingress.http_url)
        model_row(browser, MODEL)
        overflow = browser.execute_script(
            "return document.documentElement.scrollWidth - window.innerWidth;")
        assert overflow <= 0, "the page scrolls sideways"
        clipped = browser.execute_script(
            "return [...document.querySelectorAll('[role=tab], #nodes-body th, #nodes-body td')]"
            ".filter(e => e.getBoundingClientRect().right > window.innerWidth)"
            ".map(e => e.textContent);")
        assert clipped == [], "cut off at the right edge"
        # Tables are shown as cards, each value labelled with its column.
        cell = browser.find_element(By.CSS_SELECTOR, f'#models-body tr[data-model="{MODEL}"] td')
        assert cell.get_attribute("data-label") == "Providers"
    finally:
        browser.set_window_size(1280, 900)
    assert console_errors(browser) == []


def test_playground_streams_an_answer_from_the_echo_engine(
        browser: WebDriver, fed: tuple[LocalNode, LocalNode]) -> None:
    ingress, _ = fed
    open_page(browser, ingress.http_url, "playground")
    assert "Not signed in" in browser.find_element(By.ID, "chat-identity").text
    wait(browser).until(EC.presence_of_element_located(
        (By.CSS_SELECTOR, f'#chat-model option[value="{MODEL}"]')))
    assert_streams(browser, MODEL, "one two three four five", PROVIDER)
    # The conversation goes on: the second request carries the first exchange.
    turn = assert_streams(browser, MODEL, "six seven", PROVIDER)
    assert "prompt" in turn.find_element(By.CLASS_NAME, "meta").text  # usage was reported
    assert console_errors(browser) == []


def test_playground_shows_the_api_error(browser: WebDriver,
                                        fed: tuple[LocalNode, LocalNode]) -> None:
    ingress, _ = fed
    open_page(browser, ingress.http_url, "playground")
    wait(browser).until(EC.element_to_be_clickable((By.ID, "chat-send")))
    # A model nobody serves: the ingress answers 404 model_not_found in OpenAI's shape.
    browser.execute_script(
        "const s = document.getElementById('chat-model');"
        "s.add(new Option('no-such-model', 'no-such-model')); s.value = 'no-such-model';")
    browser.find_element(By.ID, "chat-input").send_keys("hello")
    browser.find_element(By.ID, "chat-send").click()
    message = visible_text(browser, "chat-error")
    assert re.match(r"404: .*no-such-model", message), message
    # The unanswered turn is marked and its text offered again.
    assert "not answered" in browser.find_element(By.CSS_SELECTOR, "#transcript li.user").text
    assert browser.find_element(By.ID, "chat-input").get_attribute("value") == "hello"
    assert console_errors(browser, allow_http_errors=True) == []


def test_signed_in_views_show_the_api_errors(browser: WebDriver,
                                             fed: tuple[LocalNode, LocalNode]) -> None:
    """No key database here: whatever /v1/me and /v1/admin/* answer, the page shows the
    API's own status and message instead of breaking."""
    ingress, _ = fed
    open_page(browser, ingress.http_url, "account")
    browser.find_element(By.ID, "key-input").send_keys("sk-not-a-real-key")
    browser.find_element(By.CSS_SELECTOR, "#key-form button[type=submit]").click()
    shown = shown_error(browser, "key-form-error", "account-error")
    assert re.match(r"\d{3}: \S", shown), shown

    open_page(browser, ingress.http_url, "admin")
    browser.find_element(By.ID, "admin-input").send_keys("not-the-token")
    browser.find_element(By.CSS_SELECTOR, "#admin-form button[type=submit]").click()
    shown = shown_error(browser, "admin-form-error", "admin-error")
    assert re.match(r"\d{3}: \S", shown), shown
    assert console_errors(browser, allow_http_errors=True) == []


# ------------------------------------------------------------------ with the back end


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalNode, LocalNode]]:
    """An ingress with a key database (SQLite) and an admin token (environment only: a
    flag would show it to every user of the host): keys required."""
    root = tmp_path_factory.mktemp("dash-keyed")
    federation, ingress, server = start_federation(
        root, "--ingress-db", str(root / "ingress.sqlite"),
        env={"OTELA_ADMIN_TOKEN": ADMIN_TOKEN})
    with federation:
        yield ingress, server


def key_refused(node: LocalNode, secret: str) -> bool:
    response = httpx.get(f"{node.http_url}/v1/me", timeout=5, trust_env=False,
                         headers={"authorization": f"Bearer {secret}"})
    return response.status_code == 401


@needs_backend
def test_a_key_created_in_the_page_streams_a_chat_and_stops_working_once_revoked(
        browser: WebDriver, keyed: tuple[LocalNode, LocalNode]) -> None:
    ingress, _ = keyed
    sign_in_admin(browser, ingress.http_url, ADMIN_TOKEN)
    key_id, secret = create_key_in_page(browser, "alice", "playground")
    browser.find_element(By.ID, "new-secret-dismiss").click()
    assert browser.find_element(By.ID, "new-secret-value").text == ""  # shown once only

    # The key holder: their key's facts, then a chat streamed with the key.
    sign_in_key(browser, ingress.http_url, secret)
    wait(browser).until(lambda d: key_id in d.find_element(By.ID, "key-info").text)
    assert "alice" in browser.find_element(By.ID, "key-info").text
    browser.find_element(By.ID, "tab-playground").click()
    wait(browser).until(lambda d: key_id in d.find_element(By.ID, "chat-identity").text)
    assert_streams(browser, MODEL, "hello from the dashboard", PROVIDER)

    # Usage is written off the hot path: once the API counts it, the chart shows it.
    wait_for(lambda: httpx.get(
        f"{ingress.http_url}/v1/me/usage", params={"since": 0, "bucket": 3600},
        headers={"authorization": f"Bearer {secret}"}, timeout=5, trust_env=False,
    ).json()["totals"]["requests"] >= 1, WAIT, "the chat's usage to be recorded")
    browser.find_element(By.ID, "tab-account").click()
    wait(browser).until(EC.presence_of_element_located(
        (By.CSS_SELECTOR, "#usage-svg rect.bar-completion")))

    # The admin revokes it in another tab; then the key holder's chat is refused.
    player = browser.current_window_handle
    browser.switch_to.new_window("tab")
    try:
        sign_in_admin(browser, ingress.http_url, ADMIN_TOKEN)
        key_action(browser, key_id, "revoke")
        wait(browser).until(lambda d: "revoked" in d.find_element(
            By.CSS_SELECTOR, f'#keys-body tr[data-key="{key_id}"]').text)
    finally:
        browser.close()
        browser.switch_to.window(player)
    wait_for(lambda: key_refused(ingress, secret), 10, "the revoked key to be refused")

    browser.find_element(By.ID, "tab-playground").click()
    send_chat(browser, MODEL, "are you still there?")
    message = visible_text(browser, "chat-error")
    assert message.startswith("401: "), message
    browser.find_element(By.ID, "tab-account").click()
    assert visible_text(browser, "account-error").startswith("401: ")
    # /v1/models refuses the revoked key too; the federation view falls back to the
    # registry's models and says so, rather than showing an error.
    browser.find_element(By.ID, "tab-federation").click()
    wait(browser).until(lambda d: "every model in the registry" in d.find_element(
        By.ID, "fed-updated").text)
    model_row(browser, MODEL)
    assert not browser.find_element(By.ID, "fed-error").is_displayed()
    assert console_errors(browser, allow_http_errors=True) == []


@needs_backend
def test_admin_rotates_a_key_and_sees_usage_by_group(
        browser: WebDriver, keyed: tuple[LocalNode, LocalNode]) -> None:
    ingress, _ = keyed
    sign_in_admin(browser, ingress.http_url, ADMIN_TOKEN)
    key_id, secret = create_key_in_page(browser, "bob", "rotating")
    key_action(browser, key_id, "rotate")
    wait(browser).until(lambda d: d.find_element(By.ID, "new-secret-value").text
                        not in ("", secret))
    new_secret = browser.find_element(By.ID, "new-secret-value").text
    wait_for(lambda: key_refused(ingress, secret), 10, "the old secret to be refused")
    assert not key_refused(ingress, new_secret)
    for by in ("key", "team", "owner", "model", "provider", "node", "ingress", "status"):
        Select(browser.find_element(By.ID, "admin-usage-by")).select_by_value(by)
        wait(browser).until(lambda d, by=by: d.find_element(By.ID, "admin-usage-group").text
                            == by.capitalize())
        assert not browser.find_element(By.ID, "admin-usage-error").is_displayed()
    assert console_errors(browser) == []
