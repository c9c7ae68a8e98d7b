"""Failure detection: SWIM-style probing with suspicion, kept out of the registry CRDT.

``FailureDetector`` (``detector``) is what a node runs; its parts — the liveness table,
local health, news, the member list, the neighbour watch, round-trip timeouts and the probe
loop — are units of their own (map: docs/failure-detection.md#code-map)."""
