"""``otela keys`` and ``otela usage`` on a real SQLite file: what an operator types."""

from __future__ import annotations

import csv
import io
import json

import pytest
from typer.testing import CliRunner

from otela.cli import app


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.setenv("OTELA_HOME", str(tmp_path))
    monkeypatch.delenv("OTELA_INGRESS_DB", raising=False)
    monkeypatch.delenv("OTELA_ADMIN_TOKEN", raising=False)
    monkeypatch.delenv("OTELA_CONFIG", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))  # no user config file
    runner = CliRunner()

    def invoke(*args: str) -> tuple[int, str, str]:
        result = runner.invoke(app, list(args))
        return result.exit_code, result.stdout, result.stderr
    return invoke


def test_create_list_show_rotate_revoke(run, tmp_path):
    code, out, err = run("keys", "create", "--owner", "alice", "--model", "m1", "--model",
                         "m2", "--rpm", "30", "--expires-in", "7d", "--json")
    assert code == 0, err
    made = json.loads(out)
    assert made["key"].startswith("otela-") and made["models"] == ["m1", "m2"]
    assert made["limits"]["rpm"] == 30 and made["expires_at"] is not None
    assert (tmp_path / "ingress.db").exists()  # the node home's database by default
    code, out, _ = run("keys", "list", "--json")
    listed = json.loads(out)
    assert [k["id"] for k in listed] == [made["id"]] and "key" not in listed[0]
    code, out, _ = run("keys", "list")
    assert made["id"] in out and "alice" in out and made["key"] not in out
    code, out, err = run("keys", "rotate", made["id"])
    assert code == 0 and out.startswith(made["id"]) and made["key"] not in out
    assert "cannot be shown again" in err
    code, out, _ = run("keys", "revoke", made["id"], "--json")
    assert json.loads(out)["status"] == "revoked"
    code, out, err = run("keys", "rotate", made["id"])  # a revoked key is said to be so
    assert code == 1 and "is revoked" in err.lower()
    code, out, err = run("keys", "rotate", "key_0000000000ff")
    assert code == 1 and "no such api key" in err.lower()


def test_bad_input_is_one_line_and_writes_nothing(run):
    for args in (["keys", "create", "--owner", ""], ["keys", "create", "--owner", "a",
                                                     "--rpm", "0"],
                 ["keys", "create", "--owner", "a", "--expires-in", "soon"]):
        code, _out, err = run(*args)
        assert code == 2 and err.startswith("otela: ") and "Traceback" not in err, args
    assert json.loads(run("keys", "list", "--json")[1]) == []
    code, _, err = run("keys", "show", "key_000000000000")
    assert code == 1
    code, _, err = run("keys", "list", "--db", "mysql://nope")
    assert code == 1 and "unsupported database URL" in err
    code, _, err = run("usage", "--by", "colour")
    assert code == 2


def test_usage_formats(run):
    run("keys", "create", "--owner", "a")
    code, out, _ = run("usage", "--since", "24h", "--by", "model", "--format", "csv")
    assert code == 0
    assert next(csv.reader(io.StringIO(out)))[:3] == ["model", "requests", "prompt_tokens"]
    code, out, _ = run("usage", "--format", "json")
    assert json.loads(out) == {"by": "key", "data": []}
    code, _, err = run("usage", "--format", "xml")
    assert code == 2 and "--format" in err


def test_a_key_expiring_beyond_what_the_platform_formats_does_not_break_the_listing(
        run, tmp_path):
    code, out, err = run("keys", "create", "--owner", "bob", "--json")
    assert code == 0, err
    import sqlite3

    with sqlite3.connect(tmp_path / "ingress.db") as db:  # a row from before the bound
        db.execute("UPDATE api_keys SET expires_at = 1e308")
    code, out, err = run("keys", "list")
    assert code == 0, err
    assert "far future" in out


def test_names_with_rich_markup_are_shown_as_written(run, tmp_path):
    # An owner is typed by an admin, but a model name in a usage row comes from any client.
    code, _, err = run("keys", "create", "--owner", "[/x]", "--name", "[red]n")
    assert code == 0, err
    code, out, err = run("keys", "list")
    assert code == 0, err
    assert "[/x]" in out and "[red]n" in out
    import sqlite3
    import time

    now = time.time()
    with sqlite3.connect(tmp_path / "ingress.db") as db:
        db.execute(
            "INSERT INTO usage (id, request_id, key_id, model, route, provider, node_peer, "
            "node_session, prompt_tokens, completion_tokens, status, error, stream, "
            "latency_ms, ttft_ms, started_at, finished_at, ingress, recorded_at) VALUES "
            "('u1', 'r1', NULL, '[/model]', '/v1/chat/completions', '', '', '', 1, 1, "
            "200, NULL, 0, 1.0, NULL, ?, ?, 'i', ?)", (now, now, now))
    code, out, err = run("usage", "--since", "24h", "--by", "model")
    assert code == 0, err
    assert "[/model]" in out


def test_keys_and_usage_read_the_config_files_ingress_table(run, tmp_path, monkeypatch):
    """The node's config file names the database: `otela keys` and `otela usage` use it
    as `otela start` does (flag > environment > file > default)."""
    shared = tmp_path / "shared.db"
    config = tmp_path / "config.toml"
    config.write_text(f'[ingress]\ndb = "{shared}"\n')
    code, out, err = run("keys", "create", "--owner", "carol", "--config", str(config),
                         "--json")
    assert code == 0, err
    assert shared.exists() and not (tmp_path / "ingress.db").exists()
    made = json.loads(out)
    code, out, _ = run("keys", "list", "--json", "--config", str(config))
    assert [k["id"] for k in json.loads(out)] == [made["id"]]
    assert run("usage", "--format", "json", "--config", str(config))[0] == 0
    # the default config file ($XDG_CONFIG_HOME/otela/config.toml) counts too
    (tmp_path / "xdg" / "otela").mkdir(parents=True)
    (tmp_path / "xdg" / "otela" / "config.toml").write_text(config.read_text())
    code, out, _ = run("keys", "list", "--json")
    assert [k["id"] for k in json.loads(out)] == [made["id"]]
    # the environment beats the file, the flag beats both
    other = tmp_path / "other.db"
    monkeypatch.setenv("OTELA_INGRESS_DB", str(other))
    code, _, err = run("keys", "list", "--json")  # read-only: names the missing database
    assert code == 1 and str(other) in err and not other.exists()
    assert run("keys", "create", "--owner", "dan")[0] == 0  # where the environment says
    assert [k["owner"] for k in json.loads(run("keys", "list", "--json")[1])] == ["dan"]
    code, out, _ = run("keys", "list", "--json", "--db", str(shared))
    assert [k["id"] for k in json.loads(out)] == [made["id"]]


def test_a_bad_config_file_is_one_line_not_a_traceback(run, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("[ingress]\ndb = 12\n")
    code, _out, err = run("keys", "list", "--config", str(config))
    assert code == 2 and err.startswith("otela: ") and "Traceback" not in err


def test_the_admin_token_comes_from_the_config_file_too(run, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text("[ingress]\nadmin_token = \"from-the-file\"\n")
    # Nothing listens there: what matters is that the token was found (no "needs" error).
    code, _out, err = run("keys", "list", "--url", "http://127.0.0.1:9", "--config",
                          str(config))
    assert code == 1 and "cannot reach" in err, err
    code, _out, err = run("keys", "list", "--url", "http://127.0.0.1:9")
    assert code == 1 and "needs the admin token" in err, err


def test_fair_sharing_settings_of_keys_and_teams(run):
    code, out, err = run("keys", "create", "--owner", "lab-a", "--team", "lab", "--weight",
                         "2", "--priority", "Default", "--queue-wait", "5m", "--json")
    assert code == 0, err
    made = json.loads(out)
    assert made["scheduling"] == {"team": "lab", "weight": 2.0, "priority": "default",
                                  "queue_wait": 300.0}
    code, out, err = run("keys", "update", made["id"], "--clear", "priority", "--weight",
                         "0.5", "--json")
    assert code == 0, err
    assert json.loads(out)["scheduling"]["priority"] is None
    assert json.loads(out)["scheduling"]["weight"] == 0.5
    code, out, err = run("keys", "team", "lab", "--weight", "3")
    assert code == 0 and "team lab: weight 3" in out, err
    code, out, err = run("keys", "team", "lab", "--priority", "Batch")
    assert code == 0 and out.strip().endswith("priority batch"), err
    code, out, err = run("keys", "team", "lab", "--clear", "priority", "--json")
    assert code == 0 and json.loads(out)["priority"] is None and \
        json.loads(out)["weight"] == 3.0, err
    code, _, err = run("keys", "team", "lab", "--weight", "0")
    assert code == 2 and err.startswith("otela: ") and "weight" in err  # bad input: one line
    code, out, err = run("keys", "create", "--owner", "x", "--priority", "very important")
    assert code == 2 and "priority" in err
    code, out, _ = run("keys", "history", made["id"], "--json")
    assert any("weight" in change["changes"] for change in json.loads(out))
