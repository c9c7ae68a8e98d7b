"""GossipSub's bytes per registry delta between real py-libp2p hosts, with and without the
sender's signed peer record on every RPC (issue 38's churn fix, docs/scale.md).

Three hosts built as the daemon builds them (``otela.mesh.host.build_host``) in one trio
process, connected in a line A - B - C, all subscribed to the registry topic. A publishes
``--messages`` payloads of a registry delta's size; every RPC pubsub writes is counted
(its serialised size and length prefix, as ``Pubsub.write_msg`` writes it: below it only
Yamux and Noise framing), split into RPCs carrying messages and control-only ones (IHAVE,
IWANT, GRAFT, PRUNE). ``before`` runs py-libp2p's own ``write_msg`` (the record attached),
``after`` the daemon's.

Run:  .venv/bin/python benchmarks/gossip_wire.py --messages 20
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from collections import Counter
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import libp2p.pubsub.pubsub as _pubsub
import trio
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.tools.anyio_service import background_trio_service
from libp2p.utils.varint import encode_uvarint

from otela.identity import load_or_create
from otela.mesh.host import build_host, quiet_libp2p_logs
from otela.replication.replicator import REGISTRY_TOPIC

DELTA_BYTES = 547  # a simulated node's registry delta (docs/scale.md)


async def measure(messages: int, root: Path) -> Counter[str]:
    counted: Counter[str] = Counter()
    meshes = [build_host(load_or_create(root / name), "127.0.0.1", 0) for name in "abc"]
    async with AsyncExitStack() as stack:
        for mesh in meshes:
            await stack.enter_async_context(mesh.host.run(listen_addrs=[mesh.listen_addr]))
            await stack.enter_async_context(background_trio_service(mesh.pubsub))
            await stack.enter_async_context(background_trio_service(mesh.gossipsub))
            await mesh.pubsub.wait_until_ready()
        subscriptions = [await m.pubsub.subscribe(REGISTRY_TOPIC) for m in meshes]
        for left, right in itertools.pairwise(meshes):
            addr = right.host.get_addrs()[0]
            await left.host.connect(info_from_p2p_addr(addr))
        await trio.sleep(3.0)  # hellos, subscriptions, GRAFTs: not counted
        counting[0] = counted
        for k in range(messages):
            await meshes[0].pubsub.publish(REGISTRY_TOPIC, bytes([k % 256]) * DELTA_BYTES)
            await trio.sleep(0.2)
        await trio.sleep(4.0)  # the heartbeats' IHAVEs for the last messages
        counting[0] = None
        for subscription in subscriptions[1:]:
            while True:
                with trio.move_on_after(0.05) as waited:
                    await subscription.get()
                if waited.cancelled_caught:
                    break
                counted["delivered"] += 1
    return counted


counting: list[Counter[str] | None] = [None]


def counting_writer(inner: Any) -> Any:
    async def write_msg(self: Any, stream: Any, rpc: Any) -> bool:
        ok = bool(await inner(self, stream, rpc))
        counter = counting[0]
        if counter is not None and ok:
            size = rpc.ByteSize()
            kind = "message_rpcs" if len(rpc.publish) else "control_rpcs"
            counter[kind] += 1
            counter[f"{kind}_bytes"] += size + len(encode_uvarint(size))
            counter["record_bytes"] += len(rpc.senderRecord) if rpc.HasField(
                "senderRecord") else 0
        return ok

    return write_msg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=20)
    args = parser.parse_args()
    quiet_libp2p_logs()
    daemons = _pubsub.Pubsub.write_msg  # the daemon's (workarounds applied on import)
    original = getattr(daemons, "__wrapped_write__", None)
    for name, inner in (("before", original), ("after", daemons)):
        assert inner is not None
        _pubsub.Pubsub.write_msg = counting_writer(inner)  # type: ignore[method-assign]
        with tempfile.TemporaryDirectory() as root:
            counted = trio.run(measure, args.messages, Path(root))
        per_message = counted["message_rpcs_bytes"] / max(1, counted["message_rpcs"])
        print(f"{name}: {counted['message_rpcs']} message RPCs, {per_message:.0f} bytes each "
              f"({per_message - DELTA_BYTES:.0f} around a {DELTA_BYTES}-byte payload); "
              f"{counted['control_rpcs']} control RPCs, {counted['control_rpcs_bytes']} "
              f"bytes; signed peer records {counted['record_bytes']} bytes; "
              f"{counted['delivered']} deliveries", flush=True)
    _pubsub.Pubsub.write_msg = daemons  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
