"""Cache-aware routing's pure parts: vLLM-compatible block hashes, KV-event decoding, the
node's index and its summaries, the wire format, the ingress's board and the policy."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import msgpack
import pytest

from otela.kvcache.anchors import anchor_depths, is_anchor
from otela.kvcache.board import CacheBoard
from otela.kvcache.events import Batch, Cleared, Removed, Stored, decode
from otela.kvcache.hashing import BlockHasher
from otela.kvcache.index import CacheIndex
from otela.kvcache.tokenize import Tokenizers
from otela.kvcache.wire import from_wire, to_wire
from otela.registry.records import Lifecycle, NodeRecord
from otela.routing.cache_aware import CacheAware, CacheContext
from otela.routing.policies import Candidate, Pick, available, load_policy
from otela.testing.localfed import PROJECT_ROOT

# A prompt's first three blocks of 32 as vLLM 0.32 (CPU) hashed them, from its KV events
# (sha256 over pickle, the default seed; tiny-llama's tokens for "You are a helpful
# assistant. " x 12).
PROMPT = [63, 372, 443, 263, 227, 269, 82, 86, 76, 91, 82, 263, 380, 79, 278, 296, 90, 20,
          227] * 6
ENGINE_HASHES = [10670456541833288299, 1303574116697698471, 9388213572264736607]


def test_block_hashes_are_the_ones_vllm_published() -> None:
    assert BlockHasher("sha256", 32).chain(PROMPT) == ENGINE_HASHES
    assert BlockHasher("sha256", 32).chain(PROMPT, limit=2) == ENGINE_HASHES[:2]
    assert BlockHasher("sha256", 32).chain(PROMPT[:31]) == []  # only full blocks


VLLM_PYTHON = PROJECT_ROOT / ".venv-vllm" / "bin" / "python"


ALGORITHMS = ("sha256", "sha256_cbor")


@pytest.fixture(scope="module")
def vllm_chains() -> tuple[list[list[int]], dict[str, list[list[int]]]]:
    """Random token sequences and their block hashes by vLLM's own functions (its installed
    package), every algorithm from one process: importing vLLM takes ~13 s of CPU."""
    if not VLLM_PYTHON.exists():
        pytest.skip("scripts/setup-vllm not run")
    rng = random.Random(7)
    prompts = [[rng.randrange(50_000) for _ in range(rng.randrange(16, 300))]
               for _ in range(6)]
    script = f"""
import json, sys
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils as k
prompts = json.load(sys.stdin)
out = {{}}
for name in {list(ALGORITHMS)!r}:
    fn = get_hash_fn_by_name(name)
    k.init_none_hash(fn)
    chains = []
    for tokens in prompts:
        parent, chain = None, []
        for i in range(len(tokens) // 16):
            parent = k.hash_block_tokens(fn, parent, tokens[i * 16:(i + 1) * 16])
            chain.append(int.from_bytes(parent, "big") & ((1 << 64) - 1))
        chains.append(chain)
    out[name] = chains
print(json.dumps(out))
"""
    done = subprocess.run([str(VLLM_PYTHON), "-c", script], input=json.dumps(prompts),
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "VLLM_NO_USAGE_STATS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    return prompts, json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_block_hashes_match_vllms_own_hashing(
    algorithm: str, vllm_chains: tuple[list[list[int]], dict[str, list[list[int]]]]
) -> None:
    prompts, theirs = vllm_chains
    hasher = BlockHasher(algorithm, 16)
    assert [hasher.chain(p) for p in prompts] == theirs[algorithm]
    assert any(theirs[algorithm])  # the comparison covered full blocks


def test_unknown_algorithms_and_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="xxhash"):
        BlockHasher("xxhash", 16)
    with pytest.raises(ValueError):
        BlockHasher("sha256", 0)


def test_anchors_are_powers_of_two_then_every_sixteenth() -> None:
    assert [d for d in range(1, 70) if is_anchor(d)] == [1, 2, 4, 8, 16, 32, 48, 64]
    assert anchor_depths(20) == [16, 8, 4, 2, 1]
    assert anchor_depths(0) == []


# -- events ---------------------------------------------------------------------------


def frames(seq: int, events: list[dict[str, object]]) -> list[bytes]:
    return [b"kv", seq.to_bytes(8, "big"), msgpack.packb([1.5, events, 0])]


def stored(hashes: list[int], parent: int | None, tokens: list[int], size: int = 32,
           **extra: object) -> dict[str, object]:
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": tokens, "block_size": size, "lora_id": None, "medium": "GPU",
            "lora_name": None, "extra_keys": [None] * len(hashes), "group_idx": 0,
            **extra}


def test_vllm_event_batches_decode() -> None:
    batch = decode(frames(4, [
        stored(ENGINE_HASHES, None, PROMPT[:96]),
        {"type": "BlockRemoved", "block_hashes": [ENGINE_HASHES[2]], "medium": "GPU"},
        {"type": "AllBlocksCleared"},
        {"type": "BlockRemoved", "block_hashes": [1], "medium": "CPU"},  # offloaded tier
        {"type": "Unknown"},
    ]))
    assert batch is not None and batch.seq == 4
    assert batch.events == (Stored(tuple(ENGINE_HASHES), None, tuple(PROMPT[:96]), 32, True),
                            Removed((ENGINE_HASHES[2],)), Cleared())
    lora = decode(frames(0, [stored([5], None, PROMPT[:32], lora_name="a")]))
    assert lora is not None and lora.events[0] == Stored((5,), None, tuple(PROMPT[:32]), 32,
                                                          False)
    assert decode([b"kv", b"\0" * 8, b"\xc1"]) is None  # not msgpack
    assert decode([b"kv", b"\0" * 8]) is None
    # a block count that does not match its tokens is skipped, not trusted
    bad = decode(frames(1, [stored([1, 2], None, PROMPT[:40])]))
    assert bad is not None and bad.events == ()


# -- the node's index -----------------------------------------------------------------


def chain_event(tokens: list[int], size: int = 32, parent: int | None = None,
                start: int = 0, hasher: BlockHasher | None = None) -> Stored:
    keys = (hasher or BlockHasher("sha256", size)).chain(tokens)
    return Stored(tuple(keys[start:]), parent, tuple(tokens[start * size:len(keys) * size]),
                  size, True)


def long_prompt(n_blocks: int, seed: int, size: int = 32) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(500) for _ in range(n_blocks * size)]


def test_the_index_advertises_anchors_and_sends_deltas() -> None:
    index = CacheIndex(rng=random.Random(1))
    assert index.summary_for(None) is None  # nothing known: nothing to say
    tokens = long_prompt(20, 1)
    keys = BlockHasher("sha256", 32).chain(tokens)
    index.apply(Batch(0, (chain_event(tokens),)))
    assert index.algorithm == "sha256" and index.rekey is None and index.block_size == 32
    whole = index.summary_for(None)
    assert whole is not None and whole.base is None
    assert set(whole.added) == {keys[d - 1] for d in (1, 2, 4, 8, 16)}
    held = (whole.epoch, whole.seq)
    assert index.summary_for(held) is None  # up to date
    # the tail goes, then a branch off block 8 grows to 16 blocks
    index.apply(Batch(1, (Removed(tuple(keys[15:])),)))
    branch = tokens[:8 * 32] + long_prompt(8, 2)
    branch_keys = BlockHasher("sha256", 32).chain(branch)
    index.apply(Batch(2, (chain_event(branch, parent=keys[7], start=8),)))
    delta = index.summary_for(held)
    assert delta is not None and delta.base == held[1]
    assert delta.removed == (keys[15],) and delta.added == (branch_keys[15],)
    # a block stored then removed between two reports is no change at all
    index.apply(Batch(3, (Removed((branch_keys[15],)),)))
    assert index.summary_for(held) is not None
    assert index.summary_for(held).added == ()  # type: ignore[union-attr]


def test_a_gap_or_a_clear_starts_a_new_epoch_and_a_whole_set() -> None:
    index = CacheIndex(rng=random.Random(2))
    tokens = long_prompt(4, 3)
    index.apply(Batch(0, (chain_event(tokens),)))
    first = index.summary_for(None)
    assert first is not None
    index.apply(Batch(5, ()))  # batches 1-4 lost
    after_gap = index.summary_for((first.epoch, first.seq))
    assert after_gap is not None and after_gap.base is None and after_gap.added == ()
    assert after_gap.epoch != first.epoch and index.stats["gaps"] == 1
    index.apply(Batch(6, (chain_event(tokens),)))
    index.apply(Batch(7, (Cleared(),)))
    assert index.anchors == {} and index.blocks == {}


def test_a_chain_whose_start_was_missed_is_kept_but_not_advertised() -> None:
    index = CacheIndex()
    index.apply(Batch(0, (chain_event(long_prompt(1, 4)),)))  # calibrates
    orphan = chain_event(long_prompt(4, 5), parent=123, start=2)
    index.apply(Batch(1, (orphan,)))
    assert index.stats["unplaced"] == 2 and len(index.anchors) == 1


def test_an_engine_hashing_otela_cannot_reproduce_is_re_keyed() -> None:
    index = CacheIndex()
    tokens = long_prompt(4, 6)
    private = Stored((11, 12, 13, 14), None, tuple(tokens), 32, True)  # e.g. xxhash
    index.apply(Batch(0, (private,)))
    assert index.rekey is not None and index.algorithm == "sha256"
    assert set(index.anchors) == {BlockHasher("sha256", 32).chain(tokens)[d - 1]
                                  for d in (1, 2, 4)}
    index.apply(Batch(1, (Removed((14, 12)),)))  # removals still name the engine's hashes
    assert list(index.anchors) == [BlockHasher("sha256", 32).chain(tokens)[0]]


def test_the_advertised_set_is_bounded_oldest_first() -> None:
    index = CacheIndex(max_anchors=3)
    for seed in range(5):
        index.apply(Batch(seed, (chain_event(long_prompt(1, 10 + seed)),)))
    assert len(index.anchors) == 3 and index.stats["not_advertised"] == 2


def test_summaries_survive_the_wire() -> None:
    index = CacheIndex()
    index.apply(Batch(0, (chain_event(long_prompt(16, 7)),)))
    summary = index.summary_for(None)
    assert summary is not None
    assert from_wire(json.loads(json.dumps(to_wire(summary)))) == summary
    for bad in ({}, {"e": 1, "q": 1, "z": 16, "h": "md5"}, {"e": -1, "q": 1, "z": 16,
                "h": "sha256"}, {"e": 1, "q": 1, "z": 16, "h": "sha256", "a": "abc"},
                {"e": 1, "q": 1, "b": 2, "z": 16, "h": "sha256"}, []):
        with pytest.raises(ValueError):
            from_wire(bad)


# -- the ingress's board --------------------------------------------------------------


def board_with(session: str, tokens: list[int], now: float = 0.0, ttl: float = 10.0
               ) -> tuple[CacheBoard, CacheIndex]:
    board, index = CacheBoard(), CacheIndex()
    index.apply(Batch(0, (chain_event(tokens),)))
    summary = index.summary_for(None)
    assert summary is not None and board.take(session, summary, now, ttl)
    return board, index


def anchors_of(tokens: list[int]) -> list[tuple[int, int]]:
    chain = BlockHasher("sha256", 32).chain(tokens)
    return [(d, chain[d - 1]) for d in anchor_depths(len(chain))]


def test_the_board_finds_the_deepest_block_each_node_holds() -> None:
    tokens = long_prompt(10, 8)
    board, index = board_with("a", tokens[:5 * 32])
    hashing = ("sha256", 32)
    assert board.matches(anchors_of(tokens), 1.0, hashing) == {"a": 4}
    assert board.matches(anchors_of(long_prompt(10, 9)), 1.0, hashing) == {}
    assert board.matches(anchors_of(tokens), 11.0, hashing) == {}  # stale: ignored
    assert board.matches(anchors_of(tokens), 1.0, ("sha256", 16)) == {}
    # a delta from a state the board does not hold is refused (the node sends it whole)
    index.apply(Batch(1, (chain_event(tokens, parent=None),)))
    stale_delta = index.summary_for((index.epoch, 0))
    assert stale_delta is not None and not board.take("a", stale_delta, 2.0, 10.0)
    assert board.stats["resync"] == 1
    board.forget("a")
    assert board.matches(anchors_of(tokens), 1.0, hashing) == {}


def test_predictions_last_until_a_summary_after_the_request_ended() -> None:
    tokens = long_prompt(4, 11)
    board, index = board_with("a", long_prompt(1, 12))
    keys = [k for _d, k in anchors_of(tokens)]
    board.predict("a", keys, 1.0)
    assert board.matches(anchors_of(tokens), 1.5, ("sha256", 32)) == {"a": 4}
    board.ended("a", keys, 2.0)
    assert board.touch("a", index.epoch, index.seq, 2.2, 10.0)  # too soon: still counts
    assert board.matches(anchors_of(tokens), 2.3, ("sha256", 32)) == {"a": 4}
    assert board.touch("a", index.epoch, index.seq, 3.0, 10.0)  # the engine's word now
    assert board.matches(anchors_of(tokens), 3.1, ("sha256", 32)) == {}
    board.predict("a", keys, 4.0)
    board.expire(4.0 + board.predict_ttl)
    assert board.matches(anchors_of(tokens), 4.1, ("sha256", 32)) == {}


# -- the policy -----------------------------------------------------------------------


def record(session: str) -> NodeRecord:
    return NodeRecord(session, "p-" + session, "prov", Lifecycle.SERVING, 1,
                      "http://127.0.0.1:1")


class PromptTokenizer:
    """Token ids are the prompt's characters' code points (the policy's part only)."""

    def prompt_ids(self, body: dict[str, object]) -> list[int] | None:
        prompt = body.get("prompt")
        return [ord(c) for c in prompt] if isinstance(prompt, str) else None


class FixedTokenizers(Tokenizers):
    def __init__(self) -> None:
        super().__init__({})

    def for_model(self, model: str) -> PromptTokenizer | None:  # type: ignore[override]
        return PromptTokenizer() if model == "m" else None


def context_with(holdings: dict[str, str], now: float = 0.0) -> CacheContext:
    board = CacheBoard()
    for session, prompt in holdings.items():
        index = CacheIndex()
        tokens = [ord(c) for c in prompt]
        index.apply(Batch(0, (chain_event(tokens, size=4),)))
        summary = index.summary_for(None)
        assert summary is not None
        board.take(session, summary, now, 30.0)
    return CacheContext(board, FixedTokenizers(), lambda: now)


def test_cache_aware_sends_a_request_where_its_prefix_is_cached() -> None:
    system = "You are terse. " * 4
    context = context_with({"a": system + "question one", "b": "something else entirely"})
    policy = load_policy("cache_aware", cache=context)
    assert "cache_aware" in available()
    nodes = [Candidate(record(s), 0.0, 1.0) for s in ("a", "b", "c")]
    body = {"prompt": system + "question one, and a follow-up"}
    for seed in range(20):
        chosen = policy.pick(nodes, Pick("m", "k", body=body), random.Random(seed))
        assert chosen.session == "a"
    # the deeper match wins over a shallower one
    context = context_with({"a": system[:8], "b": system + "question"})
    policy = CacheAware(context)
    assert policy.pick(nodes, Pick("m", "k", body=body), random.Random(0)).session == "b"


def test_load_wins_above_the_bound_and_a_prediction_follows_the_request() -> None:
    system = "Summarise this document please. " * 3
    context = context_with({"a": system})
    context.balance = 2.0
    policy = CacheAware(context)
    busy = [Candidate(record("a"), 6.0, 1.0), Candidate(record("b"), 0.0, 1.0),
            Candidate(record("c"), 0.0, 1.0)]
    pick = Pick("m", "user-1", body={"prompt": system + "doc"})
    chosen = policy.pick(busy, pick, random.Random(1))
    assert chosen.session != "a" and context.stats["load_won"] == 1
    # the chosen node now holds the prefix as far as this ingress knows... once it
    # reports a summary at all (a node without KV events is never predicted)
    context.board.take("b", CacheIndex().summary_for(None) or _empty_summary(), 0.0, 30.0)
    policy.on_start(busy[1], pick)
    nodes = [Candidate(record(s), 0.0, 1.0) for s in ("a", "b", "c")]
    again = Pick("m", "user-1", body={"prompt": system + "doc, again"})
    assert policy.pick(nodes, again, random.Random(2)).session in {"a", "b"}
    assert context.board.matches(anchors_of_prompt(system + "doc"), 0.0,
                                 ("sha256", 4)).get("b")


def _empty_summary():  # type: ignore[no-untyped-def]
    from otela.kvcache.index import Summary
    return Summary(1, 0, None, (), (), 4, "sha256")


def anchors_of_prompt(prompt: str) -> list[tuple[int, int]]:
    chain = BlockHasher("sha256", 4).chain([ord(c) for c in prompt])
    return [(d, chain[d - 1]) for d in anchor_depths(len(chain))]


def test_the_bound_keeps_the_busiest_node_near_the_mean() -> None:
    """With --cache-balance 1.5 and no floor: a holder already running a request while
    two nodes idle is passed over (it would be at 3x the mean); at 2 while the others run
    1 each, it is not (1.2x)."""
    context = context_with({"a": "Shared system prompt. " * 3})
    policy = CacheAware(context)
    body = {"prompt": "Shared system prompt. " * 3 + "question"}
    lonely = [Candidate(record("a"), 1.0, 1.0), Candidate(record("b"), 0.0, 1.0),
              Candidate(record("c"), 0.0, 1.0)]
    for seed in range(10):  # then prefix affinity's choice among the nodes in bound
        assert policy.pick(lonely, Pick("m", f"k{seed}", body=body),
                           random.Random(seed)).session != "a"
    assert context.stats["load_won"] == 10
    busy = [Candidate(record("a"), 2.0, 1.0), Candidate(record("b"), 1.0, 1.0),
            Candidate(record("c"), 1.0, 1.0)]
    assert policy.pick(busy, Pick("m", "k", body=body), random.Random(0)).session == "a"
    assert context.stats["cache_hit_routed"] == 1


def test_without_tokenizer_or_summaries_it_is_prefix_affinity() -> None:
    nodes = [Candidate(record(s), 0.0, 1.0) for s in ("a", "b", "c", "d")]
    affinity = load_policy("prefix_affinity")
    for context in (context_with({}), context_with({"a": "x" * 40}), None):
        policy = CacheAware(context)
        for key in ("alice", "bob", "carol"):
            pick = Pick("other-model" if context else "m", key, body={"prompt": "x" * 40})
            assert policy.pick(nodes, pick, random.Random(0)).session == \
                affinity.pick(nodes, Pick("m", key), random.Random(0)).session


# -- tokenization at the ingress ----------------------------------------------------


def build_tokenizer(directory: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"])
    tokenizer.train_from_iterator(["You are a helpful assistant.", "hello there"] * 20,
                                  trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "chat_template":
         "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
         "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"}))


def test_chat_requests_are_rendered_with_the_models_template(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    build_tokenizer(tmp_path)
    raw = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    tokenizer = Tokenizers({"m": tmp_path}).for_model("m")
    assert tokenizer is not None
    messages = [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": [{"type": "text", "text": "hello"},
                                             {"type": "text", "text": "there"}]}]
    text = "<s><|system|>You are a helpful assistant.</s><|user|>hello\nthere</s><|assistant|>"
    assert tokenizer.render(messages, True) == text
    assert tokenizer.prompt_ids({"messages": messages}) == \
        raw.encode(text, add_special_tokens=False).ids
    assert tokenizer.prompt_ids({"prompt": "hello there"}) == raw.encode("hello there").ids
    assert tokenizer.prompt_ids({"prompt": [1, 2, 3]}) == [1, 2, 3]
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    assert tokenizer.prompt_ids({"messages": image}) is None
    assert Tokenizers({"m": tmp_path / "missing"}).for_model("m") is None
    assert Tokenizers({}).for_model("m") is None


def test_the_node_follows_events_from_a_real_zmq_publisher() -> None:
    """A ZMQ PUB socket sending vLLM-shaped batches; the node's task indexes them, and a
    publisher that binds after the node connected (the engine starts later) is heard."""
    import socket as stdlib_socket

    import trio
    import zmq

    from otela.engine.kv_events import events_endpoint, follow_events

    with stdlib_socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                         "endpoint": f"tcp://*:{port}", "topic": "kv"})
    endpoint = events_endpoint(["python", "-m", "vllm", "--kv-events-config", config], "auto")
    assert endpoint == (f"tcp://127.0.0.1:{port}", "kv")
    assert events_endpoint(["python", "-m", "vllm", "--kv-events-config", config], "off") \
        is None
    assert events_endpoint(["python", "-m", "vllm"], "auto") is None
    index = CacheIndex()
    tokens = long_prompt(4, 20)

    async def main() -> None:
        batches = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow_events, endpoint[0], endpoint[1], index,
                               batches.set)
            await trio.sleep(0.2)  # the node is connected before anything binds
            publisher = zmq.Context.instance().socket(zmq.PUB)
            publisher.bind(f"tcp://127.0.0.1:{port}")
            try:
                with trio.fail_after(20):
                    seq = 0
                    while not batches.is_set():  # PUB drops what it sends before the
                        publisher.send_multipart(  # subscription reaches it
                            frames(seq, [stored(BlockHasher("sha256", 32).chain(tokens),
                                                None, tokens)]))
                        seq += 1
                        await trio.sleep(0.05)
            finally:
                publisher.close(linger=0)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert len(index.anchors) == 3 and index.stats["batches"] >= 1


def test_data_path_workers_get_the_boards_summaries_changes_and_refreshes() -> None:
    """The control process pushes its board to each worker (--workers): everything to one
    starting, then only what changed; a worker drops nodes the control dropped."""
    control, _index = board_with("a", long_prompt(4, 30), now=0.0, ttl=10.0)
    worker, restarted = CacheBoard(), CacheBoard()
    sent: dict[str, tuple[int, int, float]] = {}
    worker.absorb(control.export(1.0, sent), 1.0)
    assert control.export(1.0, sent)["nodes"] == {}  # nothing new
    tokens = long_prompt(4, 30)
    hashing = ("sha256", 32)
    assert worker.matches(anchors_of(tokens), 2.0, hashing) == {"a": 4}
    index = CacheIndex()
    index.apply(Batch(0, (chain_event(long_prompt(2, 31)),)))
    second = index.summary_for(None)
    assert second is not None and control.take("b", second, 3.0, 10.0)
    node_a = control.nodes["a"]
    assert control.touch("a", node_a.epoch, node_a.seq, 9.0, 10.0)  # refreshed at 9 s
    changes = control.export(9.5, sent)["nodes"]
    assert set(changes) == {"a", "b"} and "a" not in changes["a"]  # a: a refresh only
    worker.absorb({"nodes": changes, "live": ["a", "b"]}, 9.5)
    assert worker.matches(anchors_of(tokens), 15.0, hashing) == {"a": 4}  # fresh: 9 + 10
    restarted.absorb(control.export(9.5), 9.5)
    assert set(restarted.nodes) == {"a", "b"}
    control.forget("a")
    worker.absorb(control.export(10.0, sent), 10.0)
    assert set(worker.nodes) == {"b"} and "a" not in sent


def test_an_endpoint_that_cannot_be_followed_is_logged_not_fatal(
        caplog: pytest.LogCaptureFixture) -> None:
    import trio

    from otela.engine.kv_events import follow_events

    async def main() -> None:
        with trio.fail_after(10):
            await follow_events("tcp://no such host:1", "", CacheIndex())

    trio.run(main)  # returns: the node goes on without summaries
    assert "cannot follow the engine's KV events" in caplog.text
