"""What the request path asks of an API-key service (the ingress service, a plugin:
``otela.services``). Its own module, light to import: the plugin's protocol and the
``otela keys``/``usage`` commands need it without loading the request path."""

from __future__ import annotations

from typing import Any, Protocol


class KeyGate(Protocol):
    """API keys, limits and budgets (the ingress service, ``ingress.access``): who may
    send this request. Never waits: it decides from memory."""

    def authenticate(self, authorization: bytes | None) -> Any:
        """The caller's key (``None``: anonymous, where allowed), or ``RequestError``
        401. ``authorization``: ``headers.credential``, an ``Authorization`` value (an
        ``x-api-key`` comes as ``Bearer <key>``)."""
        ...

    def admit(self, key: Any, model: str, max_tokens: int | None = None,
              prompt_bound: int = 0) -> Any:
        """A grant for ``model`` (403 not allowed or over budget, 429 over a limit).
        ``max_tokens`` (what the request may generate) and ``prompt_bound`` (at most its
        prompt's tokens: its body's length in bytes) are reserved against a token budget
        until ``finished`` settles it with what it used."""
        ...

    def screen(self, authorization: bytes | None) -> None:
        """Raise what ``authenticate`` and ``admit`` would, from the headers alone (before
        the body is read); takes nothing."""
        ...

    # Optional: ``async lease_taken(timeout) -> bool`` — after a 429 ``budget_reserved``,
    # wait for the budget lease this gate is taking (the request path asks once more).

    def finished(self, grant: Any, tokens: int, prompt_tokens: int = 0,
                 provider: str = "") -> None:
        """A granted request is over: it used ``tokens``, ``prompt_tokens`` of them its
        prompt's, on a node of ``provider`` (what a budget in money prices it with)."""
        ...
