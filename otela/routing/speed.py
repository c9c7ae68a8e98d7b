"""How fast each node answers, as this ingress measures it: the check on what nodes say
about their own capacity. Pure: callers pass the observations.

A node's capacity weight comes from the node (``--capacity``, or its GPUs), so a node
that claims much would draw traffic it cannot serve (one started with ``--capacity 1000``
received every request under ``weighted``). The router therefore uses
``min(claimed, plausible) x factor``: *plausible* is what the hardware in the node's
record can serve (``otela.load.capacity``), and *factor* is learned here from time to first
byte, per model and kind of request (streamed or not; a non-streamed answer's first byte is
its last): each node's moving average against the reference, the median of those averages
over the nodes serving that model here (a median: one slow node, however slow, cannot drag
the reference to itself). A node answering within ``SLACK`` times the reference keeps its
weight (a faster node gains nothing it did not claim; a node a little slower, or unlucky
with its last answers, loses nothing: on a loaded host the averages wander by tens of
percent, and a weight that followed them skewed even idle shares); one answering more
slowly gets ``SLACK x reference / its average``, down to ``FLOOR``. So a node that claims
much and answers slowly loses weight, and no node draws more than its measured share.
Until a node has ``MIN_SAMPLES`` answers here its factor is 1.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

WEIGHT = 0.1  # of a new sample in a moving average: about the last 10-20 answers
MIN_SAMPLES = 8
FLOOR = 0.1
SLACK = 2.0  # slower than the median node by up to this factor costs no weight
REFERENCE_EVERY = 16  # answers per model between recomputations of its reference


@dataclass
class _Average:
    value: float = 0.0
    samples: int = 0

    def add(self, sample: float) -> None:
        self.samples += 1
        weight = max(WEIGHT, 1.0 / self.samples)  # the first samples count fully
        self.value += weight * (sample - self.value)


@dataclass
class _Model:
    nodes: dict[str, _Average] = field(default_factory=dict)
    reference: float = 0.0
    stale: int = REFERENCE_EVERY  # answers since the reference was computed

    def refresh(self) -> None:
        measured = [a.value for a in self.nodes.values() if a.samples >= MIN_SAMPLES]
        self.reference = statistics.median(measured) if measured else 0.0
        self.stale = 0


class Speeds:
    def __init__(self) -> None:
        self._models: dict[tuple[str, bool], _Model] = {}

    def observe(self, session: str, model: str, stream: bool, seconds: float) -> None:
        """A node answered (its first byte) ``seconds`` after the request was sent."""
        if not seconds >= 0.0:  # nan as well
            return
        kind = self._models.setdefault((model, stream), _Model())
        node = kind.nodes.setdefault(session, _Average())
        node.add(seconds)
        kind.stale += 1
        if kind.stale >= REFERENCE_EVERY or node.samples == MIN_SAMPLES:
            kind.refresh()

    def factor(self, session: str, model: str, stream: bool) -> float:
        """The share of its capacity weight a node keeps, in [``FLOOR``, 1]."""
        kind = self._models.get((model, stream))
        node = None if kind is None else kind.nodes.get(session)
        if kind is None or node is None or node.samples < MIN_SAMPLES or node.value <= 0.0:
            return 1.0
        return max(FLOOR, min(1.0, SLACK * kind.reference / node.value))

    def report(self, session: str) -> dict[str, float]:
        """For ``/v1/network``'s routing report: the node's factors by model."""
        return {f"{model}{' (stream)' if stream else ''}": round(
            self.factor(session, model, stream), 3)
            for (model, stream), kind in self._models.items() if session in kind.nodes}

    def forget_except(self, sessions: set[str]) -> None:
        for kind in self._models.values():
            kind.nodes = {s: a for s, a in kind.nodes.items() if s in sessions}
            kind.refresh()
        self._models = {k: m for k, m in self._models.items() if m.nodes}
