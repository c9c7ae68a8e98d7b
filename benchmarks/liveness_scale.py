"""What the failure detector's bookkeeping costs a node as the federation grows.

Two costs that grow with the member count N, each timed on a real ``Registry`` of N
SERVING records and the liveness parts the probe loop drives:
- *a registry change*: the member list catching up after one member re-signs its record
  (every record change anywhere in the federation: under churn at 10,000 nodes several a
  second, on every node);
- *the unwatched check*: every ten probe periods, picking the member we hold no connection
  to that was checked longest ago (``ProbeCore.unwatched_target``'s work).
Both run on the event loop, so each is also a stall of everything else the node serves.

Run:  .venv/bin/python benchmarks/liveness_scale.py [--src TREE] [--sizes 1000 10000]
      (``--src`` times another checkout's code, e.g. a worktree of an older commit)
"""

from __future__ import annotations

import argparse
import sys
import timeit
from pathlib import Path


def measure(n: int) -> tuple[float, float]:
    """(member list after one registry change, unwatched check), seconds, at n members."""
    from otela.liveness.events import EventLog
    from otela.liveness.members import MemberList
    from otela.liveness.rtt import RoundTrips
    from otela.liveness.table import LivenessTable, Status
    from otela.liveness.watch import NeighbourWatch
    from otela.registry.crdt import Entry
    from otela.registry.records import Lifecycle, NodeRecord
    from otela.registry.session import session_id_for
    from otela.registry.store import Registry

    def signed(i: int, version: int) -> Entry:
        peer = f"peer-{i:06d}"
        session = session_id_for(peer, f"{1:011x}{i % 16**5:05x}")
        record = NodeRecord(session_id=session, peer_id=peer, provider_id="p",
                            state=Lifecycle.SERVING, version=version,
                            http_url=f"http://10.0.{i // 250}.{i % 250}:8080",
                            updated_at=1000.0 + version)
        return Entry(session, Lifecycle.SERVING, version, 1000.0 + version,
                     version.to_bytes(16, "big"), record)

    def federation() -> Registry:
        registry = Registry()
        for i in range(n):
            registry.apply(signed(i, 1), 1001.0)
        return registry

    registry, apply_only = federation(), federation()
    table = LivenessTable("me", 6.0)
    members = MemberList("me", table, RoundTrips(floor=1.0, ceiling=3.0),
                         EventLog(clock=lambda: 0.0))
    members.sync(registry, registry.generation, 0.0)
    versions = {"followed": 1, "alone": 1}

    def change(into: Registry, which: str) -> None:
        versions[which] += 1
        version = versions[which]
        into.apply(signed(version % n, version), 1001.0 + version)

    def one_change() -> None:
        change(registry, "followed")
        members.sync(registry, registry.generation, 1.0)

    runs = max(20, 200_000 // n)
    followed = (timeit.timeit(one_change, number=runs)  # less what the registry takes
                - timeit.timeit(lambda: change(apply_only, "alone"), number=runs)) / runs

    watch = NeighbourWatch()
    watch.observe({f"peer-{i:06d}" for i in range(12)}, set(), set(), 0.0)

    def unwatched() -> None:
        if hasattr(table, "take_admitted"):  # ProbeCore.unwatched_target's call
            watch.admit(table.take_admitted())
            watch.next_unwatched(table.members, table.unhealthy, 1.0)
        else:  # the call site before the rotation
            alive = {p for p, m in table.members.items() if m.status is Status.ALIVE}
            watch.next_unwatched(alive, 1.0)

    unwatched()  # the first call meets every member for the first time
    return followed, timeit.timeit(unwatched, number=runs) / runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--src", default=str(Path(__file__).resolve().parent.parent),
                        help="the source tree whose otela is timed")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    args = parser.parse_args()
    sys.path.insert(0, args.src)
    print(f"otela from {args.src}")
    for n in args.sizes:
        followed, check = measure(n)
        print(f"{n:>7} members: member list after one registry change {followed * 1e3:.3f} ms,"
              f" unwatched check {check * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
