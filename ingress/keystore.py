"""API keys in the database: create, read, change, revoke, rotate, and what changed
since when.

Blocking calls (``Database.*_sync``): the command line calls them directly, the node in a
worker thread. Every change sets ``updated_at``, which is how each ingress's key cache
(``ingress.access``) picks up changes made anywhere, and writes a row of the key's
history (``api_key_audit``: who, when, what, old and new values) in the same transaction:
a change is never made without its record, nor recorded without being made.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, replace
from typing import Any

from ingress.budgets import Budget
from ingress.database import Database, Row
from ingress.keys import ApiKey, hash_secret, new_id, new_secret

_COLUMNS = ("id, secret_hash, owner, name, created_at, expires_at, revoked_at, models, "
            "providers, rpm, tpm, max_concurrent, budget_tokens, updated_at, team, weight, "
            "priority, queue_wait, budget_spend, budget_period, user_id")


# Every setting of a key, as ``KeySpec`` names them (and the api_keys columns).
KEY_FIELDS = ("owner", "name", "expires_at", "models", "providers", "rpm", "tpm",
              "max_concurrent", "budget_tokens", "team", "weight", "priority", "queue_wait",
              "budget_spend", "budget_period", "user_id")


class KeyNotFound(LookupError):
    pass


class UserNotFound(LookupError):
    """No single sign-on user has this id or email (users are made on their first
    sign-in), or several have this email (then the message asks for the id)."""

    def __init__(self, ref: str, ambiguous: bool = False) -> None:
        super().__init__(ref)
        self.ref = ref
        self.ambiguous = ambiguous

    def __str__(self) -> str:
        if self.ambiguous:
            return (f"several users have the email {self.ref[:200]!r}: name the user by "
                    "id (user_...)")
        return (f"no user has the id or email {self.ref[:200]!r} (a user is made on their "
                "first single sign-on to the dashboard)")


class KeyRevoked(Exception):
    """The key exists but is revoked: revocation is for good, so it cannot be changed or
    given a new secret."""


@dataclass(frozen=True)
class KeySpec:
    """What a new key is allowed (validated by whoever read it: CLI or admin API)."""

    owner: str
    name: str = ""
    expires_at: float | None = None
    models: frozenset[str] | None = None
    providers: frozenset[str] | None = None
    rpm: int | None = None
    tpm: int | None = None
    max_concurrent: int | None = None
    budget_tokens: int | None = None
    team: str | None = None
    weight: float | None = None
    priority: str | None = None
    queue_wait: float | None = None
    budget_spend: float | None = None
    budget_period: str | None = None
    user_id: str | None = None  # its user's id or email (``create`` resolves it)


def _names(values: frozenset[str] | None) -> str | None:
    return None if values is None else json.dumps(sorted(values))


def _from_names(text: str | None) -> frozenset[str] | None:
    return None if text is None else frozenset(json.loads(text))


def key_from_row(row: Row) -> ApiKey:
    (id_, secret_hash, owner, name, created, expires, revoked, models, providers, rpm, tpm,
     concurrent, budget, updated, team, weight, priority, queue_wait, budget_spend,
     budget_period, user_id) = row
    return ApiKey(id=id_, secret_hash=secret_hash, owner=owner, name=name,
                  created_at=float(created), expires_at=expires, revoked_at=revoked,
                  models=_from_names(models), providers=_from_names(providers), rpm=rpm,
                  tpm=tpm, max_concurrent=concurrent, budget_tokens=budget,
                  updated_at=float(updated), team=team,
                  weight=None if weight is None else float(weight), priority=priority,
                  queue_wait=None if queue_wait is None else float(queue_wait),
                  budget_spend=None if budget_spend is None else float(budget_spend),
                  budget_period=budget_period, user_id=user_id)


def user_id_of(db_or_cursor: Any, ref: str) -> str:
    """The id of the user ``ref`` names: a user's id, or the email of exactly one user
    (case-insensitive). ``UserNotFound`` otherwise. Takes a ``Database`` or, inside a
    transaction, its cursor."""
    sql = ("SELECT id FROM users WHERE id = ? UNION SELECT id FROM users "
           "WHERE LOWER(email) = LOWER(?) ORDER BY 1")
    if isinstance(db_or_cursor, Database):
        rows = db_or_cursor.query_sync(sql, (ref, ref))
    else:
        db_or_cursor.execute(sql, (ref, ref))
        rows = db_or_cursor.fetchall()
    ids = [str(row[0]) for row in rows]
    if ref in ids:
        return ref
    if len(ids) != 1:
        raise UserNotFound(ref, ambiguous=len(ids) > 1)
    return ids[0]


def users_shown(db: Database, user_ids: set[str]) -> dict[str, dict[str, Any]]:
    """How keys show their users: id, email, name (one read for all of them)."""
    if not user_ids:
        return {}
    marks = ", ".join("?" * len(user_ids))
    rows = db.query_sync(f"SELECT id, email, name FROM users WHERE id IN ({marks})",
                         tuple(sorted(user_ids)))
    return {str(i): {"id": str(i), "email": email, "name": name} for i, email, name in rows}


def keys_of_user(db: Database, user_id: str) -> list[ApiKey]:
    """The keys that belong to a user, oldest first (revoked ones too)."""
    return [key_from_row(r) for r in db.query_sync(
        f"SELECT {_COLUMNS} FROM api_keys WHERE user_id = ? ORDER BY created_at, id",
        (user_id,))]


def create(db: Database, spec: KeySpec, now: float | None = None, actor: str = ""
           ) -> tuple[ApiKey, str]:
    """A new key and its secret (the only time the secret exists outside the caller).
    ``spec.user_id`` may name the user by id or email (``user_id_of``: resolved in the
    transaction that makes the key; ``UserNotFound`` makes nothing)."""
    now = time.time() if now is None else now
    secret = new_secret()
    key = ApiKey(id=new_id(), secret_hash=hash_secret(secret), owner=spec.owner,
                 name=spec.name, created_at=now, expires_at=spec.expires_at,
                 models=spec.models, providers=spec.providers, rpm=spec.rpm, tpm=spec.tpm,
                 max_concurrent=spec.max_concurrent, budget_tokens=spec.budget_tokens,
                 updated_at=now, team=spec.team, weight=spec.weight, priority=spec.priority,
                 queue_wait=spec.queue_wait, budget_spend=spec.budget_spend,
                 budget_period=spec.budget_period, user_id=spec.user_id)
    with db.transaction() as cursor:
        if key.user_id is not None:
            key = replace(key, user_id=user_id_of(cursor, key.user_id))
        cursor.execute(f"INSERT INTO api_keys ({_COLUMNS}) VALUES "
                       f"({', '.join('?' * len(_COLUMNS.split(', ')))})", _row(key))
        _audit(cursor, key.id, now, actor, "create",
               {f: [None, _shown(getattr(key, f))] for f in KEY_FIELDS
                if getattr(key, f) not in (None, "")})
    return key, secret


def _row(key: ApiKey) -> tuple[Any, ...]:
    return (key.id, key.secret_hash, key.owner, key.name, key.created_at, key.expires_at,
            key.revoked_at, _names(key.models), _names(key.providers), key.rpm, key.tpm,
            key.max_concurrent, key.budget_tokens, key.updated_at, key.team, key.weight,
            key.priority, key.queue_wait, key.budget_spend, key.budget_period, key.user_id)


def get(db: Database, key_id: str) -> ApiKey:
    rows = db.query_sync(f"SELECT {_COLUMNS} FROM api_keys WHERE id = ?", (key_id,))
    if not rows:
        raise KeyNotFound(key_id)
    return key_from_row(rows[0])


def all_keys(db: Database) -> list[ApiKey]:
    return [key_from_row(r) for r in
            db.query_sync(f"SELECT {_COLUMNS} FROM api_keys ORDER BY created_at, id")]


def changed_since(db: Database, since: float) -> list[ApiKey]:
    """Keys created or changed at or after ``since`` (the cache's incremental refresh)."""
    return [key_from_row(r) for r in db.query_sync(
        f"SELECT {_COLUMNS} FROM api_keys WHERE updated_at >= ?", (since,))]


def _locked(cursor: Any, key_id: str) -> ApiKey:
    """The key, read inside a write transaction (PostgreSQL: its row locked until the
    commit, so two concurrent changes record each other's values correctly)."""
    cursor.execute(f"SELECT {_COLUMNS} FROM api_keys WHERE id = ?"
                   + ("" if _is_sqlite(cursor) else " FOR UPDATE"), (key_id,))
    rows = cursor.fetchall()
    if not rows:
        raise KeyNotFound(key_id)
    return key_from_row(rows[0])


def _is_sqlite(cursor: Any) -> bool:
    return getattr(cursor, "dialect", "sqlite") == "sqlite"


def revoke(db: Database, key_id: str, now: float | None = None, actor: str = "") -> ApiKey:
    """Revoke for good (revoking twice keeps the first time)."""
    now = time.time() if now is None else now
    with db.transaction() as cursor:
        key = _locked(cursor, key_id)
        if key.revoked_at is not None:
            return key
        cursor.execute("UPDATE api_keys SET revoked_at = ?, updated_at = ? WHERE id = ?",
                       (now, now, key_id))
        _audit(cursor, key_id, now, actor, "revoke", {})
    return replace(key, revoked_at=now, updated_at=now)


def rotate(db: Database, key_id: str, now: float | None = None, actor: str = ""
           ) -> tuple[ApiKey, str]:
    """A new secret for the same key (same id, limits and usage); the old one stops
    working. A revoked key cannot be rotated back to life (``KeyRevoked``)."""
    now = time.time() if now is None else now
    secret = new_secret()
    with db.transaction() as cursor:
        key = _locked(cursor, key_id)
        if key.revoked_at is not None:
            raise KeyRevoked(key_id)
        cursor.execute("UPDATE api_keys SET secret_hash = ?, updated_at = ? WHERE id = ?",
                       (hash_secret(secret), now, key_id))
        _audit(cursor, key_id, now, actor, "rotate", {})
    return replace(key, secret_hash=hash_secret(secret), updated_at=now), secret


def update(db: Database, key_id: str, change: dict[str, Any], now: float | None = None,
           actor: str = "") -> ApiKey:
    """Change some of a key's settings (``change``: ``KEY_FIELDS`` names to values, checked
    by ``ingress.admin_input.key_change``); its id, secret and usage stay. Fields set to
    what they already are are not recorded; a change that changes nothing writes nothing.
    ``KeyRevoked`` for a revoked key; ``UserNotFound`` for a ``user_id`` (an id or an
    email) that names no user."""
    now = time.time() if now is None else now
    unknown = set(change) - set(KEY_FIELDS)
    if unknown:
        raise ValueError(f"not a key field: {sorted(unknown)[0]}")
    with db.transaction() as cursor:
        key = _locked(cursor, key_id)
        if key.revoked_at is not None:
            raise KeyRevoked(key_id)
        if change.get("user_id") is not None:
            change = {**change, "user_id": user_id_of(cursor, change["user_id"])}
        changed = {f: v for f, v in change.items() if getattr(key, f) != v}
        if not changed:
            return key
        new = replace(key, **changed, updated_at=now)
        row = dict(zip(_COLUMNS.split(", "), _row(new), strict=True))
        cursor.execute(f"UPDATE api_keys SET {', '.join(f'{f} = ?' for f in changed)}, "
                       "updated_at = ? WHERE id = ?",
                       (*(row[f] for f in changed), now, key_id))
        _audit(cursor, key_id, now, actor, "update",
               {f: [_shown(getattr(key, f)), _shown(v)] for f, v in changed.items()})
    return new


# -- teams -----------------------------------------------------------------------------

TEAM_FIELDS = ("weight", "budget_tokens", "budget_spend", "budget_period", "models",
               "providers", "rpm", "tpm", "max_concurrent", "priority")
_TEAM_COLUMNS = "name, " + ", ".join(TEAM_FIELDS)


@dataclass(frozen=True)
class Team:
    """A team's settings (teams are named by their keys; one never set weighs 1 and has
    no budget of its own)."""

    name: str
    weight: float = 1.0
    budget_tokens: int | None = None
    budget_spend: float | None = None
    budget_period: str | None = None
    models: frozenset[str] | None = None  # None: every model (a key may narrow it)
    providers: frozenset[str] | None = None  # None: the ingress's trust set
    rpm: int | None = None  # the whole team's requests per minute
    tpm: int | None = None
    max_concurrent: int | None = None  # the whole team's requests in flight, per ingress
    priority: str | None = None  # the best class its keys may use (None: any)

    @property
    def budget(self) -> Budget:
        return Budget(self.budget_tokens, self.budget_spend, self.budget_period or "lifetime")

    @property
    def limited(self) -> bool:
        return self.rpm is not None or self.tpm is not None or self.max_concurrent is not None

    def to_dict(self) -> dict[str, Any]:
        return {"object": "team", "name": self.name, "weight": self.weight,
                "budget_tokens": self.budget_tokens, "budget_spend": self.budget_spend,
                "budget_period": self.budget_period or "lifetime",
                "models": None if self.models is None else sorted(self.models),
                "providers": None if self.providers is None else sorted(self.providers),
                "limits": {"rpm": self.rpm, "tpm": self.tpm,
                           "max_concurrent": self.max_concurrent},
                "priority": self.priority}


def set_team(db: Database, name: str, change: dict[str, Any], now: float | None = None
             ) -> Team:
    """Change some of a team's settings (``TEAM_FIELDS``, checked by
    ``ingress.admin_input.team_change``; None: back to the default)."""
    now = time.time() if now is None else now
    with db.transaction() as cursor:
        cursor.execute(f"SELECT {_TEAM_COLUMNS} FROM teams WHERE name = ?", (name,))
        rows = cursor.fetchall()
        team = _team(rows[0]) if rows else Team(name)
        merged = {f: (change[f] if f in change else getattr(team, f)) for f in TEAM_FIELDS}
        if merged["weight"] is None:
            merged["weight"] = 1.0
        team = Team(name, **merged)
        cursor.execute("DELETE FROM teams WHERE name = ?", (name,))
        values = [_names(v) if f in ("models", "providers") else v
                  for f, v in ((f, getattr(team, f)) for f in TEAM_FIELDS)]
        cursor.execute(f"INSERT INTO teams ({_TEAM_COLUMNS}, updated_at) VALUES "
                       f"({', '.join('?' * (len(TEAM_FIELDS) + 2))})", (name, *values, now))
    return team


def _team(row: Row) -> Team:
    name, weight, tokens, spend, period, models, providers, rpm, tpm, concurrent, priority = row
    return Team(str(name), float(weight), None if tokens is None else int(tokens),
                None if spend is None else float(spend), period, _from_names(models),
                _from_names(providers), rpm, tpm, concurrent, priority)


def teams(db: Database) -> dict[str, Team]:
    return {str(row[0]): _team(row) for row in db.query_sync(
        f"SELECT {_TEAM_COLUMNS} FROM teams ORDER BY name")}



# -- a key's history ---------------------------------------------------------------------

@dataclass(frozen=True)
class Change:
    """One row of a key's history: ``changes`` maps a field to ``[old, new]``."""

    key_id: str
    at: float
    actor: str
    action: str  # create, update, revoke, rotate
    changes: dict[str, list[Any]]

    def to_dict(self) -> dict[str, Any]:
        return {"object": "api_key.change", "key_id": self.key_id, "at": self.at,
                "actor": self.actor, "action": self.action, "changes": self.changes}


def _shown(value: Any) -> Any:
    """A field's value as the history keeps it (JSON: sets as sorted lists)."""
    return sorted(value) if isinstance(value, frozenset) else value


def _audit(cursor: Any, key_id: str, now: float, actor: str, action: str,
           changes: dict[str, list[Any]]) -> None:
    cursor.execute("INSERT INTO api_key_audit (id, key_id, at, actor, action, changes) "
                   "VALUES (?, ?, ?, ?, ?, ?)",
                   (f"{round(now * 1e6):017d}{secrets.token_hex(4)}", key_id, now,
                    actor[:200] or "unknown", action,
                    json.dumps(changes)))


def history(db: Database, key_id: str) -> list[Change]:
    """Every recorded change of a key, oldest first (``KeyNotFound`` for no such key)."""
    get(db, key_id)
    rows = db.query_sync("SELECT key_id, at, actor, action, changes FROM api_key_audit "
                         "WHERE key_id = ? ORDER BY at, id", (key_id,))
    return [Change(str(k), float(at), str(actor), str(action), json.loads(changes))
            for k, at, actor, action, changes in rows]
