"""Fair sharing with the ingress service on PostgreSQL: keys' scheduling fields and team
weights are stored and read there (migrations 4 and 5 on PostgreSQL), and the queue
orders a contended model's requests by class (``tests/integration/test_fair_sharing.py``
checks the shares and deadlines on SQLite)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from otela.testing.localfed import LocalFederation, echo_engine_command, free_port, wait_for

pytestmark = pytest.mark.slow  # a PostgreSQL server and otela processes

MODEL = "echo-fair-pg"
ADMIN = "fair-pg-admin-token-0123456789abcdef"
LONG = " ".join(["word"] * 30)  # ~1 s of generation at 30 ms a token


def test_classes_and_teams_on_postgresql(tmp_path: Path, postgres_db: str) -> None:
    with LocalFederation(tmp_path) as fed:
        ingress = fed.start_node("ingress", ingress=True, provider_id="prov-pg",
                                 extra_args=["--ingress-db", postgres_db],
                                 extra_env={"OTELA_ADMIN_TOKEN": ADMIN})
        fed.start_node("server", bootstrap=[ingress], provider_id="prov-pg",
                       process=echo_engine_command(free_port(), [MODEL], "--token-delay",
                                                   "0.03", "--max-concurrency", "2"))

        def admin(method: str, path: str, body: Any = None) -> Any:
            answer = httpx.request(method, f"{ingress.http_url}/v1/admin{path}", json=body,
                                   headers={"authorization": f"Bearer {ADMIN}"},
                                   trust_env=False, timeout=10)
            assert answer.status_code == 200, answer.text
            return answer.json()

        normal = admin("POST", "/keys", {"owner": "normal", "team": "lab", "weight": 2})
        urgent = admin("POST", "/keys", {"owner": "urgent", "priority": "interactive"})
        assert normal["scheduling"] == {"team": "lab", "weight": 2.0, "priority": None,
                                        "queue_wait": None}
        admin("PUT", "/teams/lab", {"weight": 3})
        assert admin("GET", "/teams")["data"] == [
            {"object": "team", "name": "lab", "weight": 3.0, "keys": 1, "budget_tokens": None,
             "budget_spend": None, "budget_period": "lifetime", "models": None,
             "providers": None, "limits": {"rpm": None, "tpm": None, "max_concurrent": None},
             "priority": None}]

        def chat_sync(secret: str) -> int:
            return httpx.post(f"{ingress.http_url}/v1/chat/completions", trust_env=False,
                              timeout=30, headers={"authorization": f"Bearer {secret}"},
                              json={"model": MODEL, "messages": [
                                  {"role": "user", "content": "hi"}]}).status_code

        wait_for(lambda: chat_sync(normal["key"]) == 200, 60, "the model served")
        finished: list[str] = []

        async def one(client: httpx.AsyncClient, name: str, secret: str,
                      priority: str | None = None) -> None:
            headers = {"authorization": f"Bearer {secret}"}
            if priority:
                headers["x-otela-priority"] = priority
            answer = await client.post(
                f"{ingress.http_url}/v1/chat/completions", headers=headers, timeout=120,
                json={"model": MODEL, "messages": [{"role": "user", "content": LONG}]})
            assert answer.status_code == 200, answer.text
            finished.append(name)

        def waiting() -> float:
            text = httpx.get(f"{ingress.http_url}/metrics", trust_env=False).text
            return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith("otela_queue_requests{"))

        async def main() -> None:
            with trio.fail_after(120):
                async with httpx.AsyncClient(trust_env=False) as client, \
                        trio.open_nursery() as nursery:
                    for i in range(8):  # two run, six wait
                        nursery.start_soon(one, client, f"default{i}", normal["key"])
                    while waiting() < 6:
                        await trio.sleep(0.05)
                    nursery.start_soon(one, client, "batch", normal["key"], "batch")
                    nursery.start_soon(one, client, "urgent", urgent["key"], "interactive")

        trio.run(main)
        assert "batch" in finished[-2:]  # dispatched after every default request
        assert finished.index("urgent") <= 4  # next after the two running
