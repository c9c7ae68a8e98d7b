"""Remembered peers (otela.mesh.peer_cache): what is kept, and that a bad file costs nothing."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

from otela.mesh.peer_cache import KEEP, chosen_peers, read, write
from otela.registry.records import Lifecycle

from .registry_helpers import new_node, record


def with_addr(name: str, peer_id: str, state: Lifecycle = Lifecycle.SERVING):
    return replace(record(name, state=state, peer_id=peer_id),
                   addrs=(f"/ip4/10.0.0.1/tcp/{4000 + len(name)}",))


def test_live_members_with_direct_addresses_are_remembered_and_read_back(tmp_path: Path):
    me, alive, gone = new_node(), new_node(), new_node()
    records = [with_addr("me", me.peer_id), with_addr("alive", alive.peer_id),
               with_addr("gone", gone.peer_id, Lifecycle.LEFT),
               record("no-address", peer_id=new_node().peer_id)]
    peers = chosen_peers(records, me.peer_id, random.Random(1))
    assert [p["peer_id"] for p in peers] == [alive.peer_id]
    write(tmp_path / "peers.json", peers)
    back = read(tmp_path / "peers.json", me.peer_id)
    assert [p.peer_id.to_base58() for p in back] == [alive.peer_id]
    assert [str(a) for a in back[0].addrs] == ["/ip4/10.0.0.1/tcp/4005"]


def test_at_most_keep_peers_and_an_empty_view_keeps_the_old_file(tmp_path: Path):
    nodes = [new_node() for _ in range(KEEP + 5)]
    records = [with_addr(f"n{i}", n.peer_id) for i, n in enumerate(nodes)]
    assert len(chosen_peers(records, "me", random.Random(1))) == KEEP
    path = tmp_path / "peers.json"
    write(path, chosen_peers(records, "me", random.Random(1)))
    write(path, [])  # alone for a moment: what we knew still helps after a restart
    assert len(read(path, "me")) == KEEP


def test_a_missing_or_malformed_file_or_entry_is_skipped(tmp_path: Path):
    path = tmp_path / "peers.json"
    assert read(path, "me") == []
    good = new_node()
    for text in ("not json", "[]", '{"peers": 5}', '{"peers": [{"peer_id": "x"}]}'):
        path.write_text(text)
        assert read(path, "me") == []
    path.write_text(json.dumps({"peers": [
        {"peer_id": "not a peer id 0OIl", "addrs": ["/ip4/1.2.3.4/tcp/1"]},
        {"peer_id": good.peer_id, "addrs": ["nonsense"]},
        {"peer_id": good.peer_id, "addrs": ["/ip4/1.2.3.4/tcp/1"]}]}))
    assert [p.peer_id.to_base58() for p in read(path, "me")] == [good.peer_id]
