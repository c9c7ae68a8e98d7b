"""The OpenAI Batch API on a real ingress (SQLite): the official ``openai`` client uploads a
file, makes, lists, reads and cancels batches and reads their output and error files; every
line goes through the node's own request path (usage rows, one per line); malformed lines
end in the error file; another key sees nothing of it; oversized and wrong uploads are
refused cleanly. The restart and PostgreSQL tests are in ``test_batch_durability.py``."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
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

pytestmark = pytest.mark.slow  # otela processes and echo engines

FAST = "echo-batch"
SLOW = "echo-batch-slow"
ADMIN = "batch-admin-token-00000000000000"
MAX_FILE = 1024 * 1024
TERMINAL = {"completed", "failed", "cancelled", "expired"}


@dataclass
class Setup:
    ingress: LocalNode
    db: Path
    key: str
    key_id: str
    other: str

    def client(self, key: str | None = None) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.ingress.http_url}/v1", api_key=key or self.key,
                             max_retries=0, timeout=30)


def make_key(node: LocalNode, owner: str) -> dict[str, Any]:
    made = httpx.post(f"{node.http_url}/v1/admin/keys", json={"owner": owner},
                      headers={"authorization": f"Bearer {ADMIN}"}, trust_env=False,
                      timeout=10)
    made.raise_for_status()
    return dict(made.json())


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    root = tmp_path_factory.mktemp("batch")
    db = root / "ingress.db"
    env = {"OTELA_ADMIN_TOKEN": ADMIN, "OTELA_BATCH_MAX_FILE": str(MAX_FILE),
           "OTELA_BATCH_CONCURRENCY": "8"}
    with LocalFederation(root) as fed:
        ingress = fed.start_node("ingress", ingress=True,
                                 extra_args=["--ingress-db", str(db)], extra_env=env)
        with fed.together():
            fast = fed.start_node("fast", bootstrap=[ingress], provider_id="prov-a",
                                  process=echo_engine_command(free_port(), [FAST]))
            # Slow enough that a cancel lands halfway through a 400-line batch.
            slow = fed.start_node("slow", bootstrap=[ingress], provider_id="prov-a",
                                  process=echo_engine_command(free_port(), [SLOW],
                                                              "--request-delay", "0.05"))
        for server in (fast, slow):
            wait_for(lambda s=server: ingress.states().get(s.session_id) == "SERVING", 30,
                     f"the ingress to see {server.name} serving")
            wait_for(lambda s=server: ingress.session_id in s.states(), 30,
                     f"{server.name} to know the ingress")
        first, second = make_key(ingress, "alice"), make_key(ingress, "bob")
        yield Setup(ingress, db, first["key"], first["id"], second["key"])


def jsonl(lines: list[dict[str, Any] | str]) -> bytes:
    return "".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                   for line in lines).encode()


def chat_line(custom_id: str, model: str, text: str) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": text}]}}


def finished(client: openai.OpenAI, batch_id: str, timeout: float) -> Any:
    return wait_for(lambda: (b := client.batches.retrieve(batch_id)).status in TERMINAL and b,
                    timeout, f"batch {batch_id} to finish", interval=0.25)


def lines_of(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def usage_by_request(db: Path, key_id: str) -> dict[str, int]:
    with sqlite3.connect(db) as conn:
        return {str(r): int(n) for r, n in conn.execute(
            "SELECT request_id, COUNT(*) FROM usage WHERE key_id = ? AND status = 200 "
            "GROUP BY request_id", (key_id,))}


def test_a_2000_line_batch_through_the_openai_client(setup: Setup) -> None:
    client = setup.client()
    total = 2000
    uploaded = client.files.create(
        file=("prompts.jsonl", jsonl([chat_line(f"req-{i}", FAST, f"line {i} of the batch")
                                      for i in range(total)])), purpose="batch")
    assert uploaded.purpose == "batch" and uploaded.bytes > 0
    assert client.files.retrieve(uploaded.id).filename == "prompts.jsonl"
    batch = client.batches.create(input_file_id=uploaded.id,
                                  endpoint="/v1/chat/completions", completion_window="24h",
                                  metadata={"run": "big"})
    assert batch.status in ("validating", "in_progress") and batch.metadata == {"run": "big"}
    done = finished(client, batch.id, 240)
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed,
            done.request_counts.failed) == (total, total, 0)
    assert done.error_file_id is None and done.output_file_id is not None
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    output = lines_of(client, done.output_file_id)
    assert len(output) == total
    for index, line in enumerate(output):
        assert line["custom_id"] == f"req-{index}"
        assert line["error"] is None and line["response"]["status_code"] == 200
        answer = line["response"]["body"]["choices"][0]["message"]["content"]
        assert answer == f"echo: line {index} of the batch"
    # Each line was one ordinary request of the key's, counted once.
    ids = {line["response"]["request_id"] for line in output}
    assert len(ids) == total
    # (a usage row is written within 25 ms of its answer: the last ones may still come)
    wait_for(lambda: all((rows := usage_by_request(setup.db, setup.key_id)).get(i) == 1
                         for i in ids) and rows, 10, "a usage row per line")
    assert client.files.retrieve(done.output_file_id).bytes == len(
        client.files.content(done.output_file_id).content)

    # The batch and its files belong to the key: another key sees none of them.
    stranger = setup.client(setup.other)
    with pytest.raises(openai.NotFoundError):
        stranger.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        stranger.batches.cancel(batch.id)
    for file_id in (uploaded.id, done.output_file_id):
        with pytest.raises(openai.NotFoundError):
            stranger.files.retrieve(file_id)
        with pytest.raises(openai.NotFoundError):
            stranger.files.content(file_id)
    assert batch.id not in [b.id for b in stranger.batches.list()]
    # A finished batch cannot be cancelled.
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def test_listing_pages_newest_first(setup: Setup) -> None:
    client = setup.client(make_key(setup.ingress, "pager")["key"])
    uploaded = client.files.create(file=("one.jsonl", jsonl([chat_line("a", FAST, "x")])),
                                   purpose="batch")
    made = [client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h").id for _ in range(5)]
    first = client.batches.list(limit=2)
    assert [b.id for b in first.data] == made[::-1][:2] and first.has_more
    assert [b.id for b in client.batches.list(limit=2, after=first.data[-1].id).data] == \
        made[::-1][2:4]
    assert [b.id for b in client.batches.list(limit=2)] == made[::-1]  # every page
    raw = httpx.get(f"{setup.ingress.http_url}/v1/batches?limit=500", trust_env=False,
                    headers={"authorization": f"Bearer {client.api_key}"})
    assert raw.status_code == 400 and raw.json()["error"]["param"] == "limit"


def test_malformed_lines_go_to_the_error_file(setup: Setup) -> None:
    client = setup.client()
    lines: list[dict[str, Any] | str] = [
        chat_line("ok-1", FAST, "first"),
        "{not json",
        {"method": "POST", "url": "/v1/chat/completions", "body": {"model": FAST}},
        chat_line("ok-1", FAST, "same custom_id again"),
        {**chat_line("wrong-url", FAST, "x"), "url": "/v1/embeddings"},
        {**chat_line("wrong-method", FAST, "x"), "method": "GET"},
        {"custom_id": "no-model", "method": "POST", "url": "/v1/chat/completions",
         "body": {"messages": []}},
        chat_line("ok-2", FAST, "second"),
        chat_line("unknown-model", "no-such-model", "x"),
    ]
    uploaded = client.files.create(file=("mixed.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    done = finished(client, batch.id, 60)
    assert done.status == "completed"
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed,
            done.request_counts.failed) == (9, 2, 7)
    assert [o["custom_id"] for o in lines_of(client, done.output_file_id)] == ["ok-1", "ok-2"]
    errors = lines_of(client, done.error_file_id)
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [
        (None, "invalid_json"), (None, "missing_custom_id"), ("ok-1", "duplicate_custom_id"),
        ("wrong-url", "invalid_url"), ("wrong-method", "invalid_method"),
        ("no-model", "invalid_body"), ("unknown-model", "model_not_found")]
    assert all(e["response"] is None for e in errors[:-1])
    assert errors[-1]["response"]["status_code"] == 404
    assert "(line 2)" in errors[0]["error"]["message"]


def test_cancel_halfway_keeps_what_was_done(setup: Setup) -> None:
    client = setup.client()
    total = 400
    uploaded = client.files.create(
        file=("slow.jsonl", jsonl([chat_line(f"s-{i}", SLOW, f"slow {i}")
                                   for i in range(total)])), purpose="batch")
    batch = client.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    wait_for(lambda: (c := client.batches.retrieve(batch.id).request_counts) is not None
             and c.completed >= 40, 60, "40 lines done", interval=0.05)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = finished(client, batch.id, 60)
    assert done.status == "cancelled" and done.cancelled_at and done.cancelling_at
    counts = done.request_counts
    assert counts is not None and 40 <= counts.completed < total and counts.failed == 0
    output = lines_of(client, done.output_file_id)
    assert len(output) == counts.completed
    assert all(o["response"]["body"]["choices"][0]["message"]["content"] ==
               f"echo: slow {o['custom_id'][2:]}" for o in output)
    # Nothing more is sent after the cancel.
    prefix = f"batch_req_{batch.id.removeprefix('batch_')}"

    def sent() -> int:
        return len([r for r in usage_by_request(setup.db, setup.key_id)
                    if r.startswith(prefix)])
    wait_for(lambda: sent() == counts.completed, 10, "a usage row per line sent")


def test_uploads_refused_cleanly(setup: Setup) -> None:
    client = setup.client()
    with pytest.raises(openai.APIStatusError) as too_large:
        client.files.create(file=("big.jsonl", b"x" * (MAX_FILE + 1)), purpose="batch")
    assert too_large.value.status_code == 413
    assert too_large.value.body["code"] == "file_too_large"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as purpose:
        client.files.create(file=("a.jsonl", b"{}\n"), purpose="fine-tune")
    assert purpose.value.body["param"] == "purpose"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id="file-nope", endpoint="/v1/responses",
                              completion_window="24h")  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id="file-nope", endpoint="/v1/chat/completions",
                              completion_window="24h")
    with pytest.raises(openai.AuthenticationError):
        setup.client("otela-wrong").files.list()
    # A file can be deleted; then it is gone.
    made = client.files.create(file=("gone.jsonl", b"{}\n"), purpose="batch")
    assert client.files.delete(made.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(made.id)
    # The ingress still serves.
    assert client.files.list().object == "list"
