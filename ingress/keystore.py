"""API keys in the database: create, read, revoke, rotate, and what changed since when.

Blocking calls (``Database.*_sync``): the command line calls them directly, the node in a
worker thread. Every change sets ``updated_at``, which is how each ingress's key cache
(``ingress.access``) picks up revocations made anywhere.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from typing import Any

from ingress.database import Database, Row
from ingress.keys import ApiKey, hash_secret, new_id, new_secret

_COLUMNS = ("id, secret_hash, owner, name, created_at, expires_at, revoked_at, models, "
            "providers, rpm, tpm, max_concurrent, budget_tokens, updated_at")


class KeyNotFound(LookupError):
    pass


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


def _names(values: frozenset[str] | None) -> str | None:
    return None if values is None else json.dumps(sorted(values))


def _from_names(text: str | None) -> frozenset[str] | None:
    return None if text is None else frozenset(json.loads(text))


def key_from_row(row: Row) -> ApiKey:
    (id_, secret_hash, owner, name, created, expires, revoked, models, providers, rpm, tpm,
     concurrent, budget, updated) = row
    return ApiKey(id=id_, secret_hash=secret_hash, owner=owner, name=name,
                  created_at=float(created), expires_at=expires, revoked_at=revoked,
                  models=_from_names(models), providers=_from_names(providers), rpm=rpm,
                  tpm=tpm, max_concurrent=concurrent, budget_tokens=budget,
                  updated_at=float(updated))


def create(db: Database, spec: KeySpec, now: float | None = None) -> tuple[ApiKey, str]:
    """A new key and its secret (the only time the secret exists outside the caller)."""
    now = time.time() if now is None else now
    secret = new_secret()
    key = ApiKey(id=new_id(), secret_hash=hash_secret(secret), owner=spec.owner,
                 name=spec.name, created_at=now, expires_at=spec.expires_at,
                 models=spec.models, providers=spec.providers, rpm=spec.rpm, tpm=spec.tpm,
                 max_concurrent=spec.max_concurrent, budget_tokens=spec.budget_tokens,
                 updated_at=now)
    db.run_sync(f"INSERT INTO api_keys ({_COLUMNS}) VALUES "
                "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", _row(key))
    return key, secret


def _row(key: ApiKey) -> tuple[Any, ...]:
    return (key.id, key.secret_hash, key.owner, key.name, key.created_at, key.expires_at,
            key.revoked_at, _names(key.models), _names(key.providers), key.rpm, key.tpm,
            key.max_concurrent, key.budget_tokens, key.updated_at)


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


def revoke(db: Database, key_id: str, now: float | None = None) -> ApiKey:
    """Revoke for good (revoking twice keeps the first time)."""
    now = time.time() if now is None else now
    key = get(db, key_id)
    if key.revoked_at is not None:
        return key
    db.run_sync("UPDATE api_keys SET revoked_at = ?, updated_at = ? WHERE id = ?",
                (now, now, key_id))
    return replace(key, revoked_at=now, updated_at=now)


def rotate(db: Database, key_id: str, now: float | None = None) -> tuple[ApiKey, str]:
    """A new secret for the same key (same id, limits and usage); the old one stops
    working. A revoked key cannot be rotated back to life."""
    now = time.time() if now is None else now
    key = get(db, key_id)
    if key.revoked_at is not None:
        raise KeyNotFound(key_id)
    secret = new_secret()
    db.run_sync("UPDATE api_keys SET secret_hash = ?, updated_at = ? WHERE id = ?",
                (hash_secret(secret), now, key_id))
    return replace(key, secret_hash=hash_secret(secret), updated_at=now), secret


def used_tokens(db: Database, key_ids: list[str] | None = None) -> dict[str, int]:
    """Tokens (prompt + completion) each key has used over its life."""
    rows = db.query_sync("SELECT key_id, SUM(prompt_tokens + completion_tokens) FROM usage "
                         "WHERE key_id IS NOT NULL GROUP BY key_id")
    used = {str(k): int(n or 0) for k, n in rows}
    return used if key_ids is None else {k: used.get(k, 0) for k in key_ids}
