"""Chaos benchmark: what clients see while serving nodes die, freeze or lose their peer.

Real processes on 127.0.0.1: a bootstrap node, an ingress (bootstrapped from it) and
``--nodes`` serving nodes wrapping the echo engine (``--request-delay``: each request takes
that long before its first token; streams send a token every ``--token-delay``). A steady
open-loop load of ``--rate`` requests a second goes through the ingress the whole time,
``--stream-share`` of them streaming. Each scenario gets a fresh federation:

- ``kill``: SIGKILL half the serving nodes at once (daemon and engine: a machine gone);
- ``stop``: SIGSTOP a third of them (daemon and engine) for ``--stop-seconds``, then
  SIGCONT (a machine that froze: swap storm, a paused VM);
- ``boot``: restart the bootstrap node (SIGTERM, then start it again on its home);
- ``fresh``: nothing happens: the load starts the moment the federation is up (no
  ``--warm``), and every request of its first ``--observe`` seconds counts (a freshly
  started, healthy federation must not fail any).

``--repeat N`` runs each scenario N times, each on a fresh federation.

For each: every request sent from the event on for ``--observe`` seconds, by outcome
(``ok``; ``http <status>``; for streams, ``error event`` when the stream ended with an
OpenAI-style error event, ``cut`` when it ended without ``[DONE]`` or an error event,
``hang`` when nothing ended it within ``REQUEST_TIMEOUT_S``), the latency p50/p99 of the
non-streaming ones that succeeded, and for ``kill`` the seconds until the ingress no longer
lists the killed sessions as SERVING. Figures are documented in docs/failure-detection.md.

Run: ``.venv/bin/python benchmarks/chaos.py [--scenarios kill,stop,boot]`` (~4 minutes).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import trio

from otela.testing.localfed import LocalFederation, LocalNode, free_port, wait_for
from otela.testing.netns import Lan, ensure_iptables
from otela.testing.steady_load import (
    QUIET,
    REQUEST_TIMEOUT_S,
    Outcome,
    SteadyLoad,
    machine_pids,
    signal_machine,
    start_behind_ingress,
)

MODEL = "echo-chaos"
EVENT_ENDED = "_event_ended_at"  # set by an event that takes a moment (the kill)


def start(fed: LocalFederation, args: argparse.Namespace, lan: Lan | None = None
          ) -> tuple[LocalNode, LocalNode, list[LocalNode]]:
    """The bootstrap node, the ingress and the serving nodes; with ``lan``, each node in a
    network namespace of its own (host 0 the bootstrap node, 1 the ingress, then serving)."""
    def place(i: int) -> dict[str, str]:
        if lan is None:
            return {}
        ns, ip = lan.hosts[i]
        return {"netns": ns, "host": ip}

    return start_behind_ingress(
        fed, MODEL, args.nodes, args.boot_port, place=place,
        engine_args=["--request-delay", str(args.request_delay),
                     "--token-delay", str(args.token_delay)],
        ingress_args=["--retry-broken" if args.retry_broken else "--no-retry-broken"])


def run_scenario(name: str, args: argparse.Namespace, root: Path) -> dict[str, object]:
    # The network goes after the nodes: a namespace outlives its deletion while a process
    # runs in it.
    with contextlib.ExitStack() as stack:
        lan = None
        if name == "partition":
            ensure_iptables()
            lan = stack.enter_context(Lan(args.nodes + 2))
        fed = stack.enter_context(LocalFederation(root / name))
        boot, ingress, serving = start(fed, args, lan)
        load = SteadyLoad(ingress.http_url, MODEL, args.rate, args.stream_share)
        extra: dict[str, object] = {}

        async def main() -> float:
            stop = trio.Event()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(load.run, stop)
                await trio.sleep(0.0 if name == "fresh" else args.warm)
                event_at = time.monotonic()
                await trio.to_thread.run_sync(event(name, fed, lan, boot, ingress, serving, args,
                                                    extra))
                await trio.sleep(max(0.0, args.observe - (time.monotonic() - event_at)))
                stop.set()
                await trio.sleep(2.0)  # let the last requests finish or time out
                nursery.cancel_scope.deadline = trio.current_time() + REQUEST_TIMEOUT_S
            return event_at

        event_at = trio.run(main)
        ended_at = float(extra.pop(EVENT_ENDED, event_at))  # type: ignore[arg-type]
        after = [o for o in load.outcomes if o.sent_at >= ended_at]
        # Sent before the event: those still running at it are counted apart (a request in
        # flight on a node that dies may fail; one that ended before it says the federation
        # was healthy before anything happened).
        before = [o for o in load.outcomes if o.sent_at + o.latency < event_at]
        in_flight = [o for o in load.outcomes
                     if o.sent_at < ended_at and event_at <= o.sent_at + o.latency]
        for message, count in load.messages.most_common(8):
            print(f"  {count} x {message}", file=sys.stderr)
        return summarize(name, event_at, before, in_flight, after, extra)


def event(name: str, fed: LocalFederation, lan: Lan | None, boot: LocalNode, ingress: LocalNode,
          serving: list[LocalNode], args: argparse.Namespace, extra: dict[str, object]
          ) -> Callable[[], None]:
    def kill() -> None:
        victims = serving[: len(serving) // 2]
        pids = [pid for node in victims for pid in machine_pids(node)]
        started = time.monotonic()
        signal_machine(pids, signal.SIGKILL)
        # The kill is a window: requests sent before its last signal may be running on a
        # node being killed.
        extra[EVENT_ENDED] = time.monotonic()
        gone = {n.session_id for n in victims}
        wait_for(lambda: not any(ingress.states().get(s) == "SERVING" for s in gone), 120,
                 "the ingress to stop listing the killed nodes", interval=0.25)
        extra["not_serving_after_s"] = round(time.monotonic() - started, 1)
        wait_for(lambda: all(ingress.states().get(s) in (None, "LEFT") for s in gone), 120,
                 "the killed nodes to be LEFT", interval=0.25)
        extra["left_after_s"] = round(time.monotonic() - started, 1)

    def stop() -> None:
        frozen = serving[: max(1, len(serving) // 3)]
        pids = [pid for node in frozen for pid in machine_pids(node)]
        signal_machine(pids, signal.SIGSTOP)
        time.sleep(args.stop_seconds)
        signal_machine(pids, signal.SIGCONT)
        resumed = time.monotonic()
        # Back in rotation: each frozen machine serves again (under a new session if it
        # was evicted meanwhile).
        names = {n.status["peer_id"] for n in frozen}

        def serving_again() -> bool:
            nodes = ingress.nodes()
            back = {n["peer_id"] for n in nodes if n["state"] == "SERVING"}
            return names <= back

        wait_for(serving_again, 120, "the frozen nodes to serve again", interval=0.25)
        extra["serving_again_after_s"] = round(time.monotonic() - resumed, 1)
        states = ingress.states()
        extra["evicted_while_frozen"] = sum(
            states.get(n.session_id) != "SERVING" for n in frozen)

    def restart_boot() -> None:
        started = time.monotonic()
        fed.stop_node(boot)
        restarted = fed.start_node("boot", extra_args=QUIET, timeout=60,
                                   p2p_port=args.boot_port)
        peers = {n.status["peer_id"] for n in [ingress, *serving]}
        wait_for(lambda: peers <= {n["peer_id"] for n in
                                   restarted.nodes()
                                   if n["state"] != "LEFT"}, 120,
                 "the restarted bootstrap node to list everyone again", interval=0.25)
        extra["boot_converged_s"] = round(time.monotonic() - started, 1)

    def partition() -> None:
        assert lan is not None
        nodes = [boot, ingress, *serving]
        cut = 2 + len(serving) // 2  # bootstrap, ingress and half the serving nodes | the rest
        lan.partition(range(cut), range(cut, len(nodes)))
        time.sleep(args.stop_seconds)
        lan.heal()
        healed = time.monotonic()
        names = {n.status["peer_id"] for n in serving}

        def converged() -> bool:
            views = [n.nodes() for n in nodes]
            keyed = [{(v["session_id"], v["state"]) for v in view} for view in views]
            back = {v["peer_id"] for v in views[1] if v["state"] == "SERVING"}
            return names <= back and all(k == keyed[0] for k in keyed)

        wait_for(converged, 120, "every registry to agree and list every node SERVING",
                 interval=0.1)
        extra["converged_after_heal_s"] = round(time.monotonic() - healed, 1)

    def nothing() -> None:
        pass

    return {"kill": kill, "stop": stop, "boot": restart_boot,
            "partition": partition, "fresh": nothing}[name]


def summarize(name: str, event_at: float, before: list[Outcome], in_flight: list[Outcome],
              after: list[Outcome], extra: dict[str, object]) -> dict[str, object]:
    def counts(outcomes: list[Outcome], stream: bool) -> dict[str, int]:
        return dict(collections.Counter(o.result for o in outcomes if o.stream == stream))

    latencies = sorted(o.latency for o in after if not o.stream and o.result == "ok")

    def pct(q: float) -> float | None:
        if not latencies:
            return None
        return round(1000 * latencies[min(len(latencies) - 1, int(q * len(latencies)))], 1)

    return {"scenario": name, "requests": len(after),
            "plain": counts(after, False), "streams": counts(after, True),
            "before_errors": dict(collections.Counter(o.result for o in before
                                                      if o.result != "ok")),
            "in_flight_at_event": dict(collections.Counter(o.result for o in in_flight)),
            # when the failures were sent, in seconds after the event (the first 12)
            "errors_sent_at_s": [round(o.sent_at - event_at, 1) for o in after
                                 if o.result != "ok"][:12],
            "p50_ms": pct(0.5), "p99_ms": pct(0.99),
            "median_before_ms": round(1000 * statistics.median(
                [o.latency for o in before if not o.stream and o.result == "ok"] or [0]), 1),
            **extra}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenarios", default="kill,stop,partition,boot")
    parser.add_argument("--nodes", type=int, default=6)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--stream-share", type=float, default=0.2)
    parser.add_argument("--request-delay", type=float, default=0.05)
    parser.add_argument("--token-delay", type=float, default=0.05)
    parser.add_argument("--warm", type=float, default=5.0)
    parser.add_argument("--observe", type=float, default=45.0)
    parser.add_argument("--stop-seconds", type=float, default=30.0)
    parser.add_argument("--retry-broken", action=argparse.BooleanOptionalAction,
                        default=True, help="run the ingress with --retry-broken (otela's "
                        "default) or --no-retry-broken")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run each scenario this many times, each on a fresh federation")
    parser.add_argument("--json", action="store_true", help="one JSON object per scenario")
    parser.add_argument("--keep", metavar="DIR", help="keep the nodes' homes and logs here")
    args = parser.parse_args()
    args.boot_port = free_port()
    with tempfile.TemporaryDirectory(prefix="otela-chaos-") as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        for name in args.scenarios.split(","):
            for run in range(args.repeat):
                result = run_scenario(name, args, root / f"run-{run}")
                if args.json:
                    print(json.dumps(result), flush=True)
                else:
                    print(f"{name}: " + ", ".join(f"{k} {v}" for k, v in result.items()
                                                    if k != "scenario"), flush=True)

if __name__ == "__main__":
    main()
