"""Routing's guarantees over random federations (hypothesis, thousands of examples):
whatever the registry, trust set, requirements, suspicions, ejections, policy and
sequence of failures,

- every node a request is sent to — first try or retry — is SERVING the model, of a
  trusted provider, meets every requirement and is not suspected (unless every trusted
  candidate is);
- a request is sent again only after a node provably did not take it (``NotDelivered``);
  after any other outcome there is no further send (with ``--no-retry-broken``: the
  default re-sends a non-streaming request whose node broke off, ``test_forward_failures``);
- once every request is over, the router's in-flight counts are back to zero.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otela.dataplane.errors import NotDelivered, RequestError, UpstreamFailed, UpstreamTimeout
from otela.registry.crdt import Entry, tiebreak_of
from otela.registry.records import GPU, Hardware, Lifecycle, ModelInfo, NodeRecord
from otela.registry.store import Registry
from otela.routing.ask import Ask
from otela.routing.constraints import parse
from otela.routing.policies import BUILT_IN
from otela.routing.router import Router, routing_settings
from otela.routing.trust import ANY

from .registry_helpers import record

PROVIDERS = ("a", "b", "c", "d")
OUTCOMES = ("not_delivered", "failed", "timeout", 200, 200, 200, 429, 500)
CLAUSES = ("gpu=H100", "gpu=A100|H100", "min_context=16384", "quantization=none",
           "quantization=fp8", "max_tp=2", "engine=vllm", "dtype=bfloat16")

node_strategy = st.fixed_dictionaries({
    "provider": st.sampled_from(PROVIDERS),
    "state": st.sampled_from([Lifecycle.SERVING] * 3 + [Lifecycle.JOIN, Lifecycle.DOWN]),
    "gpu": st.sampled_from(["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", None]),
    "context": st.sampled_from([4096, 32768, None]),
    "quantization": st.sampled_from([None, "fp8"]),
    "tp": st.sampled_from([1, 2, 4]),
    "engine": st.sampled_from(["vllm", "sglang"]),
    "dtype": st.sampled_from(["bfloat16", "float16", None]),
    "outcomes": st.lists(st.sampled_from(OUTCOMES), min_size=1, max_size=4),
    "suspected": st.booleans(),
})


def entry_of(i: int, spec: dict[str, Any]) -> Entry:
    rec = dataclasses.replace(
        record(f"n{i}", 1, spec["state"], provider=spec["provider"]),
        hardware=Hardware(gpus=(GPU(spec["gpu"], 80 << 30),) if spec["gpu"] else ()),
        models=(ModelInfo("m", max_context=spec["context"], dtype=spec["dtype"],
                          quantization=spec["quantization"], tensor_parallel=spec["tp"]),),
        engine=spec["engine"])
    e = Entry(rec.session_id, rec.state, 1, rec.updated_at, tiebreak_of(f"{i}".encode()), rec)
    object.__setattr__(e, "proof", e)
    return e


class Reply:
    def __init__(self, status: int, load: bytes | None) -> None:
        self.status = status
        self.headers = [(b"x-otela-load", load)] if load else []
        self.content_length = 0
        self.complete = True

    def take_buffered(self) -> bytes:
        return b""

    async def chunks(self):  # pragma: no cover - not read here
        yield b""

    async def aclose(self) -> None:
        pass


class ScriptedUpstreams:
    """Each node answers with its next scripted outcome; every send is logged."""

    def __init__(self, outcomes: dict[str, list[Any]]) -> None:
        self.outcomes = outcomes
        self.sends: list[tuple[int, NodeRecord, str]] = []  # (request, node, outcome)
        self.request = 0

    def self_session(self) -> str:
        return "not-a-candidate"

    def path_kind(self, node: NodeRecord) -> str:
        return "http"

    async def send(self, node: NodeRecord, path: str, body: bytes, headers: Sequence[Any],
                   first_byte_timeout: float, connect_timeout: float | None = None) -> Reply:
        script = self.outcomes[node.session_id]
        outcome = script[0] if len(script) == 1 else script.pop(0)
        self.sends.append((self.request, node, str(outcome)))
        await trio.sleep(0)
        if outcome == "not_delivered":
            raise NotDelivered("refused")
        if outcome == "failed":
            raise UpstreamFailed("reset")
        if outcome == "timeout":
            raise UpstreamTimeout("silent")
        return Reply(int(outcome), b"f=%d;c=1" % (len(self.sends) % 5))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.lists(node_strategy, min_size=1, max_size=8),
       trusted=st.one_of(st.none(), st.sets(st.sampled_from(PROVIDERS), min_size=1)),
       clauses=st.lists(st.sampled_from(CLAUSES), max_size=3, unique=True),
       policy=st.sampled_from(sorted(BUILT_IN)),
       requests=st.integers(min_value=1, max_value=6),
       attempts=st.integers(min_value=1, max_value=4),
       eject_after=st.integers(min_value=1, max_value=3),
       keys=st.lists(st.sampled_from(["u1", "u2", "u3", None]), min_size=6, max_size=6),
       seed=st.integers(0, 2**32 - 1))
def test_routing_never_leaves_what_the_request_allows(nodes, trusted, clauses, policy,
                                                      requests, attempts, eject_after, keys,
                                                      seed):
    import random

    registry = Registry()
    entries = [entry_of(i, spec) for i, spec in enumerate(nodes)]
    for e in entries:
        registry.apply(e, 1000.0)
    suspected = frozenset(e.record.peer_id for e, spec in zip(entries, nodes, strict=True)
                          if spec["suspected"])
    upstreams = ScriptedUpstreams({e.key: list(spec["outcomes"])
                                   for e, spec in zip(entries, nodes, strict=True)})
    clock = [0.0]
    router = Router(registry, upstreams,  # type: ignore[arg-type]
                    routing_settings(policy=policy, max_attempts=attempts,
                                    eject_after=eject_after, eject_time=1.0,
                                    retry_broken=False),
                    rng=random.Random(seed), suspected=lambda: suspected,
                    clock=lambda: clock[0])
    trust = ANY.narrowed(None if trusted is None else frozenset(trusted), "test")
    ask = Ask(trust, parse(", ".join(clauses)), body=b"{}")

    async def run_all() -> None:
        for n in range(requests):
            upstreams.request = n
            clock[0] += 0.4
            try:
                routed = await router.route("m", "/v1/completions", [], ask,
                                            lambda n=n: keys[n])
            except RequestError:
                continue
            router.release(routed)

    trio.run(run_all)

    trusted_serving = [e.record for e in entries if e.record.state is Lifecycle.SERVING
                       and trust.allows(e.record.provider_id)]
    panic = all(r.peer_id in suspected for r in trusted_serving)
    for _, node, _ in upstreams.sends:
        assert node.state is Lifecycle.SERVING
        assert trust.allows(node.provider_id)
        assert panic or node.peer_id not in suspected
        assert all(c.holds(node, node.models[0]) for c in ask.clauses)
    for n in range(requests):
        outcomes = [outcome for r, _, outcome in upstreams.sends if r == n]
        assert all(o == "not_delivered" for o in outcomes[:-1])  # retried only if undelivered
        assert len(outcomes) <= attempts
        sessions = [node.session_id for r, node, _ in upstreams.sends if r == n]
        assert len(sessions) == len(set(sessions))  # never the same node twice
    assert not router.busy
