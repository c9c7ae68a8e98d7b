"""The pure parts of routing, one rule at a time: candidates and their refusals, trust,
requirements, what a request asks, load reports, ejection and each policy."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from pathlib import Path

import orjson
import pytest

from otela.dataplane.errors import RequestError
from otela.load.engine_metrics import parse_engine_metrics
from otela.registry.crdt import Entry, tiebreak_of
from otela.registry.records import GPU, Hardware, Lifecycle, ModelInfo
from otela.registry.store import Registry
from otela.routing.ask import AskError, read_ask
from otela.routing.candidates import eligible
from otela.routing.constraints import ConstraintError, parse
from otela.routing.ejection import Ejections
from otela.routing.load import LoadBoard, NodeLoad, parse_load
from otela.routing.policies import (
    Candidate,
    LeastInFlight,
    Pick,
    PowerOfTwo,
    PrefixAffinity,
    RandomPolicy,
    RoundRobin,
    UnknownPolicy,
    Weighted,
    available,
    load_policy,
)
from otela.routing.trust import ANY, TrustError, TrustSet, parse_providers

from .registry_helpers import entry, record, sid

NOW = 1000.0


def serving(name: str, provider: str = "p", gpus: tuple[str, ...] = (),
            model: ModelInfo | None = None, engine: str | None = "vllm") -> Entry:
    rec = dataclasses.replace(
        record(name, 1, Lifecycle.SERVING, provider=provider),
        hardware=Hardware(gpus=tuple(GPU(g, 80 << 30) for g in gpus)),
        models=(model or ModelInfo("m"),), engine=engine)
    e = Entry(rec.session_id, rec.state, 1, rec.updated_at, tiebreak_of(name.encode()), rec)
    object.__setattr__(e, "proof", e)
    return e


def registry_of(*entries: Entry) -> Registry:
    reg = Registry()
    for e in entries:
        reg.apply(e, NOW)
    return reg


def refusal(call) -> RequestError:
    with pytest.raises(RequestError) as err:
        call()
    return err.value


# -- candidates -------------------------------------------------------------------------

def test_unknown_model_is_404_and_known_without_serving_node_is_503():
    assert refusal(lambda: eligible(Registry(), "ghost")).code == "model_not_found"
    reg = registry_of(entry("a", 1, Lifecycle.DOWN))
    error = refusal(lambda: eligible(reg, "m"))
    assert (error.status, error.code) == (503, "no_serving_node")


def test_only_serving_nodes_of_trusted_providers_are_candidates():
    reg = registry_of(serving("a", "cscs"), serving("b", "evil"), serving("c", "epfl"),
                      entry("d", 1, Lifecycle.DOWN))
    trust = ANY.narrowed(frozenset({"cscs", "epfl"}), "X-Otela-Providers")
    assert {r.session_id for r in eligible(reg, "m", trust=trust)} == {sid("a"), sid("c")}


def test_suspected_nodes_are_left_out_unless_every_candidate_is_suspected():
    reg = registry_of(serving("a"), serving("b"), serving("c", "other"))
    peers = {r.session_id: r.peer_id for r in eligible(reg, "m")}
    a, b, c = peers[sid("a")], peers[sid("b")], peers[sid("c")]
    assert {r.session_id for r in eligible(reg, "m", suspected={a})} == {sid("b"), sid("c")}
    # All suspected: a stale or second-hand hint; trying them beats a certain 503.
    assert len(eligible(reg, "m", suspected={a, b, c})) == 3
    # Trust first: an untrusted node that is not suspected never ends the panic.
    trust = ANY.narrowed(frozenset({"p"}), "X-Otela-Providers")
    assert {r.session_id for r in eligible(reg, "m", trust=trust, suspected={a, b})} == {
        sid("a"), sid("b")}


def test_no_trusted_node_names_the_trust_set_and_never_the_untrusted_nodes():
    reg = registry_of(serving("a", "evil"), serving("b", "other"))
    trust = ANY.narrowed(frozenset({"cscs"}), "--trusted-providers").narrowed(
        frozenset({"cscs", "epfl"}), "X-Otela-Providers")
    error = refusal(lambda: eligible(reg, "m", trust=trust))
    assert (error.status, error.code) == (503, "no_trusted_node")
    assert "{cscs}" in error.message and "--trusted-providers" in error.message
    assert "X-Otela-Providers" in error.message
    assert "evil" not in error.message and "other" not in error.message
    assert sid("a") not in error.message


def test_trust_sets_only_narrow():
    base = ANY.narrowed(frozenset({"a", "b"}), "ingress")
    assert base.narrowed(None, "API key") is base
    assert base.narrowed(frozenset({"b", "c"}), "request").providers == {"b"}
    assert base.narrowed(frozenset({"c"}), "request").providers == frozenset()
    assert not base.narrowed(frozenset({"c"}), "request").allows("c")
    assert ANY.allows("anyone")


def test_provider_lists_are_checked():
    assert parse_providers(" a, b ,a", "h") == {"a", "b"}
    assert parse_providers(["a", "b"], "h") == {"a", "b"}
    for bad in ("", " , ", "has space,b", ["a", 3], "x" * 200):
        with pytest.raises(TrustError):
            parse_providers(bad, "X-Otela-Providers")


def test_requirements_select_by_hardware_and_model_metadata():
    h100 = serving("h100", gpus=("NVIDIA H100 80GB HBM3",),
                   model=ModelInfo("m", max_context=32768, dtype="bfloat16",
                                   tensor_parallel=4))
    a100 = serving("a100", gpus=("NVIDIA A100-SXM4-80GB",),
                   model=ModelInfo("m", max_context=8192, dtype="float16",
                                   quantization="fp8", tensor_parallel=1,
                                   meta=(("licence", "Apache-2.0"),)), engine="sglang")
    reg = registry_of(h100, a100)

    def chosen(text: str) -> set[str]:
        return {r.session_id for r in eligible(reg, "m", clauses=parse(text))}

    assert chosen("gpu=H100") == {sid("h100")}
    assert chosen("gpu=h100|a100") == {sid("h100"), sid("a100")}
    assert chosen("min_context=16384") == {sid("h100")}
    assert chosen("quantization=none") == {sid("h100")}
    assert chosen("quantization=fp8, engine=sglang") == {sid("a100")}
    assert chosen("dtype=bfloat16") == {sid("h100")}
    assert chosen("max_tp=2") == {sid("a100")}
    assert chosen("meta.licence=apache-2.0|mit") == {sid("a100")}
    error = refusal(lambda: eligible(reg, "m", clauses=parse("gpu=H100, max_tp=2")))
    assert (error.status, error.code) == (503, "no_matching_node")
    assert "max_tp=2" in error.message


@pytest.mark.parametrize("text", ["gpu", "colour=red", "meta.=x", "min_context=lots", "max_tp=1|2",
                                  "gpu=", "gpu=|"])
def test_bad_requirements_name_the_clause(text):
    with pytest.raises(ConstraintError) as err:
        parse(f"engine=vllm, {text}")
    assert text.split("=")[0] in str(err.value)


def test_ejected_nodes_are_left_out_but_never_all():
    reg = registry_of(serving("a"), serving("b"))
    assert {r.session_id for r in eligible(reg, "m", ejected=lambda s: {sid("a")})} == \
        {sid("b")}
    assert len(eligible(reg, "m", ejected=lambda s: set(s))) == 2  # never all of them
    ej = Ejections(consecutive=1, max_share=0.99)
    for s in (sid("a"), sid("b")):
        ej.failure(s, NOW)
    assert len(ej.ejected([sid("a"), sid("b")], NOW)) == 1  # at most share of them


# -- what a request asks ----------------------------------------------------------------

def test_headers_and_body_extension_both_apply_and_the_extension_is_cut():
    body = {"model": "m", "messages": [], "otela": {"providers": ["a", "b"],
                                                     "require": {"gpu": ["H100", "A100"]},
                                                     "policy": "random"}}
    raw = orjson.dumps(body)
    ask = read_ask([(b"x-otela-providers", b"b,c"), (b"x-otela-require", b"engine=vllm")],
                   body, raw, ANY)
    assert ask.trust.providers == {"b"}
    assert [c.key for c in ask.clauses] == ["engine", "gpu"]
    assert ask.policy == "random"
    assert orjson.loads(ask.body) == {"model": "m", "messages": []}


def test_a_body_without_extension_goes_on_byte_for_byte():
    raw = b'{"model": "m",  "prompt": "x"}'
    ask = read_ask([], orjson.loads(raw), raw, ANY)
    assert ask.body is raw and ask.trust is ANY and ask.policy is None


@pytest.mark.parametrize("headers, extension, param", [
    ([(b"x-otela-providers", b" , ")], None, "X-Otela-Providers"),
    ([(b"x-otela-require", b"gpu")], None, "X-Otela-Require"),
    ([], "cscs", "otela"),
    ([], {"provider": ["a"]}, "otela.provider"),
    ([], {"providers": 3}, "otela.providers"),
    ([], {"require": {"gpu": [{"x": 1}]}}, "otela.require"),
    ([], {"policy": ""}, "otela.policy"),
    ([(b"x-otela-policy", b"random")], {"policy": "weighted"}, "otela.policy"),
])
def test_bad_routing_statements_are_400s_naming_where(headers, extension, param):
    body = {"model": "m"} if extension is None else {"model": "m", "otela": extension}
    with pytest.raises(AskError) as err:
        read_ask(headers, body, orjson.dumps(body), ANY)
    assert err.value.param == param


# -- load reports -----------------------------------------------------------------------

def test_load_reports_round_trip_and_bad_ones_are_ignored():
    load = NodeLoad(in_flight=3, running=5, waiting=2, kv_usage=0.42, capacity=1.6)
    assert parse_load(load.header()) == load
    assert load.outstanding == 7
    assert NodeLoad(in_flight=4).outstanding == 4
    for bad in (b"", b"r=1", b"f=x", b"f=-1", b"f=nan"):
        assert parse_load(bad) is None
    assert parse_load(b"f=1e30;c=1e9").in_flight == 1_000_000  # clamped
    assert parse_load(b"f=1;c=1e9").capacity == 1000.0


def test_the_board_combines_reports_with_our_own_counts_and_forgets_old_ones():
    board = LoadBoard(ttl=10)
    assert board.estimate("s", 2, NOW) == 2  # no report: what we see ourselves
    board.report("s", NodeLoad(in_flight=5, capacity=2.0), NOW)
    assert board.estimate("s", 2, NOW + 1) == 5
    board.sent("s")
    assert board.estimate("s", 2, NOW + 1) == 6  # sent after the report
    assert board.estimate("s", 9, NOW + 1) == 9
    assert board.capacity("s", NOW + 1) == 2.0
    assert board.estimate("s", 2, NOW + 11) == 2  # expired
    assert board.capacity("s", NOW + 11) == 1.0
    board.report("t", NodeLoad(in_flight=1), NOW, ttl=60)
    copy = LoadBoard()
    copy.absorb(board.snapshot(NOW + 5), NOW + 5)
    assert copy.estimate("t", 0, NOW + 50) == 1 and copy.latest("s", NOW + 50) is None


def test_engine_metrics_of_vllm_and_sglang():
    vllm = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="a"} 3.0
vllm:num_requests_running{engine="0",model_name="b"} 1.0
vllm:num_requests_waiting{engine="0",model_name="a"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="a"} 0.25
vllm:num_requests_waiting_by_reason{reason="capacity"} 7.0
"""
    load = parse_engine_metrics(vllm)
    assert (load.running, load.waiting, load.kv_usage) == (4, 2, 0.25)
    sglang = "sglang:num_running_reqs 6\nsglang:num_queue_reqs 1\nsglang:token_usage 0.5\n"
    load = parse_engine_metrics(sglang)
    assert (load.running, load.waiting, load.kv_usage) == (6, 1, 0.5)
    assert parse_engine_metrics("process_cpu_seconds_total 3\ngarbage").empty
    assert parse_engine_metrics("vllm:num_requests_running NaN\n").empty


# -- ejection ---------------------------------------------------------------------------

def test_consecutive_failures_eject_for_growing_times_and_success_resets():
    ej = Ejections(consecutive=3, base=10, max_time=25, max_share=1.0)
    ej.failure("a", NOW)
    ej.failure("a", NOW)
    ej.success("a")
    assert not ej.failure("a", NOW) and not ej.failure("a", NOW)
    assert ej.failure("a", NOW)  # third in a row
    sessions = ["a", "b", "c"]
    assert ej.ejected(sessions, NOW + 9) == {"a"}
    assert ej.ejected(sessions, NOW + 10.1) == frozenset()
    for _ in range(3):
        ej.failure("a", NOW + 11)
    assert ej.ejected(sessions, NOW + 30) == {"a"}  # 20 s the second time
    assert ej.ejected(sessions, NOW + 31.1) == frozenset()
    for _ in range(3):
        ej.failure("a", NOW + 40)
    assert ej.report(NOW + 40)["a"]["remaining_s"] == 25  # capped
    assert ej.total == 3 and ej.count(NOW + 40) == 1


def test_a_refused_connection_ejects_at_once_within_the_share():
    ej = Ejections(consecutive=5, base=10, max_share=0.5)
    assert ej.failure("a", NOW, unreachable=True)  # nothing listens there: out now
    assert not ej.failure("a", NOW, unreachable=True)  # already out: no second ejection
    assert ej.failure("b", NOW + 1, unreachable=True)
    assert ej.failure("c", NOW + 2, unreachable=True)
    assert ej.ejected(["a", "b", "c", "d"], NOW + 3) == {"b", "c"}  # at most half
    assert not ej.failure("d", NOW)  # other failures still need five in a row
    assert ej.total == 3


def test_at_most_a_share_is_ejected_and_the_oldest_ejection_ends_first():
    ej = Ejections(consecutive=1, max_share=0.5)
    for i, s in enumerate("abcd"):
        ej.failure(s, NOW + i)
    assert ej.ejected(list("abcd"), NOW + 4) == {"c", "d"}


# -- policies ---------------------------------------------------------------------------

def cands(*loads: float, capacities: tuple[float, ...] | None = None) -> list[Candidate]:
    caps = capacities or (1.0,) * len(loads)
    return [Candidate(record(f"n{i}", 1, Lifecycle.SERVING), load, cap)
            for i, (load, cap) in enumerate(zip(loads, caps, strict=True))]


def picks(policy, candidates, n=4000, key=None, seed=1) -> Counter[int]:
    rng = random.Random(seed)
    index = {c.session: i for i, c in enumerate(candidates)}
    return Counter(index[policy.pick(candidates, Pick("m", key), rng).session]
                   for _ in range(n))


def test_random_is_uniform_and_round_robin_takes_turns():
    counts = picks(RandomPolicy(), cands(0, 0, 0, 0))
    assert all(800 < c < 1200 for c in counts.values())
    assert set(picks(RoundRobin(), cands(5, 0, 0), n=3).values()) == {1}


def test_weighted_follows_capacity():
    counts = picks(Weighted(), cands(0, 0, capacities=(1.0, 3.0)))
    assert 2.5 < counts[1] / counts[0] < 3.5


def test_least_in_flight_picks_the_lowest_load_per_capacity():
    assert picks(LeastInFlight(), cands(3, 1, 2)) == {1: 4000}
    assert picks(LeastInFlight(), cands(3, 4, capacities=(1.0, 2.0))) == {1: 4000}


def test_power_of_two_never_picks_the_most_loaded_of_several():
    counts = picks(PowerOfTwo(), cands(9, 1, 2, 3))
    assert 0 not in counts and counts[1] > counts[3]


def test_prefix_affinity_keeps_keys_on_one_node_within_the_load_bound():
    nodes = cands(0, 0, 0, 0)
    policy = PrefixAffinity()
    homes = {key: picks(policy, nodes, n=5, key=key) for key in map(str, range(200))}
    assert all(len(h) == 1 for h in homes.values())  # same key, same node
    spread = Counter(next(iter(h)) for h in homes.values())
    assert len(spread) == 4 and max(spread.values()) < 80  # keys spread over nodes
    key = "hot"
    home = next(iter(picks(policy, nodes, n=1, key=key)))
    loaded = cands(*[6 if i == home else 1 for i in range(4)])
    assert home not in picks(policy, loaded, n=50, key=key)  # over the bound: next choice
    assert picks(policy, cands(0), n=3, key=key) == {0: 3}


def test_policies_are_found_by_name_and_unknown_names_list_the_choices():
    assert {"random", "round_robin", "weighted", "least_in_flight", "power_of_two",
            "prefix_affinity"} <= set(available())
    assert load_policy("power_of_two").name == "power_of_two"
    with pytest.raises(UnknownPolicy) as err:
        load_policy("fastest")
    assert "least_in_flight" in str(err.value)


def test_trust_set_describe():
    assert ANY.describe() == "any provider"
    empty = TrustSet(frozenset(), ("a", "b"))
    assert "none" in empty.describe()


# -- plugins --------------------------------------------------------------------------

# The example plugin of docs/routing.md, installed the way pip would (a module and a
# dist-info directory with an entry point).
PLUGIN = '''
import random
from collections.abc import Sequence

from otela.routing.policies import Candidate, Pick


class LowestLatency:
    """Sends each request to the node whose recent answers were fastest (an
    exponentially weighted mean of how long each node took, per model)."""

    name = "lowest_latency"
    uses_affinity_key = False

    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha = alpha
        self.mean_s: dict[str, float] = {}
        self.started: dict[str, float] = {}

    def pick(self, candidates: Sequence[Candidate], request: Pick,
             rng: random.Random) -> Candidate:
        unknown = [c for c in candidates if c.session not in self.mean_s]
        if unknown:  # try every node once
            return rng.choice(unknown)
        return min(candidates, key=lambda c: self.mean_s[c.session])

    def on_start(self, node: Candidate, request: Pick) -> None:
        import time
        self.started[node.session] = time.monotonic()

    def on_end(self, node: Candidate, request: Pick, outcome: str) -> None:
        import time
        began = self.started.pop(node.session, None)
        if began is None or outcome != "ok":
            return
        took = time.monotonic() - began
        old = self.mean_s.get(node.session, took)
        self.mean_s[node.session] = (1 - self.alpha) * old + self.alpha * took
'''


def install_plugin(root: Path, module: str, source: str, entry_points_txt: str) -> None:
    (root / f"{module}.py").write_text(source)
    info = root / f"{module}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(entry_points_txt)


def test_a_policy_plugin_is_found_by_its_entry_point_and_routes(tmp_path, monkeypatch):
    install_plugin(tmp_path, "latency_policy", PLUGIN,
                   "[otela.routing_policies]\nlowest_latency = latency_policy:LowestLatency\n"
                   "broken = latency_policy:Pick\nnot_a_policy = collections:OrderedDict\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "lowest_latency" in available()
    policy = load_policy("lowest_latency")
    candidates = [Candidate(record=serving(name).record, load=0.0, capacity=1.0)
                  for name in "abc"]
    rng, request = random.Random(1), Pick(model="m")
    tried = set()
    for _ in range(3):  # every node once, learning how long each takes
        node = policy.pick(candidates, request, rng)
        policy.on_start(node, request)
        policy.on_end(node, request, "ok")
        tried.add(node.session)
    assert tried == {c.session for c in candidates}
    slow = candidates[0]
    policy.mean_s[slow.session] = 5.0  # type: ignore[attr-defined]
    assert all(policy.pick(candidates, request, rng) is not slow for _ in range(20))
    with pytest.raises(UnknownPolicy, match=r"broken.*failed to load: TypeError"):
        load_policy("broken")
    with pytest.raises(UnknownPolicy, match="does not implement"):
        load_policy("not_a_policy")
