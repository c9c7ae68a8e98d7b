"""What a request asks of routing, read from its headers and its body.

Headers, for clients that can set them::

    X-Otela-Providers: cscs,epfl          (trust: only these providers' nodes)
    X-Otela-Require: gpu=H100|A100, min_context=32768
    X-Otela-Policy: least_in_flight

and the same as a body extension, for clients that cannot (an OpenAI SDK's
``extra_body``)::

    {"model": "...", "messages": [...],
     "otela": {"providers": ["cscs", "epfl"], "require": "gpu=H100", "policy": "random"}}

The extension is removed before the body goes on (engines reject unknown fields); only
then is the body re-encoded. Both ways may be used at once: trust sets intersect,
requirements add up, and two different policies are an error. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from otela.dataplane.jsonfields import materialized
from otela.routing.constraints import Clause, ConstraintError, parse
from otela.routing.trust import TrustError, TrustSet, parse_providers

PROVIDERS_HEADER = b"x-otela-providers"
REQUIRE_HEADER = b"x-otela-require"
POLICY_HEADER = b"x-otela-policy"
EXTENSION = "otela"
_EXTENSION_KEYS = ("providers", "require", "policy")


class AskError(ValueError):
    """A routing statement that cannot be read (400); ``param`` names where it was."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Ask:
    trust: TrustSet
    clauses: tuple[Clause, ...] = ()
    policy: str | None = None  # None: the ingress's --routing-policy
    body: bytes = b""  # what the engine gets: the client's bytes unless the extension was cut
    extension: dict[str, Any] = field(default_factory=dict)
    stream: bool = False  # the client asked for a stream (never re-sent once delivered)


def read_ask(headers: list[tuple[bytes, bytes]], body: Mapping[str, Any], raw: bytes,
             base: TrustSet) -> Ask:
    """The routing statement of one request; ``AskError`` (400) naming a bad part."""
    trust, policy = base, None
    clauses: tuple[Clause, ...] = ()
    wanted = {k: v for k, v in headers if k in (PROVIDERS_HEADER, REQUIRE_HEADER,
                                                 POLICY_HEADER)}
    try:
        if PROVIDERS_HEADER in wanted:
            text = wanted[PROVIDERS_HEADER].decode("utf-8", "replace")
            trust = trust.narrowed(parse_providers(text, "X-Otela-Providers"),
                                   "X-Otela-Providers")
    except TrustError as exc:
        raise AskError(str(exc), "X-Otela-Providers") from None
    try:
        if REQUIRE_HEADER in wanted:
            clauses = parse(wanted[REQUIRE_HEADER].decode("utf-8", "replace"))
    except ConstraintError as exc:
        raise AskError(f"X-Otela-Require: {exc}", "X-Otela-Require") from None
    if POLICY_HEADER in wanted:
        policy = wanted[POLICY_HEADER].decode("latin-1").strip() or None
    if EXTENSION not in body:
        return Ask(trust, clauses, policy, raw, stream=body.get("stream") is True)
    rewritten = materialized(body)  # the extension is cut out: the body is re-encoded
    extension = rewritten.pop(EXTENSION)
    trust, extra_clauses, body_policy = _read_extension(extension, trust)
    if policy is not None and body_policy is not None and policy != body_policy:
        raise AskError(f"X-Otela-Policy says {policy!r} and the body's otela.policy "
                       f"{body_policy!r}; give one", "otela.policy")
    return Ask(trust, clauses + extra_clauses, policy or body_policy, orjson.dumps(rewritten),
               extension, stream=rewritten.get("stream") is True)


def _read_extension(extension: Any, trust: TrustSet
                    ) -> tuple[TrustSet, tuple[Clause, ...], str | None]:
    if not isinstance(extension, dict):
        raise AskError("'otela' must be an object with providers, require and/or policy",
                       EXTENSION)
    unknown = sorted(set(extension) - set(_EXTENSION_KEYS))
    if unknown:
        raise AskError(f"otela.{unknown[0][:40]} is not a routing field (expected "
                       f"{', '.join(_EXTENSION_KEYS)})", f"otela.{unknown[0][:40]}")
    clauses: tuple[Clause, ...] = ()
    policy = None
    if "providers" in extension:
        value = extension["providers"]
        if not isinstance(value, str | list):
            raise AskError("otela.providers is a list of provider ids", "otela.providers")
        try:
            trust = trust.narrowed(parse_providers(value, "otela.providers"),
                                   "otela.providers")
        except TrustError as exc:
            raise AskError(str(exc), "otela.providers") from None
    if "require" in extension:
        clauses = _read_require(extension["require"])
    if "policy" in extension:
        if not isinstance(extension["policy"], str) or not extension["policy"].strip():
            raise AskError("otela.policy is a policy name", "otela.policy")
        policy = extension["policy"].strip()
    return trust, clauses, policy


def _read_require(value: Any) -> tuple[Clause, ...]:
    """``"gpu=H100, max_tp=4"`` or ``{"gpu": ["H100", "A100"], "max_tp": 4}``."""
    if isinstance(value, dict):
        parts = []
        for key, wanted in value.items():
            alternatives = wanted if isinstance(wanted, list) else [wanted]
            if not all(isinstance(a, str | int) and not isinstance(a, bool)
                       for a in alternatives):
                raise AskError(f"otela.require.{str(key)[:40]}: values are strings or "
                               "numbers", "otela.require")
            parts.append(f"{key}={'|'.join(str(a) for a in alternatives)}")
        value = ", ".join(parts)
    if not isinstance(value, str):
        raise AskError("otela.require is a string like the header or an object",
                       "otela.require")
    try:
        return parse(value)
    except ConstraintError as exc:
        raise AskError(f"otela.require: {exc}", "otela.require") from None
