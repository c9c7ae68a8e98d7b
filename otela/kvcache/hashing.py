"""Prefix-cache block hashes computed exactly as vLLM computes them, so an ingress can
name the blocks a request's tokens would fill and ask which node holds them.

vLLM (v1, ``vllm/v1/core/kv_cache_utils.py``) cuts a prompt's token ids into full blocks
of ``block_size`` and chains them: block i's hash is ``H((parent, tuple(tokens), extra))``
where ``parent`` is block i-1's hash (the first block's parent is ``NONE_HASH =
H(seed)``), ``extra`` is ``None`` for a plain text request (LoRA, multimodal inputs and
cache salts add keys: those blocks are never advertised), and ``H`` is the engine's
``--prefix-caching-hash-algo``: ``sha256`` (pickle, the default) or ``sha256_cbor``.
The seed is ``"vllm-none-hash"`` unless the engine runs with ``PYTHONHASHSEED`` set.
Its KV events name a block by the digest's low 64 bits as an integer, and so does otela
(``Fingerprint``): 8 bytes a block on the wire, a collision once in 2^64.

The xxhash algorithms are not reproducible across processes without a shared secret seed
(vLLM draws one per process), so a node whose events match neither algorithm re-keys its
blocks with ``sha256`` from the token ids the events carry (``otela.kvcache.index``).
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Sequence
from typing import Any

Fingerprint = int  # a block hash's low 64 bits, as vLLM's KV events give it
DEFAULT_SEED = "vllm-none-hash"
ALGORITHMS = ("sha256", "sha256_cbor")
LOW64 = (1 << 64) - 1  # a fingerprint's bits: vLLM's events keep the low 64


def _sha256_pickle(value: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _sha256_cbor(value: Any) -> bytes:
    import cbor2  # only for engines run with --prefix-caching-hash-algo sha256_cbor

    return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()


_FUNCTIONS: dict[str, Callable[[Any], bytes]] = {
    "sha256": _sha256_pickle, "sha256_cbor": _sha256_cbor}


def fingerprint(digest: bytes) -> Fingerprint:
    """The integer vLLM's KV events carry for a block whose hash is ``digest``."""
    return int.from_bytes(digest, "big") & LOW64


class BlockHasher:
    """Chains a token sequence's full blocks the way one engine configuration does.

    ``chain`` is what the ingress runs per request: ~2 us a block the first time (pickle
    and SHA-256), ~0.3 us a block it has seen (``benchmarks/cache_scale.py``)."""

    __slots__ = ("_hash", "_memo", "_none", "algorithm", "block_size", "seed")

    MEMO_BLOCKS = 1 << 16  # remembered block digests (~15 MB at most), then forgotten

    def __init__(self, algorithm: str = "sha256", block_size: int = 16,
                 seed: str = DEFAULT_SEED) -> None:
        if algorithm not in _FUNCTIONS:
            raise ValueError(f"unsupported prefix-caching hash algorithm {algorithm!r} "
                             f"(otela reproduces {', '.join(ALGORITHMS)})")
        if block_size < 1:
            raise ValueError("block_size must be at least 1")
        self.algorithm = algorithm
        self.block_size = block_size
        self.seed = seed
        self._hash = _FUNCTIONS[algorithm]
        self._none = self._hash(seed)
        # Requests repeat prefixes (a system prompt, a conversation's earlier turns), and
        # a dictionary lookup of a block costs a tenth of pickling and hashing it.
        self._memo: dict[tuple[bytes, tuple[int, ...]], bytes] = {}

    def block(self, parent: bytes | None, tokens: Sequence[int]) -> bytes:
        """One block's full digest, after ``parent``'s (``None``: the first block)."""
        key = (parent or self._none, tuple(tokens))
        digest = self._memo.get(key)
        if digest is None:
            if len(self._memo) >= self.MEMO_BLOCKS:
                self._memo.clear()
            digest = self._memo[key] = self._hash((key[0], key[1], None))
        return digest

    def chain(self, tokens: Sequence[int], limit: int | None = None) -> list[Fingerprint]:
        """The fingerprints of ``tokens``' full blocks, in order (at most ``limit``)."""
        size = self.block_size
        count = len(tokens) // size
        if limit is not None:
            count = min(count, limit)
        out: list[Fingerprint] = []
        parent: bytes | None = None
        for i in range(count):
            parent = self.block(parent, tokens[i * size:(i + 1) * size])
            out.append(fingerprint(parent))
        return out
