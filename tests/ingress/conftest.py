"""Fixtures of the ingress tests: a real PostgreSQL server — Debian's binaries, run as
the ``postgres`` user (they refuse root) on a private directory, port and socket
directory, started once per session and removed afterwards — and, for the dashboard, the
system's headless Chromium driven by Selenium."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from otela.localfed import wait_for


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_postgres(*argv: str) -> list[str]:
    return list(argv) if os.geteuid() != 0 else ["runuser", "-u", "postgres", "--", *argv]


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        pytest.skip("PostgreSQL is not installed (scripts/bootstrap installs it with apt)")
    bin_dir = Path(found[-1]).parent
    root = Path(tempfile.mkdtemp(prefix="otela-pg-"))
    data, sockets = root / "data", root / "sock"
    sockets.mkdir()
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(sockets, "postgres")
    port = _free_port()
    subprocess.run(_as_postgres(str(bin_dir / "initdb"), "-D", str(data), "-A", "trust",
                                "-U", "postgres", "--no-sync"),
                   check=True, capture_output=True)
    subprocess.run(_as_postgres(
        str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-o",
        f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off "
        "-c max_connections=200", "start"), check=True, capture_output=True)
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    try:
        import psycopg

        def ready() -> bool:
            try:
                with psycopg.connect(url, connect_timeout=2):
                    return True
            except psycopg.OperationalError:
                return False
        wait_for(ready, 30, "PostgreSQL to accept connections")
        yield f"postgresql://postgres@127.0.0.1:{port}"
    finally:
        subprocess.run(_as_postgres(str(bin_dir / "pg_ctl"), "-D", str(data), "-m",
                                    "immediate", "stop"), capture_output=True)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def postgres_db(postgres_url: str, request: pytest.FixtureRequest) -> str:
    """A fresh database on the session's server, for one test."""
    import psycopg

    name = "t_" + request.node.name.lower().replace("[", "_").replace("]", "")[:50]
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    with psycopg.connect(f"{postgres_url}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{postgres_url}/{name}"


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
