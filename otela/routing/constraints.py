"""What a request may require of the node that serves it (``X-Otela-Require``).

    gpu=H100|A100, min_context=32768, quantization=none|fp8, dtype=bfloat16,
    engine=vllm, max_tp=4

Clauses are comma separated and all must hold; ``|`` separates accepted values. They are
matched against the node's signed record: its hardware (``gpu``: any of its GPUs' names
contains the value, case-insensitive) and the requested model's metadata as the engine
and the provider declared it (``min_context``, ``quantization`` — ``none`` for an
unquantized model —, ``dtype``, ``max_tp``: tensor-parallel degree at most, ``engine``,
and ``meta.<key>`` for any pair a provider declared with ``--model-meta``).
The paper (§8) names this QoS negotiation as future work. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from otela.registry.records import ModelInfo, NodeRecord

KEYS = ("gpu", "min_context", "quantization", "dtype", "engine", "max_tp")
_NUMERIC = ("min_context", "max_tp")
META = "meta."


class ConstraintError(ValueError):
    """A clause that cannot be understood; the message names it."""


@dataclass(frozen=True)
class Clause:
    key: str
    values: tuple[str, ...]  # alternatives, lowercased; one number for numeric keys
    text: str  # as the client wrote it, for messages

    def holds(self, record: NodeRecord, model: ModelInfo | None) -> bool:
        if self.key == "gpu":
            names = [gpu.name.lower() for gpu in record.hardware.gpus]
            return any(value in name for value in self.values for name in names)
        if self.key == "engine":
            return (record.engine or "").lower() in self.values
        if model is None:
            return False
        if self.key.startswith(META):
            wanted = self.key[len(META):]
            return any(k.lower() == wanted and v.lower() in self.values for k, v in model.meta)
        if self.key == "min_context":
            return model.max_context is not None and model.max_context >= int(self.values[0])
        if self.key == "max_tp":
            return (model.tensor_parallel or 1) <= int(self.values[0])
        if self.key == "quantization":
            return (model.quantization or "none").lower() in self.values
        return (model.dtype or "").lower() in self.values  # dtype


def parse(text: str) -> tuple[Clause, ...]:
    """Clauses from ``X-Otela-Require``; ``ConstraintError`` naming a bad one."""
    clauses = []
    for raw in text.split(","):
        part = raw.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        key, value = key.strip().lower(), value.strip()
        known = key in KEYS or (key.startswith(META) and len(key) > len(META))
        if not sep or not known or not value:
            raise ConstraintError(
                f"cannot read the requirement {part[:80]!r} (expected key=value with a key "
                f"among {', '.join(KEYS)} or meta.<key>)")
        values = tuple(v.strip().lower() for v in value.split("|") if v.strip())
        if key in _NUMERIC and (len(values) != 1 or not values[0].isdigit()):
            raise ConstraintError(f"requirement {part[:80]!r}: {key} takes one whole number")
        if not values:
            raise ConstraintError(f"requirement {part[:80]!r} lists no value")
        clauses.append(Clause(key, values, part[:80]))
    return tuple(clauses)


def model_of(record: NodeRecord, model_id: str) -> ModelInfo | None:
    return next((m for m in record.models if m.id == model_id), None)


def select(clauses: Sequence[Clause], candidates: Sequence[NodeRecord], model_id: str
           ) -> tuple[tuple[NodeRecord, ...], Clause | None]:
    """The candidates every clause holds for, and, if none is left, the clause that
    excluded the last of them (checked in the order given)."""
    kept = tuple(candidates)
    for clause in clauses:
        narrowed = tuple(r for r in kept if clause.holds(r, model_of(r, model_id)))
        if not narrowed:
            return (), clause
        kept = narrowed
    return kept, None
