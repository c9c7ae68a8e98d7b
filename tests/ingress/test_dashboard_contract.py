"""The dashboard's signed-in views in Chromium, against an in-memory double of the ingress
API contract (``contract_api.py``) with known keys and usage: what the page shows of a key
and its usage (the chart's bars are the seeded buckets), the admin's key management and
federation-wide usage, a chat with a key and the 401 once it is revoked.

These pin the page to the contract; ``test_dashboard_chromium.py`` runs the same flows
against live otela nodes once the back end exists.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

pytest.importorskip("selenium", reason="selenium is not installed")
from contract_api import (
    ADMIN_TOKEN,
    MODEL,
    PROVIDER,
    ContractState,
    Use,
    create_contract_app,
    served,
)
from dashboard_browser import (
    assert_streams,
    console_errors,
    create_key_in_page,
    key_action,
    model_row,
    open_page,
    send_chat,
    sign_in_admin,
    sign_in_key,
    visible_text,
    wait,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import Select

pytestmark = pytest.mark.slow

HOUR = 3600


@pytest.fixture(scope="module")
def contract() -> Iterator[tuple[str, ContractState]]:
    state = ContractState()
    with served(create_contract_app(state)) as url:
        yield url, state


@pytest.fixture
def seeded(contract: tuple[str, ContractState]) -> tuple[str, ContractState, str, str, list[int]]:
    """A key with usage in three distinct hours of the last day, one with an error;
    (url, state, key id, secret, the hour starts that have usage)."""
    url, state = contract
    key = state.add_key("carol", name="analytics", rpm=60, tpm=100_000, budget_tokens=10_000,
                        models=[MODEL])
    now = time.time()
    hours = sorted({int((now - ago) // HOUR * HOUR) for ago in (2 * HOUR, 5 * HOUR, 9 * HOUR)})
    for start in hours:
        state.usage.append(Use(key.id, start + 60, prompt_tokens=100, completion_tokens=50))
    state.usage.append(Use(key.id, hours[0] + 120, prompt_tokens=10, completion_tokens=0,
                           error=True, model="other-model", provider="prov-other"))
    return url, state, key.id, key.secret, hours


def test_a_wrong_key_is_refused_at_sign_in_with_the_api_message(
        browser: WebDriver, contract: tuple[str, ContractState]) -> None:
    url, _ = contract
    open_page(browser, url, "account")
    browser.find_element(By.ID, "key-input").send_keys("sk-wrong")
    browser.find_element(By.CSS_SELECTOR, "#key-form button[type=submit]").click()
    assert visible_text(browser, "key-form-error") == "401: invalid API key"
    assert not browser.find_element(By.ID, "account").is_displayed()
    assert browser.execute_script("return sessionStorage.length") == 0  # not kept
    assert console_errors(browser, allow_http_errors=True) == []


def test_key_holder_sees_their_batches_with_progress(
        browser: WebDriver, seeded: tuple[str, ContractState, str, str, list[int]]) -> None:
    url, state, key_id, secret, _ = seeded
    counts = {"total": 2000, "completed": 1490, "failed": 10}
    state.batches[key_id] = [
        {"id": "batch_0123456789abcdef01234567", "object": "batch",
         "endpoint": "/v1/chat/completions", "status": "in_progress",
         "created_at": int(time.time()) - 60, "request_counts": counts,
         "output_file_id": None, "error_file_id": None},
        {"id": "batch_fedcba9876543210fedcba98", "object": "batch",
         "endpoint": "/v1/embeddings", "status": "completed",
         "created_at": int(time.time()) - 7200,
         "request_counts": {"total": 3, "completed": 3, "failed": 0},
         "output_file_id": "file-00112233445566778899aabb", "error_file_id": None}]
    open_page(browser, url, "account")
    sign_in_key(browser, url, secret)
    table = wait(browser).until(lambda d: (t := d.find_element(By.ID, "batches-body").text)
                                and "1,500 of 2,000" in t and t)
    assert "(10 failed)" in table and "in_progress" in table and "completed" in table
    assert "/v1/embeddings" in table and "output" in table
    meter = browser.find_element(By.CSS_SELECTOR, "#batches-body .meter")
    assert meter.get_attribute("aria-valuenow") == "75"
    assert not browser.find_element(By.ID, "batches-empty").is_displayed()
    assert console_errors(browser) == []


def test_key_holder_sees_their_key_and_usage_chart(
        browser: WebDriver, seeded: tuple[str, ContractState, str, str, list[int]]) -> None:
    url, state, key_id, secret, hours = seeded
    open_page(browser, url, "account")
    sign_in_key(browser, url, secret)
    info = wait(browser).until(lambda d: (t := d.find_element(By.ID, "key-info").text)
                               and key_id in t and t)
    for fact in ("analytics", "carol", "active", MODEL, "60 req/min", "100,000 tokens/min",
                 "460 of 10,000"):
        assert fact in info, fact
    # Totals over the last 24 hours, and one pair of bars per hour with usage.
    totals = wait(browser).until(lambda d: d.find_element(By.ID, "usage-totals").text)
    assert "Requests\n4" in totals and "Prompt tokens\n310" in totals
    assert "Completion tokens\n150" in totals and "Errors\n1" in totals
    wait(browser).until(EC.presence_of_element_located((By.ID, "usage-svg")))
    starts = {int(g.get_attribute("data-start"))
              for g in browser.find_elements(By.CSS_SELECTOR, "#usage-svg g.bucket")
              if g.find_elements(By.CSS_SELECTOR, "rect.bar-prompt")}
    assert starts == set(hours)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#usage-svg .dot-errors")) == 1
    title = browser.find_element(By.CSS_SELECTOR, "#usage-svg > title").get_attribute("textContent")
    assert "460 tokens in 4 requests" in title
    assert browser.find_element(By.ID, "usage-svg").get_attribute("role") == "img"

    # New usage shows up by itself (the view refreshes every 15 s while shown).
    state.usage.append(Use(key_id, time.time() - 60, prompt_tokens=1, completion_tokens=1))
    wait(browser, 25).until(
        lambda d: "Requests\n5" in d.find_element(By.ID, "usage-totals").text)

    # A shorter period asks the API for less: only that last request.
    Select(browser.find_element(By.ID, "usage-range")).select_by_value("3600")
    wait(browser).until(lambda d: "Requests\n1" in d.find_element(By.ID, "usage-totals").text)
    assert len(browser.find_elements(By.CSS_SELECTOR, "#usage-svg rect.bar-prompt")) == 1

    # The key survives a reload (session storage) and signing out forgets it.
    browser.refresh()
    wait(browser).until(lambda d: key_id in d.find_element(By.ID, "key-info").text)
    browser.find_element(By.ID, "key-signout").click()
    wait(browser).until(EC.visibility_of_element_located((By.ID, "key-form")))
    assert browser.execute_script("return sessionStorage.length") == 0
    assert console_errors(browser) == []


def test_federation_view_shows_gpus_and_load(browser: WebDriver,
                                             contract: tuple[str, ContractState]) -> None:
    url, _ = contract
    open_page(browser, url)
    row = model_row(browser, MODEL)
    assert "H100" in row.text and PROVIDER in row.text and "vllm" in row.text
    assert "3 in flight" in row.text and "capacity 8" in row.text
    assert "5 queued here" in row.text  # the ingress queue, every class
    node = browser.find_element(By.CSS_SELECTOR, '#nodes-body tr[data-session="s-serving"]')
    assert "4\u00d7 H100 80.0 GiB" in node.text and "KV 40 %" in node.text
    assert "16 slots" in node.text
    # One row per node: a restart's old LEFT session is not a second node.
    assert "restarted: 1 earlier session" in node.text
    assert not browser.find_elements(By.CSS_SELECTOR,
                                     '#nodes-body tr[data-session="s-serving-old"]')
    meter = node.find_element(By.CSS_SELECTOR, '[role="meter"]')
    assert meter.get_attribute("aria-valuenow") == "38"  # 3 of 8
    assert console_errors(browser) == []


def test_a_warming_registry_is_said_not_shown_as_no_models(
        browser: WebDriver, contract: tuple[str, ContractState]) -> None:
    """Right after a start the node's replica is empty until it catches up with a peer:
    the page says so (in the node's summary and where the models would be) instead of
    "no model is served"; once warm, the models show."""
    url, state = contract
    state.warming = True
    try:
        open_page(browser, url)
        wait(browser).until(lambda d: "registry warming" in
                            d.find_element(By.ID, "node-summary").text)
        empty = browser.find_element(By.ID, "models-empty")
        assert empty.is_displayed() and "catching up with its peers" in empty.text
    finally:
        state.warming = False
    browser.refresh()
    model_row(browser, MODEL)
    assert "registry warming" not in browser.find_element(By.ID, "node-summary").text
    assert not browser.find_element(By.ID, "models-empty").is_displayed()
    assert console_errors(browser) == []


def test_admin_manages_keys_and_sees_usage_by_group(
        browser: WebDriver, seeded: tuple[str, ContractState, str, str, list[int]]) -> None:
    url, state, seeded_id, _, _ = seeded
    open_page(browser, url, "admin")
    browser.find_element(By.ID, "admin-input").send_keys("not-the-token")
    browser.find_element(By.CSS_SELECTOR, "#admin-form button[type=submit]").click()
    assert visible_text(browser, "admin-form-error") == "401: invalid admin token"

    sign_in_admin(browser, url, ADMIN_TOKEN)
    key_id, secret = create_key_in_page(browser, "dave", "limited", rpm="30", models="a, b",
                                        expires_days="1.5", budget_tokens="5000")
    created = state.keys[key_id]
    assert (created.owner, created.name, created.rpm, created.models) == \
        ("dave", "limited", 30, ["a", "b"])
    assert created.budget_tokens == 5000 and created.tpm is None
    assert created.expires_at is not None
    assert abs(created.expires_at - created.created_at - 1.5 * 86400) < 5
    assert secret == created.secret
    row = browser.find_element(By.CSS_SELECTOR, f'#keys-body tr[data-key="{key_id}"]')
    assert "30 req/min" in row.text and "models: a, b" in row.text and "active" in row.text

    # Rotation shows the new secret once; revocation marks the key and disables its actions.
    key_action(browser, key_id, "rotate")
    wait(browser).until(lambda d: d.find_element(By.ID, "new-secret-value").text
                        not in ("", secret))
    assert browser.find_element(By.ID, "new-secret-value").text == state.keys[key_id].secret
    browser.find_element(By.ID, "new-secret-dismiss").click()
    assert not browser.find_element(By.ID, "new-secret").is_displayed()
    key_action(browser, key_id, "revoke")
    wait(browser).until(lambda d: "revoked" in d.find_element(
        By.CSS_SELECTOR, f'#keys-body tr[data-key="{key_id}"]').text)
    assert state.keys[key_id].revoked_at is not None
    for button in browser.find_elements(By.CSS_SELECTOR,
                                        f'#keys-body tr[data-key="{key_id}"] button'):
        assert not button.is_enabled()

    # Usage across the federation, by each grouping the API offers.
    wait(browser).until(EC.presence_of_element_located(
        (By.CSS_SELECTOR, f'#admin-usage-body tr[data-group="{seeded_id}"]')))
    by_key = browser.find_element(By.CSS_SELECTOR,
                                  f'#admin-usage-body tr[data-group="{seeded_id}"]')
    assert "analytics · carol" in by_key.text  # the key's name and owner, not only its id
    expected = {"model": {MODEL, "other-model"}, "provider": {PROVIDER, "prov-other"},
                "node": {"node-contract"}}
    for by, groups in expected.items():
        Select(browser.find_element(By.ID, "admin-usage-by")).select_by_value(by)
        wait(browser).until(lambda d, groups=groups: {
            r.get_attribute("data-group")
            for r in d.find_elements(By.CSS_SELECTOR, "#admin-usage-body tr")} >= groups)
        assert browser.find_element(By.ID, "admin-usage-group").text == by.capitalize()
    model_rows = {r.get_attribute("data-group"): r.text for r in browser.find_elements(
        By.CSS_SELECTOR, "#admin-usage-body tr")}
    assert model_rows  # node grouping: latency and TTFT shown in ms
    assert "120 ms" in model_rows["node-contract"] and "30 ms" in model_rows["node-contract"]
    assert console_errors(browser, allow_http_errors=True) == []  # the wrong token's 401


def test_chat_with_a_key_streams_then_a_revoked_key_gets_401(
        browser: WebDriver, contract: tuple[str, ContractState]) -> None:
    url, state = contract
    key = state.add_key("erin", name="chat")
    open_page(browser, url, "account")
    sign_in_key(browser, url, key.secret)
    browser.find_element(By.ID, "tab-playground").click()
    wait(browser).until(lambda d: key.id in d.find_element(By.ID, "chat-identity").text)
    assert_streams(browser, MODEL, "streamed with a key", PROVIDER)
    assert state.usage[-1].key_id == key.id  # the request carried the key

    key.revoked_at = time.time()
    send_chat(browser, MODEL, "still there?")
    assert visible_text(browser, "chat-error") == "401: invalid API key"
    browser.find_element(By.ID, "tab-account").click()
    assert visible_text(browser, "account-error") == "401: invalid API key"
    assert console_errors(browser, allow_http_errors=True) == []


def test_tabs_follow_the_keyboard_and_the_address(browser: WebDriver,
                                                  contract: tuple[str, ContractState]) -> None:
    """WAI-ARIA tabs: arrow keys move between views; each view has its own #address."""
    url, _ = contract
    open_page(browser, url)
    browser.find_element(By.ID, "tab-federation").click()
    browser.switch_to.active_element.send_keys(Keys.ARROW_RIGHT)
    wait(browser).until(EC.visibility_of_element_located((By.ID, "view-account")))
    assert browser.switch_to.active_element.get_attribute("id") == "tab-account"
    assert browser.find_element(By.ID, "tab-account").get_attribute("aria-selected") == "true"
    assert not browser.find_element(By.ID, "view-federation").is_displayed()
    assert browser.current_url.endswith("#account")
    browser.switch_to.active_element.send_keys(Keys.END)
    wait(browser).until(EC.visibility_of_element_located((By.ID, "view-admin")))
    browser.switch_to.active_element.send_keys(Keys.ARROW_RIGHT)  # wraps around
    wait(browser).until(EC.visibility_of_element_located((By.ID, "view-federation")))
    browser.get(f"{url}/ui#playground")
    wait(browser).until(EC.visibility_of_element_located((By.ID, "view-playground")))
    assert console_errors(browser) == []


def test_admin_pages_through_keys_and_finds_them_by_search(
        browser: WebDriver, contract: tuple[str, ContractState]) -> None:
    """Many keys: 20 a page with the range shown, and a search over id, name, owner, team
    and status (a page with 23 keys used to be 2,800 px long, with no way to find one)."""
    url, state = contract
    for i in range(25):
        state.add_key(f"bulk-{i:02d}", name=f"bulk key {i}")
    needle = state.add_key("zoe-searchable", name="the one")
    total = len(state.keys)
    open_page(browser, url, "admin")
    sign_in_admin(browser, url, ADMIN_TOKEN)
    wait(browser).until(lambda d: d.find_element(By.ID, "keys-page").text
                        == f"1\u201320 of {total}")
    assert len(browser.find_elements(By.CSS_SELECTOR, "#keys-body tr[data-key]")) == 20
    assert not browser.find_element(By.ID, "keys-prev").is_enabled()
    browser.find_element(By.ID, "keys-next").click()
    wait(browser).until(lambda d: d.find_element(By.ID, "keys-page").text.startswith("21\u2013"))
    assert len(browser.find_elements(By.CSS_SELECTOR, "#keys-body tr[data-key]")) == total - 20
    search = browser.find_element(By.ID, "keys-search")
    search.send_keys("ZOE one")  # words in any field, any case
    wait(browser).until(lambda d: [r.get_attribute("data-key") for r in d.find_elements(
        By.CSS_SELECTOR, "#keys-body tr[data-key]")] == [needle.id])
    assert browser.find_element(By.ID, "keys-page").text == f"1\u20131 of 1 (of {total} keys)"
    search.send_keys(" nobody-has-this")
    wait(browser).until(lambda d: "No key matches the search." in
                        d.find_element(By.ID, "keys-body").text)
    assert console_errors(browser) == []


def test_admin_reads_the_request_log_pages_filters_and_exports_it(
        browser: WebDriver, seeded: tuple[str, ContractState, str, str, list[int]]) -> None:
    url, state, key_id, _, _ = seeded
    for i in range(60):  # more than a page of 50
        state.usage.append(Use(key_id, time.time() - i, prompt_tokens=1, completion_tokens=1,
                               model="paged-model"))
    open_page(browser, url, "admin")
    sign_in_admin(browser, url, ADMIN_TOKEN)
    wait(browser).until(lambda d: len(d.find_elements(
        By.CSS_SELECTOR, "#log-body tr[data-request]")) == 50)
    newest = browser.find_elements(By.CSS_SELECTOR, "#log-body tr[data-request]")[0]
    assert key_id in newest.text and "paged-model" in newest.text
    older = browser.find_element(By.ID, "log-older")
    assert older.is_displayed()
    older.click()
    total = len(state.usage)
    wait(browser).until(lambda d: len(d.find_elements(
        By.CSS_SELECTOR, "#log-body tr[data-request]")) == total)
    assert not browser.find_element(By.ID, "log-older").is_displayed()
    ids = [r.get_attribute("data-request")
           for r in browser.find_elements(By.CSS_SELECTOR, "#log-body tr[data-request]")]
    assert len(set(ids)) == total  # no page repeated
    browser.find_element(By.ID, "log-model").send_keys("other-model")
    browser.find_element(By.ID, "log-show").click()
    wait(browser).until(lambda d: [r.text for r in d.find_elements(
        By.CSS_SELECTOR, "#log-body tr[data-request]")] and all(
        "other-model" in r.text for r in d.find_elements(
            By.CSS_SELECTOR, "#log-body tr[data-request]")))
    before = state.exports
    browser.find_element(By.ID, "log-export").click()
    wait(browser).until(lambda d: state.exports == before + 1)
    assert not browser.find_element(By.ID, "log-error").is_displayed()
    assert console_errors(browser) == []
