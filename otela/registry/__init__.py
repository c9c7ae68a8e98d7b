"""The federation registry: node records, their merge rule, and the views routing reads."""

from otela.registry.records import Hardware, Lifecycle, ModelInfo, NodeRecord
from otela.registry.store import Registry

__all__ = ["Hardware", "Lifecycle", "ModelInfo", "NodeRecord", "Registry"]
