"""From an OpenID provider's claims to a dashboard user: who, which team, admin or not.

Pure. A claim may be a string or a list of strings (``groups``), and may be nested: a
dotted name (``realm_access.roles``, Keycloak's realm roles) walks into objects. The team
is the first entry of ``sso_teams`` (in the operator's order) whose claim value the user
has, so a user in two mapped groups always lands in the same team.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ingress.sso.settings import SsoSettings

_MAX_TEXT = 200  # longest email or name kept (a provider's claims are its users' input)


@dataclass(frozen=True)
class Profile:
    subject: str
    email: str | None
    name: str | None
    team: str | None
    admin: bool


def claim_values(claims: Mapping[str, Any], name: str) -> list[str]:
    """The string values of claim ``name`` (dotted: nested), ``[]`` where it is absent or
    of another type."""
    value: Any = claims
    for part in name.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return []
        value = value[part]
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def team_of(claims: Mapping[str, Any], settings: SsoSettings) -> str | None:
    held = set(claim_values(claims, settings.team_claim))
    return next((team for value, team in settings.teams.items() if value in held), None)


def is_admin(claims: Mapping[str, Any], settings: SsoSettings) -> bool:
    return bool(settings.admin_values & set(claim_values(claims, settings.admin_claim)))


def _text(value: Any) -> str | None:
    return value.strip()[:_MAX_TEXT] or None if isinstance(value, str) else None


def profile(claims: Mapping[str, Any], settings: SsoSettings) -> Profile:
    """The user these (verified) claims describe. ``sub`` is required: it, with the
    issuer, is the user's identity; the email may change at the provider."""
    subject = claims.get("sub")
    if not isinstance(subject, str) or not subject:
        raise ValueError("the provider's claims have no subject ('sub')")
    email = claims.get("email") if claims.get("email_verified", True) is not False else None
    return Profile(subject=subject, email=_text(email),
                   name=_text(claims.get("name")) or _text(claims.get("preferred_username")),
                   team=team_of(claims, settings), admin=is_admin(claims, settings))
