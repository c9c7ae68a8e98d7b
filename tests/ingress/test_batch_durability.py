"""The Batch API's durability and its PostgreSQL dialect, with real processes: an ingress
killed with SIGKILL halfway through a batch and restarted on the same database finishes it
with every line's result exactly once (only a line in flight at the kill runs twice: its
result was never recorded); the whole flow on PostgreSQL."""

from __future__ import annotations

import json
import signal
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from otela.testing.localfed import (
    LocalFederation,
    LocalNode,
    echo_engine_command,
    free_port,
    wait_for,
)

pytestmark = pytest.mark.slow  # otela processes, an echo engine, a PostgreSQL server

MODEL = "echo-batch-durable"
ADMIN = "batch-durable-admin-token-000000"
CONCURRENCY = 8
TERMINAL = {"completed", "failed", "cancelled", "expired"}
SEEN = "batch-line-seen"


def make_key(node: LocalNode, owner: str) -> dict[str, Any]:
    made = httpx.post(f"{node.http_url}/v1/admin/keys", json={"owner": owner},
                      headers={"authorization": f"Bearer {ADMIN}"}, trust_env=False,
                      timeout=10)
    made.raise_for_status()
    return dict(made.json())


def client_of(node: LocalNode, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{node.http_url}/v1", api_key=key, max_retries=0,
                         timeout=30)


def batch_file(total: int, extra: tuple[str, ...] = ()) -> bytes:
    lines = [json.dumps({"custom_id": f"c-{i}", "method": "POST",
                         "url": "/v1/chat/completions",
                         "body": {"model": MODEL, "max_tokens": 8,
                                  "messages": [{"role": "user", "content": f"n{i}"}]}})
             for i in range(total)]
    return ("\n".join([*lines, *extra]) + "\n").encode()


def finished(client: openai.OpenAI, batch_id: str, timeout: float) -> Any:
    return wait_for(lambda: (b := client.batches.retrieve(batch_id)).status in TERMINAL and b,
                    timeout, f"batch {batch_id} to finish", interval=0.25)


def check_output(client: openai.OpenAI, file_id: str | None, total: int) -> None:
    assert file_id is not None
    output = [json.loads(line) for line in client.files.content(file_id).text.splitlines()]
    assert [o["custom_id"] for o in output] == [f"c-{i}" for i in range(total)]
    for index, line in enumerate(output):
        assert line["response"]["body"]["choices"][0]["message"]["content"] == \
            f"echo: n{index}"


def engine_requests(server: LocalNode) -> int:
    """Chat requests the echo engine received (it logs ``SEEN`` on each)."""
    log = server.home / "logs" / "engine.log"
    if not log.exists():
        return 0
    return sum(1 for line in log.read_text().splitlines() if line.strip() == SEEN)


def start_pair(fed: LocalFederation, args: list[str], env: dict[str, str],
               engine_args: tuple[str, ...] = ()) -> tuple[LocalNode, LocalNode]:
    ingress = fed.start_node("ingress", ingress=True, extra_args=args, extra_env=env)
    server = fed.start_node("server", bootstrap=[ingress], provider_id="prov-a",
                            process=echo_engine_command(free_port(), [MODEL], *engine_args))
    serving(ingress, server)
    return ingress, server


def serving(ingress: LocalNode, server: LocalNode) -> None:
    wait_for(lambda: ingress.states().get(server.session_id) == "SERVING", 30,
             "the ingress to see the server serving")
    wait_for(lambda: ingress.session_id in server.states(), 30,
             "the server to know the ingress")


def test_sigkill_mid_batch_then_restart_runs_every_line_once(tmp_path: Path) -> None:
    db = tmp_path / "ingress.db"
    args = ["--ingress-db", str(db)]
    env = {"OTELA_ADMIN_TOKEN": ADMIN, "OTELA_BATCH_CONCURRENCY": str(CONCURRENCY)}
    total = 600
    with LocalFederation(tmp_path) as fed:
        ingress, server = start_pair(fed, args, env, ("--request-delay", "0.02",
                                                      "--log-on-request", SEEN))
        made = make_key(ingress, "durable")
        client = client_of(ingress, made["key"])
        uploaded = client.files.create(file=("in.jsonl", batch_file(total)), purpose="batch")
        batch = client.batches.create(input_file_id=uploaded.id,
                                      endpoint="/v1/chat/completions",
                                      completion_window="24h")
        wait_for(lambda: (c := client.batches.retrieve(batch.id).request_counts) is not None
                 and c.completed >= total // 4, 60, "a quarter of the lines", interval=0.05)
        ingress.process.send_signal(signal.SIGKILL)
        ingress.process.wait(10)
        with sqlite3.connect(db) as conn:
            status, recorded = conn.execute(
                "SELECT status, completed FROM batches WHERE id = ?", (batch.id,)).fetchone()
        assert status == "in_progress" and total // 4 <= recorded < total

        restarted = fed.start_node("ingress", ingress=True, extra_args=args, extra_env=env,
                                   bootstrap=[server])
        serving(restarted, server)
        client = client_of(restarted, made["key"])
        done = finished(client, batch.id, 180)
        assert done.status == "completed", done
        assert done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (total, 0)
        check_output(client, done.output_file_id, total)

        # The engine saw every line once, and a few twice: those in flight at the kill,
        # whose results were never recorded (usage rows cannot tell: a row written less
        # than a flush interval before the kill is lost with the process).
        wait_for(lambda: engine_requests(server) >= total, 10, "the engine's log")
        assert total <= engine_requests(server) <= total + CONCURRENCY


def test_the_whole_flow_on_postgresql(tmp_path: Path, postgres_db: str) -> None:
    env = {"OTELA_ADMIN_TOKEN": ADMIN}
    total = 150
    with LocalFederation(tmp_path) as fed:
        ingress, _ = start_pair(fed, ["--ingress-db", postgres_db], env)
        owner, stranger = make_key(ingress, "pg-owner"), make_key(ingress, "pg-stranger")
        client = client_of(ingress, owner["key"])
        uploaded = client.files.create(file=("pg.jsonl", batch_file(total, ("[1, 2]",))),
                                       purpose="batch")
        batch = client.batches.create(input_file_id=uploaded.id,
                                      endpoint="/v1/chat/completions",
                                      completion_window="24h")
        done = finished(client, batch.id, 120)
        assert done.status == "completed"
        assert done.request_counts is not None
        assert (done.request_counts.total, done.request_counts.completed,
                done.request_counts.failed) == (total + 1, total, 1)
        check_output(client, done.output_file_id, total)
        assert done.error_file_id is not None
        [error] = client.files.content(done.error_file_id).text.splitlines()
        assert json.loads(error)["error"]["code"] == "invalid_json"
        assert [b.id for b in client.batches.list()] == [batch.id]
        other = client_of(ingress, stranger["key"])
        assert list(other.batches.list()) == []
        with pytest.raises(openai.NotFoundError):
            other.files.content(done.output_file_id)  # type: ignore[arg-type]
        # An unfinished batch on PostgreSQL can be cancelled too.
        again = client.batches.create(input_file_id=uploaded.id,
                                      endpoint="/v1/chat/completions",
                                      completion_window="24h")
        cancelled = client.batches.cancel(again.id)
        assert cancelled.status in ("cancelling", "cancelled", "completed")
        assert finished(client, again.id, 60).status in ("cancelled", "completed")


def test_an_ingress_with_data_path_workers_runs_batches(tmp_path: Path) -> None:
    """With --workers the port is the workers': they check the control process's runner
    credential with the node's shared secret, so its lines are served, as their key."""
    args = ["--ingress-db", str(tmp_path / "ingress.db"), "--workers", "2"]
    with LocalFederation(tmp_path) as fed:
        ingress, _ = start_pair(fed, args, {"OTELA_ADMIN_TOKEN": ADMIN})
        made = make_key(ingress, "workers")
        client = client_of(ingress, made["key"])
        uploaded = client.files.create(file=("in.jsonl", batch_file(40)), purpose="batch")
        batch = client.batches.create(input_file_id=uploaded.id,
                                      endpoint="/v1/chat/completions",
                                      completion_window="24h")
        done = finished(client, batch.id, 120)
        assert done.status == "completed", done
        assert done.request_counts.completed == 40 and done.request_counts.failed == 0
        check_output(client, done.output_file_id, 40)

        def requests_counted() -> int:
            usage = httpx.get(f"{ingress.http_url}/v1/me/usage", trust_env=False, timeout=10,
                              headers={"authorization": f"Bearer {made['key']}"}).json()
            return int(usage["totals"]["requests"])

        # the lines counted as the key's requests (usage rows are written in batches)
        wait_for(lambda: requests_counted() == 40, 30, "40 usage rows for the key")
