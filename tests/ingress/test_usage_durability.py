"""Usage accounting survives a SIGKILL of the ingress: every response that finished 100 ms
before the kill is in the database with the tokens the client was told, nothing is
counted twice, and after a restart on the same database the rest of the load is counted
too. Real processes, a real SQLite file."""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

from otela.testing.localfed import (
    LocalFederation,
    LocalNode,
    echo_engine_command,
    free_port,
    wait_for,
)

pytestmark = pytest.mark.slow

MODEL = "echo-durable"
ADMIN = "durability-admin-token-000000000"
TOTAL = 200
KILL_AFTER = 100
WORKERS = 8


@dataclass
class Success:
    request_id: str
    finished: float  # time.monotonic() when the client had the whole answer
    tokens: tuple[int, int]


def chat(node: LocalNode, key: str, request_id: str) -> Success | None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": f"count {request_id}"}]}
    try:
        answer = httpx.post(f"{node.http_url}/v1/chat/completions", json=body, timeout=10,
                            trust_env=False, headers={"authorization": f"Bearer {key}",
                                                      "x-request-id": request_id})
    except httpx.HTTPError:
        return None
    if answer.status_code != 200:
        return None
    used = answer.json()["usage"]
    return Success(request_id, time.monotonic(),
                   (used["prompt_tokens"], used["completion_tokens"]))


def rows(db: str) -> dict[str, list[tuple[int, int, int]]]:
    with sqlite3.connect(db) as conn:
        found: dict[str, list[tuple[int, int, int]]] = {}
        for request_id, prompt, completion, status in conn.execute(
                "SELECT request_id, prompt_tokens, completion_tokens, status FROM usage"):
            found.setdefault(request_id, []).append((prompt, completion, status))
    return found


def test_sigkill_loses_no_finished_request_and_counts_none_twice(tmp_path):
    db = str(tmp_path / "usage.db")
    args = ["--ingress-db", db]
    env = {"OTELA_ADMIN_TOKEN": ADMIN}
    with LocalFederation(tmp_path) as fed:
        ingress = fed.start_node("ingress", ingress=True, extra_args=args, extra_env=env)
        server = fed.start_node("server", bootstrap=[ingress], provider_id="prov-a",
                                process=echo_engine_command(free_port(), [MODEL]))
        wait_for(lambda: ingress.states().get(server.session_id) == "SERVING", 20,
                 "the server to serve")
        key = httpx.post(f"{ingress.http_url}/v1/admin/keys", json={"owner": "load"},
                         headers={"authorization": f"Bearer {ADMIN}"}, trust_env=False,
                         timeout=10).json()["key"]

        successes: list[Success] = []
        lock = threading.Lock()
        killed_at: list[float] = []

        def one(index: int) -> None:
            done = chat(ingress, key, f"load-{index:04d}")
            if done is None:
                return
            with lock:
                successes.append(done)
                if len(successes) == KILL_AFTER and not killed_at:
                    killed_at.append(time.monotonic())
                    ingress.process.send_signal(signal.SIGKILL)

        with ThreadPoolExecutor(WORKERS) as pool:
            list(pool.map(one, range(TOTAL)))
        ingress.process.wait(10)
        assert killed_at, "the ingress was never killed"
        kill = killed_at[0]
        before_kill = {s.request_id: s for s in successes}

        # Every answer that finished 100 ms before the kill is there, once, exactly.
        stored = rows(db)
        for success in successes:
            if success.finished <= kill - 0.1:
                assert stored.get(success.request_id) == [(*success.tokens, 200)], \
                    success.request_id
        assert all(len(found) == 1 for found in stored.values())
        # A row nobody saw answered can only be one in flight at the kill.
        unseen = set(stored) - set(before_kill)
        assert len(unseen) <= WORKERS and all(i.startswith("load-") for i in unseen)

        # Restart on the same database: the rest of the load is counted as well.
        restarted = fed.start_node("ingress", ingress=True, extra_args=args, extra_env=env,
                                   bootstrap=[server])
        wait_for(lambda: restarted.states().get(server.session_id) == "SERVING", 20,
                 "the restarted ingress to see the server")
        retried = [chat(restarted, key, f"retry-{i:04d}") for i in
                   range(TOTAL - len(successes))]
        assert all(r is not None for r in retried)

        def all_counted() -> bool:
            return sum(1 for i in rows(db) if i.startswith("retry-")) == len(retried)
        wait_for(all_counted, 5, "the retried requests' rows")
        final = rows(db)
        for success in [*successes, *(r for r in retried if r is not None)]:
            if success.request_id.startswith("retry-") or success.finished <= kill - 0.1:
                assert final[success.request_id] == [(*success.tokens, 200)]
        assert all(len(found) == 1 for found in final.values())
        assert {i for i in final if i.startswith("load-")} == set(stored)  # none re-written
