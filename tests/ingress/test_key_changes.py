"""Editable keys: ``PATCH /v1/admin/keys/{id}`` through a real ingress and ``otela keys
update`` on the database, checked as creation is, applied at once, recorded in the key's
history; revoked keys say so (409) instead of "no such key"; the migration that adds the
history keeps every key and usage row."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ingress import keystore, usage
from ingress.database import Database, DatabaseUrl
from ingress.keystore import KeySpec
from ingress.migrations import LATEST, MIGRATIONS, migrate
from otela.testing.localfed import (
    LocalFederation,
    LocalNode,
    echo_engine_command,
    free_port,
    wait_for,
)

pytestmark = pytest.mark.slow

MODEL = "echo-edit"
OTHER = "echo-edit-2"
ADMIN = "edit-admin-token-0123456789abcdef"
Fed = tuple[LocalNode, Path]


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fed]:
    root = tmp_path_factory.mktemp("edit")
    db = root / "edit.db"
    with LocalFederation(root) as federation:
        node = federation.start_node(
            "ingress", ingress=True, provider_id="prov-e",
            process=echo_engine_command(free_port(), [MODEL, OTHER]),
            extra_args=["--ingress-db", str(db)], extra_env={"OTELA_ADMIN_TOKEN": ADMIN})
        wait_for(lambda: node.states().get(node.session_id) == "SERVING", 30, "serving")
        yield node, db


def admin(node: LocalNode, method: str, path: str, body: Any = None) -> httpx.Response:
    return httpx.request(method, f"{node.http_url}/v1/admin{path}", trust_env=False,
                         timeout=10, headers={"authorization": f"Bearer {ADMIN}"},
                         json=body)


def chat(node: LocalNode, key: str, model: str = MODEL) -> httpx.Response:
    return httpx.post(f"{node.http_url}/v1/chat/completions", trust_env=False, timeout=10,
                      headers={"authorization": f"Bearer {key}"},
                      json={"model": model, "messages": [{"role": "user", "content": "x"}]})


def test_a_change_applies_at_once_and_is_recorded(fed: Fed) -> None:
    node, _ = fed
    made = admin(node, "POST", "/keys", {"owner": "bob", "rpm": 600}).json()
    assert chat(node, made["key"], OTHER).status_code == 200
    changed = admin(node, "PATCH", f"/keys/{made['id']}",
                    {"models": [MODEL], "name": "narrowed", "rpm": None,
                     "expires_at": "2099-01-01T00:00:00Z"})
    assert changed.status_code == 200, changed.text
    shown = changed.json()
    assert shown["models"] == [MODEL] and shown["name"] == "narrowed"
    assert shown["limits"]["rpm"] is None and shown["id"] == made["id"]
    assert shown["expires_at"] == 4070908800.0 and "key" not in shown
    denied = chat(node, made["key"], OTHER)  # the same secret, the new rules, at once
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "model_not_allowed"
    assert chat(node, made["key"], MODEL).status_code == 200
    history = admin(node, "GET", f"/keys/{made['id']}/history").json()["data"]
    assert [h["action"] for h in history] == ["create", "update"]
    assert history[0]["changes"]["rpm"] == [None, 600]
    update = history[1]
    assert update["changes"] == {"name": ["", "narrowed"], "models": [None, [MODEL]],
                                 "rpm": [600, None], "expires_at": [None, 4070908800.0]}
    assert update["actor"].startswith("admin API from 127.0.0.1 via ")
    assert update["at"] >= history[0]["at"]


def test_changes_are_checked_as_creation_is_and_write_nothing(fed: Fed) -> None:
    node, db = fed
    made = admin(node, "POST", "/keys", {"owner": "carol", "tpm": 1000}).json()
    before = admin(node, "GET", f"/keys/{made['id']}").json()
    bad_bodies: list[Any] = [{}, {"rpm": -1}, {"rpm": True}, {"tpm": 1.5}, {"models": []},
                             {"owner": None}, {"owner": ""}, {"surprise": 1},
                             {"expires_at": 1}, {"expires_at": "yesterday"},
                             {"expires_in": 10, "expires_at": 4070908800},
                             {"name": "x" * 500}, {"name": "bad\x00name"}, [], "text"]
    for body in bad_bodies:
        answer = admin(node, "PATCH", f"/keys/{made['id']}", body)
        assert answer.status_code == 400, (body, answer.text)
        assert answer.json()["error"]["message"]
    assert admin(node, "GET", f"/keys/{made['id']}").json() == before
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT action FROM api_key_audit WHERE key_id = ?",
                            (made["id"],)).fetchall()
    assert rows == [("create",)]


def test_unknown_and_revoked_keys_say_which(fed: Fed) -> None:
    node, _ = fed
    for path in ("/keys/key_000000000000", "/keys/nonsense"):
        missing = admin(node, "PATCH", path, {"rpm": 5})
        assert missing.status_code == 404
        assert missing.json()["error"]["message"] == "No such API key."
        assert admin(node, "GET", f"{path}/history").status_code == 404
    made = admin(node, "POST", "/keys", {"owner": "dave"}).json()
    assert admin(node, "POST", f"/keys/{made['id']}/revoke").status_code == 200
    for method, path, body in (("PATCH", "", {"rpm": 5}), ("POST", "/rotate", None)):
        refused = admin(node, method, f"/keys/{made['id']}{path}", body)
        assert refused.status_code == 409, refused.text
        error = refused.json()["error"]
        assert error["code"] == "key_revoked" and "revoked" in error["message"]
    history = admin(node, "GET", f"/keys/{made['id']}/history").json()["data"]
    assert [h["action"] for h in history] == ["create", "revoke"]
    assert chat(node, made["key"]).status_code == 401


def otela(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTELA_")}
    env["XDG_CONFIG_HOME"] = str(cwd / "xdg")
    return subprocess.run([sys.executable, "-m", "otela", *args], capture_output=True,
                          text=True, timeout=60, env=env, cwd=cwd)


def test_the_command_line_updates_on_the_database_and_through_an_ingress(
        fed: Fed, tmp_path: Path) -> None:
    node, _ = fed
    db = str(tmp_path / "cli.db")
    made = json.loads(otela("keys", "create", "--owner", "erin", "--rpm", "60", "--model",
                            MODEL, "--db", db, "--json", cwd=tmp_path).stdout)
    done = otela("keys", "update", made["id"], "--tpm", "500", "--clear", "rpm",
                 "--clear", "models", "--provider", "prov-e", "--db", db, "--json",
                 cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["limits"] == {"rpm": None, "tpm": 500, "max_concurrent": None}
    assert shown["models"] is None and shown["providers"] == ["prov-e"]
    history = otela("keys", "history", made["id"], "--db", db, "--json", cwd=tmp_path)
    changes = json.loads(history.stdout)
    assert [c["action"] for c in changes] == ["create", "update"]
    assert changes[1]["changes"]["tpm"] == [None, 500]
    assert changes[1]["actor"].startswith("otela keys on the database by ")
    table = otela("keys", "history", made["id"], "--db", db, cwd=tmp_path)
    assert table.returncode == 0 and "tpm: null -> 500" in table.stdout
    for bad in (["--rpm", "0"], ["--clear", "colour"], []):
        refused = otela("keys", "update", made["id"], *bad, "--db", db, cwd=tmp_path)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, bad
    missing = otela("keys", "update", "key_000000000000", "--rpm", "5", "--db", db,
                    cwd=tmp_path)
    assert missing.returncode == 1 and "no such API key" in missing.stderr
    otela("keys", "revoke", made["id"], "--db", db, cwd=tmp_path)
    for command in (["update", made["id"], "--rpm", "5"], ["rotate", made["id"]]):
        refused = otela("keys", *command, "--db", db, cwd=tmp_path)
        assert refused.returncode == 1 and "revoked" in refused.stderr, refused.stderr
        assert "no such" not in refused.stderr.lower()
    # through an ingress's admin API: the same objects
    remote = admin(node, "POST", "/keys", {"owner": "frank"}).json()
    env_free = otela("keys", "update", remote["id"], "--name", "via-url", "--url",
                     node.http_url, "--json", cwd=tmp_path)
    assert env_free.returncode == 1 and "OTELA_ADMIN_TOKEN" in env_free.stderr
    (tmp_path / "xdg" / "otela").mkdir(parents=True)
    (tmp_path / "xdg" / "otela" / "config.toml").write_text(
        f'[ingress]\nadmin_token = "{ADMIN}"\n')
    via_url = otela("keys", "update", remote["id"], "--name", "via-url", "--url",
                    node.http_url, "--json", cwd=tmp_path)
    assert via_url.returncode == 0, via_url.stderr
    assert json.loads(via_url.stdout)["name"] == "via-url"
    remote_history = otela("keys", "history", remote["id"], "--url", node.http_url,
                           "--json", cwd=tmp_path)
    assert [c["action"] for c in json.loads(remote_history.stdout)] == ["create", "update"]


def test_the_history_migration_keeps_every_key_and_row(tmp_path: Path) -> None:
    """A database at the schema before the history (version 2) with keys and usage rows
    comes through the migration with all of them, and their changes are recorded after."""
    path = tmp_path / "old.db"
    db = Database.connect(DatabaseUrl.parse(str(path)))
    db.run_sync("CREATE TABLE otela_schema (version INTEGER NOT NULL)")
    for version in (1, 2):
        for statement in MIGRATIONS[version - 1]:
            db.run_sync(statement)
        db.run_sync("INSERT INTO otela_schema (version) VALUES (?)", (version,))
    db.run_sync("INSERT INTO api_keys (id, secret_hash, owner, name, created_at, rpm, "
                "updated_at) VALUES ('key_0123456789ab', 'h', 'old', 'n', 1, 60, 1)")
    db.run_sync("INSERT INTO usage (id, request_id, key_id, model, route, provider, "
                "node_peer, node_session, prompt_tokens, completion_tokens, status, stream, "
                "latency_ms, started_at, finished_at, ingress, recorded_at) VALUES ('u1', "
                "'r', 'key_0123456789ab', 'm', '/v1/chat/completions', 'p', 'n', 's', 3, 4, "
                "200, 0, 1.0, 1, 2, 'i', 2)")
    assert migrate(db) == 2 and LATEST >= 3
    old = keystore.get(db, "key_0123456789ab")
    assert (old.owner, old.rpm) == ("old", 60)
    assert usage.used_tokens(db) == {"key_0123456789ab": 7}
    assert keystore.history(db, old.id) == []
    keystore.update(db, old.id, {"rpm": 30}, actor="test")
    assert [c.changes for c in keystore.history(db, old.id)] == [{"rpm": [60, 30]}]
    made, _ = keystore.create(db, KeySpec(owner="new"))
    assert [c.action for c in keystore.history(db, made.id)] == ["create"]
    unchanged = keystore.update(db, made.id, {"owner": "new"})  # nothing changes
    assert unchanged == made and len(keystore.history(db, made.id)) == 1
    db.close()
