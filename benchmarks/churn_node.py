"""A real ``otela start`` node that also re-registers every few seconds: churn load.

``python benchmarks/churn_node.py SECONDS start [otela start options]`` runs the ordinary
daemon (same CLI, same mesh, same registry code) and, while the file ``<home>/churn``
exists, signs and gossips a fresh version of its record every SECONDS, as upstream nodes
re-registering their services do. While the file ``<home>/load`` exists, it also acts as
a serving node whose load changes all the time (a new in-flight count every 0.25 s), the
worst case for load reports (``otela.load.reports``). The files let
``benchmarks/convergence.py`` measure the same federation idle first, then under load
reports, then under churn.
"""

from __future__ import annotations

import random
import sys

import trio

from otela import cli
from otela.daemon import Node


def with_reregistration(every: float) -> None:
    """Wrap ``Node.run`` so the node re-announces its record every ``every`` seconds (and
    reports a changing load) while its switch files exist."""
    plain_run = Node.run

    async def run(self: Node) -> int:
        async def reregister() -> None:
            while self.replica.record is None:
                await trio.sleep(0.1)
            switch = self.config.home / "churn"
            while not self._stopping:
                await trio.sleep(every)
                if switch.exists() and not self._stopping:
                    await self.announce()

        async def changing_load() -> None:
            switch = self.config.home / "load"
            plain_serving = self.load_reports.serving
            self.load_reports.serving = lambda: switch.exists() or plain_serving()
            while not self._stopping:
                await trio.sleep(0.25)
                if switch.exists():
                    self.load.in_flight = random.randrange(16)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reregister)
            nursery.start_soon(changing_load)
            code = await plain_run(self)
            nursery.cancel_scope.cancel()
        return code

    Node.run = run  # type: ignore[method-assign]


if __name__ == "__main__":
    with_reregistration(float(sys.argv[1]))
    cli.app(sys.argv[2:])
