"""What a registry replica costs in memory, per member, and what the views cost a caller.

A replica holds one entry per member (``otela.registry.crdt``: one session per peer), each
at most ``MAX_RECORD_BYTES`` encoded, so its size is bounded by members x the per-member
cost measured here. Measured with tracemalloc: the Python allocations a ``Registry`` keeps
after taking N members' signed records (the envelope, the parsed record, the views), for
typical records (one model, a few addresses) and records padded to the size limit. Also:
a member announcing thousands of sessions costs what one session does, and the paged
views (``/v1/registry/nodes`` page, ``/v1/models``) cost a caller a bounded amount.

Run: .venv/bin/python benchmarks/replica_memory.py [--members 1000 10000]
Figures are documented in docs/security.md#a-member-that-lies-about-itself.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import time
import tracemalloc
from collections.abc import Iterator

import msgpack
import orjson
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from otela.api.app import NODES_PAGE
from otela.registry.crdt import Superseded
from otela.registry.records import MAX_META, MAX_TEXT, Hardware, Lifecycle, ModelInfo, NodeRecord
from otela.registry.session import new_session_id
from otela.registry.store import Registry
from otela.registry.wire import MAX_RECORD_BYTES, Trust, sign_record, verify
from otela.routing.catalog import catalog
from otela.routing.trust import ANY

NOW = time.time()
TRUST = Trust()


def template(padded_to: int | None) -> NodeRecord:
    """A typical record, or one padded with model metadata to about ``padded_to`` bytes."""
    record = NodeRecord(
        session_id="", peer_id="", provider_id="lab", state=Lifecycle.SERVING, version=2,
        http_url="http://10.0.0.1:8092", addrs=("/ip4/10.0.0.1/tcp/43905",),
        hardware=Hardware(64, 512 << 30), models=(ModelInfo("meta-llama/Llama-3.1-8B", 8192),),
        engine="vllm", updated_at=NOW)
    if padded_to is None:
        return record
    def size(r: NodeRecord) -> int:
        return len(msgpack.packb(r.to_dict(), use_bin_type=True))

    value = "v" * MAX_TEXT
    while True:  # metadata pairs, one at a time, over as many models as it takes
        model = record.models[-1]
        if len(model.meta) == MAX_META:
            model = ModelInfo(f"meta-llama/Llama-3.1-8B-v{len(record.models)}", 8192)
            models = record.models
        else:
            models = record.models[:-1]
        model = dataclasses.replace(model, meta=(*model.meta, (f"k{len(model.meta):02d}",
                                                               value)))
        bigger = dataclasses.replace(record, models=(*models, model))
        if size(bigger) > padded_to:
            return record
        record = bigger


def envelopes(members: int, base: NodeRecord) -> Iterator[dict]:
    """Each member's signed record, made on the fly (so only the replica keeps them)."""
    for i in range(members):
        keys = create_new_key_pair()
        peer = ID.from_pubkey(keys.public_key).to_base58()
        record = dataclasses.replace(
            base, session_id=new_session_id(peer, int(NOW * 1000)), peer_id=peer,
            provider_id=f"lab-{i % 50}",
            models=tuple(dataclasses.replace(m, id=f"{m.id}-{i % 200}") for m in base.models))
        yield sign_record(record, keys.private_key)


def retained(members: int, base: NodeRecord) -> tuple[Registry, int, int]:
    """A replica of ``members`` members, the bytes it retains, and the encoded size of one
    record."""
    gc.collect()
    tracemalloc.start()
    registry = Registry()
    size = 0
    for envelope in envelopes(members, base):
        size = len(envelope["body"])
        entry = verify(envelope, TRUST, NOW)
        assert not isinstance(entry, tuple)
        registry.apply(entry, NOW)
    gc.collect()
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return registry, current, size


def flood(sessions: int) -> int:
    """Bytes a replica retains after one member announced ``sessions`` maximal sessions."""
    keys = create_new_key_pair()
    peer = ID.from_pubkey(keys.public_key).to_base58()
    base = template(MAX_RECORD_BYTES - 100)
    signed = [sign_record(dataclasses.replace(
        base, session_id=new_session_id(peer, int(NOW * 1000) + (i if i % 2 else -i)),
        peer_id=peer), keys.private_key) for i in range(sessions)]
    gc.collect()
    tracemalloc.start()
    registry = Registry()
    for envelope in signed:
        entry = verify(envelope, TRUST, NOW)
        assert not isinstance(entry, tuple)
        with contextlib.suppress(Superseded):  # older than the session held
            registry.apply(entry, NOW)
    gc.collect()
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(registry) == 1
    return current


def views(registry: Registry) -> str:
    started = time.perf_counter()
    page = [r.to_dict() for r in registry.snapshot()[:NODES_PAGE]]
    body = orjson.dumps({"nodes": page})
    page_s = time.perf_counter() - started
    started = time.perf_counter()
    models = orjson.dumps({"data": catalog(registry, ANY, ())})
    catalog_s = time.perf_counter() - started
    return (f"a /v1/registry/nodes page ({NODES_PAGE}) {len(body) / 1024:.0f} KiB in "
            f"{page_s * 1e3:.0f} ms; /v1/models {len(models) / 1024:.0f} KiB in "
            f"{catalog_s * 1e3:.0f} ms (computed once per registry change)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, nargs="+", default=[1000, 10000])
    args = parser.parse_args()
    for members in args.members:
        for label, base in (("typical", template(None)),
                            ("at the limit", template(MAX_RECORD_BYTES - 100))):
            registry, retained_bytes, size = retained(members, base)
            print(f"{members:>6} members, {label} records ({size / 1024:.1f} KiB): replica "
                  f"keeps {retained_bytes / 2**20:.1f} MiB, "
                  f"{retained_bytes / members / 1024:.1f} KiB per member; {views(registry)}")
    for sessions in (1000, 5000):
        print(f"one member announcing {sessions} sessions at the limit: the replica keeps "
              f"{flood(sessions) / 1024:.1f} KiB (one session)")


if __name__ == "__main__":
    main()
