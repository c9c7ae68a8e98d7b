"""The federation registry: a CRDT of node records, its wire format, the membership
certificates and revocations records are checked against (``certificate``), and its
views."""

from otela.registry.crdt import Entry, GCPolicy, GMap
from otela.registry.records import Hardware, Lifecycle, ModelInfo, NodeRecord
from otela.registry.store import ModelEntry, Registry

__all__ = [
    "Entry",
    "GCPolicy",
    "GMap",
    "Hardware",
    "Lifecycle",
    "ModelEntry",
    "ModelInfo",
    "NodeRecord",
    "Registry",
]
