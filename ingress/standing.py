"""Where a key stands against its budgets: what it used in its budget's period, whether
it (or its team) is over budget, and when the period resets. The one answer ``/v1/me``,
the admin API, ``otela keys`` and the dashboard all show, from the usage table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ingress import keystore, usage
from ingress.budgets import Ledger, over, period_end
from ingress.database import Database
from ingress.keys import ApiKey
from ingress.keystore import Team


@dataclass(frozen=True)
class Standing:
    used_tokens: int  # over the key's life (what ``used_tokens`` always said)
    period_tokens: int  # in its budget's period (its life without one)
    period_spend: float
    over_budget: bool  # the key's budget or its team's is used up
    resets_at: float | None  # when its budget's period turns

    def to_dict(self) -> dict[str, Any]:
        return {"used_tokens": self.used_tokens,
                "budget_used": {"tokens": self.period_tokens,
                                "spend": round(self.period_spend, 6),
                                "resets_at": self.resets_at}}


def standing_of(key: ApiKey, ledger: Ledger, teams: dict[str, Team], now: float) -> Standing:
    """``key``'s standing from a ledger of everyone's use."""
    budget = key.budget
    spent = ledger.spent(("key", key.id), budget.period, now)
    team = teams.get(key.team) if key.team else None
    team_over = team is not None and over(
        team.budget, ledger.spent(("team", team.name), team.budget.period, now))
    return Standing(ledger.spent(("key", key.id), "lifetime", now).tokens, spent.tokens,
                    spent.spend, over(budget, spent) or team_over,
                    period_end(budget.period, now))


def standings(db: Database, keys: list[ApiKey], now: float) -> dict[str, Standing]:
    """Every one of ``keys``' standing, from one read of the usage table's sums."""
    teams = keystore.teams(db)
    named = sorted({key.team for key in keys if key.team})
    ledger = Ledger.from_totals(usage.window_totals(db, now, [key.id for key in keys], named),
                                now)
    return {key.id: standing_of(key, ledger, teams, now) for key in keys}


def shown(key: ApiKey, standing: Standing | None, now: float,
          user: dict[str, Any] | None = None) -> dict[str, Any]:
    """The key as the admin API, ``/v1/me`` and ``otela keys`` show it (``user``: its
    user's id, email and name, ``keystore.users_shown``)."""
    if standing is None:
        return {**key.to_dict(now), "user": user}
    return {**key.to_dict(now, standing.used_tokens, standing.over_budget),
            **standing.to_dict(), "user": user}


def described(db: Database, keys: list[ApiKey], now: float) -> list[dict[str, Any]]:
    """``keys`` as every view shows them: settings, standing and user, from one read of
    the usage sums and one of the users."""
    found = standings(db, keys, now)
    people = keystore.users_shown(db, {k.user_id for k in keys if k.user_id})
    return [shown(k, found[k.id], now, people.get(k.user_id or "")) for k in keys]
