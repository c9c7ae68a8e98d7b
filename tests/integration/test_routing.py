"""Routing through real federations (separate OS processes on 127.0.0.1): requests run
only on trusted providers' nodes, even as those fail; a node cannot borrow a trusted
provider's name; requirements pick the node with the right hardware and metadata; a
failing node is ejected and comes back once it recovers; load reports reach ingresses on
answers and straight from the serving nodes (and nobody else); a request may choose its
policy."""

from __future__ import annotations

import re
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

from otela.testing.localfed import (
    LocalFederation,
    LocalNode,
    echo_engine_command,
    free_port,
    wait_for,
)

from .helpers import CONVERGE_S, serving_node, wait_known, wait_state
from .test_registry_federation import Authority

pytestmark = pytest.mark.slow

MODEL = "echo-r"
SERVED = "served-here"


def ask(node: LocalNode, content: str = "hi", *, model: str = MODEL,
        headers: dict[str, str] | None = None, **extra: object) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}], **extra}
    return httpx.post(f"{node.http_url}/v1/chat/completions", json=body,
                      headers=headers or {}, timeout=30, trust_env=False)


def engine_requests(node: LocalNode) -> int:
    """Completion requests the node's echo engine ran (it logs a line for each)."""
    log = node.home / "logs" / "engine.log"
    if not log.exists():
        return 0
    return sum(1 for line in log.read_text().splitlines() if line.strip() == SERVED)


def metric(node: LocalNode, name: str) -> float:
    text = httpx.get(f"{node.http_url}/metrics", timeout=5, trust_env=False).text
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


def test_requests_only_reach_trusted_providers_even_as_they_fail(federation):
    ingress = federation.start_node("ingress", ingress=True)
    with federation.together():
        nodes = {name: serving_node(federation, name, ingress, MODEL, "--log-on-request",
                                    SERVED, provider=f"prov-{name}") for name in "abc"}
    for node in nodes.values():
        wait_state(ingress, node, "SERVING")
    trusted = {"X-Otela-Providers": "prov-a, prov-b"}

    seen = set()
    for i in range(100):
        response = ask(ingress, f"request {i}", headers=trusted)
        assert response.status_code == 200, response.text
        seen.add(response.headers["x-otela-provider-id"])
        assert "x-otela-load" not in response.headers  # for the ingress, not the client
    assert seen == {"prov-a", "prov-b"}  # both trusted ones used, the third never

    def until(node: LocalNode, code: str) -> None:
        """Send requests until ``code`` comes back: each meanwhile must be served by a
        trusted node or refused, never dispatched elsewhere."""
        deadline = time.monotonic() + 3 * CONVERGE_S
        while time.monotonic() < deadline:
            response = ask(ingress, headers=trusted)
            if response.status_code == 200:
                assert response.headers["x-otela-provider-id"] in {"prov-a", "prov-b"}
                continue
            error = response.json()["error"]
            assert "prov-c" not in error["message"]
            if error["code"] == code:
                return error
            assert error["code"] in ("no_serving_node", "all_nodes_unreachable"), error
            time.sleep(0.1)
        raise AssertionError(f"no {code} within {3 * CONVERGE_S} s")

    nodes["a"].process.send_signal(signal.SIGKILL)  # fail-stop, no goodbye
    wait_for(lambda: nodes["a"].session_id not in {
        s for s, state in ingress.states().items() if state == "SERVING"},
        3 * CONVERGE_S, "the ingress to evict the killed node")
    response = ask(ingress, headers=trusted)
    assert response.headers["x-otela-provider-id"] == "prov-b"
    nodes["b"].process.send_signal(signal.SIGKILL)
    error = until(nodes["b"], "no_trusted_node")
    assert "prov-a" in error["message"] and "X-Otela-Providers" in error["message"]
    assert engine_requests(nodes["c"]) == 0  # never an untrusted dispatch
    # Without a trust statement the untrusted node serves: the filter, not luck, kept it out.
    assert ask(ingress).headers["x-otela-provider-id"] == "prov-c"


def test_an_ingress_default_trust_set_narrows_with_the_request(federation):
    ingress = federation.start_node("ingress", ingress=True,
                                    extra_args=["--trusted-providers", "prov-a,prov-b"])
    with federation.together():
        a = serving_node(federation, "a", ingress, MODEL, provider="prov-a")
        c = serving_node(federation, "c", ingress, MODEL, provider="prov-c")
    wait_state(ingress, a, "SERVING")
    wait_state(ingress, c, "SERVING")
    for _ in range(20):
        assert ask(ingress).headers["x-otela-provider-id"] == "prov-a"
    # A request cannot widen the ingress's set, only narrow it.
    error = ask(ingress, headers={"X-Otela-Providers": "prov-c"}).json()["error"]
    assert error["code"] == "no_trusted_node"
    assert ask(ingress, headers={"X-Otela-Providers": ""}).status_code == 400
    models = ingress.get("/v1/models")["data"]
    assert models[0]["otela"]["providers"] == ["prov-a"]  # the catalog shows usable nodes


def test_a_certified_node_cannot_claim_a_trusted_providers_name(federation, tmp_path: Path):
    authority = Authority(tmp_path)
    args = ["--authority", authority.text]

    def start(name: str, provider: str, *more: str, launcher=None,
              bootstrap=None) -> LocalNode:
        authority.enrol(federation, name, provider)
        return federation.start_node(name, bootstrap=bootstrap, launcher=launcher,
                                     extra_args=[*args, *more])

    ingress = start("ingress", "lab-ingress", "--ingress")
    with federation.together():
        good = start("good", "lab-good", "--process",
                     echo_engine_command(free_port(), [MODEL]), bootstrap=[ingress])
        launcher = [sys.executable, "-m", "tests.integration.forger",
                    "--claim-provider", "lab-good", "--rounds", "6"]
        liar = start("liar", "lab-evil", "--process",
                     echo_engine_command(free_port(), [MODEL], "--log-on-request", SERVED),
                     launcher=launcher, bootstrap=[ingress])
    wait_state(ingress, good, "SERVING")
    wait_state(ingress, liar, "SERVING")
    wait_for(lambda: liar.log_tail(400).count("forger: sent claim") >= 2, CONVERGE_S,
             "the liar to publish its claim")
    listed = {n["session_id"]: n for n in ingress.nodes()}
    assert listed[liar.session_id]["provider_id"] == "lab-evil"  # the claim was refused
    assert ingress.get("/v1/health")["replication"].get("gossip_rejected", 0) >= 1
    for i in range(50):
        response = ask(ingress, f"for good only {i}", headers={"X-Otela-Providers": "lab-good"})
        assert response.status_code == 200
        assert response.headers["x-otela-peer-id"] == good.status["peer_id"]
    assert engine_requests(liar) == 0


def test_requirements_pick_the_node_with_matching_hardware_and_metadata(federation):
    ingress = federation.start_node("ingress", ingress=True)
    with federation.together():
        h100 = federation.start_node(
            "h100", bootstrap=[ingress], provider_id="lab",
            process=echo_engine_command(free_port(), [MODEL], "--max-context", "4096"),
            extra_args=["--gpus", "1xH100-SXM5-80GB:80", "--model-meta", "quantization=fp8",
                        "--model-meta", "licence=apache-2.0"])
        a100 = federation.start_node(
            "a100", bootstrap=[ingress], provider_id="lab",
            process=echo_engine_command(free_port(), [MODEL], "--max-context", "32768"),
            extra_args=["--gpus", "2xA100-SXM4-80GB:80", "--model-meta", "tensor_parallel=2"])
    wait_state(ingress, h100, "SERVING")
    wait_state(ingress, a100, "SERVING")

    def served_by(require: str) -> set[str]:
        return {ask(ingress, headers={"X-Otela-Require": require})
                .headers["x-otela-session-id"] for _ in range(8)}

    assert served_by("gpu=H100") == {h100.session_id}
    assert served_by("min_context=16384") == {a100.session_id}
    assert served_by("quantization=fp8, engine=echo|vllm") == {h100.session_id}
    assert served_by("quantization=none, max_tp=2") == {a100.session_id}
    assert served_by("meta.licence=apache-2.0") == {h100.session_id}
    # The body extension, for clients that cannot set headers; the engine never sees it.
    response = ask(ingress, otela={"require": {"gpu": ["A100"]}, "providers": ["lab"]})
    assert response.status_code == 200
    assert response.headers["x-otela-session-id"] == a100.session_id

    nothing = ask(ingress, headers={"X-Otela-Require": "gpu=A100, quantization=fp8"})
    assert nothing.status_code == 503
    assert nothing.json()["error"]["code"] == "no_matching_node"
    assert "quantization=fp8" in nothing.json()["error"]["message"]
    bad = ask(ingress, headers={"X-Otela-Require": "gpu=H100, colour=blue"})
    assert bad.status_code == 400 and "colour=blue" in bad.json()["error"]["message"]

    everything = ingress.get("/v1/models")["data"][0]["otela"]
    assert everything["quantization"] == ["fp8", "none"]
    assert everything["max_context"] == [4096, 32768]
    assert len(everything["gpu"]) == 2
    only = httpx.get(f"{ingress.http_url}/v1/models", params={"require": "gpu=H100"},
                     trust_env=False).json()["data"][0]
    assert only["serving_nodes"] == 1 and only["otela"]["max_context"] == [4096]
    none = httpx.get(f"{ingress.http_url}/v1/models", headers={"X-Otela-Require": "max_tp=0"},
                     trust_env=False).json()
    assert none["data"] == []


def test_a_failing_node_is_ejected_and_comes_back_after_it_recovers(federation, tmp_path):
    broken = tmp_path / "broken"
    ingress = federation.start_node("ingress", ingress=True, extra_args=[
        "--eject-after", "3", "--eject-time", "3s", "--routing-policy", "round_robin"])
    with federation.together():
        flaky = serving_node(federation, "flaky", ingress, MODEL, "--fail-while", str(broken))
        steady = serving_node(federation, "steady", ingress, MODEL)
    wait_state(ingress, flaky, "SERVING")
    wait_state(ingress, steady, "SERVING")

    broken.touch()
    statuses = [ask(ingress, f"r{i}").status_code for i in range(12)]
    assert statuses.count(500) == 3  # delivered, so relayed and not retried; then ejected
    assert statuses[-4:] == [200] * 4
    routing = ingress.get("/v1/network")["routing"]
    assert flaky.session_id in routing["ejected"]
    assert metric(ingress, "otela_routing_ejections_total") == 1
    assert metric(ingress, "otela_routing_ejected_nodes") == 1

    broken.unlink()
    wait_for(lambda: flaky.session_id not in ingress.get("/v1/network")["routing"]["ejected"],
             10, "the ejection to end")
    sessions = {ask(ingress).headers["x-otela-session-id"] for _ in range(6)}
    assert sessions == {flaky.session_id, steady.session_id}  # back in rotation


def test_load_reports_reach_ingresses_on_answers_and_straight_from_the_node(federation):
    fast = ["--load-interval", "0.5s"]
    ingress = federation.start_node("ingress", ingress=True, extra_args=fast)
    with federation.together():
        other = federation.start_node("other", ingress=True, bootstrap=[ingress],
                                      extra_args=fast)
        bystander = federation.start_node("bystander", bootstrap=[ingress], extra_args=fast)
        busy = federation.start_node(
            "busy", bootstrap=[ingress], provider_id="lab", extra_args=fast,
            process=echo_engine_command(free_port(), [MODEL], "--request-delay", "6",
                                        "--max-concurrency", "2"))
    wait_state(ingress, busy, "SERVING")
    wait_state(other, busy, "SERVING")
    # and the node both ingresses (started beside it, it may hear of one a moment later):
    # it reports to the ingresses its registry lists
    wait_known(busy, ingress, other)

    def slow_request() -> None:
        ask(ingress, "take your time")

    import threading

    threads = [threading.Thread(target=slow_request, daemon=True) for _ in range(3)]
    for thread in threads:
        thread.start()

    def reported(node: LocalNode) -> dict | None:
        return node.get("/v1/network")["routing"]["loads"].get(busy.session_id)

    # The node read its engine's metrics (two running, one waiting) and sent them to the
    # ingresses: the other one, which sent it nothing, knows.
    wait_for(lambda: (r := reported(other)) is not None and r["running"] == 2
             and r["waiting"] == 1, CONVERGE_S, "the other ingress to learn the load")
    own = busy.get("/v1/network")["routing"]
    assert own["engine_metrics"] == "engine metrics" and own["own_load"]["in_flight"] == 3
    for thread in threads:
        thread.join(30)
    # Answers carry reports too: the ingress that sent them has one, fresh.
    assert ask(ingress).status_code == 200
    assert reported(ingress) is not None and reported(ingress)["age_s"] < 5
    assert metric(busy, 'otela_load_reports_total{direction="out"}') >= 2  # one per ingress
    assert metric(other, 'otela_load_reports_total{direction="in"}') >= 1
    # A node that does not route hears nothing (reports are not broadcast).
    assert metric(bystander, 'otela_load_reports_total{direction="in"}') == 0
    assert bystander.get("/v1/network")["routing"]["load_reports"]["bytes_received"] == 0


def test_a_request_may_choose_the_policy_and_prefix_affinity_keeps_users_together(
        federation):
    ingress = federation.start_node("ingress", ingress=True)
    with federation.together():
        nodes = [serving_node(federation, f"n{i}", ingress, MODEL) for i in range(3)]
    for node in nodes:
        wait_state(ingress, node, "SERVING")
    affinity = {"X-Otela-Policy": "prefix_affinity"}
    for user in ("alice", "bob", "carol"):
        homes = {ask(ingress, f"turn {i}", headers=affinity, user=user)
                 .headers["x-otela-session-id"] for i in range(6)}
        assert len(homes) == 1, user
    prompt = "You are a helpful assistant. " * 40
    homes = {ask(ingress, prompt + str(i), headers=affinity)
             .headers["x-otela-session-id"] for i in range(6)}
    assert len(homes) == 1  # the same first 512 characters
    spread = {ask(ingress, headers={"X-Otela-Policy": "round_robin"})
              .headers["x-otela-session-id"] for _ in range(3)}
    assert len(spread) == 3
    bad = ask(ingress, headers={"X-Otela-Policy": "fastest"})
    assert bad.status_code == 400 and "power_of_two" in bad.json()["error"]["message"]


def test_an_unknown_policy_stops_the_node_before_it_joins(tmp_path):
    from otela.testing.localfed import FederationError

    with LocalFederation(tmp_path) as fed, pytest.raises(FederationError) as err:
        fed.start_node("n", extra_args=["--routing-policy", "fastest"], timeout=20)
    assert "fastest" in str(err.value)
