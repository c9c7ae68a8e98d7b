"""otela's vocabulary: what a model id, a provider id, an inference route and an issuer
look like, wherever one is read (settings, records, requests, assignments, fleet files).
Pure, and below everything else in otela, so that every layer checks names alike.

Model ids.

Model ids come from engines (``/v1/models``), from members' records, from a planner's
assignments and from fleet files, and end up in URLs (``/v1/models/{id}``), in engine
command lines (``--served-model-name {model}``) and in file paths (a weights directory
under a model root). So a model id is a *name*: one or more ``/``-separated segments of
letters, digits and ``. _ - : @ + = ~``, each starting with a letter, a digit or ``_``
(never ``-``, which a command line reads as an option, nor ``.``, so no ``.`` or ``..``
segment can climb out of a directory), at most ``MAX_MODEL_ID`` characters. That admits
every Hugging Face repository id (``meta-llama/Llama-3.1-8B-Instruct``), tags and
quantisation suffixes (``qwen3:8b-q4_K_M``, ``org/model@rev``), and refuses
``m/../../../../etc``, control characters, spaces, quotes, shell metacharacters and
percent-encoding.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MAX_MODEL_ID = 256
_SEGMENT = r"[A-Za-z0-9_][A-Za-z0-9._:@+=~-]*"
_MODEL_ID = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT})*")


def model_id_problem(model_id: object) -> str | None:
    """Why ``model_id`` is not a model id, or ``None`` if it is one."""
    if not isinstance(model_id, str) or not model_id:
        return "a model id is a non-empty string"
    if len(model_id) > MAX_MODEL_ID:
        return f"a model id is at most {MAX_MODEL_ID} characters"
    if not _MODEL_ID.fullmatch(model_id):
        return ("a model id is '/'-separated names of letters, digits and . _ - : @ + = ~, "
                "each starting with a letter, a digit or _")
    return None


def is_model_id(model_id: object) -> bool:
    return model_id_problem(model_id) is None


# -- provider ids ------------------------------------------------------------------------

MAX_PROVIDERS = 64  # per statement: a trust list, not a directory
MAX_PROVIDER_LEN = 128  # as certificates allow


class InvalidName(ValueError):
    """A name that is not one (the message says why)."""


def parse_providers(value: str | Iterable[object], source: str) -> frozenset[str]:
    """A provider list, as ``a,b`` or a list of strings; ``InvalidName`` if malformed."""
    items = value.split(",") if isinstance(value, str) else list(value)
    providers: set[str] = set()
    for item in items:
        if not isinstance(item, str):
            raise InvalidName(f"{source}: provider ids are strings, got {type(item).__name__}")
        name = item.strip()
        if not name:
            continue
        if len(name) > MAX_PROVIDER_LEN or not name.isprintable() or \
                any(ch.isspace() for ch in name):
            raise InvalidName(f"{source}: {name[:40]!r} is not a provider id (1-"
                             f"{MAX_PROVIDER_LEN} printable characters without spaces)")
        providers.add(name)
    if not providers:
        raise InvalidName(f"{source} names no provider (leave it out to accept any)")
    if len(providers) > MAX_PROVIDERS:
        raise InvalidName(f"{source} names {len(providers)} providers; at most {MAX_PROVIDERS}")
    return frozenset(providers)


# -- inference routes --------------------------------------------------------------------

ENGINE_PREFIX = "/v1/engine"  # the engine hop: never an inference route
_ROUTE_SEGMENT = re.compile(r"[A-Za-z0-9_~-][A-Za-z0-9._~-]*")


def route_problem(route: str) -> str | None:
    """Why ``route`` is not an inference route an operator may add (a canonical ``/v1/...``
    path: no query, encoding, dot segments, empty segments or trailing slash), or
    ``None``."""
    segments = route.split("/")
    if not route.startswith("/v1/") or route.startswith(ENGINE_PREFIX + "/") or not all(
            _ROUTE_SEGMENT.fullmatch(s) for s in segments[1:]):
        return (f"an inference route is a canonical /v1/... path (letters, digits and "
                f". _ ~ - between single slashes, no .. segment), not {route[:100]!r}")
    return None


# -- issuers of assignments ----------------------------------------------------------------

AUTHORITY_PREFIX = "otela-authority:"
_BASE58 = re.compile(r"[1-9A-HJ-NP-Za-km-z]+")


def issuer_problem(issuer: str) -> str | None:
    """Why ``issuer`` is not an assignment issuer's name (a peer id, an
    ``otela-authority:<key>`` string, or ``authority``), or ``None``. The syntax only: the
    key inside is checked when the node loads its policy."""
    if issuer == "authority":
        return None
    text = issuer.removeprefix(AUTHORITY_PREFIX)
    if 20 <= len(text) <= 128 and _BASE58.fullmatch(text):
        return None
    return f"{issuer[:100]!r} is not a peer id, an {AUTHORITY_PREFIX}<key> string or 'authority'"
