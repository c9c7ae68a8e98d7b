"""A node listening on 0.0.0.0 is joinable from another host using only what it printed.

Two network namespaces ("hosts") joined by a veth pair, with no default route and a
loopback in each: the situation where ``gethostbyname(gethostname())`` answered
127.0.0.1 and the printed multiaddr sent the second host to itself. Host A runs an
ingress on 0.0.0.0; host B joins with A's first printed multiaddr, serves an echo model,
and a request sent from B's side to A's printed HTTP URL is routed back to B.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from otela.testing.localfed import LocalFederation, echo_engine_command, free_port, wait_for

pytestmark = pytest.mark.slow

PREFIX = f"otad{os.getpid() % 100000}"
A_IP, B_IP = "10.217.0.1", "10.217.0.2"


def run(*cmd: str) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise OSError(f"{' '.join(cmd)}: {result.stderr.strip()}")
    return result.stdout


@pytest.fixture
def hosts() -> Iterator[tuple[str, str]]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    if not shutil.which("ip") or not shutil.which("curl"):
        pytest.skip("needs iproute2 and curl")
    a, b = f"{PREFIX}-a", f"{PREFIX}-b"
    for ns in (a, b):
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    try:
        for ns in (a, b):
            run("ip", "netns", "add", ns)
            run("ip", "-n", ns, "link", "set", "lo", "up")
        run("ip", "-n", a, "link", "add", "eth0", "type", "veth", "peer", "name", "eth0",
            "netns", b)
        for ns, ip in ((a, A_IP), (b, B_IP)):
            run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            run("ip", "-n", ns, "link", "set", "eth0", "up")
        yield a, b
    finally:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        left = run("ip", "netns", "list")
        assert PREFIX not in left, f"namespaces left behind: {left}"


def printed(log: str, what: str) -> list[str]:
    """The values of ``otela: <what> <value>`` lines, in the order the node printed them."""
    prefix = f"otela: {what} "
    return [line[len(prefix):].strip() for line in log.splitlines() if line.startswith(prefix)]


def curl_json(ns: str, url: str, body: dict[str, Any] | None = None) -> Any:
    cmd = ["ip", "netns", "exec", ns, "curl", "-sf", "--max-time", "10", url]
    if body is not None:
        cmd += ["-H", "content-type: application/json", "-d", json.dumps(body)]
    return json.loads(run(*cmd))


def test_wildcard_node_is_joined_with_what_it_printed(
    hosts: tuple[str, str], federation: LocalFederation
) -> None:
    ns_a, ns_b = hosts
    a = federation.start_node("A", netns=ns_a, host="0.0.0.0", ingress=True, timeout=60)
    log = a.log_path.read_text()
    p2p, http = printed(log, "p2p"), printed(log, "http")
    assert p2p and p2p[0].startswith(f"/ip4/{A_IP}/tcp/"), p2p
    assert all("/ip4/127." in addr for addr in p2p[1:]), p2p  # loopback only after it
    assert not any("0.0.0.0" in addr for addr in p2p)
    assert http and http[0].startswith(f"http://{A_IP}:"), http

    b = federation.start_node(
        "B", netns=ns_b, host="0.0.0.0", provider_id="site-b", timeout=60,
        process=echo_engine_command(free_port(), ["model-b"]),
        extra_args=["--bootstrap", p2p[0]],
    )
    b_id = b.status["peer_id"]

    def a_sees_b_serving() -> dict[str, Any] | None:
        nodes = curl_json(ns_b, f"{http[0]}/v1/registry/nodes")["nodes"]
        mine = [n for n in nodes if n["peer_id"] == b_id and n["state"] == "SERVING"]
        return mine[0] if mine else None

    record = wait_for(a_sees_b_serving, 40, "A to list B as SERVING")
    assert record["addrs"][0].startswith(f"/ip4/{B_IP}/"), record["addrs"]
    assert record["http_url"].startswith(f"http://{B_IP}:")

    answer = curl_json(ns_b, f"{http[0]}/v1/chat/completions", {
        "model": "model-b", "messages": [{"role": "user", "content": "hi"}]})
    assert answer["choices"][0]["message"]["content"]

    def a_reachability() -> str | None:
        state = curl_json(ns_b, f"{http[0]}/v1/network")["nat"]["reachability"]
        return str(state) if state != "unknown" else None

    assert wait_for(a_reachability, 30, "A's dial-back check") == "public"


def test_doctor_warns_a_node_advertising_only_loopback_to_remote_peers(
    hosts: tuple[str, str], federation: LocalFederation
) -> None:
    ns_a, ns_b = hosts
    b = federation.start_node("B", netns=ns_b, host="0.0.0.0", timeout=60)
    b_p2p = printed(b.log_path.read_text(), "p2p")[0]
    # A listens everywhere but says it is at 127.0.0.1; it can still dial out to B.
    a = federation.start_node("A", netns=ns_a, host="0.0.0.0", timeout=60,
                              extra_args=["--public-host", "127.0.0.1", "--bootstrap", b_p2p])
    a_http = printed(a.log_path.read_text(), "http")[0]
    assert a_http.startswith("http://127.0.0.1:")

    def warned() -> str | None:
        verdict = str(curl_json(ns_a, f"{a_http}/v1/network")["verdict"])
        return verdict if "advertising only loopback" in verdict else None

    verdict = wait_for(warned, 30, "A's doctor verdict to warn about loopback")
    assert B_IP in verdict and "--public-host" in verdict
