"""Keeping this node's registry replica in step with the federation's.

``LocalReplica`` (``local``) is this node's part: its own entry (the only one it writes),
lease refresh, GC, revocation files, rejoining after a false eviction. ``Replicator``
(``replicator``) moves signed entries: delta gossip for changes and digest anti-entropy
(``otela.registry.antientropy``) for joins and repair, verifying everything it receives.
"""

from otela.replication.local import (
    LocalReplica,
    MembershipConfigError,
    load_authority,
    load_own_certificate,
)
from otela.replication.replicator import AE_PROTOCOL, REGISTRY_TOPIC, GossipLag, Replicator

__all__ = ["AE_PROTOCOL", "REGISTRY_TOPIC", "GossipLag", "LocalReplica",
           "MembershipConfigError", "Replicator", "load_authority", "load_own_certificate"]
