"""API keys: what one is, how its secret looks and is stored, and whether it may be used.

A key's secret is ``otela-`` and 43 URL-safe characters (256 random bits); only its SHA-256
is stored. A slow password hash buys nothing for secrets this random (no dictionary to
guess from) and would cost the request path time on every call. The ``id`` (``key_`` and
12 hex digits) names the key everywhere else: CLI, admin API, usage rows, logs.

Pure: no I/O. ``check`` is the one rule the request path applies.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, replace
from typing import Any

from ingress.budgets import Budget
from otela.dataplane.errors import RequestError

SECRET_PREFIX = "otela-"
OVER_BUDGET = "over budget"


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def new_id() -> str:
    return "key_" + secrets.token_hex(6)


def hash_secret(secret: str | bytes) -> str:
    data = secret.encode() if isinstance(secret, str) else secret
    return hashlib.sha256(data).hexdigest()


def same_secret(given: str, expected: str) -> bool:
    """Constant-time comparison (admin tokens)."""
    return hmac.compare_digest(given.encode(), expected.encode())


@dataclass(frozen=True)
class ApiKey:
    id: str
    secret_hash: str
    owner: str
    name: str = ""
    created_at: float = 0.0
    expires_at: float | None = None
    revoked_at: float | None = None
    models: frozenset[str] | None = None  # None: every model
    providers: frozenset[str] | None = None  # None: the ingress's own trust set
    rpm: int | None = None  # requests per minute
    tpm: int | None = None  # tokens (prompt + completion) per minute
    max_concurrent: int | None = None  # requests in flight at once, per ingress node
    budget_tokens: int | None = None  # tokens per budget_period
    updated_at: float = 0.0
    # Fair sharing (otela.routing.admission): its team (None: a team of its own), its
    # weight within the team, the best class it may use, its longest wait in the queue.
    team: str | None = None
    weight: float | None = None
    priority: str | None = None
    queue_wait: float | None = None
    team_weight: float = 1.0  # the team's, from the teams table (not a key column)
    budget_spend: float | None = None  # money (at the prices set) per budget_period
    budget_period: str | None = None  # day, month, or None: the key's life
    # The single sign-on user the key belongs to (``ingress.sso.users``; None: nobody
    # signed in). ``owner`` stays the free-text label it always was.
    user_id: str | None = None

    @property
    def budget(self) -> Budget:
        return Budget(self.budget_tokens, self.budget_spend, self.budget_period or "lifetime")

    def usable(self, now: float) -> bool:
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)

    def status(self, now: float, used_tokens: int | None = None,
               over_budget: bool | None = None) -> str:
        """``revoked``, ``expired``, ``over budget`` (requests are refused, 403
        ``budget_exceeded``: ``over_budget`` says so from its standing, else a lifetime
        token budget against ``used_tokens``) or ``active``: the one status ``/v1/me``,
        the admin API, ``otela keys`` and the dashboard all show
        (``ingress.standing``)."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        if over_budget is None:
            over_budget = self.budget_tokens is not None and used_tokens is not None and \
                self.budget_period is None and used_tokens >= self.budget_tokens
        return OVER_BUDGET if over_budget else "active"

    def revoked(self, now: float) -> ApiKey:
        return replace(self, revoked_at=self.revoked_at or now, updated_at=now)

    def to_dict(self, now: float, used_tokens: int | None = None,
                over_budget: bool | None = None) -> dict[str, Any]:
        """The key as the admin API and ``otela keys`` show it (never its hash)."""
        out: dict[str, Any] = {
            "object": "api_key",
            "id": self.id,
            "name": self.name,
            "owner": self.owner,
            "user_id": self.user_id,
            "status": self.status(now, used_tokens, over_budget),
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "revoked_at": self.revoked_at,
            "models": sorted(self.models) if self.models is not None else None,
            "providers": sorted(self.providers) if self.providers is not None else None,
            "limits": {"rpm": self.rpm, "tpm": self.tpm,
                       "max_concurrent": self.max_concurrent},
            "budget_tokens": self.budget_tokens,
            "budget_spend": self.budget_spend,
            "budget_period": self.budget_period or "lifetime",
            "scheduling": {"team": self.team, "weight": self.weight,
                           "priority": self.priority, "queue_wait": self.queue_wait},
        }
        if used_tokens is not None:
            out["used_tokens"] = used_tokens
        return out


# -- what a request's Authorization header says ------------------------------------------

UNAUTHORIZED = ("Invalid API key. Pass a valid key as 'Authorization: Bearer <key>' "
                "(or 'x-api-key: <key>').")


def bearer(value: bytes | None) -> bytes | None:
    """The token of an ``Authorization: Bearer <token>`` header (``None``: none given).
    A key sent as Anthropic's clients send it, ``x-api-key: <key>``, arrives here as
    ``Bearer <key>`` (``otela.dataplane.headers.credential``): one check for both."""
    if value is None:
        return None
    scheme, _, token = value.strip().partition(b" ")
    if scheme.lower() != b"bearer" or not token.strip():
        return None
    return token.strip()


def check(key: ApiKey | None, model: str | None, now: float, used_tokens: int) -> None:
    """Whether ``key`` may ask for ``model`` now; raises the error the caller gets.

    Wrong, revoked and expired keys all get the same 401, so an error never tells a
    caller whether some other key exists."""
    if key is None or not key.usable(now):
        raise RequestError(401, UNAUTHORIZED, code="invalid_api_key")
    if model is not None and key.models is not None and model not in key.models:
        raise RequestError(403, f"This API key may not use the model `{model[:200]}`.",
                           code="model_not_allowed", param="model")
    if key.budget_tokens is not None and used_tokens >= key.budget_tokens:
        raise RequestError(403, f"This API key's token budget ({key.budget_tokens}) is "
                           "used up.", code="budget_exceeded")
