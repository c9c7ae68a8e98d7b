"""The dashboard in a real browser (the system's headless Chromium, driven by Selenium)
against a live local federation: an ingress node and a node serving the echo engine, each
its own OS process.

Without the ingress back end (no key database) the page must already work: it loads with
no console error, lists the federation's models and nodes, streams a chat from the echo
engine, and shows the API's errors when someone signs in. With it (``--ingress-db``,
``--admin-token``), an admin creates a key in the page, a chat streams with that key, and
after the admin revokes it the playground shows the 401.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from otela.localfed import LocalFederation, LocalNode, echo_engine_command, free_port, wait_for

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402
from selenium.webdriver.support import expected_conditions as EC  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
MODEL = "echo-dashboard"
TOKEN_DELAY = 0.25  # seconds per generated token: slow enough to watch the stream arrive
WAIT = 20.0  # seconds any one page condition may take
ADMIN_TOKEN = "dashboard-test-admin-token"
# A failed fetch is logged by Chromium itself (not by the page): expected where a test
# provokes an HTTP error, and nothing else may be.
HTTP_ERROR_LOG = re.compile(r"Failed to load resource: the server responded with a status of 4\d\d")


@functools.cache
def ingress_backend_available() -> bool:
    """Whether ``otela start`` takes the ingress service's flags yet (issue 15 items 1-4)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTELA_")}
    help_text = subprocess.run([sys.executable, "-m", "otela", "start", "--help"],
                               capture_output=True, text=True, timeout=60,
                               env={**env, "COLUMNS": "250", "NO_COLOR": "1"}).stdout
    return "--ingress-db" in help_text and "--admin-token" in help_text


# A string condition is evaluated when such a test is about to run, not at collection.
needs_backend = pytest.mark.skipif(
    "not ingress_backend_available()",
    reason="needs the ingress back end: `otela start` has no --ingress-db/--admin-token yet "
           "(API keys, /v1/me, /v1/admin/*)")


# ------------------------------------------------------------------ browser


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    for binary in (CHROMIUM, CHROMEDRIVER):
        if not binary.exists() or shutil.which(str(binary)) is None:
            pytest.skip(f"{binary} is missing (apt-get install chromium chromium-driver)")
    options = Options()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--window-size=1280,900",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def console_errors(driver: WebDriver, allow_http_errors: bool = False) -> list[dict[str, Any]]:
    """SEVERE browser-log entries since the last call (reading the log drains it)."""
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"
            and not (allow_http_errors and HTTP_ERROR_LOG.search(e["message"]))]


def wait(driver: WebDriver, timeout: float = WAIT) -> WebDriverWait:
    return WebDriverWait(driver, timeout, poll_frequency=0.05)


def open_page(driver: WebDriver, node: LocalNode, view: str = "federation") -> None:
    """A fresh page: session storage cleared, so no test inherits another's sign-in."""
    driver.get(f"{node.http_url}/ui#{view}")
    driver.execute_script("sessionStorage.clear();")
    driver.refresh()
    wait(driver).until(EC.visibility_of_element_located((By.ID, f"view-{view}")))


def visible_text(driver: WebDriver, element_id: str) -> str:
    """The text of ``element_id`` once it is shown (an alert the page revealed)."""
    element = wait(driver).until(EC.visibility_of_element_located((By.ID, element_id)))
    return str(element.text)


def model_row(driver: WebDriver, model: str) -> WebElement:
    return wait(driver).until(EC.visibility_of_element_located(
        (By.CSS_SELECTOR, f'#models-body tr[data-model="{model}"]')))


# ------------------------------------------------------------------ federation


def wait_serving(observer: LocalNode, target: LocalNode) -> None:
    wait_for(lambda: observer.states().get(target.session_id) == "SERVING", 30,
             f"{observer.name} to see {target.name} SERVING")


def start_federation(root: Path, *ingress_args: str) -> tuple[LocalFederation, LocalNode,
                                                              LocalNode]:
    federation = LocalFederation(root)
    try:
        ingress = federation.start_node("ingress", ingress=True, extra_args=list(ingress_args))
        engine = echo_engine_command(free_port(), [MODEL], "--token-delay", str(TOKEN_DELAY))
        server = federation.start_node("server", bootstrap=[ingress], process=engine,
                                       provider_id="prov-echo")
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
    open_page(browser, ingress)
    row = model_row(browser, MODEL)
    wait(browser).until(lambda _: "prov-echo" in row.text and "SERVING" in row.text)
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
        open_page(browser, ingress)
        model_row(browser, MODEL)
        overflow = browser.execute_script(
            "return document.documentElement.scrollWidth - window.innerWidth;")
        assert overflow <= 0, "the page scrolls sideways (tables should scroll in place)"
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


def send_chat(driver: WebDriver, text: str) -> WebElement:
    """Type ``text`` in the playground and send it; the assistant's turn as it appears."""
    wait(driver).until(EC.element_to_be_clickable((By.ID, "chat-send")))
    Select(driver.find_element(By.ID, "chat-model")).select_by_value(MODEL)
    box = driver.find_element(By.ID, "chat-input")
    box.clear()
    box.send_keys(text)
    before = len(driver.find_elements(By.CSS_SELECTOR, "#transcript li.user"))
    driver.find_element(By.ID, "chat-send").click()
    wait(driver).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#transcript li.user"))
                       > before)
    return driver.find_elements(By.CSS_SELECTOR, "#transcript li")[-1]


def assert_streams(driver: WebDriver, text: str) -> WebElement:
    """Send ``text``; the echo arrives token by token (seen part-way, while the turn is
    busy) and ends complete. The finished assistant turn."""
    expected = f"echo: {text}"
    turn = send_chat(driver, text)
    assert "assistant" in (turn.get_attribute("class") or "")
    reply = turn.find_element(By.CLASS_NAME, "text")

    def partial(_: WebDriver) -> bool:
        shown = reply.text
        return (turn.get_attribute("aria-busy") == "true" and shown.startswith("echo:")
                and shown != expected)

    wait(driver).until(partial)  # some tokens shown, more still coming
    wait(driver).until(lambda _: turn.get_attribute("data-outcome") == "done")
    assert reply.text == expected
    meta = turn.find_element(By.CLASS_NAME, "meta").text
    assert "first token" in meta and "served by prov-echo" in meta
    assert not driver.find_element(By.ID, "chat-error").is_displayed()
    return turn


def test_playground_streams_an_answer_from_the_echo_engine(
        browser: WebDriver, fed: tuple[LocalNode, LocalNode]) -> None:
    ingress, _ = fed
    open_page(browser, ingress, "playground")
    assert "Not signed in" in browser.find_element(By.ID, "chat-identity").text
    wait(browser).until(EC.presence_of_element_located(
        (By.CSS_SELECTOR, f'#chat-model option[value="{MODEL}"]')))
    assert_streams(browser, "one two three four five")
    # The conversation goes on: the second request carries the first exchange.
    turn = assert_streams(browser, "six seven")
    assert "prompt" in turn.find_element(By.CLASS_NAME, "meta").text  # usage was reported
    assert console_errors(browser) == []


def test_playground_shows_the_api_error(browser: WebDriver,
                                        fed: tuple[LocalNode, LocalNode]) -> None:
    ingress, _ = fed
    open_page(browser, ingress, "playground")
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
    """No key database here: /v1/me and /v1/admin/* are not served, and the page says so
    with the API's own status and message instead of breaking."""
    ingress, _ = fed
    open_page(browser, ingress, "account")
    browser.find_element(By.ID, "key-input").send_keys("sk-not-a-real-key")
    browser.find_element(By.CSS_SELECTOR, "#key-form button[type=submit]").click()
    shown = wait(browser).until(lambda d: next(
        (e.text for e in d.find_elements(By.CSS_SELECTOR, "#key-form-error, #account-error")
         if e.is_displayed()), None))
    assert re.match(r"\d{3}: \S", shown), shown

    open_page(browser, ingress, "admin")
    browser.find_element(By.ID, "admin-input").send_keys("not-the-token")
    browser.find_element(By.CSS_SELECTOR, "#admin-form button[type=submit]").click()
    shown = wait(browser).until(lambda d: next(
        (e.text for e in d.find_elements(By.CSS_SELECTOR, "#admin-form-error, #admin-error")
         if e.is_displayed()), None))
    assert re.match(r"\d{3}: \S", shown), shown
    assert console_errors(browser, allow_http_errors=True) == []


# ------------------------------------------------------------------ with the back end


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalNode, LocalNode]]:
    """An ingress with a key database (SQLite) and an admin token: keys required."""
    root = tmp_path_factory.mktemp("dash-keyed")
    federation, ingress, server = start_federation(
        root, "--ingress-db", str(root / "ingress.sqlite"), "--admin-token", ADMIN_TOKEN)
    with federation:
        yield ingress, server


def sign_in_admin(driver: WebDriver, node: LocalNode) -> None:
    open_page(driver, node, "admin")
    driver.find_element(By.ID, "admin-input").send_keys(ADMIN_TOKEN)
    driver.find_element(By.CSS_SELECTOR, "#admin-form button[type=submit]").click()
    wait(driver).until(EC.visibility_of_element_located((By.ID, "admin")))
    assert not driver.find_element(By.ID, "admin-error").is_displayed()


def create_key_in_page(driver: WebDriver, owner: str, name: str) -> tuple[str, str]:
    """Create a key through the admin form; (key id, secret) as the page showed them once."""
    driver.find_element(By.CSS_SELECTOR, "#create-key summary").click()
    driver.find_element(By.ID, "ck-owner").send_keys(owner)
    driver.find_element(By.ID, "ck-name").send_keys(name)
    driver.find_element(By.ID, "ck-submit").click()
    secret = visible_text(driver, "new-secret-value")
    key_id = driver.find_element(By.ID, "new-secret").get_attribute("data-key")
    assert key_id and secret and secret != key_id
    wait(driver).until(EC.visibility_of_element_located(
        (By.CSS_SELECTOR, f'#keys-body tr[data-key="{key_id}"]')))
    return key_id, secret


def sign_in_key(driver: WebDriver, node: LocalNode, secret: str) -> None:
    driver.get(f"{node.http_url}/ui#account")
    wait(driver).until(EC.visibility_of_element_located((By.ID, "view-account")))
    driver.find_element(By.ID, "key-input").send_keys(secret)
    driver.find_element(By.CSS_SELECTOR, "#key-form button[type=submit]").click()
    wait(driver).until(EC.visibility_of_element_located((By.ID, "account")))


def key_refused(node: LocalNode, secret: str) -> bool:
    response = httpx.get(f"{node.http_url}/v1/me", timeout=5, trust_env=False,
                         headers={"authorization": f"Bearer {secret}"})
    return response.status_code == 401


@needs_backend
def test_a_key_created_in_the_page_streams_a_chat_and_stops_working_once_revoked(
        browser: WebDriver, keyed: tuple[LocalNode, LocalNode]) -> None:
    ingress, _ = keyed
    sign_in_admin(browser, ingress)
    key_id, secret = create_key_in_page(browser, "alice", "playground")
    browser.find_element(By.ID, "new-secret-dismiss").click()
    assert browser.find_element(By.ID, "new-secret-value").text == ""  # shown once only

    # The key holder: their key's facts, then a chat streamed with the key.
    sign_in_key(browser, ingress, secret)
    wait(browser).until(lambda d: key_id in d.find_element(By.ID, "key-info").text)
    assert "alice" in browser.find_element(By.ID, "key-info").text
    browser.find_element(By.ID, "tab-playground").click()
    wait(browser).until(lambda d: key_id in d.find_element(By.ID, "chat-identity").text)
    assert_streams(browser, "hello from the dashboard")

    # Usage is written off the hot path: once the API counts it, the chart shows it.
    wait_for(lambda: httpx.get(
        f"{ingress.http_url}/v1/me/usage", params={"since": 0, "bucket": 3600},
        headers={"authorization": f"Bearer {secret}"}, timeout=5, trust_env=False,
    ).json()["totals"]["requests"] >= 1, WAIT, "the chat's usage to be recorded")
    browser.find_element(By.ID, "tab-account").click()
    wait(browser).until(EC.presence_of_element_located(
        (By.CSS_SELECTOR, "#usage-svg rect.bar-completion")))

    # The admin revokes it in the page; then the same page's chat is refused.
    browser.execute_script("window.open('about:blank');")
    player = browser.current_window_handle
    browser.switch_to.window(browser.window_handles[-1])
    try:
        sign_in_admin(browser, ingress)
        revoke = wait(browser).until(EC.element_to_be_clickable(
            (By.CSS_SELECTOR, f'#keys-body tr[data-key="{key_id}"] [data-action="revoke"]')))
        revoke.click()
        assert "Confirm" in revoke.text  # destructive: two clicks
        revoke.click()
        wait(browser).until(lambda d: "revoked" in d.find_element(
            By.CSS_SELECTOR, f'#keys-body tr[data-key="{key_id}"]').text)
    finally:
        browser.close()
        browser.switch_to.window(player)
    wait_for(lambda: key_refused(ingress, secret), 10, "the revoked key to be refused")

    browser.find_element(By.ID, "tab-playground").click()
    send_chat(browser, "are you still there?")
    message = visible_text(browser, "chat-error")
    assert message.startswith("401: "), message
    browser.find_element(By.ID, "tab-account").click()
    assert visible_text(browser, "account-error").startswith("401: ")
    assert console_errors(browser, allow_http_errors=True) == []


@needs_backend
def test_admin_rotates_a_key_and_sees_usage_by_group(
        browser: WebDriver, keyed: tuple[LocalNode, LocalNode]) -> None:
    ingress, _ = keyed
    sign_in_admin(browser, ingress)
    key_id, secret = create_key_in_page(browser, "bob", "rotating")
    rotate = browser.find_element(
        By.CSS_SELECTOR, f'#keys-body tr[data-key="{key_id}"] [data-action="rotate"]')
    rotate.click()
    rotate.click()
    wait(browser).until(lambda d: d.find_element(By.ID, "new-secret-value").text
                        not in ("", secret))
    new_secret = browser.find_element(By.ID, "new-secret-value").text
    wait_for(lambda: key_refused(ingress, secret), 10, "the old secret to be refused")
    assert not key_refused(ingress, new_secret)
    for by in ("key", "model", "provider", "node"):
        Select(browser.find_element(By.ID, "admin-usage-by")).select_by_value(by)
        wait(browser).until(lambda d, by=by: d.find_element(By.ID, "admin-usage-group").text
                            == by.capitalize())
        assert not browser.find_element(By.ID, "admin-usage-error").is_displayed()
    assert console_errors(browser) == []
