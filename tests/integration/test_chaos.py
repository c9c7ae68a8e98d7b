"""Chaos under load (the slowest tier): what clients of an ingress see while serving nodes
freeze, die, or the bootstrap node restarts. Real processes; a steady open-loop load the
whole time. The longer version, with figures, is ``benchmarks/chaos.py``; partitions under
load are in ``test_partition.py``.

What a client relies on, checked for every request sent:
- a non-streaming request succeeds whenever some trusted node still serves the model,
  even one running on a node at the moment that node is killed (``--retry-broken``, on by
  default: it is sent to another node);
- a stream completes, one running on a node at the moment it is killed too (sent to
  another node before its answer began, continued on another node once it had: request
  migration): no error event, no cut, no hang;
- no node that came back stays out of routing.
"""

from __future__ import annotations

import re
import signal
import time
from collections import Counter
from collections.abc import Callable

import httpx
import pytest
import trio

from otela.testing.localfed import LocalFederation, LocalNode, free_port, wait_for
from otela.testing.steady_load import (
    QUIET,
    Outcome,
    SteadyLoad,
    machine_pids,
    signal_machine,
    start_behind_ingress,
)

pytestmark = [pytest.mark.slow, pytest.mark.chaos]

MODEL = "echo-chaos"
FREEZE_S = 12.0  # longer than it takes to suspect and evict a node here (~8 s)
SETTLE_S = 120.0  # generous: a loaded CI machine stretches failure detection


def serving_peers(ingress: LocalNode) -> set[str]:
    return {n["peer_id"] for n in ingress.nodes()
            if n["state"] == "SERVING"}


def report(load: SteadyLoad, outcomes: list[Outcome]) -> str:
    return f"{Counter(o.result for o in outcomes)}; messages: {dict(load.messages)}"


def test_clients_see_no_errors_through_restart_freeze_and_kill(
    federation: LocalFederation,
) -> None:
    boot_port = free_port()  # a bootstrap node keeps its well-known address on restart
    boot, ingress, nodes = start_behind_ingress(
        federation, MODEL, 6, boot_port, engine_args=["--request-delay", "0.05",
                                                      "--token-delay", "0.02"],
        settle_s=SETTLE_S)
    everyone = {n.status["peer_id"] for n in [ingress, *nodes]}
    load = SteadyLoad(ingress.http_url, MODEL, rate=12.0, stream_share=0.25, timeout=120.0)

    def restart_bootstrap() -> None:
        federation.stop_node(boot)
        restarted = federation.start_node("boot", extra_args=QUIET, timeout=60,
                                          p2p_port=boot_port)
        wait_for(lambda: everyone <= {n["peer_id"] for n in restarted.nodes()
                                      if n["state"] != "LEFT"}, SETTLE_S,
                 "the restarted bootstrap node to list everyone again", interval=0.25)

    def freeze_a_third() -> None:
        frozen = nodes[:2]
        pids = [pid for node in frozen for pid in machine_pids(node)]
        signal_machine(pids, signal.SIGSTOP)
        time.sleep(FREEZE_S)
        signal_machine(pids, signal.SIGCONT)
        names = {n.status["peer_id"] for n in frozen}
        # Back in rotation (under new sessions if they were evicted while frozen).
        wait_for(lambda: names <= serving_peers(ingress), SETTLE_S,
                 "the frozen nodes to serve again", interval=0.25)

    def kill_half() -> None:
        victims = nodes[3:]
        pids = [pid for node in victims for pid in machine_pids(node)]
        signal_machine(pids, signal.SIGKILL)
        gone = {n.session_id for n in victims}
        wait_for(lambda: all(ingress.states().get(s) in (None, "LEFT") for s in gone),
                 SETTLE_S, "the ingress to evict the killed nodes", interval=0.25)
        time.sleep(2.0)  # keep the load on the survivors a moment

    phases: list[Callable[[], None]] = [restart_bootstrap, freeze_a_third, kill_half]

    async def run() -> None:
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(load.run, stop)
            await trio.sleep(2.0)
            for phase in phases:
                await trio.to_thread.run_sync(phase)
            stop.set()

    trio.run(run)

    assert len(load.outcomes) > 300, report(load, load.outcomes)
    # Zero client-visible errors, those running on a node while it was killed included:
    # re-sent before their answer began, continued elsewhere once it had.
    failures = [o for o in load.outcomes if o.result != "ok"]
    assert not failures, report(load, failures)
    # No node stays out: the survivors and the thawed nodes all serve.
    assert {n.status["peer_id"] for n in nodes[:3]} <= serving_peers(ingress)


def test_with_retry_broken_requests_on_a_frozen_node_go_elsewhere_without_waiting(
    federation: LocalFederation,
) -> None:
    # A node frozen (SIGSTOP) after taking requests: its kernel keeps the connections, so
    # without --retry-broken they wait until it thaws. With it, once the failure detector
    # suspects the node they are sent to the other one.
    _, ingress, nodes = start_behind_ingress(
        federation, MODEL, 2, free_port(), engine_args=["--request-delay", "0.5"],
        ingress_args=["--retry-broken"], settle_s=SETTLE_S)
    frozen = machine_pids(nodes[0])
    latencies: list[float] = []
    statuses: list[int] = []

    async def one(client: httpx.AsyncClient) -> None:
        began = time.monotonic()
        response = await client.post(
            f"{ingress.http_url}/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
        statuses.append(response.status_code)
        latencies.append(time.monotonic() - began)

    async def burst() -> None:
        # Six at once, each engine busy 0.5 s per request: a load-aware pick sends some to
        # each node, the frozen one included.
        async with httpx.AsyncClient(timeout=90.0, trust_env=False) as client, \
                trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(one, client)

    signal_machine(frozen, signal.SIGSTOP)
    try:
        trio.run(burst)
    finally:
        signal_machine(frozen, signal.SIGCONT)
    assert statuses == [200] * 6
    # Suspecting a frozen node takes a few seconds here (up to ~15 on a loaded machine);
    # waiting for it to thaw would have taken the whole 90 s.
    assert max(latencies) < 45.0, latencies
    metrics = httpx.get(f"{ingress.http_url}/metrics", trust_env=False).text
    given_up = re.search(r'otela_resent_total\{reason="node_failed"\} (\d+)', metrics)
    assert given_up is not None and int(given_up.group(1)) >= 1, metrics[:2000]
