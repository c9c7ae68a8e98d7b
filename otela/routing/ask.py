"""What a request asks of routing, read from its headers and its body.

Headers, for clients that can set them::

    X-Otela-Providers: cscs,epfl          (trust: only these providers' nodes)
    X-Otela-Require: gpu=H100|A100, min_context=32768
    X-Otela-Policy: least_in_flight
    X-Otela-Priority: batch               (the ingress queue: otela.routing.admission)
    X-Otela-Queue-Timeout: 600

and the same as a body extension, for clients that cannot (an OpenAI SDK's
``extra_body``)::

    {"model": "...", "messages": [...],
     "otela": {"providers": ["cscs", "epfl"], "require": "gpu=H100", "policy": "random",
               "priority": "batch", "queue_timeout": 600}}

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
PRIORITY_HEADER = b"x-otela-priority"
QUEUE_TIMEOUT_HEADER = b"x-otela-queue-timeout"
EXTENSION = "otela"
_EXTENSION_KEYS = ("providers", "require", "policy", "priority", "queue_timeout")
_WANTED = (PROVIDERS_HEADER, REQUIRE_HEADER, POLICY_HEADER, PRIORITY_HEADER,
           QUEUE_TIMEOUT_HEADER)


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
    priority: str | None = None  # the class asked for (None: the ingress's default)
    queue_timeout: str | None = None  # seconds it may wait in the queue, as written


def read_ask(headers: list[tuple[bytes, bytes]], body: Mapping[str, Any], raw: bytes,
             base: TrustSet) -> Ask:
    """The routing statement of one request; ``AskError`` (400) naming a bad part."""
    trust, policy = base, None
    clauses: tuple[Clause, ...] = ()
    wanted = {k: v for k, v in headers if k in _WANTED}
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
    priority = _header_text(wanted, PRIORITY_HEADER)
    queue_timeout = _header_text(wanted, QUEUE_TIMEOUT_HEADER)
    if EXTENSION not in body:
        return Ask(trust, clauses, policy, raw, stream=body.get("stream") is True,
                   priority=priority, queue_timeout=queue_timeout)
    rewritten = materialized(body)  # the extension is cut out: the body is re-encoded
    extension = rewritten.pop(EXTENSION)
    trust, extra_clauses, body_policy = _read_extension(extension, trust)
    if policy is not None and body_policy is not None and policy != body_policy:
        raise AskError(f"X-Otela-Policy says {policy!r} and the body's otela.policy "
                       f"{body_policy!r}; give one", "otela.policy")
    if priority is None and "priority" in extension:
        if not isinstance(extension["priority"], str):
            raise AskError("otela.priority is a class name", "otela.priority")
        priority = extension["priority"]
    if queue_timeout is None and "queue_timeout" in extension:
        value = extension["queue_timeout"]
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise AskError("otela.queue_timeout is a number of seconds",
                           "otela.queue_timeout")
        queue_timeout = str(value)
    return Ask(trust, clauses + extra_clauses, policy or body_policy, orjson.dumps(rewritten),
               extension, stream=rewritten.get("stream") is True, priority=priority,
               queue_timeout=queue_timeout)


def _header_text(wanted: Mapping[bytes, bytes], name: bytes) -> str | None:
    value = wanted.get(name)
    return None if value is None else value.decode("latin-1").strip() or None


def _read_extension(extension: Any, trust: TrustSet
                    ) -> tuple[TrustSet, tuple[Clause, ...], str | None]:
    if not isinstance(extension, dict):
        raise AskError("'otela' must be an object with providers, require, policy, "
                       "priority and/or queue_timeout", EXTENSION)
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
