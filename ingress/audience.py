"""Who is asking the node's inspection endpoints: strangers, API key holders or the admin
(``otela.api.visibility.Audience``, installed by ``ingress.plugin``).

The endpoints themselves, and the audience each has by default, are otela's
(``otela.config.visibility``); this service only knows the keys and the admin token, and
applies the operator's ``[ingress] visibility``. A wrong, revoked or expired credential
makes its sender a stranger: the public part of an endpoint still answers, so a monitoring
probe with a stale token sees the node alive instead of an error.
"""

from __future__ import annotations

from ingress.access import Access
from ingress.keys import bearer, same_secret
from otela.config.visibility import ADMIN, KEY, PUBLIC, effective
from otela.dataplane.errors import RequestError


class IngressAudience:
    def __init__(self, access: Access, admin_token: str | None,
                 visibility: dict[str, str] | None = None) -> None:
        self.access = access
        self.admin_token = admin_token
        self.visibility = effective(visibility or {})

    def required(self, endpoint: str) -> str:
        return self.visibility.get(endpoint, ADMIN)  # an endpoint nobody named: admin

    def caller(self, authorization: str | None) -> tuple[str, str | None]:
        if authorization is None:
            return PUBLIC, None
        raw = authorization.encode("latin-1", "replace")
        token = bearer(raw)
        if token is None:
            return PUBLIC, None
        if self.admin_token is not None and \
                same_secret(token.decode("latin-1"), self.admin_token):
            return ADMIN, None
        try:
            key = self.access.authenticate(raw)
        except RequestError:
            return PUBLIC, None
        return KEY, key.id
