"""Fixtures of the ingress tests: a real PostgreSQL server (``otela.testing.localpg``), started
once per session, with a fresh database on it per test; and, for the dashboard, the
system's headless Chromium driven by Selenium."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otela.testing.localpg import PostgresMissing, create_database, local_postgres


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    try:
        with local_postgres() as url:
            yield url
    except PostgresMissing as exc:
        pytest.skip(str(exc))


@pytest.fixture
def postgres_db(postgres_url: str, request: pytest.FixtureRequest) -> str:
    return create_database(postgres_url, "t_" + request.node.name.lower())


CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One Chromium per test module, with a fresh profile; its console log is captured
    (``goog:loggingPrefs``) so tests can assert it has no errors."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    for binary in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(str(binary)) is None:
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
