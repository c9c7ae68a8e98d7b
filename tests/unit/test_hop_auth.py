"""Engine-hop tokens: members get through, everyone and everything else is refused."""

import pytest
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from otela.dataplane.hop_auth import (
    HopRefused,
    HopSigner,
    HopVerifier,
    ReplayWindow,
    pairwise_key,
)
from otela.registry.records import Lifecycle
from otela.registry.store import Registry

from .registry_helpers import entry


class Peer:
    def __init__(self) -> None:
        keys = create_new_key_pair()
        self.seed = keys.private_key.to_bytes()
        self.peer_id = ID.from_pubkey(keys.public_key).to_base58()


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


PATH = "/v1/engine/v1/chat/completions"
BODY = b'{"model": "m", "messages": []}'


@pytest.fixture
def setup():
    caller, target, outsider = Peer(), Peer(), Peer()
    clock = Clock()
    members = {caller.peer_id, target.peer_id}
    signer = HopSigner(caller.seed, caller.peer_id, clock)
    verifier = HopVerifier(target.seed, target.peer_id, members.__contains__, clock)
    return caller, target, outsider, clock, signer, verifier


def refusal(verifier, token, body=BODY, path=PATH, method="POST"):
    with pytest.raises(HopRefused) as err:
        verifier.verify(token, method, path, body)
    return err.value


def test_both_ends_derive_the_same_pairwise_key_and_nobody_else_does():
    a, b, c = Peer(), Peer(), Peer()
    assert pairwise_key(a.seed, a.peer_id, b.peer_id) == pairwise_key(b.seed, b.peer_id, a.peer_id)
    assert pairwise_key(a.seed, a.peer_id, b.peer_id) != pairwise_key(c.seed, c.peer_id, b.peer_id)


def test_a_members_token_names_it(setup):
    caller, target, _, _, signer, verifier = setup
    token = signer.token(target.peer_id, "POST", PATH, BODY)
    assert verifier.verify(token, "POST", PATH, BODY) == caller.peer_id


def test_no_token_or_garbage_is_unauthenticated(setup):
    *_, verifier = setup
    for token in (None, "", "nope", "1.a.b.c.d", "2.a.b.1.2.x", "1.a.b.x.2.y"):
        assert refusal(verifier, token).status == 401


def test_a_token_is_bound_to_its_request(setup):
    _, target, _, _, signer, verifier = setup
    token = signer.token(target.peer_id, "POST", PATH, BODY)
    assert refusal(verifier, token, body=BODY + b" ").code == "hop_unauthenticated"
    assert refusal(verifier, token, path="/v1/engine/v1/completions").status == 401
    assert refusal(verifier, token, method="GET").status == 401


def test_a_token_for_one_node_is_useless_at_another(setup):
    caller, target, _, clock, signer, _ = setup
    other = Peer()
    token = signer.token(target.peer_id, "POST", PATH, BODY)
    elsewhere = HopVerifier(other.seed, other.peer_id, lambda p: True, clock)
    assert refusal(elsewhere, token).status == 401
    assert elsewhere.verify(signer.token(other.peer_id, "POST", PATH, BODY), "POST", PATH,
                            BODY) == caller.peer_id


def test_a_token_is_accepted_once(setup):
    _, target, _, _, signer, verifier = setup
    token = signer.token(target.peer_id, "POST", PATH, BODY)
    verifier.verify(token, "POST", PATH, BODY)
    assert refusal(verifier, token).code == "hop_replayed"


def test_tokens_may_arrive_out_of_order_but_not_twice(setup):
    _, target, _, _, signer, verifier = setup
    tokens = [signer.token(target.peer_id, "POST", PATH, BODY) for _ in range(50)]
    for token in reversed(tokens):
        verifier.verify(token, "POST", PATH, BODY)
    for token in tokens:
        assert refusal(verifier, token).code == "hop_replayed"


def test_stale_tokens_expire(setup):
    _, target, _, clock, signer, verifier = setup
    token = signer.token(target.peer_id, "POST", PATH, BODY)
    clock.now += verifier.window + 1
    assert "clock" in refusal(verifier, token).message


def test_a_non_member_is_forbidden_even_with_a_well_formed_token(setup):
    _, target, outsider, clock, _, verifier = setup
    token = HopSigner(outsider.seed, outsider.peer_id, clock).token(
        target.peer_id, "POST", PATH, BODY)
    assert refusal(verifier, token).status == 403


def test_claiming_to_be_a_member_without_its_key_fails(setup):
    caller, target, outsider, clock, _, verifier = setup
    impostor = HopSigner(outsider.seed, outsider.peer_id, clock)
    token = impostor.token(target.peer_id, "POST", PATH, BODY)
    forged = token.replace(outsider.peer_id, caller.peer_id)
    assert refusal(verifier, forged).status == 401


def test_a_restarted_caller_starts_a_new_epoch_and_is_accepted(setup):
    caller, target, _, clock, signer, verifier = setup
    verifier.verify(signer.token(target.peer_id, "POST", PATH, BODY), "POST", PATH, BODY)
    restarted = HopSigner(caller.seed, caller.peer_id, clock)
    assert restarted.epoch != signer.epoch
    token = restarted.token(target.peer_id, "POST", PATH, BODY)
    assert verifier.verify(token, "POST", PATH, BODY) == caller.peer_id


def test_replay_window_slides_and_forgets_what_fell_below_it():
    window = ReplayWindow(size=8)
    assert window.accept(0) and window.accept(5) and window.accept(3)
    assert not window.accept(3) and not window.accept(5)
    assert window.accept(20)
    assert not window.accept(12)  # below the window: too old to tell, refused
    assert window.accept(13) and not window.accept(13)


def test_registry_members_are_peers_with_a_live_session():
    registry = Registry()
    registry.apply(entry("a", 1, Lifecycle.SERVING, peer_id="peer-x"), 1000.0)
    registry.apply(entry("b", 1, Lifecycle.DOWN, peer_id="peer-y"), 1000.0)
    assert registry.is_member("peer-x") and registry.is_member("peer-y")
    assert not registry.is_member("peer-z")
    registry.apply(entry("a", 2, Lifecycle.LEFT, peer_id="peer-x"), 1000.0)
    assert not registry.is_member("peer-x")
