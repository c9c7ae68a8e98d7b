"""Signed assignments: the pure decision a node takes, every refusal reason, the wire format
and the sender against a real HTTP server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import msgpack
import pytest
from libp2p.crypto.ed25519 import Ed25519PrivateKey
from libp2p.peer.id import ID

from otela.assignments import message, sender
from otela.assignments.acceptor import Acceptor, load_policy
from otela.assignments.decide import decide
from otela.assignments.message import Assignment, AssignmentError, from_http, sign, to_http
from otela.assignments.policy import Policy, PolicyError, parse_accept_from, parse_allowlist
from otela.assignments.replay import ReplayGuard
from otela.registry.certificate import format_authority, issue_certificate

NOW = 1_800_000_000.0
ALLOW = """
[engines.vllm]
command = "vllm serve {model} --port {port} --tensor-parallel-size {tp}"
models = ["meta-llama/*"]
max_tp = 4

[engines.echo]
command = "python -m otela.engine.demo.echo --port {port} --model {model} --max-context {ctx}"
params = ["ctx"]
"""


def peer() -> tuple[Ed25519PrivateKey, str]:
    key = Ed25519PrivateKey.new()
    return key, ID.from_pubkey(key.get_public_key()).to_base58()


PLANNER_KEY, PLANNER = peer()
NODE_KEY, NODE = peer()
AUTH_KEY = Ed25519PrivateKey.new()


def policy(**kw: Any) -> Policy:
    peers, auths = parse_accept_from([PLANNER, format_authority(AUTH_KEY.get_public_key())])
    base: dict[str, Any] = {"node_peer_id": NODE, "peers": peers, "authorities": auths,
                            "engines": parse_allowlist(ALLOW), "local_gpus": 4}
    base.update(kw)
    return Policy(**base)


def assignment(**kw: Any) -> Assignment:
    base: dict[str, Any] = {"id": message.new_id(), "issuer": PLANNER, "target": NODE,
                            "issued_at": NOW - 5, "expires_at": NOW + 600, "engine": "vllm",
                            "model": "meta-llama/Llama-3.3-70B-Instruct", "tp": 4,
                            "plan": "p1", "params": {}}
    base.update(kw)
    return Assignment(**base)


def check(data: bytes, pol: Policy | None = None, guard: ReplayGuard | None = None,
          busy: bool = False):  # type: ignore[no-untyped-def]
    return decide(data, pol or policy(), now=NOW, replay=guard or ReplayGuard(), port=21000,
                  busy=busy)


def test_a_signed_allowed_assignment_launches_the_rendered_template() -> None:
    d = check(sign(assignment(), PLANNER_KEY))
    assert d.launch and d.code == "ok" and d.http_status == 202
    assert d.argv == ("vllm", "serve", "meta-llama/Llama-3.3-70B-Instruct", "--port", "21000",
                      "--tensor-parallel-size", "4")


def test_the_membership_authority_may_assign_when_listed() -> None:
    issuer = message.issuer_for_authority(AUTH_KEY.get_public_key())
    d = check(sign(assignment(issuer=issuer), AUTH_KEY))
    assert d.launch, d.reason
    # ... but not when only peers are accepted
    peers, _ = parse_accept_from([PLANNER])
    d = check(sign(assignment(issuer=issuer), AUTH_KEY), policy(peers=peers, authorities={}))
    assert d.code == "unauthorized"


def test_a_node_that_did_not_opt_in_refuses_everything() -> None:
    for pol in (policy(peers=frozenset(), authorities={}), policy(engines={})):
        d = check(sign(assignment(), PLANNER_KEY), pol)
        assert not d.launch and d.code == "not_opted_in"


def test_forged_and_unauthorised_assignments_are_refused() -> None:
    other_key, other = peer()
    # signed by someone not accepted
    assert check(sign(assignment(issuer=other), other_key)).code == "unauthorized"
    # claims to be the planner, signed by another key
    assert check(sign(assignment(), other_key)).code == "forged"
    # body tampered after signing
    env = msgpack.unpackb(sign(assignment(), PLANNER_KEY), raw=False)
    body = msgpack.unpackb(env["body"], raw=False)
    body["model"] = "meta-llama/Evil"
    env["body"] = msgpack.packb(body, use_bin_type=True)
    assert check(msgpack.packb(env, use_bin_type=True)).code == "forged"


def test_another_otela_signature_cannot_be_replayed_as_an_assignment() -> None:
    # a membership certificate, signed by the accepted authority, is no assignment
    cert = issue_certificate(AUTH_KEY, peer_id=NODE, provider_id="lab", expires_at=NOW + 60,
                             now=NOW)
    assert check(cert).code == "malformed"
    # the same body signed without the assignment domain does not verify
    a = assignment()
    body = msgpack.packb(a.body(), use_bin_type=True)
    env = {"v": 1, "kind": "assignment", "body": body, "sig": PLANNER_KEY.sign(body)}
    assert check(msgpack.packb(env, use_bin_type=True)).code == "forged"


@pytest.mark.parametrize("change, code", [
    ({"target": peer()[1]}, "wrong_target"),
    ({"expires_at": NOW - 1, "issued_at": NOW - 100}, "expired"),
    ({"issued_at": NOW + 1000, "expires_at": NOW + 1100}, "not_yet_valid"),
    ({"expires_at": NOW + 100_000}, "too_long_lived"),
    ({"engine": "sglang"}, "engine_not_allowed"),
    ({"model": "Qwen/Qwen3-8B"}, "model_not_allowed"),
    ({"model": "-rf"}, "bad_model"),
    # a glob such as `m*` or `meta-llama/*` matched these before they were checked as names
    ({"model": "meta-llama/../../../../etc"}, "bad_model"),
    ({"model": "meta-llama/./x"}, "bad_model"),
    ({"model": "meta-llama/x\n--trust-remote-code"}, "bad_model"),
    ({"model": "meta-llama/%2e%2e/x"}, "bad_model"),
    ({"tp": 8}, "too_many_gpus"),
    ({"params": {"ctx": "512"}}, "bad_params"),
    ({"engine": "echo", "model": "x", "tp": 1}, "bad_params"),
    ({"engine": "echo", "model": "x", "tp": 1, "params": {"ctx": "1 2"}}, "bad_params"),
])
def test_each_refusal_reason(change: dict[str, Any], code: str) -> None:
    d = check(sign(assignment(**change), PLANNER_KEY))
    assert not d.launch and d.code == code, d.reason


def test_allowed_params_are_substituted() -> None:
    a = assignment(engine="echo", model="tiny", tp=1, params={"ctx": "512"})
    d = check(sign(a, PLANNER_KEY))
    assert d.launch
    assert d.command == ("python -m otela.engine.demo.echo --port 21000 --model tiny "
                         "--max-context 512")


def test_replays_are_refused_until_the_memory_expires() -> None:
    guard = ReplayGuard()
    data = sign(assignment(), PLANNER_KEY)
    assert check(data, guard=guard).launch
    again = check(data, guard=guard)
    assert again.code == "replayed" and again.http_status == 409
    # a refused assignment is not remembered: it can be sent again once the node is idle
    other = sign(assignment(), PLANNER_KEY)
    assert check(other, guard=guard, busy=True).code == "busy"
    assert check(other, guard=guard).launch
    guard.prune(NOW + 601)
    assert not guard.seen
    assert ReplayGuard.from_json(ReplayGuard({"a": 1.0}).to_json()).seen == {"a": 1.0}


def test_malformed_envelopes() -> None:
    for junk in (b"", b"\x00" * 10, msgpack.packb({"v": 2}), b"x" * 9000,
                 msgpack.packb({"v": 1, "kind": "assignment", "body": b"", "sig": b"s" * 64})):
        assert check(junk).code == "malformed"
    with pytest.raises(AssignmentError):
        sign(assignment(id="short"), PLANNER_KEY)
    with pytest.raises(AssignmentError):
        from_http({"envelope": "!!"})
    assert from_http(to_http(b"abc")) == b"abc"


def test_bad_policies_are_one_line_errors() -> None:
    with pytest.raises(PolicyError, match=r"not a libp2p peer id|Ed25519"):
        parse_accept_from(["nobody"])
    with pytest.raises(PolicyError, match="port"):
        parse_allowlist('[engines.x]\ncommand = "serve {model}"')
    with pytest.raises(PolicyError, match="unknown placeholders"):
        parse_allowlist('[engines.x]\ncommand = "serve {model} --port {port} {evil}"')
    with pytest.raises(PolicyError, match="no \\[engines"):
        parse_allowlist("")


class _Node(BaseHTTPRequestHandler):
    """A stand-in node endpoint that runs the node's real endpoint logic."""

    acceptor = Acceptor(policy(), launch=lambda command, a: None, busy=lambda: False,
                        clock=lambda: NOW, pick_port=lambda: 21000)

    def do_POST(self) -> None:
        length = int(self.headers["content-length"])
        answer = self.acceptor.submit(json.loads(self.rfile.read(length)))
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


@pytest.fixture
def node_url() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Node)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_sender_posts_and_reports_each_outcome(node_url: str) -> None:
    a, env = sender.make(PLANNER, PLANNER_KEY, target=NODE, engine="vllm",
                         model="meta-llama/Llama-2-13b-hf", tp=1, now=NOW)
    ok = sender.send(node_url, NODE, a, env)
    assert ok.accepted and ok.status == 202 and "--port 21000" in ok.detail
    again = sender.send(node_url, NODE, a, env)
    assert not again.accepted and again.status == 409
    forged_key, _ = peer()
    b, env2 = sender.make(PLANNER, forged_key, target=NODE, engine="vllm",
                          model="meta-llama/Llama-2-13b-hf", tp=1, now=NOW)
    bad = sender.send(node_url, NODE, b, env2)
    assert not bad.accepted and bad.status == 403 and "signature" in bad.detail
    assert bad.code == "forged"
    down = sender.send("http://127.0.0.1:9", NODE, a, env)
    assert down.status == 0 and not down.accepted


# -- the node side (otela.assignments.acceptor) -------------------------------------------


def acceptor(tmp_path: Path, launched: list[Any], *, busy: bool = False,
             pol: Policy | None = None, opted_in: bool = True) -> Acceptor:
    return Acceptor((pol or policy()) if opted_in else None,
                    launch=lambda command, a: launched.append((command, a)),
                    busy=lambda: busy, replay_path=tmp_path / "seen.json", clock=lambda: NOW,
                    pick_port=lambda: 21000)


def test_the_acceptor_launches_once_and_remembers_across_restarts(tmp_path: Path) -> None:
    launched: list[Any] = []
    data = to_http(sign(assignment(), PLANNER_KEY))
    answer = acceptor(tmp_path, launched).submit(data)
    assert answer.status == 202 and answer.body["accepted"]
    assert answer.body["engine_url"] == "http://127.0.0.1:21000"
    (command, a), = launched
    assert a.model == "meta-llama/Llama-3.3-70B-Instruct"
    assert command.argv[:2] == ("vllm", "serve") and command.kind == "vllm"
    # a restarted node (a new acceptor over the same home) still refuses the replay
    again = acceptor(tmp_path, launched).submit(data)
    assert again.status == 409 and again.body["error"]["code"] == "replayed"
    assert len(launched) == 1


def test_the_acceptor_answers_refusals_as_openai_errors(tmp_path: Path) -> None:
    launched: list[Any] = []
    cases = [
        (acceptor(tmp_path, launched, opted_in=False), to_http(sign(assignment(), PLANNER_KEY)),
         403, "not_opted_in"),
        (acceptor(tmp_path, launched), {"envelope": 3}, 400, "malformed"),
        (acceptor(tmp_path, launched), to_http(sign(assignment(), peer()[0])), 403, "forged"),
        (acceptor(tmp_path, launched, busy=True), to_http(sign(assignment(), PLANNER_KEY)),
         409, "busy"),
    ]
    for acc, payload, status, code in cases:
        answer = acc.submit(payload)
        assert answer.status == status
        error = answer.body["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == code
    assert not launched
    assert acceptor(tmp_path, launched, opted_in=False).describe()["accepting"] is False
    view = acceptor(tmp_path, launched).describe()
    assert view["accepting"] and view["peers"] == [PLANNER]
    assert view["engines"] == ["echo", "vllm"] and "command" not in json.dumps(view)


def test_a_damaged_replay_memory_is_ignored(tmp_path: Path) -> None:
    (tmp_path / "seen.json").write_text("[not json")
    launched: list[Any] = []
    assert acceptor(tmp_path, launched).submit(to_http(sign(assignment(), PLANNER_KEY))).status \
        == 202


def test_node_settings_become_a_policy(tmp_path: Path) -> None:
    auth = AUTH_KEY.get_public_key()
    assert load_policy([], None, tmp_path, node_peer_id=NODE, federation_authority=None,
                       local_gpus=0) is None
    with pytest.raises(PolicyError, match="engine allowlist"):
        load_policy([PLANNER], None, tmp_path, node_peer_id=NODE, federation_authority=None,
                    local_gpus=0)
    (tmp_path / "engines.toml").write_text(ALLOW)
    with pytest.raises(PolicyError, match="needs --authority"):
        load_policy(["authority"], None, tmp_path, node_peer_id=NODE,
                    federation_authority=None, local_gpus=0)
    pol = load_policy(["authority", PLANNER], None, tmp_path, node_peer_id=NODE,
                      federation_authority=auth, local_gpus=0)
    assert pol is not None and pol.opted_in and pol.peers == {PLANNER}
    assert list(pol.authorities.values()) == [auth]
    assert pol.local_gpus == 1  # a CPU-only node still runs TP 1
    issuer = message.issuer_for_authority(auth)
    d = decide(sign(assignment(issuer=issuer, tp=1), AUTH_KEY), pol, now=NOW,
               replay=ReplayGuard(), port=1)
    assert d.launch, d.reason


def test_refusal_logging_has_a_budget_and_says_what_it_skipped() -> None:
    from otela.logbudget import LogBudget

    now = [0.0]
    budget = LogBudget(burst=3, window=60.0, clock=lambda: now[0])
    assert [budget.take() for _ in range(5)] == [0, 0, 0, None, None]
    now[0] += 20.0  # one line's worth of refill
    assert budget.take() == 2 and budget.take() is None
    now[0] += 3600.0  # refills up to the burst, never beyond
    assert [budget.take() for _ in range(4)] == [1, 0, 0, None]


def test_a_flood_of_refusals_is_counted_but_not_all_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    node = acceptor(tmp_path, [], opted_in=False)
    with caplog.at_level("WARNING", logger="otela.assignments"):
        for _ in range(100):
            assert node.submit({"envelope": "x"}).status == 403
    assert node.refused == {"not_opted_in": 100}
    assert 1 <= len(caplog.records) <= 20
