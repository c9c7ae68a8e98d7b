"""Registry benchmark: delta merge, anti-entropy bytes, and the routing lookup.

Run: .venv/bin/python benchmarks/registry_bench.py
Figures are documented in docs/registry.md.
"""

from __future__ import annotations

import statistics
import time
import timeit

from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from otela.registry import antientropy
from otela.registry.crdt import GCPolicy
from otela.registry.records import Hardware, Lifecycle, ModelInfo, NodeRecord
from otela.registry.session import session_id_for
from otela.registry.store import Registry
from otela.registry.wire import Trust, encode, sign_record, verify
from otela.routing.candidates import eligible

NOW = time.time()
TRUST = Trust()


def signed_records(n: int, models: int = 20) -> list[dict]:
    """``n`` nodes' records, each of its own peer (a registry keeps one session per peer)."""
    out = []
    for i in range(n):
        keys = create_new_key_pair()
        peer = ID.from_pubkey(keys.public_key).to_base58()
        record = NodeRecord(
            session_id=session_id_for(peer, f"{i:016x}"), peer_id=peer, provider_id=f"lab-{i % 7}",
            state=Lifecycle.SERVING, version=2, http_url=f"http://10.0.{i // 250}.{i % 250}:8092",
            addrs=(f"/ip4/10.0.0.1/tcp/43905/p2p/{peer}",),
            hardware=Hardware(64, 512 << 30), models=(ModelInfo(f"model-{i % models}", 8192),),
            engine="vllm", updated_at=NOW,
        )
        out.append(sign_record(record, keys.private_key))
    return out


def registry_of(envelopes: list[dict]) -> Registry:
    registry = Registry(GCPolicy())
    for envelope in envelopes:
        entry = verify(envelope, TRUST, NOW)
        assert not isinstance(entry, tuple)
        registry.apply(entry, NOW)
    return registry


def exchange_bytes(initiator: Registry, responder: Registry) -> tuple[int, int]:
    """(bytes on the wire, round trips) of one anti-entropy exchange, both directions."""
    sent = encode(antientropy.opening(initiator))
    answer = antientropy.answer_opening(responder, antientropy.opening(initiator))
    total, trips = len(sent) + len(encode(answer)), 1
    request = antientropy.digests(initiator, answer)
    if request is None:
        return total, trips
    reply = antientropy.answer_digests(responder, request)
    for proof in reply["entries"]:
        entry = verify(proof, TRUST, NOW)
        assert not isinstance(entry, tuple)
        initiator.apply(entry, NOW)
    final = antientropy.entries(initiator, reply["want"])
    total += len(encode(request)) + len(encode(reply)) + len(encode(final))
    return total, trips + 2


def bench_merge() -> None:
    envelopes = signed_records(1000)
    start = time.perf_counter()
    entries = [verify(e, TRUST, NOW) for e in envelopes]
    verify_s = time.perf_counter() - start
    registry = Registry()
    start = time.perf_counter()
    for entry in entries:
        assert not isinstance(entry, tuple)
        registry.apply(entry, NOW)
    apply_s = time.perf_counter() - start
    print(f"merge of a 1,000-node delta: verify {verify_s * 1e3:.1f} ms "
          f"({verify_s / 1000 * 1e6:.0f} us/record), apply {apply_s * 1e3:.1f} ms "
          f"({apply_s / 1000 * 1e6:.1f} us/record)")


def bench_anti_entropy(n: int, envelopes: list[dict]) -> None:
    full = registry_of(envelopes[:n])
    record_bytes = statistics.mean(len(e["body"]) + len(e["sig"]) for e in envelopes[:n])
    same = registry_of(envelopes[:n])
    bytes_same, trips_same = exchange_bytes(same, full)
    one_off = registry_of(envelopes[: n - 1])
    bytes_one, trips_one = exchange_bytes(one_off, full)
    ten_off = registry_of(envelopes[: n - 10])
    bytes_ten, _ = exchange_bytes(ten_off, full)
    empty = Registry()
    bytes_join, exchanges = 0, 0
    while len(empty.map) < len(full.map):  # batches of MAX_ENTRIES_PER_MESSAGE
        bytes_join += exchange_bytes(empty, full)[0]
        exchanges += 1
    full_digest = sum(len(encode({"d": full.map.bucket_digest(b)})) for b in range(256))
    print(f"{n:>6} nodes: record ~{record_bytes:.0f} B | in sync: {bytes_same} B, "
          f"{trips_same} round trip | 1 missing: {bytes_one / 1024:.1f} KiB, {trips_one} trips | "
          f"10 missing: {bytes_ten / 1024:.1f} KiB | joiner from empty: "
          f"{bytes_join / 1024 / 1024:.2f} MiB in {exchanges} exchange(s) | "
          f"full digest would be {full_digest / 1024:.0f} KiB")


def bench_lookup() -> None:
    registry = registry_of(signed_records(10_000, models=50))
    model = "model-7"
    assert len(registry.serving_candidates(model)) == 200
    n = 200_000
    per_lookup = min(timeit.repeat(lambda: eligible(registry, model), number=n, repeat=5))
    print(f"candidate lookup, 10,000-entry registry (200 candidates): "
          f"{per_lookup / n * 1e9:.0f} ns per request (paper: < 0.1 ms)")


def main() -> None:
    bench_merge()
    envelopes = signed_records(10_000)
    for n in (1_000, 10_000):
        bench_anti_entropy(n, envelopes)
    bench_lookup()


if __name__ == "__main__":
    main()
