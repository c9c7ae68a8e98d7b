"""`otela plan` end to end against a stand-in federation: real HTTP, the registry snapshot
format, the real assignment decision on each node, real Ed25519 signatures."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from otela.assignments.decide import decide
from otela.assignments.message import AssignmentError, from_http
from otela.assignments.policy import Policy, parse_accept_from, parse_allowlist
from otela.assignments.replay import ReplayGuard
from otela.cli import app
from otela.identity import load_or_create

A100 = {"name": "NVIDIA A100-SXM4-80GB", "memory_bytes": 85_899_345_920}
ALLOW = '[engines.vllm]\ncommand = "vllm serve {model} --port {port} --tensor-parallel-size {tp}"'
DEMAND = """
[[models]]
model = "llama-3.1-8b"
rate = 60
input = "normal:400,100"
output = "normal:100,30"
"""


class Federation:
    """Serves GET /v1/registry/nodes and POST /v1/assignments for several fake nodes, each
    node at its own path prefix (``/n1``...)."""

    def __init__(self, planner: str) -> None:
        self.nodes: list[dict[str, Any]] = []
        self.policies: dict[str, Policy] = {}
        self.launched: dict[str, list[str]] = {}
        self.guard = ReplayGuard()
        self.planner = planner
        fed = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/v1/registry/nodes":
                    self._reply(200, {"nodes": fed.nodes, "count": len(fed.nodes)})
                else:
                    self._reply(404, {})

            def do_POST(self) -> None:
                prefix, _, rest = self.path.lstrip("/").partition("/")
                payload = json.loads(self.rfile.read(int(self.headers["content-length"])))
                pol = fed.policies.get(prefix)
                if rest != "v1/assignments" or pol is None:
                    self._reply(404, {})
                    return
                try:
                    data = from_http(payload)
                except AssignmentError as exc:
                    self._reply(400, {"accepted": False, "reason": str(exc)})
                    return
                d = decide(data, pol, now=__import__("time").time(), replay=fed.guard,
                           port=30000)
                if d.launch:
                    fed.launched.setdefault(prefix, []).append(d.command)
                    self._reply(202, {"accepted": True, "command": d.command})
                else:
                    self._reply(d.http_status, {"accepted": False, "code": d.code,
                                                "reason": d.reason})

            def _reply(self, status: int, body: dict[str, Any]) -> None:
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, name: str, peer_id: str, *, idle: bool, opted_in: bool = True,
            models: tuple[str, ...] = ()) -> None:
        self.nodes.append({
            "session_id": name, "peer_id": peer_id, "provider_id": "lab",
            "state": "SERVING", "version": 1, "http_url": f"{self.url}/{name}",
            "hardware": {"cpus": 8, "memory_bytes": 1 << 36, "gpus": [A100]},
            "idle": idle, "models": [{"id": m} for m in models], "slurm": None,
        })
        peers, auths = parse_accept_from([self.planner] if opted_in else [])
        self.policies[name] = Policy(peer_id, peers, auths, parse_allowlist(ALLOW), 1)


@pytest.fixture
def planner_home(tmp_path: Path) -> Path:
    home = tmp_path / "planner"
    load_or_create(home)
    return home


@pytest.fixture
def federation(planner_home: Path) -> Iterator[Federation]:
    fed = Federation(load_or_create(planner_home).peer_id.to_base58())
    thread = threading.Thread(target=fed.server.serve_forever, daemon=True)
    thread.start()
    yield fed
    fed.server.shutdown()


def _peer(tmp_path: Path, name: str) -> str:
    return load_or_create(tmp_path / name).peer_id.to_base58()


def test_plan_from_a_federation_assigns_idle_nodes(federation: Federation, tmp_path: Path,
                                                   planner_home: Path) -> None:
    for name in ("n1", "n2"):
        federation.add(name, _peer(tmp_path, name), idle=True)
    federation.add("n3", _peer(tmp_path, "n3"), idle=True, opted_in=False)
    federation.add("n4", _peer(tmp_path, "n4"), idle=False,
                   models=("meta-llama/Llama-3.1-8B-Instruct",))
    demand = tmp_path / "demand.toml"
    demand.write_text(DEMAND)
    result = CliRunner().invoke(app, [
        "plan", "--from", federation.url, "--demand", str(demand), "--json",
        "--cache", str(tmp_path / "cache"), "--sim-requests", "100",
        "--assign", "--identity", str(planner_home)])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["pool"]["gpus"] == 3  # the three idle nodes; n4 serves already
    change = {(c["gpu"], c["tp"]): c for c in plan["changes"]}
    assert change[("a100-80g-sxm", 1)]["now"] == 1
    assert change[("a100-80g-sxm", 1)]["planned"] == 1 + len(plan["assignments"])
    assert len(plan["assignments"]) == 3  # the demand needs every idle GPU
    for a in plan["assignments"]:
        node = next(n for n in federation.nodes if n["peer_id"] == a["peer_id"])
        opted = federation.policies[node["session_id"]].peers
        assert a["accepted"] == bool(opted), a
        if not opted:
            assert a["status"] == 403 and "accepts no assignments" in a["detail"]
    launched = [c for cmds in federation.launched.values() for c in cmds]
    assert launched and all(c.startswith("vllm serve meta-llama/Llama-3.1-8B-Instruct "
                                         "--port 30000") for c in launched)
    assert sorted(federation.launched) == ["n1", "n2"]  # n3 did not opt in
    refused = [a for a in plan["assignments"] if not a["accepted"]]
    assert len(refused) == 1 and refused[0]["status"] == 403


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    runner = CliRunner()
    demand = tmp_path / "d.toml"
    demand.write_text(DEMAND)
    cases = [
        ["plan", "--demand", str(demand)],
        ["plan", "--pool", str(tmp_path / "missing.toml"), "--demand", str(demand)],
        ["plan", "--pool", str(demand), "--demand", str(demand)],
        ["plan", "--from", "http://127.0.0.1:9", "--demand", str(demand)],
        ["plan", "--pool", str(demand), "--demand", str(demand), "--assign"],
    ]
    for args in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output
        assert result.output.strip().startswith("otela plan:"), result.output


def test_pool_file_plan_json_and_sbatch(tmp_path: Path) -> None:
    pool = tmp_path / "pool.toml"
    pool.write_text('[[hosts]]\nname = "a"\ngpu = "a100-80g-sxm"\ngpus_per_host = 2\n')
    demand = tmp_path / "d.toml"
    demand.write_text(DEMAND.replace("rate = 60", "rate = 3"))
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(app, [
        "plan", "--pool", str(pool), "--demand", str(demand), "--cache", str(tmp_path / "c"),
        "--sim-requests", "100", "--emit-sbatch", str(tmp_path / "jobs"), "--engine", "echo",
        "--out", str(out), "--objective", "gpus"])
    assert result.exit_code == 0, result.output
    plan = json.loads(out.read_text())
    assert plan["solver"]["optimal"] and plan["predicted"]["gpus"] >= 1
    assert len(plan["sbatch"]) == len(plan["replicas"])
    assert "python -m otela.engine.demo.echo" in Path(plan["sbatch"][0]).read_text()
    # the same demand at 100x the rate cannot be met within the pool: exit 3, one line
    demand.write_text(DEMAND.replace("rate = 60", "rate = 300"))
    result = CliRunner().invoke(app, [
        "plan", "--pool", str(pool), "--demand", str(demand), "--cache", str(tmp_path / "c"),
        "--sim-requests", "100", "--objective", "gpus"])
    assert result.exit_code == 3, result.output
    assert "needs 300 req/s" in result.output
