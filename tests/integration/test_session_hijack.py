"""A member that forges records for another node's session (hijack, forced LEFT) changes
nothing: every replica rejects, counts and logs the forgeries, and the victim keeps serving.

The forger is a real otela daemon with one added step (``tests/integration/forger.py``),
a separate OS process, admitted like any member (with a valid certificate of its own in
authority mode).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from otela.testing.localfed import LocalFederation, LocalNode, wait_for

from .helpers import CONVERGE_S, chat, serving_node, wait_state
from .test_registry_federation import Authority

pytestmark = pytest.mark.slow

MODEL = "echo-victim"


def forged_rejections(node: LocalNode) -> int:
    return int(node.get("/v1/health")["replication"].get("forged_rejected", 0))


def start_forger(federation: LocalFederation, victim: LocalNode, boot: LocalNode,
                 extra_args: list[str] | None = None) -> LocalNode:
    launcher = [sys.executable, "-m", "tests.integration.forger",
                "--victim", victim.session_id, "--rounds", "4"]
    return federation.start_node("forger", bootstrap=[boot], launcher=launcher,
                                 extra_args=extra_args)


def check_the_attack_failed(replicas: list[LocalNode], victim: LocalNode,
                            ingress: LocalNode, forger: LocalNode) -> None:
    wait_for(lambda: forger.log_tail(400).count("forger: sent") >= 2, CONVERGE_S,
             "the forger to publish its forgeries twice")
    for replica in replicas:
        wait_for(lambda replica=replica: forged_rejections(replica) >= 2, CONVERGE_S,
                 f"{replica.name} to reject the forgeries")
    wait_for(lambda: forger.process.poll() is not None
             or forger.log_tail(400).count("forger: sent") >= 4, 30.0,
             "the forger to finish its rounds")
    for replica in replicas:
        nodes = {n["session_id"]: n for n in replica.nodes()}
        entry = nodes[victim.session_id]
        assert entry["state"] == "SERVING", replica.name
        assert entry["peer_id"] == victim.status["peer_id"]
        assert entry["http_url"] == victim.http_url
        assert entry["provider_id"] == victim.status["provider_id"]
        assert "rejected a forged registry record" in replica.log_tail(2000)
    health = victim.get("/v1/health")
    assert health["state"] == "SERVING" and health["session_id"] == victim.session_id
    for i in range(20):
        response = chat(ingress, MODEL, f"prompt {i}")
        assert response.status_code == 200
        assert response.headers["x-otela-peer-id"] == victim.status["peer_id"]


def scenario(federation: LocalFederation, start: Callable[..., LocalNode],
             forger_args: list[str] | None = None) -> None:
    boot = start(federation, "boot", ingress=True)
    victim = start(federation, "victim", bootstrap=[boot], process=MODEL)
    wait_state(boot, victim, "SERVING")
    forger = start_forger(federation, victim, boot, forger_args)
    wait_for(lambda: forger.session_id in boot.states(), CONVERGE_S, "the forger to join")
    check_the_attack_failed([boot, victim], victim, boot, forger)


def test_open_federation_rejects_hijack_and_forced_left(federation):
    def start(fed: LocalFederation, name: str, *, bootstrap=None, ingress=False,
              process=None) -> LocalNode:
        if process:
            return serving_node(fed, name, bootstrap[0], process)
        return fed.start_node(name, bootstrap=bootstrap, ingress=ingress)

    scenario(federation, start)


def test_a_certified_member_cannot_hijack_either(federation, tmp_path: Path):
    authority = Authority(tmp_path)

    def start(fed: LocalFederation, name: str, *, bootstrap=None, ingress=False,
              process=None) -> LocalNode:
        home = authority.enrol(fed, name, f"lab-{name}")
        args = ["--authority", authority.text]
        if ingress:
            args.append("--ingress")
        if process:
            from otela.testing.localfed import echo_engine_command, free_port

            args += ["--process", echo_engine_command(free_port(), [process])]
        assert home == fed.root / name
        return fed.start_node(name, bootstrap=bootstrap, extra_args=args)

    authority.enrol(federation, "forger", "lab-forger")
    scenario(federation, start, ["--authority", authority.text])
