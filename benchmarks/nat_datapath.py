"""NAT traversal figures with real otela processes behind real NATs (root; docs/nat.md).

    sudo .venv/bin/python -m benchmarks.nat_datapath [--requests 200]

Builds the namespace topology of tests/integration/nat_topology.py (a public relay R, nodes A and
B each behind its own MASQUERADE NAT), starts one otela process per namespace, and prints
JSON: how long each NAT'd node took to learn it is private, reserve on R and advertise its
circuit address; the latency of the first request B -> A (includes the relayed dial); when
hole punching upgraded the connection; and per-request latency over the libp2p data path
(client inside B's namespace, so no process start-up is counted). Namespaces are removed
at the end, also on errors.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from otela.testing.localfed import (
    LocalFederation,
    LocalNode,
    echo_engine_command,
    free_port,
    wait_for,
)
from otela.testing.nat_topology import PRIVATE, PUBLIC, Topology

CLIENT = r"""
import json, sys, time, httpx
url, n = sys.argv[1], int(sys.argv[2])
body = {"model": "model-a", "messages": [{"role": "user", "content": "hi"}]}
out = {"plain": [], "stream_first": [], "stream_total": [], "paths": set()}
with httpx.Client(timeout=30, trust_env=False) as c:
    for _ in range(n):
        t = time.perf_counter(); r = c.post(url, json=body); r.raise_for_status()
        out["plain"].append((time.perf_counter() - t) * 1e3)
        out["paths"].add(r.headers.get("x-otela-path", "http"))
    for _ in range(max(1, n // 4)):
        t = time.perf_counter(); first = None
        with c.stream("POST", url, json={**body, "stream": True}) as r:
            for chunk in r.iter_raw():
                first = first or (time.perf_counter() - t) * 1e3
        out["stream_first"].append(first)
        out["stream_total"].append((time.perf_counter() - t) * 1e3)
out["paths"] = sorted(out["paths"])
print(json.dumps(out))
"""


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--no-hole-punch", action="store_true",
                        help="keep A and B on the relay (measures the relayed data path)")
    args = parser.parse_args()
    topo = Topology("otbench")
    topo.down()
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        fed = LocalFederation(Path(tmp))
        try:
            topo.up()

            def start(name: str, ip: str, **kw: Any) -> LocalNode:
                return fed.start_node(name, netns=topo.ns(name), host=ip,
                                      p2p_port=4001, timeout=60, **kw)

            relay = start("R", PUBLIC["R"], extra_args=["--relay"])
            t0 = time.monotonic()
            extra = ["--no-hole-punch"] if args.no_hole_punch else []
            a = start("A", PRIVATE["A"], bootstrap=[relay], extra_args=extra,
                      process=echo_engine_command(free_port(), ["model-a"]))
            b = start("B", PRIVATE["B"], bootstrap=[relay], extra_args=extra)
            a_id = a.status["peer_id"]

            def advertised() -> bool:
                nodes = topo.get_json("B", f"{b.http_url}/v1/registry/nodes")["nodes"]
                return any(n["peer_id"] == a_id and n["circuit_addrs"] and n["state"] ==
                           "SERVING" for n in nodes)

            wait_for(advertised, 60, "A's circuit address at B", interval=0.05)
            result["a_start_to_circuit_addr_at_b_s"] = round(time.monotonic() - t0, 2)
            url = f"{b.http_url}/v1/chat/completions"
            t = time.perf_counter()
            topo.post("B", url, json.dumps({"model": "model-a", "messages": [
                {"role": "user", "content": "hi"}]}))
            result["first_request_incl_relayed_dial_and_curl_ms"] = round(
                (time.perf_counter() - t) * 1e3, 1)

            def punched() -> dict[str, Any] | None:
                report = topo.get_json("B", f"{b.http_url}/v1/network?peer={a_id}")
                log = report["peer"]["log"]
                return log if log and log["hole_punch"]["upgraded_to_direct"] else None

            try:
                log = wait_for(punched, 5 if args.no_hole_punch else 30, "hole punch",
                               interval=0.2)
                result["hole_punch_upgrade_after_s"] = log["hole_punch"]["upgrade_after_s"]
            except Exception:
                result["hole_punch_upgrade_after_s"] = None
            run = subprocess.run([*topo.exec_prefix("B"), sys.executable, "-c", CLIENT, url,
                                  str(args.requests)], capture_output=True, text=True, timeout=600)
            data = json.loads(run.stdout)
            result["paths"] = data["paths"]
            for key in ("plain", "stream_first", "stream_total"):
                result[f"{key}_ms_p50_p95"] = [pct(data[key], 0.5), pct(data[key], 0.95)]
            result["requests"] = args.requests
        finally:
            fed.close()
            left = topo.down()
            if left:
                print(f"namespaces left behind: {left}", file=sys.stderr)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
