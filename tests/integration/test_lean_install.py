"""``pip install otela`` without extras: an ingress with API keys and a serving node start
and serve, and the commands that need an extra say which, instead of a traceback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from otela.testing import lean_install
from otela.testing.localfed import LocalFederation, free_port, wait_for

from .helpers import CONVERGE_S

pytestmark = pytest.mark.slow

EXTRA_PACKAGES = ("numpy", "matplotlib", "ortools", "pandas", "psycopg", "openai",
                  "anthropic")


@pytest.fixture(scope="module")
def lean_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return lean_install.build(tmp_path_factory.mktemp("lean") / "venv")


@pytest.fixture
def lean_federation(tmp_path: Path, lean_python: Path) -> Iterator[LocalFederation]:
    fed = LocalFederation(tmp_path / "fed", python=str(lean_python))
    try:
        yield fed
    finally:
        fed.close()


def test_the_lean_install_lacks_every_extra(lean_python: Path) -> None:
    probe = ("import importlib.util, json; print(json.dumps({m: importlib.util.find_spec(m) "
             f"is not None for m in {list(EXTRA_PACKAGES)!r}}}))")
    found = json.loads(lean_install.run(lean_python, "-c", probe).stdout)
    assert found == dict.fromkeys(EXTRA_PACKAGES, False)


@pytest.mark.parametrize(("argv", "extra"), [
    (["sim", "run", "--help"], "sim"), (["plan", "--gpus", "a100:1"], "plan"),
    (["trace", "gen"], "traces"), (["demo"], "demo"),
])
def test_a_command_that_needs_an_extra_names_it(lean_python: Path, argv: list[str],
                                                extra: str) -> None:
    result = lean_install.run(lean_python, "-m", "otela", *argv)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"pip install 'otela[{extra}]'" in result.stderr
    assert "Traceback" not in result.stderr


def test_help_lists_every_command_and_what_it_needs(lean_python: Path) -> None:
    result = lean_install.run(lean_python, "-m", "otela", "--help")
    assert result.returncode == 0, result.stderr
    for command in ("start", "fleet", "keys", "sim", "plan", "trace"):
        assert f" {command} " in result.stdout
    assert "Needs otela[sim]" in result.stdout.replace("\n", " ").replace("│", "")


def test_a_keyed_ingress_and_a_serving_node_work_without_extras(
        lean_federation: LocalFederation, lean_python: Path, tmp_path: Path) -> None:
    db = tmp_path / "keys.db"
    ingress = lean_federation.start_node(
        "ingress", ingress=True, extra_args=["--ingress-db", str(db)],
        # the registry is for key holders and the admin on a keyed ingress (states())
        extra_env={"OTELA_ADMIN_TOKEN": "lean-admin-token-0123456789"})
    engine = (f"{lean_python} -m otela.engine.demo.echo --port {free_port()} "
              "--model lean-model")
    node = lean_federation.start_node("node", bootstrap=[ingress], process=engine)
    wait_for(lambda: ingress.states().get(node.session_id) == "SERVING", CONVERGE_S,
             "the ingress to see the node serving")
    made = lean_install.run(lean_python, "-m", "otela", "keys", "create", "--db", str(db),
                            "--owner", "lean", "--json")
    assert made.returncode == 0, made.stderr
    key = json.loads(made.stdout)["key"]
    body = {"model": "lean-model", "messages": [{"role": "user", "content": "hi"}]}
    url = f"{ingress.http_url}/v1/chat/completions"
    refused = httpx.post(url, json=body, timeout=30)
    assert refused.status_code == 401
    # the ingress reads new keys every second (ingress.access): wait for it

    def with_key() -> httpx.Response:
        return httpx.post(url, json=body, headers={"authorization": f"Bearer {key}"},
                          timeout=30)

    wait_for(lambda: with_key().status_code == 200, 10, "the new key to reach the ingress")
    answer = with_key()
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-otela-session-id"] == node.session_id
