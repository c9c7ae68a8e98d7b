"""Which providers a request may run on (paper §3.3, requirement R4).

A federation of mutually distrustful providers works because a user's request only ever
reaches nodes of providers the user trusts, however many other GPUs sit idle. Trust is
stated as sets of provider ids, from up to three places that all apply:

- the ingress's default (``--trusted-providers``): an institution's ingress may only ever
  send its users' requests to its own and its partners' clusters;
- the caller's API key (the ingress service), a set fixed per key;
- the request itself (``X-Otela-Providers: a,b`` or ``{"otela": {"providers": [...]}}``).

The effective set is their intersection: each party can narrow, none can widen. ``None``
means "no statement" (any provider). Provider ids are the ones in node records, which an
authority certifies (docs/membership.md): a node cannot claim another provider's name.
Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from otela import names


class TrustError(ValueError):
    """A provider list that cannot be read; the message says why."""


@dataclass(frozen=True)
class TrustSet:
    """The providers a request may run on, and where that came from (for messages)."""

    providers: frozenset[str] | None = None  # None: any provider
    sources: tuple[str, ...] = ()  # e.g. ("ingress default", "X-Otela-Providers")

    def allows(self, provider_id: str) -> bool:
        return self.providers is None or provider_id in self.providers

    def narrowed(self, providers: frozenset[str] | None, source: str) -> TrustSet:
        """This set intersected with another statement (``None``: no statement)."""
        if providers is None:
            return self
        mine = providers if self.providers is None else self.providers & providers
        return TrustSet(mine, (*self.sources, source))

    def describe(self) -> str:
        """The applied set as an error message shows it (never other providers' nodes)."""
        if self.providers is None:
            return "any provider"
        names = ", ".join(sorted(self.providers)) if self.providers else "(none: the " \
            "statements have no provider in common)"
        return f"{{{names}}} from {' ∩ '.join(self.sources)}"


ANY = TrustSet()


def parse_providers(value: str | Iterable[object], source: str) -> frozenset[str]:
    """A provider list, as ``a,b`` or a JSON list of strings; ``TrustError`` if malformed
    (``otela.names``)."""
    try:
        return names.parse_providers(value, source)
    except names.InvalidName as exc:
        raise TrustError(str(exc)) from None
