"""A real ``otela start`` node that also re-registers every few seconds: churn load.

``python benchmarks/churn_node.py SECONDS start [otela start options]`` runs the ordinary
daemon (same CLI, same mesh, same registry code) and, while the file ``<home>/churn``
exists, signs and gossips a fresh version of its record every SECONDS, as upstream nodes
re-registering their services do. The file lets ``benchmarks/convergence.py`` measure the
same federation idle first, then under churn.
"""

from __future__ import annotations

import sys

import trio

from otela import cli
from otela.daemon import Node


def with_reregistration(every: float) -> None:
    """Wrap ``Node.run`` so the node re-announces its record every ``every`` seconds."""
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

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reregister)
            code = await plain_run(self)
            nursery.cancel_scope.cancel()
        return code

    Node.run = run  # type: ignore[method-assign]


if __name__ == "__main__":
    with_reregistration(float(sys.argv[1]))
    cli.app(sys.argv[2:])
