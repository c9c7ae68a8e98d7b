"""Periodic health checks of a running engine; repeated failure means fail-stop.

One failed check proves little (a busy engine may answer slowly), so only
``failures`` consecutive failures count. Engines with a ``/health`` endpoint (vLLM,
SGLang, llama.cpp, echo) are asked there; any other OpenAI server via ``/v1/models``.
"""

from __future__ import annotations

import logging

import httpx
import trio

from otela.engine.command import EngineCommand

log = logging.getLogger("otela.engine")

_HEALTH_PATH = {"vllm": "/health", "sglang": "/health", "llama.cpp": "/health", "echo": "/health"}
CHECK_TIMEOUT_S = 10.0


def health_url(command: EngineCommand) -> str:
    return command.url + _HEALTH_PATH.get(command.kind, "/v1/models")


async def check_once(client: httpx.AsyncClient, url: str) -> str | None:
    """``None`` if healthy, else why not."""
    try:
        response = await client.get(url, timeout=CHECK_TIMEOUT_S)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None if response.status_code == 200 else f"HTTP {response.status_code}"


async def watch_health(
    client: httpx.AsyncClient, command: EngineCommand, interval: float, failures: int
) -> str:
    """Return (with the last reason) once ``failures`` checks in a row have failed."""
    url = health_url(command)
    failed = 0
    while True:
        await trio.sleep(interval)
        reason = await check_once(client, url)
        if reason is None:
            failed = 0
            continue
        failed += 1
        log.warning("engine health check %d/%d failed: %s", failed, failures, reason)
        if failed >= failures:
            return f"{failures} health checks in a row failed at {url} (last: {reason})"


def check_reachable(base_url: str, timeout: float = 5.0) -> None:
    """Raise ``ValueError`` naming the problem if nothing answers at ``base_url``.

    For ``--engine-url`` without ``--process``: otela launches nothing, so an engine that
    does not answer at start is a configuration mistake, reported before joining.
    """
    url = f"{base_url.rstrip('/')}/v1/models"
    try:
        response = httpx.get(url, timeout=timeout, trust_env=False)
    except httpx.HTTPError as exc:
        raise ValueError(f"engine URL {base_url} is unreachable: {exc}") from None
    if response.status_code != 200:
        raise ValueError(f"engine URL {base_url} answered HTTP {response.status_code} at {url}")
