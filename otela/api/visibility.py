"""Who is asking, and may they see this: the gate in front of the node's inspection
endpoints (``app.py``) and its ``/metrics`` (``dispatch.py``).

The node knows no keys and no admin of its own: the ingress service (a plugin,
``otela.services``) installs an ``Audience`` on the node's API app and its metrics. A node
without one shows everything to everyone, as it always did (a federation member without
the ingress service has no strangers' keys to tell apart). The audiences and their
defaults are ``otela.config.visibility``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from otela.config.visibility import ADMIN, KEY, PUBLIC, rank
from otela.dataplane.errors import RequestError

LabelFilter = Callable[[tuple[str, ...]], bool]


class Audience(Protocol):
    """Tells callers apart (the ingress service: API keys and the admin token)."""

    def caller(self, authorization: str | None) -> tuple[str, str | None]:
        """``(level, key id)``: ``admin`` for the admin token, ``key`` and its id for a
        usable API key, else ``public`` (a missing, wrong, revoked or expired credential:
        the caller is a stranger, told nothing more)."""
        ...

    def required(self, endpoint: str) -> str:
        """Who may see ``endpoint`` (``otela.config.visibility.DEFAULTS``' names)."""
        ...


def install(app: Any, audience: Audience) -> None:
    """Gate ``app``'s inspection endpoints (a FastAPI app made by ``create_app``)."""
    app.state.audience = audience


def audience_of(app: Any) -> Audience | None:
    return getattr(app.state, "audience", None)


def allowed(audience: Audience | None, endpoint: str, authorization: str | None) -> bool:
    """Whether this caller may see ``endpoint`` (always, without an audience)."""
    if audience is None:
        return True
    needed = audience.required(endpoint)
    if needed == PUBLIC:
        return True
    level, _ = audience.caller(authorization)
    return rank(level) >= rank(needed)


def require(audience: Audience | None, endpoint: str, authorization: str | None) -> None:
    """Raise the 401 (no usable credential) or 403 (a key where the admin token is needed)
    a caller who may not see ``endpoint`` gets."""
    if audience is None:
        return
    needed = audience.required(endpoint)
    if needed == PUBLIC:
        return
    level, _ = audience.caller(authorization)
    if rank(level) >= rank(needed):
        return
    if needed == KEY:
        raise RequestError(401, "This endpoint needs an API key: pass it as "
                           "'Authorization: Bearer <key>'.", code="invalid_api_key")
    if level == PUBLIC:
        raise RequestError(401, "This endpoint needs the admin token: pass it as "
                           "'Authorization: Bearer <token>'.", code="invalid_admin_token")
    raise RequestError(403, "This endpoint is for the admin only.", code="admin_only")


def series_filter(audience: Audience, endpoint: str, label: int,
                  authorization: str | None) -> LabelFilter | None:
    """Which series of a metric labelled by key id (label ``label``) this caller sees:
    ``None`` all of them; else a filter. An admin sees every key's series; a key holder,
    where ``endpoint`` is open to key holders, only its own key's; a caller below the
    endpoint's audience none."""
    needed = audience.required(endpoint)
    if needed == PUBLIC:
        return None
    level, key_id = audience.caller(authorization)
    if level == ADMIN:
        return None
    if level == KEY and needed == KEY:
        return lambda values: values[label] == key_id
    return _nothing


def _nothing(values: tuple[str, ...]) -> bool:
    return False
