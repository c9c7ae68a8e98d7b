"""``otela doctor`` against real nodes on this machine: it must name the right cause."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from otela.testing.localfed import LocalFederation, LocalNode, free_port, wait_for
from tests.integration.peer import new_identity

pytestmark = pytest.mark.slow


def doctor(node: LocalNode, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "otela", "doctor", "--node", node.http_url, *args],
        capture_output=True, text=True, timeout=30,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def doctor_says(node: LocalNode, text: str, *args: str, timeout: float = 30) -> str:
    def check() -> str | None:
        out = doctor(node, *args)
        return out if text in out else None

    return wait_for(check, timeout, f"otela doctor to say {text!r}", interval=0.5)


def test_doctor_names_an_unreachable_bootstrap(federation: LocalFederation) -> None:
    ghost = new_identity().peer_id.to_base58()
    address = f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/{ghost}"
    node = federation.start_node("lonely", extra_args=["--bootstrap", address])
    out = doctor_says(node, "bootstrap unreachable")
    assert address.rsplit("/p2p/", 1)[0] in out
    assert "failed attempt" in out and "keeps retrying" in out


def test_doctor_explains_peers_that_left_or_never_appeared(
    federation: LocalFederation,
) -> None:
    fed = federation
    fast = ["--suspicion-timeout", "3s"]
    a = fed.start_node("a", extra_args=fast)
    with fed.together():
        b = fed.start_node("b", bootstrap=[a])
        c = fed.start_node("c", bootstrap=[a], extra_args=fast)
        # d: with a, the second member an eviction needs as witness once b has left
        d = fed.start_node("d", bootstrap=[a], extra_args=fast)
    wait_for(lambda: all(len(n.states()) == 4 for n in (a, c, d)), 20, "all to see all")

    fed.stop_node(b)  # SIGTERM: a clean leave
    b_id = b.status["peer_id"]
    out = doctor_says(a, "peer left at", b_id)
    assert "announced LEFT (a clean shutdown)" in out

    fed.stop_node(c, sig=signal.SIGKILL)  # a crash: the federation evicts it
    c_id = c.status["peer_id"]
    out = doctor_says(a, "peer left at", c_id)
    assert "evicted by" in out and "not a clean shutdown" in out

    stranger = new_identity().peer_id.to_base58()
    assert "never appeared" in doctor(a, stranger)
