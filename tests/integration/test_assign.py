"""`otela plan --assign` against a real federation (separate OS processes on 127.0.0.1):
two idle nodes that opted in with --accept-assignments receive signed assignments, launch
the echo engine from their allowlist and serve the planned models through the ingress; a
third idle node that did not opt in is left out and never runs anything; a forged
assignment, one for a busy node and one for the node that did not opt in are refused with
OpenAI-style errors."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from otela.assignments import sender
from otela.identity import load_or_create
from otela.testing.localfed import LocalFederation, LocalNode, wait_for

from .helpers import CONVERGE_S, chat

pytestmark = pytest.mark.slow

GPUS = ["--gpus", "1xA100-SXM4-80GB:80"]
DEMAND = """
horizon_s = 60

[[models]]
name = "planned-alpha"
model = "llama-3.1-8b"
rate = 2
input = "normal:200,50"
output = "normal:50,10"

[[models]]
name = "planned-beta"
model = "qwen3-8b"
rate = 2
input = "normal:200,50"
output = "normal:50,10"
"""


def registry(node: LocalNode) -> dict[str, dict[str, Any]]:
    return {n["session_id"]: n for n in node.nodes()}


def post(node: LocalNode, envelope: bytes) -> httpx.Response:
    return httpx.post(f"{node.http_url}/v1/assignments", json={
        "envelope": __import__("base64").b64encode(envelope).decode()}, timeout=10,
        trust_env=False)


def test_plan_assigns_opted_in_idle_nodes_which_serve_through_the_ingress(
        federation: LocalFederation, tmp_path: Path) -> None:
    planner_home = tmp_path / "planner"
    planner = load_or_create(planner_home)
    planner_id = planner.peer_id.to_base58()
    allowlist = tmp_path / "engines.toml"
    echo = shlex.join([sys.executable, "-m", "otela.engine.demo.echo"])
    allowlist.write_text(f'[engines.echo]\ncommand = "{echo} --port {{port}} --model {{model}}"'
                         '\nmodels = ["planned-*"]\n')
    opt_in = ["--accept-assignments", planner_id, "--engine-allowlist", str(allowlist)]

    ingress = federation.start_node("ingress", ingress=True)
    with federation.together():
        a = federation.start_node("idle-a", bootstrap=[ingress], extra_args=[*GPUS, *opt_in])
        b = federation.start_node("idle-b", bootstrap=[ingress], extra_args=[*GPUS, *opt_in])
        c = federation.start_node("idle-c", bootstrap=[ingress], extra_args=GPUS)
    idle = {n.session_id: n for n in (a, b, c)}
    wait_for(lambda: all(registry(ingress).get(s, {}).get("idle") for s in idle), CONVERGE_S,
             "the ingress to see the three idle nodes")

    demand = tmp_path / "demand.toml"
    demand.write_text(DEMAND)
    out = tmp_path / "plan.json"
    result = subprocess.run(
        [sys.executable, "-m", "otela", "plan", "--from", ingress.http_url,
         "--demand", str(demand), "--assign", "--identity", str(planner_home),
         "--engine", "echo", "--cache", str(tmp_path / "cache"), "--sim-requests", "100",
         "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    plan = json.loads(out.read_text())

    # c did not opt in: asked, left out of the pool, never sent anything
    assert plan["pool"]["gpus"] == 2
    c_id = registry(ingress)[c.session_id]["peer_id"]
    assert any(c_id[-8:] in n and "does not accept assignments" in n for n in plan["notes"])
    sent = plan["assignments"]
    assert sorted(x["model"] for x in sent) == ["planned-alpha", "planned-beta"]
    assert all(x["accepted"] and x["status"] == 202 for x in sent), sent
    peers = {registry(ingress)[n.session_id]["peer_id"]: n for n in (a, b)}
    assert {x["peer_id"] for x in sent} == set(peers)

    # each opted-in node serves its model; the ingress routes to it
    def serving() -> dict[str, str] | None:
        nodes = registry(ingress)
        got = {m["id"]: s for s, n in nodes.items() if n["state"] == "SERVING"
               for m in n["models"]}
        return got if {"planned-alpha", "planned-beta"} <= set(got) else None

    where = wait_for(serving, CONVERGE_S, "both planned models SERVING")
    for x in sent:
        node = peers[x["peer_id"]]
        assert where[x["model"]] == node.session_id
        response = chat(ingress, x["model"], "hello")
        assert response.status_code == 200, response.text
        assert response.headers["x-otela-session-id"] == node.session_id
        record = registry(ingress)[node.session_id]
        assert record["engine"] == "echo" and not record["idle"]

    # refusals: forged (right issuer, wrong key), busy, not opted in
    forger = load_or_create(tmp_path / "forger").key_pair.private_key
    key = planner.key_pair.private_key
    a_id = next(p for p, n in peers.items() if n is a)
    _, forged = sender.make(planner_id, forger, target=a_id, engine="echo",
                            model="planned-alpha", tp=1)
    _, busy = sender.make(planner_id, key, target=a_id, engine="echo", model="planned-beta",
                          tp=1)
    _, uninvited = sender.make(planner_id, key, target=c_id, engine="echo",
                               model="planned-alpha", tp=1)
    for node, envelope, status, code in ((a, forged, 403, "forged"), (a, busy, 409, "busy"),
                                         (c, uninvited, 403, "not_opted_in")):
        response = post(node, envelope)
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["code"] == code and error["message"].startswith("assignment refused")
        assert f"refused ({code})" in node.log_path.read_text()
    bad = httpx.post(f"{a.http_url}/v1/assignments", content=b"{not json", timeout=10,
                     trust_env=False)
    assert bad.status_code == 400 and "error" in bad.json()
    assert "Traceback" not in a.log_path.read_text()

    # c stayed idle, with no engine, the whole time
    record = registry(ingress)[c.session_id]
    assert record["idle"] and record["engine"] is None and record["state"] == "JOIN"
    assert not c.engine_pids()
    assert c.get("/v1/assignments")["accepting"] is False
