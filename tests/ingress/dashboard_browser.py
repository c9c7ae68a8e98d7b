"""Steps the dashboard's browser tests share: open a view, read what the page shows,
chat, sign in. Every wait is a WebDriverWait on a condition of the page."""

from __future__ import annotations

import re
from typing import Any

from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import Select, WebDriverWait

WAIT = 20.0  # seconds any one page condition may take
# A failed fetch is logged by Chromium itself (not by the page): expected where a test
# provokes an HTTP error, and nothing else may be.
HTTP_ERROR_LOG = re.compile(r"Failed to load resource: the server responded with a status of 4\d\d")


def console_errors(driver: WebDriver, allow_http_errors: bool = False) -> list[dict[str, Any]]:
    """SEVERE browser-log entries since the last call (reading the log drains it)."""
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"
            and not (allow_http_errors and HTTP_ERROR_LOG.search(e["message"]))]


def wait(driver: WebDriver, timeout: float = WAIT) -> WebDriverWait:
    """Poll every 50 ms; an element the page redrew meanwhile (stale) is looked up again
    on the next poll (the federation view redraws every few seconds)."""
    return WebDriverWait(driver, timeout, poll_frequency=0.05,
                         ignored_exceptions=(NoSuchElementException,
                                             StaleElementReferenceException))


def open_page(driver: WebDriver, base_url: str, view: str = "federation") -> None:
    """A fresh page: session storage cleared, so no test inherits another's sign-in. The
    first load still runs the page with the previous test's credentials (a key that test
    revoked draws a 401 when its request finishes before the reload): what that load
    logged is read off and dropped, so a test's console check sees its own page only."""
    driver.get(f"{base_url}/ui#{view}")
    driver.execute_script("sessionStorage.clear();")
    driver.refresh()
    driver.get_log("browser")
    wait(driver).until(EC.visibility_of_element_located((By.ID, f"view-{view}")))


def visible_text(driver: WebDriver, element_id: str) -> str:
    """The text of ``element_id`` once it is shown (an alert the page revealed)."""
    element = wait(driver).until(EC.visibility_of_element_located((By.ID, element_id)))
    return str(element.text)


def shown_error(driver: WebDriver, *element_ids: str) -> str:
    """The text of whichever of the alerts ``element_ids`` the page shows first."""
    selector = ", ".join(f"#{i}" for i in element_ids)
    return str(wait(driver).until(lambda d: next(
        (e.text for e in d.find_elements(By.CSS_SELECTOR, selector) if e.is_displayed()),
        None)))


def model_row(driver: WebDriver, model: str) -> WebElement:
    return wait(driver).until(EC.visibility_of_element_located(
        (By.CSS_SELECTOR, f'#models-body tr[data-model="{model}"]')))


def send_chat(driver: WebDriver, model: str, text: str) -> WebElement:
    """Type ``text`` in the playground and send it; the assistant's turn as it appears."""
    wait(driver).until(EC.element_to_be_clickable((By.ID, "chat-send")))
    Select(driver.find_element(By.ID, "chat-model")).select_by_value(model)
    box = driver.find_element(By.ID, "chat-input")
    box.clear()
    box.send_keys(text)
    before = len(driver.find_elements(By.CSS_SELECTOR, "#transcript li.user"))
    driver.find_element(By.ID, "chat-send").click()
    wait(driver).until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#transcript li.user"))
                       > before)
    return driver.find_elements(By.CSS_SELECTOR, "#transcript li")[-1]


def assert_streams(driver: WebDriver, model: str, text: str, provider: str) -> WebElement:
    """Send ``text``; the echo arrives token by token (seen part-way, while the turn is
    busy) and ends complete. The finished assistant turn."""
    expected = f"echo: {text}"
    turn = send_chat(driver, model, text)
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
    assert "first token" in meta and f"served by {provider}" in meta, meta
    assert not driver.find_element(By.ID, "chat-error").is_displayed()
    return turn


def sign_in_admin(driver: WebDriver, base_url: str, token: str) -> None:
    open_page(driver, base_url, "admin")
    driver.find_element(By.ID, "admin-input").send_keys(token)
    driver.find_element(By.CSS_SELECTOR, "#admin-form button[type=submit]").click()
    wait(driver).until(EC.visibility_of_element_located((By.ID, "admin")))
    assert not driver.find_element(By.ID, "admin-error").is_displayed()


def create_key_in_page(driver: WebDriver, owner: str, name: str,
                       **fields: str) -> tuple[str, str]:
    """Create a key through the admin form (``fields``: other inputs by their ``name``);
    (key id, secret) as the page showed them, once."""
    driver.find_element(By.CSS_SELECTOR, "#create-key summary").click()
    driver.find_element(By.ID, "ck-owner").send_keys(owner)
    driver.find_element(By.ID, "ck-name").send_keys(name)
    for field, value in fields.items():
        driver.find_element(By.CSS_SELECTOR, f'#create-form [name="{field}"]').send_keys(value)
    driver.find_element(By.ID, "ck-submit").click()
    secret = visible_text(driver, "new-secret-value")
    key_id = driver.find_element(By.ID, "new-secret").get_attribute("data-key")
    assert key_id and secret and secret != key_id
    wait(driver).until(EC.visibility_of_element_located(
        (By.CSS_SELECTOR, f'#keys-body tr[data-key="{key_id}"]')))
    return key_id, secret


def key_action(driver: WebDriver, key_id: str, action: str) -> None:
    """Rotate or revoke a key from the keys table: two clicks, as the page asks (the table
    may be redrawn in between, so the button is found again)."""
    selector = (By.CSS_SELECTOR, f'#keys-body tr[data-key="{key_id}"] [data-action="{action}"]')
    wait(driver).until(EC.element_to_be_clickable(selector)).click()
    wait(driver).until(lambda d: d.find_element(*selector).get_attribute("aria-pressed")
                       == "true")  # armed: the first click alone did nothing
    assert "Confirm" in driver.find_element(*selector).text
    driver.find_element(*selector).click()


def sign_in_key(driver: WebDriver, base_url: str, secret: str) -> None:
    driver.get(f"{base_url}/ui#account")
    wait(driver).until(EC.visibility_of_element_located((By.ID, "view-account")))
    driver.find_element(By.ID, "key-input").send_keys(secret)
    driver.find_element(By.CSS_SELECTOR, "#key-form button[type=submit]").click()
    wait(driver).until(EC.visibility_of_element_located((By.ID, "account")))
