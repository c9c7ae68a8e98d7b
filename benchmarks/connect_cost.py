"""What a plain TCP connect to a daemon's libp2p port costs the daemon.

The failure detector connects to members' libp2p ports without speaking libp2p (the
unwatched check and the reach sample: ``otela/mesh/listening.py``): a reach sample asks up
to 8 members at once, and after a kill every node that hears of the suspicion samples.
The daemon at the other end accepts the connection and pays for it. This starts one real
daemon, makes N connects each way, and prints the daemon's own CPU per connect (its idle
CPU subtracted):

- ``otela``: ``answer_at``, as the failure detector connects (closed with a reset);
- ``fin``: a plain connect closed the ordinary way, as ``answer_at`` did before.

Run:  .venv/bin/python benchmarks/connect_cost.py [--connects 200]
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import multiaddr
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fedbench import cpu_seconds

from otela.mesh.listening import answer_at
from otela.testing.localfed import LocalFederation

GAP_S = 0.025  # between connects: the daemon's loop is never saturated


def plain_fin(host: str, port: int) -> None:
    with socket.create_connection((host, port), timeout=1.0):
        pass


def otela_connect(addr: str) -> None:
    answer = trio.run(answer_at, [multiaddr.Multiaddr(addr)])
    if answer != "accepted":
        raise SystemExit(f"the daemon did not accept a connect: {answer}")


def per_connect_ms(pid: int, connect: Callable[[], None], count: int) -> float:
    """The daemon's CPU per connect, in ms, less what it spends idle meanwhile."""
    before = cpu_seconds(pid)
    time.sleep(3.0)
    idle_per_s = (cpu_seconds(pid) - before) / 3.0
    start, before = time.monotonic(), cpu_seconds(pid)
    for _ in range(count):
        connect()
        time.sleep(GAP_S)
    time.sleep(1.0)  # let the daemon finish with the last ones
    used = cpu_seconds(pid) - before - idle_per_s * (time.monotonic() - start)
    return 1000.0 * used / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connects", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="otela-bench-") as tmp, \
            LocalFederation(Path(tmp)) as fed:
        node = fed.start_node("a")
        addr = node.multiaddr
        parts = addr.split("/")
        host, port = parts[2], int(parts[4])
        pid = node.process.pid
        time.sleep(3.0)  # past its start-up work
        print(f"{'connect':>8}  {'daemon CPU per connect (ms)':>28}")
        ways: dict[str, Callable[[], None]] = {"otela": lambda: otela_connect(addr),
                                               "fin": lambda: plain_fin(host, port)}
        for _ in range(2):  # interleaved, twice
            for name, connect in ways.items():
                print(f"{name:>8}  {per_connect_ms(pid, connect, args.connects):>28.2f}")


if __name__ == "__main__":
    main()
