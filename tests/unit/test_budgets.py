"""Budgets in tokens and money, per day, month and lifetime, for keys and teams: the pure
ledger and rules, and the gate (``ingress.access``) on a real SQLite file with a clock
the test moves across midnight."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio

from ingress import keystore, prices, usage
from ingress.access import Access
from ingress.budgets import Budget, Ledger, Reservation, Spent, period_end, period_start, refusal
from ingress.database import Database, DatabaseUrl
from ingress.keystore import KeySpec
from ingress.migrations import migrate
from ingress.prices import Price
from ingress.standing import standings
from otela.dataplane.errors import RequestError
from otela.dataplane.exchange import Exchange, UsageTap


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


def test_periods_are_utc_calendar_days_and_months():
    now = at("2026-12-31T23:59:30")
    assert period_start("day", now) == at("2026-12-31T00:00:00")
    assert period_end("day", now) == at("2027-01-01T00:00:00")
    assert period_start("month", now) == at("2026-12-01T00:00:00")
    assert period_end("month", now) == at("2027-01-01T00:00:00")
    assert period_start("lifetime", now) == 0.0 and period_end("lifetime", now) is None


def test_the_ledger_starts_a_window_afresh_when_its_period_turns():
    ledger = Ledger(at("2026-11-30T23:00:00"))
    account = ("key", "k")
    ledger.add(account, 100, 1.0, at("2026-11-30T23:30:00"))
    assert ledger.spent(account, "day", at("2026-11-30T23:59:59")).tokens == 100
    after = at("2026-12-01T00:00:01")
    assert ledger.spent(account, "day", after).tokens == 0
    assert ledger.spent(account, "month", after).tokens == 0
    assert ledger.spent(account, "lifetime", after) == Spent(100, 1.0)
    # A row another ingress served yesterday, read today, stays yesterday's.
    ledger.add(account, 7, 0.0, after, finished_at=at("2026-11-30T23:59:00"))
    assert ledger.spent(account, "day", after).tokens == 0
    assert ledger.spent(account, "lifetime", after).tokens == 107


def test_refusals_say_which_budget_and_when_it_resets():
    now = at("2026-11-27T12:00:00")
    daily = Budget(tokens=100, period="day")
    assert refusal(daily, Spent(99), Spent(), "This API key's", now) is None
    used_up = refusal(daily, Spent(100), Spent(), "This API key's", now)
    assert used_up is not None and used_up.status == 403 and used_up.code == "budget_exceeded"
    assert "daily token budget (100)" in used_up.message
    assert "2026-11-28T00:00Z" in used_up.message
    held = refusal(daily, Spent(50), Spent(50), "Team physics's", now)
    assert held is not None and (held.status, held.code) == (429, "budget_reserved")
    money = refusal(Budget(spend=2.5, period="month"), Spent(0, 2.5), Spent(), "Team t's", now)
    assert money is not None and "monthly spend budget (2.5)" in money.message
    reservation = Reservation()
    reservation.hold(("key", "k"), 10, 0.5)
    reservation.release(("key", "k"), 10, 0.5)
    assert reservation.held == {}


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return 1000.0


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    moved = Clock(at("2026-11-27T23:00:00"))
    monkeypatch.setattr("ingress.access.time", SimpleNamespace(time=moved.time,
                                                                monotonic=moved.monotonic))
    return moved


def sqlite(path: Path) -> Database:
    db = Database.connect(DatabaseUrl.parse(str(path)))
    migrate(db)
    return db


def serve(access: Access, key: keystore.ApiKey, model: str, prompt: int, completion: int,
          provider: str = "uni") -> None:
    grant = access.admit(key, model, max_tokens=completion, prompt_bound=prompt)
    access.finished(grant, prompt + completion, prompt, provider)


def test_a_daily_token_budget_refuses_until_midnight_utc(tmp_path, clock):
    db = sqlite(tmp_path / "d.db")
    key, _ = keystore.create(db, KeySpec(owner="a", budget_tokens=100, budget_period="day"))
    access = Access(db, "ingress-1")
    access.load()
    serve(access, key, "m", 40, 60)
    with pytest.raises(RequestError) as caught:
        access.admit(key, "m", max_tokens=1)
    assert caught.value.status == 403 and "daily" in caught.value.message
    assert access.standing(key).over_budget
    clock.now = at("2026-11-28T00:00:05")
    access.admit(key, "m", max_tokens=1)  # a new day
    assert not access.standing(key).over_budget


def test_a_money_budget_prices_each_request_and_refuses_unpriced_models(tmp_path, clock):
    db = sqlite(tmp_path / "m.db")
    prices.set_price(db, Price("m", "", 1_000.0, 1_000.0))  # 0.001 per token
    prices.set_price(db, Price("m", "cloud", 10_000.0, 10_000.0))
    key, _ = keystore.create(db, KeySpec(owner="a", budget_spend=0.5, budget_period="month"))
    access = Access(db, "ingress-1")
    access.load()
    with pytest.raises(RequestError) as caught:
        access.admit(key, "free-model", max_tokens=1)
    assert (caught.value.status, caught.value.code) == (403, "model_unpriced")
    # A reservation is priced at the model's highest (cloud's) rate: 2 x 10 tokens here.
    grant = access.admit(key, "m", max_tokens=10, prompt_bound=10)
    assert grant.reserved_spend == pytest.approx(0.2)
    access.finished(grant, 20, 10, "uni")  # served by the cheaper provider: 0.02
    assert access.standing(key).period_spend == pytest.approx(0.02)
    serve(access, key, "m", 200, 280, "uni")  # 0.48: 0.5 reached
    with pytest.raises(RequestError) as caught:
        access.admit(key, "m", max_tokens=1)
    assert caught.value.code == "budget_exceeded" and "monthly spend" in caught.value.message


def test_a_team_budget_holds_across_its_keys_and_the_tighter_budget_wins(tmp_path, clock):
    db = sqlite(tmp_path / "t.db")
    keystore.set_team(db, "physics", {"budget_tokens": 150, "budget_period": "day"})
    roomy, _ = keystore.create(db, KeySpec(owner="a", team="physics"))
    tight, _ = keystore.create(db, KeySpec(owner="b", team="physics", budget_tokens=30))
    outsider, _ = keystore.create(db, KeySpec(owner="c"))
    access = Access(db, "ingress-1")
    access.load()
    serve(access, tight, "m", 10, 20)
    with pytest.raises(RequestError) as caught:  # its own budget, tighter than the team's
        access.admit(tight, "m", max_tokens=1)
    assert "This API key's token budget (30)" in caught.value.message
    serve(access, roomy, "m", 60, 60)  # the team: 150 used
    with pytest.raises(RequestError) as caught:
        access.admit(roomy, "m", max_tokens=1)
    assert "Team physics's daily token budget (150)" in caught.value.message
    access.admit(outsider, "m", max_tokens=10**6)  # another team's use is not ours
    # Concurrent requests hold the rest: the second is 429 until the first is over.
    keystore.set_team(db, "physics", {"budget_tokens": 400})
    access.refresh()
    first = access.admit(roomy, "m", max_tokens=240, prompt_bound=10)  # 150 + 250
    with pytest.raises(RequestError) as caught:
        access.admit(roomy, "m", max_tokens=200)
    assert (caught.value.status, caught.value.code) == (429, "budget_reserved")
    access.finished(first, 5, 5, "uni")
    access.admit(roomy, "m", max_tokens=200)


def test_use_from_the_database_counts_in_its_window_and_the_standing_agrees(tmp_path, clock):
    """A restarted ingress (``load``) and the admin API's standing read the same sums."""
    db = sqlite(tmp_path / "s.db")
    keystore.set_team(db, "astro", {"budget_tokens": 50, "budget_period": "day"})
    key, _ = keystore.create(db, KeySpec(owner="a", team="astro", budget_tokens=1000,
                                         budget_period="month"))
    writer = usage.UsageWriter(db, "elsewhere")
    for when, tokens in ((at("2026-11-26T10:00:00"), 40), (at("2026-11-27T10:00:00"), 30)):
        done = Exchange(route="/v1/chat/completions", request_id="r", model="m", status=200,
                        api_key=key.id)
        done.arrival = when
        done.tap = UsageTap(False)
        done.tap.prompt_tokens, done.tap.completion_tokens = tokens, 0
        writer.finished(done)
    writer.context = SimpleNamespace(prices=prices.PriceList(),  # type: ignore[assignment]
                                     team_of=lambda key_id: "astro",
                                     user_of=lambda key_id: None)
    trio.run(writer.flush)
    access = Access(db, "ingress-1")
    access.load()
    assert access.standing(key).period_tokens == 70  # this month
    assert not access.standing(key).over_budget  # the team: 30 today, of 50
    standing = standings(db, [key], clock.now)[key.id]
    assert (standing.period_tokens, standing.over_budget) == (70, False)
    assert standing.resets_at == at("2026-12-01T00:00:00")
    keystore.set_team(db, "astro", {"budget_tokens": 30})
    access.refresh()
    assert access.standing(key).over_budget and standings(db, [key], clock.now)[key.id].over_budget
    assert key.to_dict(clock.now, 70, True)["status"] == "over budget"


def test_a_teams_models_providers_and_limits_hold_its_keys_the_tighter_wins(tmp_path, clock):
    """Set per team: the models and providers all its keys may use (a key narrows, never
    widens them) and limits the whole team shares; changes apply at the next refresh."""
    db = sqlite(tmp_path / "team.db")
    keystore.set_team(db, "bio", {"models": frozenset({"a", "b"}),
                                  "providers": frozenset({"uni", "cloud"}),
                                  "max_concurrent": 2, "rpm": 600})
    wide, _ = keystore.create(db, KeySpec(owner="a", team="bio"))
    narrow, _ = keystore.create(db, KeySpec(owner="b", team="bio", models=frozenset({"b", "c"}),
                                            providers=frozenset({"uni"})))
    access = Access(db, "ingress-1")
    access.load()
    wide, narrow = access.by_id[wide.id], access.by_id[narrow.id]
    with pytest.raises(RequestError) as caught:
        access.admit(wide, "c")  # not the team's
    assert caught.value.code == "model_not_allowed"
    with pytest.raises(RequestError):
        access.admit(narrow, "a")  # the team's, not the key's
    assert narrow.models == frozenset({"b"}) and narrow.providers == frozenset({"uni"})
    first = access.admit(wide, "a")
    second = access.admit(narrow, "b")  # two in flight across the team's keys: its limit
    with pytest.raises(RequestError) as caught:
        access.admit(wide, "b")
    assert (caught.value.status, caught.value.code) == (429, "concurrency_limit_exceeded")
    assert caught.value.message.startswith("Team bio has 2 requests in flight")
    assert access.limits[wide.id].in_flight == 1  # the refusal took no slot of the key's
    access.finished(first, 10)
    access.finished(second, 10)
    third = access.admit(wide, "b")
    access.finished(third, 1)
    # A team's list widened: the keys follow at the next refresh (not their old, narrowed
    # copies); its limit removed: the team's requests are no longer counted together.
    keystore.set_team(db, "bio", {"models": None, "max_concurrent": None, "rpm": None})
    access.refresh()
    assert access.by_id[wide.id].models is None
    assert access.by_id[narrow.id].models == frozenset({"b", "c"})
    assert "bio" not in access.team_limits
    grants = [access.admit(access.by_id[wide.id], "z") for _ in range(3)]
    assert len(grants) == 3


def test_a_teams_priority_and_a_keys_the_tighter_class_wins(tmp_path, clock):
    """Set per team: the best priority class its keys may use. A key's own applies too:
    of the two, the one further down the ingress's classes; changes apply at the next
    refresh, and a key stored keeps its own setting."""
    db = sqlite(tmp_path / "priority.db")
    classes = ("realtime", "interactive", "default", "batch")
    keystore.set_team(db, "night", {"priority": "default"})
    free, _ = keystore.create(db, KeySpec(owner="a", team="night"))
    urgent, _ = keystore.create(db, KeySpec(owner="b", team="night", priority="realtime"))
    humble, _ = keystore.create(db, KeySpec(owner="c", team="night", priority="batch"))
    alone, _ = keystore.create(db, KeySpec(owner="d", priority="interactive"))
    access = Access(db, "ingress-1", priority_classes=classes, default_priority="default")
    access.load()
    assert [access.by_id[k.id].priority for k in (free, urgent, humble, alone)] == [
        "default", "default", "batch", "interactive"]
    assert keystore.get(db, urgent.id).priority == "realtime"  # as stored: the key's own
    assert keystore.teams(db)["night"].to_dict()["priority"] == "default"

    keystore.set_team(db, "night", {"priority": "batch", "weight": 2})
    access.refresh()
    assert {access.by_id[k.id].priority for k in (free, urgent, humble)} == {"batch"}
    keystore.set_team(db, "night", {"priority": None})
    access.refresh()
    assert [access.by_id[k.id].priority for k in (free, urgent, humble)] == [
        None, "realtime", "batch"]
    assert keystore.teams(db)["night"].weight == 2  # other settings kept

    # A class this ingress does not have counts as its default class (as the queue reads
    # it), so it never loosens a known one below the default.
    assert access.tighter_class("gold", "batch") == "batch"
    assert access.tighter_class("gold", "realtime") == "gold"
    assert access.tighter_class(None, None) is None


def test_a_teams_priority_is_checked_like_a_keys():
    from ingress.admin_input import team_change

    assert team_change("night", {"priority": " Batch "}) == ("night", {"priority": "batch"})
    assert team_change("night", {"priority": None}) == ("night", {"priority": None})
    for bad in ("very important", 3, ""):
        with pytest.raises(RequestError) as caught:
            team_change("night", {"priority": bad})
        assert caught.value.status == 400 and caught.value.param == "priority"
