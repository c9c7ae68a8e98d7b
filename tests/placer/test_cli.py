"""`otela plan` end to end against a stand-in federation: real HTTP, the registry snapshot
format, the nodes' real assignment endpoint logic (otela.assignments.acceptor), real Ed25519
signatures. tests/integration/test_assign.py does the same with real nodes."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from otela.assignments.acceptor import Acceptor
from otela.assignments.policy import Policy, parse_accept_from, parse_allowlist
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
    """Serves GET /v1/registry/nodes, and GET and POST /v1/assignments for several fake
    nodes, each node at its own path prefix (``/n1``...)."""

    def __init__(self, planner: str) -> None:
        self.nodes: list[dict[str, Any]] = []
        self.policies: dict[str, Policy | None] = {}
        self.acceptors: dict[str, Acceptor] = {}
        self.launched: dict[str, list[str]] = {}
        self.posted: list[str] = []
        self.planner = planner
        fed = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                prefix, _, rest = self.path.lstrip("/").partition("/")
                if self.path.partition("?")[0] == "/v1/registry/nodes":
                    self._reply(200, {"nodes": fed.nodes, "count": len(fed.nodes)})
                elif rest == "v1/assignments" and prefix in fed.acceptors:
                    self._reply(200, fed.acceptors[prefix].describe())
                else:
                    self._reply(404, {})

            def do_POST(self) -> None:
                prefix, _, rest = self.path.lstrip("/").partition("/")
                payload = json.loads(self.rfile.read(int(self.headers["content-length"])))
                acceptor = fed.acceptors.get(prefix)
                if rest != "v1/assignments" or acceptor is None:
                    self._reply(404, {})
                    return
                fed.posted.append(prefix)
                answer = acceptor.submit(payload)
                self._reply(answer.status, answer.body)

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
        peers, auths = parse_accept_from([self.planner])
        pol = Policy(peer_id, peers, auths, parse_allowlist(ALLOW), 1) if opted_in else None
        self.policies[name] = pol

        def launch(command: Any, assignment: Any, name: str = name) -> None:
            self.launched.setdefault(name, []).append(" ".join(command.argv))

        self.acceptors[name] = Acceptor(pol, launch=launch, busy=lambda: False,
                                        pick_port=lambda: 30000)


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
    # n1 and n2 (n3 did not opt in: asked, and left out); n4 serves already
    assert plan["pool"]["gpus"] == 2
    assert any("left out of the pool: does not accept assignments" in n for n in plan["notes"])
    change = {(c["gpu"], c["tp"]): c for c in plan["changes"]}
    assert change[("a100-80g-sxm", 1)]["now"] == 1
    assert change[("a100-80g-sxm", 1)]["planned"] == 1 + len(plan["assignments"])
    assert len(plan["assignments"]) == 2  # the demand needs every idle GPU
    assert all(a["accepted"] and a["status"] == 202 for a in plan["assignments"])
    launched = [c for cmds in federation.launched.values() for c in cmds]
    assert launched and all(c.startswith("vllm serve meta-llama/Llama-3.1-8B-Instruct "
                                         "--port 30000") for c in launched)
    assert sorted(federation.launched) == ["n1", "n2"]
    assert "n3" not in federation.posted  # never sent anything

    # n3 refuses what it is sent anyway: 403 in the OpenAI error shape
    from otela.assignments import sender
    from otela.identity import load_or_create as identity

    key = identity(planner_home).key_pair.private_key
    n3 = next(n for n in federation.nodes if n["session_id"] == "n3")
    a, env = sender.make(federation.planner, key, target=n3["peer_id"], engine="vllm",
                         model="m", tp=1)
    res = sender.send(n3["http_url"], n3["peer_id"], a, env)
    assert (res.status, res.accepted, res.code) == (403, False, "not_opted_in")
    assert "accepts no assignments" in res.detail


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


def test_a_quantized_model_is_planned_at_its_precision(tmp_path: Path) -> None:
    """A demand file's FP8 70B on one 80 GB GPU: the plan places it (BF16 would not fit)
    and says at which precision; the --ttft default keeps the precision too."""
    pool = tmp_path / "pool.toml"
    pool.write_text('[[hosts]]\nname = "a"\ngpu = "a100-80g-sxm"\ngpus_per_host = 1\n')
    demand = tmp_path / "d.toml"
    demand.write_text('[[models]]\nmodel = "llama-3.3-70b"\nname = "llama-70b-fp8"\n'
                      'rate = 0.1\ninput = "normal:400,100"\noutput = "normal:100,30"\n'
                      'weight_bits = 8\nact_bits = 8\ntp = [1]\n')
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(app, [
        "plan", "--pool", str(pool), "--demand", str(demand), "--cache", str(tmp_path / "c"),
        "--sim-requests", "100", "--ttft", "30", "--out", str(out)])
    assert result.exit_code == 0, result.output
    plan = json.loads(out.read_text())
    assert [(m["name"], m["precision"]) for m in plan["models"]] == [("llama-70b-fp8",
                                                                      "fp8 w8a8")]
    assert [(r["model"], r["tp"]) for r in plan["replicas"]] == [("llama-70b-fp8", 1)]


def test_which_idle_nodes_would_take_an_assignment() -> None:
    from simulator.placer.federation import accepts

    policy = {"accepting": True, "peers": ["12D3KooWPlanner"], "authorities": ["abc"],
              "engines": ["vllm"], "busy": False}
    assert accepts(policy, "12D3KooWPlanner", "vllm") is None
    assert accepts(policy, "otela-authority:abc", "vllm") is None
    assert "this planner" in str(accepts(policy, "12D3KooWOther", "vllm"))
    assert "this authority" in str(accepts(policy, "otela-authority:xyz", "vllm"))
    assert "no engine 'sglang'" in str(accepts(policy, "12D3KooWPlanner", "sglang"))
    assert "already runs" in str(accepts({**policy, "busy": True}, "12D3KooWPlanner", "vllm"))
    for refusal in ({"accepting": False}, None, [], "yes"):
        assert "does not accept" in str(accepts(refusal, "12D3KooWPlanner", "vllm"))
