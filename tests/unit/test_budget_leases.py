"""Budget leases (``ingress.leases``): the pure share arithmetic, and two ingress gates
(``ingress.access.Access``) leasing one budget through a real SQLite file: together they
overshoot it by less than one request's reservation, a killed ingress's share is taken
back once it expires, and a stopping ingress gives back what it did not use."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio

from ingress import keystore, leases, usage
from ingress.access import Access, Grant
from ingress.budgets import (
    LEASE_IDLE_MAX_S,
    LEASE_IDLE_S,
    Budget,
    Lease,
    Spent,
    give_back_idle,
    lease_grant,
)
from ingress.database import Database, DatabaseUrl
from ingress.keys import ApiKey
from ingress.keystore import KeySpec
from ingress.migrations import migrate
from otela.dataplane.errors import RequestError
from otela.dataplane.exchange import Exchange, UsageTap


def test_a_take_hands_out_a_quarter_of_the_rest_and_at_least_the_need():
    budget = Budget(tokens=1000, period="day")
    assert lease_grant(budget, Spent(0), Spent(0)) == Spent(250, 0.0)
    assert lease_grant(budget, Spent(600), Spent(10)) == Spent(100, 0.0)
    assert lease_grant(budget, Spent(600), Spent(300)) == Spent(300, 0.0)
    # The rest is smaller than the need: this one take crosses the budget, then none.
    assert lease_grant(budget, Spent(990), Spent(50)) == Spent(50, 0.0)
    assert lease_grant(budget, Spent(1000), Spent(1)) is None
    assert lease_grant(budget, Spent(999), Spent(0)) == Spent(1, 0.0)
    money = Budget(tokens=None, spend=2.0)
    assert lease_grant(money, Spent(10**9, 1.0), Spent(0, 0.1)) == Spent(0, 0.25)
    # Both measures: nothing when either is spent.
    assert lease_grant(Budget(tokens=10, spend=1.0), Spent(5, 1.0), Spent(1, 0.1)) is None


@pytest.mark.parametrize("seed", range(20))
def test_any_number_of_takers_overshoot_by_less_than_one_need(seed):
    rng = random.Random(seed)
    budget = Budget(tokens=rng.randint(100, 100_000))
    committed = Spent(rng.randint(0, budget.tokens // 2))
    largest = 0
    while (need := rng.choice([0, rng.randint(1, 3000)])) is not None:
        granted = lease_grant(budget, committed, Spent(need))
        if granted is None:
            break
        largest = max(largest, need)
        committed.tokens += granted.tokens
    assert budget.tokens <= committed.tokens < budget.tokens + max(largest, 1)


def test_a_lease_admits_what_it_covers_and_asks_for_a_top_up_below_half():
    lease = Lease(Budget(tokens=1000, period="day"), 0.0, 0, None, valid_until=100.0)
    lease.add(Spent(200), 1.0, 100.0)
    assert lease.fits(Budget(tokens=1000, period="day"), 0.0, 50.0)
    assert not lease.fits(Budget(tokens=1000, period="day"), 0.0, 100.0)  # expired
    assert not lease.fits(Budget(tokens=1000, period="month"), 0.0, 50.0)
    assert not lease.fits(Budget(spend=1.0, period="day"), 0.0, 50.0)
    assert lease.shortfall(Spent(50), 150, 0.0) is None
    assert lease.shortfall(Spent(50), 160, 0.0) == Spent(10, 0.0)
    assert not lease.low(Spent(100)) and lease.low(Spent(101))
    lease.used_tokens = 120
    assert lease.unused(Spent(30)) == Spent(50, 0.0)
    assert lease.unused(Spent(300)) == Spent(0, 0.0)


def test_an_idle_lease_is_given_back_when_it_holds_much_of_the_rest_or_for_long():
    lease = Lease(Budget(tokens=1000, period="day"), 0.0, 0, None, 1e9, last_used=0.0)
    lease.add(Spent(100), 0.0, 1e9)
    spent_far, spent_near = Spent(100), Spent(850)
    assert not give_back_idle(lease, Spent(), spent_near, LEASE_IDLE_S - 1)  # not idle
    assert not give_back_idle(lease, Spent(5), spent_near, LEASE_IDLE_S)  # in flight
    assert give_back_idle(lease, Spent(), spent_near, LEASE_IDLE_S)
    assert not give_back_idle(lease, Spent(), spent_far, LEASE_IDLE_S)
    assert give_back_idle(lease, Spent(), spent_far, LEASE_IDLE_MAX_S)


# -- two gates on one database -----------------------------------------------------------


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def sqlite(path: Path) -> Database:
    db = Database.connect(DatabaseUrl.parse(str(path)))
    migrate(db)
    return db


def gate(path: Path, name: str, ttl: float = leases.LEASE_TTL_S) -> Access:
    access = Access(sqlite(path), name, lease_budgets=True, lease_ttl=ttl)
    access.load()
    return access


def take_wanted(access: Access) -> None:
    """What ``Access._keep_leases`` does in the background, once, here and now."""
    wanted, access._wanted = access._wanted, {}

    async def takes() -> None:
        for account, (budget, need) in wanted.items():
            await access._take(account, budget, need)

    trio.run(takes)


def admitted_once_leased(access: Access, key: ApiKey, max_tokens: int) -> Grant:
    """A key's first request at a gate: refused (429 ``budget_reserved``) until the gate
    has taken its lease, then admitted."""
    with pytest.raises(RequestError) as refused:
        access.admit(key, "m", max_tokens=max_tokens)
    assert refused.value.code == "budget_reserved"
    take_wanted(access)
    return access.admit(key, "m", max_tokens=max_tokens)


def committed(db: Database, name: str) -> int:
    return int(db.query_sync("SELECT tokens FROM budget_windows WHERE name = ?", (name,))[0][0])


def test_two_gates_hammering_one_team_budget_overshoot_by_less_than_one_request(tmp_path):
    path = tmp_path / "two.db"
    made = sqlite(path)
    keystore.set_team(made, "lab", {"budget_tokens": 5000, "budget_period": "day"})
    keys = [keystore.create(made, KeySpec(owner=f"o{i}", team="lab"))[0] for i in range(2)]
    gates = [gate(path, "ingress-a"), gate(path, "ingress-b")]
    rng = random.Random(7)
    used, largest, in_flight = 0, 0, []
    refused = {0: 0, 1: 0}
    while min(refused.values()) < 3:
        side = rng.randrange(2)
        access, key = gates[side], keys[side]
        reserve = rng.randint(1, 400)
        try:
            grant = access.admit(key, "m", max_tokens=reserve)
        except RequestError as error:
            assert error.status == 429 and error.code == "budget_reserved", error.message
            lease = access.leases.get(("team", "lab"))
            before = None if lease is None else lease.tokens
            take_wanted(access)
            lease = access.leases.get(("team", "lab"))
            if (None if lease is None else lease.tokens) == before:  # nothing was left
                refused[side] += 1
            continue
        largest = max(largest, reserve)
        in_flight.append((access, grant))
        if len(in_flight) > 4 or rng.random() < 0.5:  # finish one: it used all it could
            done, grant = in_flight.pop(rng.randrange(len(in_flight)))
            done.finished(grant, grant.reserved, 0)
            used += grant.reserved
    for done, grant in in_flight:
        done.finished(grant, grant.reserved, 0)
        used += grant.reserved
    # Neither gate saw the other's use (no refresh ran): the leases alone held the budget.
    # What is left unused is what each gate's lease could not cover of its last request.
    assert 5000 - 2 * 400 < used < 5000 + largest, (used, largest)
    assert committed(made, "lab") < 5000 + largest


def test_a_killed_gates_share_is_taken_back_when_it_expires_less_what_it_used(tmp_path):
    path = tmp_path / "killed.db"
    made = sqlite(path)
    key, _ = keystore.create(made, KeySpec(owner="o", budget_tokens=1000,
                                            budget_period="lifetime"))
    killed, alive = gate(path, "ingress-killed", ttl=0.5), gate(path, "ingress-alive")
    grant = admitted_once_leased(killed, key, 100)  # its lease: a quarter of 1000
    assert killed.leases[("key", key.id)].tokens == 250
    writer = usage.UsageWriter(killed.db, "ingress-killed", context=killed)
    row = Exchange(route="/v1/chat/completions", request_id="r", model="m", status=200,
                   api_key=key.id)
    row.tap = UsageTap(False)
    row.tap.prompt_tokens, row.tap.completion_tokens = 30, 40
    writer.finished(row)
    trio.run(writer.flush)
    killed.finished(grant, 70, 30)  # and then it is killed: it renews nothing
    expires = float(made.query_sync("SELECT expires_at FROM budget_leases")[0][0])
    while made.now() <= expires:  # the database's clock passes the share's expiry
        trio.run(trio.sleep, 0.05)
    with pytest.raises(RequestError):
        alive.admit(key, "m", max_tokens=10)
    take_wanted(alive)
    # 250 were the killed gate's, of which its usage rows show 70: 180 came back, and
    # the alive one took a quarter of the 930 left.
    assert alive.leases[("key", key.id)].tokens == 233
    assert committed(made, key.id) == 70 + 233
    assert made.query_sync("SELECT ingress FROM budget_leases") == [("ingress-alive",)]


def test_a_stopping_gate_gives_back_what_it_did_not_use(tmp_path):
    path = tmp_path / "stop.db"
    made = sqlite(path)
    key, _ = keystore.create(made, KeySpec(owner="o", budget_tokens=1000,
                                            budget_period="month"))
    access = gate(path, "ingress-1")
    grant = admitted_once_leased(access, key, 10)
    access.finished(grant, 6, 2)
    assert committed(made, key.id) == 250

    async def run_then_stop() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(access.run)
            nursery.cancel_scope.cancel()

    trio.run(run_then_stop)
    # What it used stays spoken for, in its lease's row (to be taken back, once expired,
    # less what its usage rows show).
    assert committed(made, key.id) == 6 and not access.leases
    assert made.query_sync("SELECT tokens FROM budget_leases") == [(6,)]


def test_at_midnight_a_new_window_is_leased_for_the_requests_still_in_flight(
        tmp_path, monkeypatch):
    clock = SimpleNamespace(now=at("2026-11-27T23:59:50"))
    monkeypatch.setattr("ingress.access.time", SimpleNamespace(
        time=lambda: clock.now, monotonic=lambda: 1000.0))
    path = tmp_path / "midnight.db"
    made = sqlite(path)
    key, _ = keystore.create(made, KeySpec(owner="o", budget_tokens=1000,
                                            budget_period="day"))
    access = gate(path, "ingress-1")
    late = admitted_once_leased(access, key, 100)  # still in flight at midnight
    clock.now = at("2026-11-28T00:00:05")
    with pytest.raises(RequestError) as caught:  # yesterday's lease is no use today
        access.admit(key, "m", max_tokens=50)
    assert caught.value.code == "budget_reserved"
    assert access._wanted[("key", key.id)][1] == Spent(150, 0.0)  # with what it holds
    take_wanted(access)
    lease = access.leases[("key", key.id)]
    assert lease.window == at("2026-11-28T00:00:00") and lease.tokens == 250
    access.finished(late, 80, 20)  # it finishes today: today's lease pays for it
    assert lease.unused(access.reservation.of(("key", key.id))) == Spent(170, 0.0)
    trio.run(access._tend_leases)  # yesterday's window is gone from the database
    assert made.query_sync("SELECT window_start FROM budget_windows") == [
        (at("2026-11-28T00:00:00"),)]
