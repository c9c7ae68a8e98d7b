"""Single sign-on to the dashboard, end to end with real components: the certified
``oidc-provider`` (Node.js) as the OpenID provider, an ingress node as its own OS process
configured for it (``[ingress] sso_*``), and the system's headless Chromium signing in
through the provider's own login and consent pages.

An admin (in the provider's ``otela-admins`` group) lands on the admin view and manages
keys with the session alone (no admin token); a team member sees their team's keys and
their own (one an admin gave them, one they make in the page, in their team), revokes one
of theirs, and gets 403 from the admin API; a key holder still signs in with a key;
signing out ends the session. Refused: a call without the CSRF header, a declined
consent, an altered state, a replayed callback, a code used twice, an expired session, an
unreachable provider. The pages are kept as screenshots (``OTELA_TEST_ARTIFACTS``, else
the test's temp dir).
"""

from __future__ import annotations

import os
import secrets
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest

from otela.testing.localfed import LocalFederation, LocalNode, free_port

pytest.importorskip("selenium", reason="selenium is not installed")
pytest.importorskip("authlib", reason="authlib is not installed (the sso extra)")
from dashboard_browser import open_page, sign_in_key, visible_text, wait
from openid_provider import OpenIDProvider, ProviderMissing, openid_provider
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support import expected_conditions as EC

pytestmark = pytest.mark.slow

CLIENT_ID = "otela-dashboard"
USERS = {
    "alice": {"email": "alice@uni.example", "email_verified": True, "name": "Alice Admin",
              "groups": ["otela-admins", "physics"]},
    "bob": {"email": "bob@uni.example", "email_verified": True, "name": "Bob Physicist",
            "groups": ["physics", "staff"]},
}


@dataclass
class Sso:
    provider: OpenIDProvider
    ingress: LocalNode
    db: Path
    admin_token: str
    team_key: str  # a key of team physics-lab, and its secret
    team_key_secret: str
    federation: LocalFederation
    shots: Path

    @property
    def url(self) -> str:
        return self.ingress.http_url

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        with sqlite3.connect(self.db) as connection:
            return list(connection.execute(sql, params))

    def shot(self, driver: WebDriver, name: str) -> None:
        driver.save_screenshot(str(self.shots / f"{name}.png"))


def sso_env(issuer: str, port: int, secret: str) -> dict[str, str]:
    return {"OTELA_SSO_ISSUER": issuer, "OTELA_SSO_CLIENT_ID": CLIENT_ID,
            "OTELA_SSO_CLIENT_SECRET": secret,
            "OTELA_SSO_REDIRECT_BASE": f"http://127.0.0.1:{port}",
            "OTELA_SSO_SCOPES": "openid email profile groups",
            "OTELA_SSO_TEAMS": "physics=physics-lab", "OTELA_SSO_ADMIN_VALUES": "otela-admins",
            "OTELA_SSO_USER_KEYS": "true"}


@pytest.fixture(scope="module")
def sso(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sso]:
    root = tmp_path_factory.mktemp("sso")
    shots = Path(os.environ.get("OTELA_TEST_ARTIFACTS", root)) / "sso-screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    op_port, port = free_port(), free_port()
    client_secret, admin_token = secrets.token_urlsafe(32), secrets.token_urlsafe(24)
    try:
        provider_cm = openid_provider(op_port, CLIENT_ID, client_secret,
                                      f"http://127.0.0.1:{port}/ui/callback", USERS,
                                      root / "provider.log")
        provider = provider_cm.__enter__()
    except ProviderMissing as exc:
        pytest.skip(str(exc))
    try:
        with LocalFederation(root) as federation:
            db = root / "ingress.sqlite"
            ingress = federation.start_node(
                "ingress", ingress=True,
                extra_args=["--ingress-db", str(db), "--http-port", str(port)],
                extra_env={**sso_env(provider.issuer, port, client_secret),
                           "OTELA_ADMIN_TOKEN": admin_token})
            created = httpx.post(f"{ingress.http_url}/v1/admin/keys", trust_env=False,
                                 headers={"authorization": f"Bearer {admin_token}"},
                                 json={"owner": "physics lab", "name": "lab key",
                                       "team": "physics-lab"}, timeout=10)
            assert created.status_code == 200, created.text
            yield Sso(provider, ingress, db, admin_token, created.json()["id"],
                      created.json()["key"], federation, shots)
    finally:
        provider_cm.__exit__(None, None, None)


# -- browser steps ------------------------------------------------------------------------

def fresh(driver: WebDriver) -> None:
    """No cookie of any site: signed out of the provider and of the ingress."""
    driver.execute_cdp_cmd("Network.enable", {})
    driver.execute_cdp_cmd("Network.clearBrowserCookies", {})


def at_provider_sign_in(driver: WebDriver, user: str) -> None:
    """Fill the provider's own login form."""
    box = wait(driver).until(EC.visibility_of_element_located((By.NAME, "login")))
    box.send_keys(user)
    driver.find_element(By.NAME, "password").send_keys("any password")
    driver.find_element(By.CSS_SELECTOR, "button[type=submit]").click()


def consent(driver: WebDriver) -> None:
    wait(driver).until(EC.element_to_be_clickable(
        (By.XPATH, "//button[normalize-space()='Continue']"))).click()


def start_sign_in(driver: WebDriver, sso: Sso) -> None:
    open_page(driver, sso.url, "account")
    wait(driver).until(EC.element_to_be_clickable((By.ID, "sso-login"))).click()


def sign_in(driver: WebDriver, sso: Sso, user: str) -> None:
    fresh(driver)
    start_sign_in(driver, sso)
    at_provider_sign_in(driver, user)
    consent(driver)
    wait(driver).until(lambda d: d.current_url.startswith(sso.url + "/ui"))
    signed_in_page(driver)


def signed_in_page(driver: WebDriver) -> None:
    """The page has asked /ui/session and shows who is signed in (on the account view,
    whichever view is open)."""
    wait(driver).until(lambda d: d.find_element(By.ID, "sso-in").get_attribute("hidden")
                       is None)


def fetch(driver: WebDriver, path: str, method: str = "GET", csrf: bool = True,
          body: Any = None) -> dict[str, Any]:
    """``fetch`` from the page, with the session cookie (and its CSRF token unless
    ``csrf`` is false): {status, body}."""
    return dict(driver.execute_async_script("""
        const [path, method, withCsrf, body, done] = arguments;
        (async () => {
          const who = await (await fetch('/ui/session', {credentials: 'same-origin'})).json();
          const headers = {'content-type': 'application/json'};
          if (withCsrf && who.csrf) headers['x-otela-csrf'] = who.csrf;
          const r = await fetch(path, {method, credentials: 'same-origin', headers,
                                       body: body === null ? undefined : JSON.stringify(body)});
          done({status: r.status, body: await r.json()});
        })().catch((e) => done({status: -1, body: String(e)}));
    """, path, method, csrf, body))


def failure(driver: WebDriver) -> tuple[str, str]:
    """The sign-in failure page's (code, message)."""
    page = wait(driver).until(EC.visibility_of_element_located((By.ID, "sso-failure")))
    return str(page.get_attribute("data-code")), visible_text(driver, "sso-message")


def held_callback(driver: WebDriver, sso: Sso, user: str = "bob") -> str:
    """Start a sign-in but keep the provider's answer from being used: the callback URL
    (code, state) the provider sent the browser to, with the sign-in still under way.
    Every cookie is cleared first (signed out of the provider and of the ingress).

    The browser's sign-in cookie (HttpOnly; read through the DevTools protocol) is taken
    away while the provider's pages are answered as ``user``, so the callback finds no
    sign-in (and uses nothing); then it is put back."""
    fresh(driver)  # signed out at the provider too: it shows its login page
    start_sign_in(driver, sso)
    wait(driver).until(EC.visibility_of_element_located((By.NAME, "login")))
    cookies = driver.execute_cdp_cmd("Network.getAllCookies", {})["cookies"]
    login = next(c for c in cookies if c["name"] == "otela_sso_login")
    driver.execute_cdp_cmd("Network.deleteCookies", {
        "name": login["name"], "domain": login["domain"], "path": login["path"]})

    def step(d: WebDriver) -> bool:
        if d.find_elements(By.ID, "sso-failure"):
            return True
        if d.find_elements(By.NAME, "login"):
            at_provider_sign_in(d, user)
        elif d.find_elements(By.XPATH, "//button[normalize-space()='Continue']"):
            consent(d)
        return False

    wait(driver).until(step)
    assert failure(driver)[0] == "no_sign_in"
    driver.execute_cdp_cmd("Network.setCookie", {
        key: login[key] for key in ("name", "value", "domain", "path", "httpOnly",
                                    "secure", "sameSite") if key in login})
    return str(driver.current_url)


def with_query(url: str, **changes: str) -> str:
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
    query.update(changes)
    return parts._replace(query=urlencode(query)).geturl()


# -- the tests ----------------------------------------------------------------------------

def test_an_admin_signs_in_manages_keys_with_the_session_and_signs_out(
        browser: WebDriver, sso: Sso) -> None:
    sign_in(browser, sso, "alice")
    assert browser.current_url.endswith("/ui#admin")  # admins land on the admin view
    wait(browser).until(EC.visibility_of_element_located(
        (By.CSS_SELECTOR, f'#keys-body tr[data-key="{sso.team_key}"]')))
    assert not browser.find_element(By.ID, "admin-form").is_displayed()  # no token asked
    sso.shot(browser, "1-admin-signed-in")
    browser.find_element(By.ID, "tab-account").click()
    facts = visible_text(browser, "sso-facts")
    assert "alice@uni.example" in facts and "team: physics-lab" in facts and "admin" in facts
    assert browser.find_element(By.ID, "sso-name").text == "Alice Admin"

    # The user was made from the provider's claims: team and admin mapped.
    (user_id, email, name, team, admin, created, last), = sso.rows(
        "SELECT id, email, name, team, admin, created_at, last_login_at FROM users "
        "WHERE issuer = ? AND subject = 'alice'", sso.provider.issuer)
    assert (email, name, team, admin) == ("alice@uni.example", "Alice Admin", "physics-lab", 1)
    assert created <= last <= time.time()

    # The admin API with the session: reads, and a change, in the user's name.
    listed = fetch(browser, "/v1/admin/keys")
    assert listed["status"] == 200 and sso.team_key in {k["id"] for k in listed["body"]["data"]}
    made = fetch(browser, "/v1/admin/keys", "POST", body={"owner": "alice", "name": "sso"})
    assert made["status"] == 200, made
    (actor,), = sso.rows("SELECT actor FROM api_key_audit WHERE key_id = ?",
                         made["body"]["id"])
    assert actor.startswith(f"alice@uni.example ({user_id}, signed in)"), actor
    # ... but never without the session's CSRF token (what another site's form could send).
    before = len(sso.rows("SELECT id FROM api_keys"))
    forged = fetch(browser, "/v1/admin/keys", "POST", csrf=False, body={"owner": "mallory"})
    assert forged["status"] == 403 and forged["body"]["error"]["code"] == "csrf_token_invalid"
    assert len(sso.rows("SELECT id FROM api_keys")) == before

    # The session cookie is HttpOnly (the page's script cannot read it) and SameSite=Lax.
    cookie = browser.get_cookie("otela_session")
    assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Lax"
    assert "otela_session" not in browser.execute_script("return document.cookie")

    # Signing out ends the session server side: the old cookie opens nothing any more.
    browser.find_element(By.ID, "tab-admin").click()
    wait(browser).until(EC.element_to_be_clickable((By.ID, "admin-signout"))).click()
    wait(browser).until(EC.visibility_of_element_located((By.ID, "sso-out")))
    assert sso.rows("SELECT COUNT(*) FROM ui_sessions WHERE user_id = ?", user_id) == [(0,)]
    sso.shot(browser, "2-admin-signed-out")
    browser.add_cookie({"name": "otela_session", "value": cookie["value"], "path": "/"})
    again = fetch(browser, "/v1/admin/keys")
    assert again["status"] == 401 and again["body"]["error"]["code"] == "session_expired"


def test_a_team_member_sees_the_team_but_no_admin_data_and_keys_still_work(
        browser: WebDriver, sso: Sso) -> None:
    sign_in(browser, sso, "bob")
    assert browser.current_url.endswith("/ui#account")
    facts = visible_text(browser, "sso-facts")
    assert "team: physics-lab" in facts and "not an admin" in facts
    wait(browser).until(EC.visibility_of_element_located(
        (By.CSS_SELECTOR, f'#sso-team-keys li[data-key="{sso.team_key}"]')))
    assert sso.rows("SELECT team, admin FROM users WHERE subject = 'bob'") == \
        [("physics-lab", 0)]
    sso.shot(browser, "3-member-signed-in")

    refused = fetch(browser, "/v1/admin/keys")
    assert refused["status"] == 403 and refused["body"]["error"]["code"] == "admin_only"
    own_keys(browser, sso)
    browser.find_element(By.ID, "tab-admin").click()
    wait(browser).until(EC.visibility_of_element_located((By.ID, "admin-form")))
    assert not browser.find_element(By.ID, "admin").is_displayed()

    # A key holder signs in with a key exactly as before, SSO cookie or not.
    sign_in_key(browser, sso.url, sso.team_key_secret)
    wait(browser).until(lambda d: sso.team_key in d.find_element(By.ID, "key-info").text)
    # The admin token still works too.
    token = httpx.get(f"{sso.url}/v1/admin/keys", timeout=5, trust_env=False,
                      headers={"authorization": f"Bearer {sso.admin_token}"})
    assert token.status_code == 200

    # An expired session: the page offers a new sign-in, the API says why.
    sso.rows("UPDATE ui_sessions SET expires_at = 0")
    open_page(browser, sso.url, "account")
    wait(browser).until(EC.visibility_of_element_located((By.ID, "sso-expired")))
    expired = fetch(browser, "/v1/admin/keys")
    assert expired["status"] == 401 and expired["body"]["error"]["code"] == "session_expired"


def own_keys(browser: WebDriver, sso: Sso) -> None:
    """Bob (signed in, no admin) sees the key an admin gave him, makes one of his own in
    the page (in his team, named after him, its secret shown once), and revokes the
    given one with two clicks; his keys work, and say whose they are."""
    wait(browser).until(EC.visibility_of_element_located((By.ID, "my-keys-none")))
    given = httpx.post(f"{sso.url}/v1/admin/keys", trust_env=False, timeout=10,
                       headers={"authorization": f"Bearer {sso.admin_token}"},
                       json={"owner": "bob", "name": "given", "user": "bob@uni.example"})
    assert given.status_code == 200, given.text
    (bob_id,), = sso.rows("SELECT id FROM users WHERE subject = 'bob'")
    assert given.json()["user_id"] == bob_id
    open_page(browser, sso.url, "account")
    given_item = f'#my-keys li[data-key="{given.json()["id"]}"]'
    wait(browser).until(EC.visibility_of_element_located((By.CSS_SELECTOR, given_item)))
    assert not browser.find_element(By.ID, "my-keys-none").is_displayed()

    browser.find_element(By.ID, "my-key-name").send_keys("bob's laptop")
    browser.find_element(By.ID, "my-key-create").click()
    secret = visible_text(browser, "my-key-secret-value")
    made_id = browser.find_element(By.ID, "my-key-secret").get_attribute("data-key")
    wait(browser).until(EC.visibility_of_element_located(
        (By.CSS_SELECTOR, f'#my-keys li[data-key="{made_id}"]')))
    assert sso.rows("SELECT owner, name, team, user_id FROM api_keys WHERE id = ?",
                    made_id) == [("bob@uni.example", "bob's laptop", "physics-lab", bob_id)]
    me = httpx.get(f"{sso.url}/v1/me", trust_env=False, timeout=5,
                   headers={"authorization": f"Bearer {secret}"})
    assert me.status_code == 200 and me.json()["user"]["email"] == "bob@uni.example"
    sso.shot(browser, "3b-member-own-keys")

    def revoke_button(d: WebDriver) -> Any:
        return d.find_element(By.CSS_SELECTOR, f"{given_item} button[data-action=revoke]")
    revoke_button(browser).click()
    wait(browser).until(lambda d: revoke_button(d).text == "Confirm revoke")
    revoke_button(browser).click()
    wait(browser).until(lambda d: "revoked" in d.find_element(By.CSS_SELECTOR,
                                                              given_item).text)
    (revoked_at,), = sso.rows("SELECT revoked_at FROM api_keys WHERE id = ?",
                              given.json()["id"])
    assert revoked_at is not None
    (actor,), = sso.rows("SELECT actor FROM api_key_audit WHERE key_id = ? AND action = "
                         "'revoke'", given.json()["id"])
    assert actor.startswith(f"bob@uni.example ({bob_id}, signed in, own key)"), actor
    assert httpx.get(f"{sso.url}/v1/me", trust_env=False, timeout=5, headers={
        "authorization": f"Bearer {given.json()['key']}"}).status_code == 401
    sso.shot(browser, "3c-member-revoked-own-key")


def test_declined_altered_replayed_and_reused_sign_ins_are_refused(
        browser: WebDriver, sso: Sso) -> None:
    fresh(browser)
    # The user declines at the provider.
    start_sign_in(browser, sso)
    at_provider_sign_in(browser, "bob")
    wait(browser).until(EC.element_to_be_clickable(
        (By.CSS_SELECTOR, "a[href$='/abort']"))).click()
    code, message = failure(browser)
    assert code == "sign_in_declined" and "access_denied" in message, message
    sso.shot(browser, "4-declined")

    # An altered state: refused, and that sign-in is spent.
    url = held_callback(browser, sso)
    assert "code=" in url and "state=" in url
    browser.get(with_query(url, state=secrets.token_urlsafe(16)))
    assert failure(browser)[0] == "state_mismatch"
    sso.shot(browser, "5-state-mismatch")

    # A callback used once signs in; the same URL again finds no sign-in under way.
    first = held_callback(browser, sso)
    browser.get(first)
    signed_in_page(browser)
    browser.get(first)
    assert failure(browser)[0] == "no_sign_in"

    # A code the provider already redeemed, brought to a fresh sign-in: the provider
    # refuses it, and the page says so.
    fresh_state = parse_qs(urlsplit(held_callback(browser, sso)).query)["state"][0]
    browser.get(with_query(first, state=fresh_state))
    code, message = failure(browser)
    assert code == "code_refused" and "invalid_grant" in message, message
    sso.shot(browser, "6-code-reused")
    assert sso.federation.nodes and httpx.get(f"{sso.url}/v1/health", timeout=5,
                                              trust_env=False).status_code == 200


def test_an_unreachable_provider_is_a_page_not_a_crash(sso: Sso) -> None:
    port = free_port()
    node = sso.federation.start_node(
        "ingress-no-op", ingress=True,
        extra_args=["--ingress-db", str(sso.db.parent / "other.sqlite"),
                    "--http-port", str(port)],
        extra_env=sso_env(f"http://127.0.0.1:{free_port()}", port, "unused"))
    page = httpx.get(f"{node.http_url}/ui/login", timeout=15, trust_env=False)
    assert page.status_code == 502 and 'data-code="provider_unreachable"' in page.text
    assert "cannot be reached" in page.text and "Traceback" not in page.text
    assert "unused" not in page.text  # the client secret is never shown
    assert httpx.get(f"{node.http_url}/v1/health", timeout=5,
                     trust_env=False).status_code == 200
    log = (sso.federation.root / "ingress-no-op" / "node.log").read_text()
    assert "provider_unreachable" in log and "unused" not in log
