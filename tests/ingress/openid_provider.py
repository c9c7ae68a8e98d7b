"""A real OpenID provider for the SSO tests: the certified ``oidc-provider`` (npm), run
by Node.js from ``tests/ingress/oidc`` (``provider.mjs``) on 127.0.0.1.

Its packages are installed from the committed lockfile by ``scripts/bootstrap`` (``npm
ci``); where that has not run, the first test that needs the provider runs it. Client
secrets and the provider's keys are made at test time."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).parent / "oidc"
READY_S = 20.0


class ProviderMissing(Exception):
    """Node.js or npm is not installed, or ``npm ci`` failed."""


@dataclass(frozen=True)
class OpenIDProvider:
    issuer: str
    client_id: str
    client_secret: str
    log: Path


def ensure_installed() -> None:
    """``npm ci`` in ``tests/ingress/oidc`` unless its packages match the lockfile."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        raise ProviderMissing("Node.js and npm are needed for the OpenID provider "
                              "(apt-get install nodejs npm; Node 20 or later)")
    stamp = HERE / "node_modules" / ".package-lock.json"
    lock = HERE / "package-lock.json"
    if stamp.is_file() and stamp.stat().st_mtime >= lock.stat().st_mtime:
        return
    done = subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                          cwd=HERE, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise ProviderMissing(f"npm ci in {HERE} failed: {done.stderr.strip()[-500:]}")


@contextmanager
def openid_provider(port: int, client_id: str, client_secret: str, redirect_uri: str,
                    users: dict[str, dict[str, Any]], log: Path) -> Iterator[OpenIDProvider]:
    """Run the provider until the block ends; ``users``: account id -> its claims."""
    ensure_installed()
    issuer = f"http://127.0.0.1:{port}"
    config = {"port": port, "issuer": issuer, "users": users,
              "client": {"id": client_id, "secret": client_secret,
                         "redirect_uri": redirect_uri}}
    env = {**os.environ, "OIDC_TEST_CONFIG": json.dumps(config)}
    with open(log, "ab") as out:
        proc = subprocess.Popen(["node", str(HERE / "provider.mjs")], cwd=HERE, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + READY_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the OpenID provider exited ({proc.returncode}): "
                                   f"{log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{issuer}/.well-known/openid-configuration", timeout=2,
                             trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the OpenID provider did not start: "
                                   f"{log.read_text()[-2000:]}")
            time.sleep(0.1)
        yield OpenIDProvider(issuer, client_id, client_secret, log)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
