"""What a node running the ingress service shows to whom (docs/security.md, "What each
endpoint shows to whom"), through real ``otela start`` processes and real HTTP: strangers
get liveness and the models, key holders the registry and network, the admin per-key
metrics; no answer names the database; the SQLite file is its owner's only; commands that
only read never create a database."""

from __future__ import annotations

import os
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from otela.config.visibility import DEFAULTS, parse_visibility
from otela.testing.localfed import (
    LocalFederation,
    LocalNode,
    echo_engine_command,
    free_port,
    wait_for,
)

pytestmark = pytest.mark.slow

MODEL = "echo-surface"
ADMIN = "surface-admin-token-0123456789abcdef"
INSPECTION = ("/v1/network", "/v1/registry/nodes", "/v1/registry/models")
Fed = tuple[LocalNode, LocalNode, Path]


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fed]:
    root = tmp_path_factory.mktemp("surface")
    db = root / "keys" / "ingress.db"
    with LocalFederation(root) as federation:
        ingress = federation.start_node(
            "ingress", ingress=True, extra_args=["--ingress-db", str(db)],
            extra_env={"OTELA_ADMIN_TOKEN": ADMIN})
        server = federation.start_node("server", bootstrap=[ingress], provider_id="prov-s",
                                       process=echo_engine_command(free_port(), [MODEL]))
        wait_for(lambda: ingress.states().get(server.session_id) == "SERVING", 20,
                 "the ingress to see the server serving")
        wait_for(lambda: ingress.session_id in server.states(), 20,
                 "the server to know the ingress")
        yield ingress, server, db


def get(node: LocalNode, path: str, token: str | None = None) -> httpx.Response:
    headers = {} if token is None else {"authorization": f"Bearer {token}"}
    return httpx.get(f"{node.http_url}{path}", headers=headers, trust_env=False, timeout=10)


def new_key(node: LocalNode) -> dict[str, Any]:
    made = httpx.post(f"{node.http_url}/v1/admin/keys", json={"owner": "surface"},
                      headers={"authorization": f"Bearer {ADMIN}"}, trust_env=False,
                      timeout=10)
    assert made.status_code == 200, made.text
    return made.json()


def chat(node: LocalNode, key: str) -> None:
    answer = httpx.post(f"{node.http_url}/v1/chat/completions", trust_env=False, timeout=10,
                        headers={"authorization": f"Bearer {key}"},
                        json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]})
    assert answer.status_code == 200, answer.text


def test_strangers_get_liveness_and_models_key_holders_the_rest(fed: Fed) -> None:
    ingress, _, db = fed
    key = new_key(ingress)["key"]
    health = get(ingress, "/v1/health")
    assert health.status_code == 200
    assert set(health.json()) == {"status", "version", "state", "display_state",
                                  "registry_warming", "visibility"}
    assert health.json()["visibility"] == {"health": "key", "registry": "key", "network": "key"}
    assert health.json()["status"] == "ok"
    for token in ("otela-wrong", "nonsense"):  # a wrong credential: a stranger, not an error
        assert set(get(ingress, "/v1/health", token).json()) == set(health.json())
    for caller in (None, key, ADMIN):  # the admin token is not a key: the whole catalog
        listed = get(ingress, "/v1/models", caller)
        assert listed.status_code == 200, (caller, listed.text)
        assert MODEL in {m["id"] for m in listed.json()["data"]}
    for path in INSPECTION:
        refused = get(ingress, path)
        assert refused.status_code == 401, path
        assert refused.json()["error"]["code"] == "invalid_api_key"
        assert get(ingress, path, "otela-wrong").status_code == 401
        for token in (key, ADMIN):
            assert get(ingress, path, token).status_code == 200, (path, token)
    server_session = next(n["session_id"] for n in get(ingress, "/v1/registry/nodes", key)
                          .json()["nodes"] if n["session_id"] != ingress.session_id)
    assert get(ingress, f"/v1/registry/nodes/{server_session}").status_code == 401
    assert get(ingress, f"/v1/registry/nodes/{server_session}", key).status_code == 200
    for token in (key, ADMIN):
        full = get(ingress, "/v1/health", token).json()
        assert full["peer_id"] and full["ingress_service"]["database"] == "sqlite"
        assert full["ingress_service"]["database_status"] == "ok"
    # No answer, to anyone, names where the database is.
    for caller in (None, key, ADMIN):
        for path in ("/v1/health", *INSPECTION, "/v1/models", "/metrics"):
            text = get(ingress, path, caller).text
            assert str(db.parent) not in text and "ingress.db" not in text, (path, caller)


def test_per_key_metric_series_are_for_the_admin_only(fed: Fed) -> None:
    ingress, _, _ = fed
    made = new_key(ingress)
    chat(ingress, made["key"])
    series = f'otela_api_key_requests_total{{key="{made["id"]}",status="200"}}'

    def admin_sees_it() -> bool:
        return series in get(ingress, "/metrics", ADMIN).text
    wait_for(admin_sees_it, 5, "the admin to see the key's series")
    for token in (None, made["key"], "otela-wrong"):
        text = get(ingress, "/metrics", token).text
        assert "otela_requests_total{" in text  # the node's own metrics: for everyone
        assert "otela_api_key_requests_total{" not in text
        assert "otela_api_key_tokens_total{" not in text
        assert made["id"] not in text


def test_a_node_without_the_ingress_service_shows_everything_as_before(fed: Fed) -> None:
    _, server, _ = fed
    health = get(server, "/v1/health").json()
    assert health["peer_id"] and health["ingress_service"] is None
    for path in INSPECTION:
        assert get(server, path).status_code == 200, path


def test_the_sqlite_database_is_its_owners_only(fed: Fed) -> None:
    ingress, _, db = fed
    chat(ingress, new_key(ingress)["key"])  # a write: the -wal and -shm files exist
    files = [db, Path(f"{db}-wal"), Path(f"{db}-shm")]
    wait_for(lambda: all(f.exists() for f in files), 5, "the database's files")
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def otela(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTELA_")}
    env["XDG_CONFIG_HOME"] = str(cwd / "xdg")
    return subprocess.run([sys.executable, "-m", "otela", *args], capture_output=True,
                          text=True, timeout=60, env=env, cwd=cwd)


def test_commands_that_only_read_never_create_a_database(tmp_path: Path) -> None:
    typo = tmp_path / "ingres.db"
    for command in (["keys", "list"], ["keys", "show", "key_000000000000"], ["usage"]):
        done = otela(*command, "--db", str(typo), cwd=tmp_path)
        assert done.returncode != 0, command
        assert str(typo) in done.stderr and "Traceback" not in done.stderr, done.stderr
        assert not typo.exists(), command
    foreign = tmp_path / "other.sqlite"  # some other program's database
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE notes (text TEXT)")
    done = otela("keys", "list", "--db", str(foreign), cwd=tmp_path)
    assert done.returncode != 0 and "not an otela ingress database" in done.stderr
    with sqlite3.connect(foreign) as conn:
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    assert tables == {"notes"}  # nothing was created in it
    # A command that writes creates it (owner-only), and then the readers work.
    real = tmp_path / "real.db"
    assert otela("keys", "create", "--owner", "a", "--db", str(real), cwd=tmp_path) \
        .returncode == 0
    assert stat.S_IMODE(real.stat().st_mode) == 0o600
    listed = otela("keys", "list", "--db", str(real), "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert otela("usage", "--db", str(real), cwd=tmp_path).returncode == 0


def test_visibility_is_settable_in_the_config_file(tmp_path: Path) -> None:
    """``[ingress] visibility`` opens the network view to strangers and per-key series to
    key holders, each seeing only its own key's."""
    config = tmp_path / "xdg-config" / "otela" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('[ingress]\nvisibility = {network = "public", '
                      'key_metrics = "key", registry = "admin"}\n')
    with LocalFederation(tmp_path) as federation:
        ingress = federation.start_node(
            "ingress", ingress=True, provider_id="prov-v",
            process=echo_engine_command(free_port(), [MODEL]),
            extra_args=["--ingress-db", str(tmp_path / "v.db")],
            extra_env={"OTELA_ADMIN_TOKEN": ADMIN})
        wait_for(lambda: ingress.states().get(ingress.session_id) == "SERVING", 30,
                 "serving")
        mine, theirs = new_key(ingress), new_key(ingress)
        chat(ingress, mine["key"])
        chat(ingress, theirs["key"])
        assert get(ingress, "/v1/network").status_code == 200
        refused = get(ingress, "/v1/registry/nodes", mine["key"])
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "admin_only"
        assert get(ingress, "/v1/registry/nodes", ADMIN).status_code == 200

        def own_series_only() -> bool:
            text = get(ingress, "/metrics", mine["key"]).text
            return mine["id"] in text and theirs["id"] not in text
        wait_for(own_series_only, 5, "the key holder to see its own series")
        assert "otela_api_key_requests_total{" not in get(ingress, "/metrics").text


def test_visibility_values_are_checked() -> None:
    assert parse_visibility("network=public, registry=admin") == {
        "network": "public", "registry": "admin"}
    assert parse_visibility({"models": "key"}) == {"models": "key"}
    bad_values: list[Any] = ["network=everyone", "netwrok=public", "network", {"health": 3}]
    for bad in bad_values:
        with pytest.raises(ValueError):
            parse_visibility(bad)
    assert DEFAULTS["models"] == "public" and DEFAULTS["key_metrics"] == "admin"
