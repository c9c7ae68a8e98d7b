"""Hypothesis-driven HTTP fuzzing of one live node: its OpenAPI routes and the routes it
handles natively (routed OpenAI requests, the engine hop, ``/metrics``).

Shared by ``tests/integration/test_fuzz_http.py`` (a bounded number of examples, slow
tier) and ``benchmarks/fuzz.py`` (many more). The rule every answer must keep:

- never a 5xx of the node's own making; 502, 503 and 504 are documented upstream failures
  (no serving node, candidates unreachable, engine timeout) and must carry an OpenAI error
  body like every other error the node produces;
- every error the node itself answers is ``{"error": {"message": ..., ...}}``;
- the node neither crashes nor logs a traceback, and still serves afterwards (checked by
  the callers).

Requests are built from the live ``/openapi.json`` (paths, path and query parameters,
POST bodies; the ingress service's admin and key-holder routes included), plus the query
parameters and headers the node reads without declaring them (``providers``, ``require``,
``X-Otela-*``, ``Authorization``), plus ``/v1/...`` inference routes with valid requests,
JSON that is nearly right or wrong, and bytes that are not JSON or not UTF-8, plus the
engine hop, random paths, and signed assignments with fuzzed fields (see each fuzzer).
"""

from __future__ import annotations

import json
import re
import secrets
import string
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otela.identity import load_or_create
from otela.testing.localfed import (
    LocalFederation,
    LocalNode,
    echo_engine_command,
    free_port,
    wait_for,
)

UPSTREAM_FAILURES = frozenset({502, 503, 504})
ROUTED = ("chat/completions", "completions", "embeddings", "responses", "rerank",
          "audio/speech", "moderations")
SEGMENT_ALPHABET = string.ascii_letters + string.digits + "-_.~%:@!$&'()*+,;="


class FuzzFailure(AssertionError):
    """A response that breaks the rule above, with the request that caused it."""


@dataclass
class Target:
    """The live node under test and what we learned about it."""

    base_url: str
    model: str
    client: httpx.Client = field(init=False)
    spec: dict[str, Any] = field(default_factory=dict)
    seen: dict[int, int] = field(default_factory=dict)  # status -> count
    # Real ``Authorization`` values (an API key, the admin token) and ids (an API key's)
    # the fuzzers use half the time, so they get past authentication.
    credentials: tuple[bytes, ...] = ()
    known_ids: tuple[str, ...] = ()
    # Which of them a route wants (path prefix -> Authorization), used 3 times in 4 there.
    route_credentials: dict[str, bytes] = field(default_factory=dict)
    planner_key: Any = None  # an opted-in planner's private key: signed assignments too
    node_peer_id: str = ""

    def __post_init__(self) -> None:
        self.client = httpx.Client(base_url=self.base_url, timeout=30, trust_env=False)

    def load_spec(self) -> dict[str, Any]:
        response = self.client.get("/openapi.json")
        response.raise_for_status()
        self.spec = response.json()
        return self.spec

    def operations(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(method, path template, operation) for every operation in the schema."""
        return [(method.upper(), path, op)
                for path, ops in sorted(self.spec.get("paths", {}).items())
                for method, op in sorted(ops.items())]

    def send(self, method: str, path: str, *, params: Any = None, headers: Any = None,
             content: bytes | None = None) -> httpx.Response:
        request = self.client.build_request(method, path, params=params, headers=headers,
                                            content=content)
        try:
            response = self.client.send(request)
        except httpx.HTTPError as exc:
            raise FuzzFailure(f"{method} {request.url}: no HTTP answer ({exc!r})") from exc
        self.seen[response.status_code] = self.seen.get(response.status_code, 0) + 1
        check(method, str(request.url), content, response)
        return response


def check(method: str, url: str, body: bytes | None, response: httpx.Response) -> None:
    """Raise ``FuzzFailure`` when ``response`` breaks the rule (module docstring)."""
    status = response.status_code
    where = f"{method} {url} body={body[:200] if body else b''!r} -> {status}"
    if status >= 500 and status not in UPSTREAM_FAILURES:
        raise FuzzFailure(f"{where}: {response.text[:500]}")
    if status < 400 or method == "HEAD" or response.headers.get("x-otela-session-id"):
        return  # success, or an answer relayed from the engine (not the node's own)
    try:
        error = response.json()["error"]
        ok = isinstance(error, dict) and isinstance(error.get("message"), str)
    except (ValueError, KeyError, TypeError):
        ok = False
    if not ok:
        raise FuzzFailure(f"{where}: not an OpenAI error body: {response.text[:500]!r}")


# A whole line: a plain traceback, an exception group's ("+ Exception Group Traceback"), or
# one nested inside a group ("| Traceback"), which trio's nurseries produce; or the header
# of a box that rich draws around one (the CLI's crash output: "╭─── Traceback (...) ───╮").
_TRACEBACK = re.compile(
    r"^(?:(?:Traceback|[ |+-]*\+ Exception Group Traceback|[ |]*\| Traceback)"
    r" \(most recent call last\):"
    r"|[│ ]*╭─+ Traceback \(most recent call last\) ─+╮[│ ]*)$", re.MULTILINE)


def traceback_in(log: Path) -> str:
    """The first Python traceback a log holds, or ''. Matched as a whole line: fuzzed
    input that contains the word (logged in a refusal) is not one."""
    text = log.read_text(errors="replace") if log.exists() else ""
    found = _TRACEBACK.search(text)
    return text[found.start():found.start() + 3000] if found else ""


def start_node(federation: LocalFederation, root: Path, model: str,
               extra_args: list[str] | None = None) -> tuple[LocalNode, Target]:
    """The node every fuzzer targets: an ingress serving ``model`` with an echo engine,
    running the ingress service (SQLite, ``--open`` so keyless requests reach routing, an
    admin token) with two API keys, and opted in to assignments from a planner whose key the
    target holds (so signed assignments reach the decision; the node is busy, so none
    launches)."""
    planner = load_or_create(root / "planner")
    allowlist = root / "engines.toml"
    allowlist.write_text('[engines.echo]\ncommand = "echo-engine --port {port} --model '
                         '{model}"\nmodels = ["planned-*"]\n')
    admin = secrets.token_hex(16)
    node = federation.start_node(
        "node", ingress=True, process=echo_engine_command(free_port(), [model]),
        extra_env={"OTELA_ADMIN_TOKEN": admin},
        extra_args=["--accept-assignments", planner.peer_id.to_base58(),
                    "--engine-allowlist", str(allowlist), "--ingress-db", "default", "--open",
                    *(extra_args or [])])
    wait_for(lambda: node.get("/v1/health")["state"] == "SERVING", 30, "the node to serve")

    def new_key(owner: str) -> dict[str, Any]:
        created = httpx.post(f"{node.http_url}/v1/admin/keys", json={"owner": owner},
                             headers={"authorization": f"Bearer {admin}"}, timeout=10,
                             trust_env=False)
        created.raise_for_status()
        return dict(created.json())

    # Two keys: the fuzzers use the first's secret and the second's id, so revoking or
    # rotating a known id (which they do) never locks them out of the keyed routes.
    user, victim = new_key("fuzz"), new_key("fuzz-victim")
    target = Target(node.http_url, model, planner_key=planner.key_pair.private_key,
                    node_peer_id=node.status["peer_id"],
                    credentials=(f"Bearer {admin}".encode(), f"Bearer {user['key']}".encode()),
                    known_ids=(victim["id"],),
                    route_credentials={"/v1/admin": f"Bearer {admin}".encode(),
                                       "/v1/me": f"Bearer {user['key']}".encode()})
    target.load_spec()
    return node, target


# -- strategies ------------------------------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40))
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                max_size=4),
    max_leaves=12,
)
texts = st.text(max_size=80)
# Header values as bytes: anything a client library will send (no control characters but
# tab), so invalid UTF-8 and Latin-1 arrive as they are. Control characters, CR/LF
# injection and header floods are sent over raw sockets (test_hostile_input.py).
_HEADER_OCTETS = bytes([9, *range(0x20, 0x7F), *range(0x80, 0x100)])
header_bytes = st.binary(max_size=120).map(
    lambda b: bytes(c for c in b if c in _HEADER_OCTETS).strip(b" \t"))


def otela_headers(credentials: tuple[bytes, ...] = ()) -> st.SearchStrategy[dict[str, bytes]]:
    """The headers a node reads, with values from plausible to garbage; ``credentials``
    (real ``Authorization`` values: an API key, the admin token) are used half the time."""
    headers = st.dictionaries(
        st.sampled_from(["x-otela-providers", "x-otela-require", "x-otela-request-id",
                         "x-otela-hop", "x-otela-not-delivered", "authorization",
                         "content-type", "accept", "x-request-id", "user-agent"]),
        st.one_of(header_bytes, st.sampled_from([
            b"gpu=H100|A100, min_context=32768", b"min_context=abc", b"gpu=", b",,,", b"*",
            b"a" * 4000, b"application/json", b"text/event-stream", "caf\u00e9".encode(),
            b"Bearer", b"Bearer otela-", b"Basic Zm9vOmJhcg==", b"bearer  x",
        ])),
        max_size=4,
    )
    if not credentials:
        return headers
    real = st.sampled_from(credentials).map(lambda c: {"authorization": c})
    return st.one_of(headers, st.tuples(real, headers).map(lambda t: {**t[1], **t[0]}))


def model_names(model: str) -> st.SearchStrategy[Any]:
    return st.one_of(st.just(model), texts, st.just(""), json_values)


def messages() -> st.SearchStrategy[Any]:
    message = st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "tool"]) | texts},
        optional={"content": texts | json_values, "name": texts},
    )
    return st.lists(message, max_size=3) | json_values


def inference_bodies(model: str) -> st.SearchStrategy[bytes]:
    """Request bodies for routed routes: nearly right JSON, wrong JSON, and non-JSON."""
    nearly_right = st.fixed_dictionaries(
        {"model": model_names(model)},
        optional={
            "messages": messages(), "prompt": texts | json_values, "input": texts | json_values,
            "stream": st.booleans() | json_values, "max_tokens": st.integers() | json_values,
            "n": st.integers(-2, 4), "otela": json_values | st.fixed_dictionaries(
                {}, optional={"providers": texts | json_values,
                              "require": texts | json_values}),
            "stream_options": json_values,
        },
    ).map(lambda d: json.dumps(d).encode())
    nested = st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n)
    return st.one_of(
        nearly_right, nearly_right, nearly_right,
        json_values.map(lambda v: json.dumps(v).encode()),
        st.binary(max_size=512),
        st.sampled_from([b"", b"{", b"null", b'{"model": NaN}', b'{"model": "\xff\xfe"}',
                         b'{"model": "a", "model": "b"}', b"\xef\xbb\xbf{}", b'"\\ud800"']),
        nested,
    )


def segments() -> st.SearchStrategy[str]:
    return st.text(SEGMENT_ALPHABET, min_size=1, max_size=20)


def inference_paths() -> st.SearchStrategy[str]:
    random_path = st.lists(segments(), min_size=1, max_size=3).map(lambda s: "/".join(s))
    return st.one_of(st.sampled_from(ROUTED), random_path).map(lambda p: f"/v1/{p}")


# Query values: any text, and the numbers and dates parameters such as since, until and
# bucket parse (the edges of float: nan, inf, huge, tiny; the edges of ISO dates).
_EDGES = st.sampled_from([
    "nan", "NaN", "inf", "-inf", "Infinity", "1e308", "-1e308", "1e309", "0", "-1", "1e-300",
    "9999-12-31", "0001-01-01", "2026-11-24T12:00:00+14:00", "24h", "-0", "0x10", "1_000"])
query_values = st.one_of(
    texts, _EDGES, _EDGES, st.floats().map(str), st.integers(-(2**70), 2**70).map(str),
    st.datetimes().map(lambda d: d.isoformat()),
)


def query_params() -> st.SearchStrategy[list[tuple[str, str]]]:
    name = st.sampled_from(["providers", "require", "peer", "model", "stream"]) | segments()
    return st.lists(st.tuples(name, query_values), max_size=3)


def key_specs() -> st.SearchStrategy[dict[str, Any]]:
    """Bodies for ``POST /v1/admin/keys``: the fields it reads, values plausible to wild."""
    count = st.integers(1, 1000) | st.integers(-(2**70), 2**70) | json_values
    names = st.lists(texts, max_size=3) | texts | json_values
    return st.fixed_dictionaries({"owner": texts | json_values}, optional={
        "name": texts | json_values, "expires_in": count | st.floats(),
        "expires_at": count | st.floats(), "models": names, "providers": names,
        "rpm": count, "tpm": count, "max_concurrent": count, "budget_tokens": count,
    })


def path_value() -> st.SearchStrategy[str]:
    """A path parameter: any text, percent-encoded (clients cannot send it raw)."""
    encoded = texts.filter(lambda s: s not in ("", ".", "..")).map(
        lambda s: urllib.parse.quote(s, safe=""))
    return st.one_of(encoded, segments())


# -- fuzzers (each runs ``examples`` Hypothesis examples against the target) ------------------

def _settings(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, database=None,
                    suppress_health_check=list(HealthCheck), derandomize=False)


def fuzz_openapi(target: Target, examples: int) -> None:
    """Every operation of the schema: its path and query parameters, the undeclared ones
    the node reads, headers, and a body for POSTs; also the other methods on each path."""
    ops = target.operations()
    if not ops:
        raise FuzzFailure("the node's /openapi.json lists no operations")

    @st.composite
    def requests(draw: Callable[..., Any]) -> tuple[str, str, Any, Any, bytes | None]:
        method, template, op = draw(st.sampled_from(ops))
        path = template
        for param in op.get("parameters", []):
            if param.get("in") == "path":
                known = st.sampled_from(target.known_ids) if target.known_ids else st.nothing()
                path = path.replace("{" + param["name"] + "}",
                                    draw(st.one_of(path_value(), known)))
        declared = [p["name"] for p in op.get("parameters", []) if p.get("in") == "query"]
        params = [(name, draw(query_values)) for name in declared
                  if draw(st.integers(0, 3))]  # each declared one, 3 times in 4
        params += draw(query_params())
        if not draw(st.integers(0, 3)):  # the schema's method 3 times in 4, else another
            method = draw(st.sampled_from(["PUT", "DELETE", "PATCH", "OPTIONS", "HEAD",
                                           "POST", "GET"]))
        headers = draw(otela_headers(target.credentials))
        wanted = [c for prefix, c in target.route_credentials.items()
                  if template.startswith(prefix)]
        if wanted and draw(st.integers(0, 3)):  # the route's own credential, 3 times in 4
            headers["authorization"] = wanted[0]
        body = None
        if method in ("POST", "PUT", "PATCH"):
            body = draw(st.one_of(
                json_values.map(lambda v: json.dumps(v).encode()),
                st.fixed_dictionaries({"envelope": texts | json_values}).map(
                    lambda d: json.dumps(d).encode()),
                key_specs().map(lambda d: json.dumps(d).encode()),
                st.binary(max_size=256)))
        return method, path, params, headers, body

    @_settings(examples)
    @given(requests())
    def run(request: tuple[str, str, Any, Any, bytes | None]) -> None:
        method, path, params, headers, body = request
        target.send(method, path, params=params, headers=headers, content=body)

    run()


def valid_requests(model: str) -> st.SearchStrategy[tuple[str, bytes, dict[str, bytes], Any]]:
    """Requests a client could well send (the served model, real messages or prompts,
    plausible options and headers): they reach the engine, plain and streaming, so the
    success path is fuzzed too, not only the refusals."""
    options = {"stream": st.booleans(), "max_tokens": st.integers(1, 64),
               "temperature": st.floats(0, 2), "user": texts,
               "stream_options": st.just({"include_usage": True}),
               "otela": st.just({})}
    role = st.sampled_from(["user", "system", "assistant"])
    chat = st.fixed_dictionaries(
        {"model": st.just(model), "messages": st.lists(
            st.fixed_dictionaries({"role": role, "content": texts}), min_size=1, max_size=3)},
        optional=options).map(lambda d: ("/v1/chat/completions", d))
    completion = st.fixed_dictionaries(
        {"model": st.just(model), "prompt": texts | st.lists(texts, min_size=1, max_size=2)},
        optional=options).map(lambda d: ("/v1/completions", d))
    headers = st.lists(st.sampled_from([
        ("x-otela-request-id", b"abc-123"), ("x-otela-request-id", "r\u00e9q".encode()),
        ("accept", b"text/event-stream"), ("accept", b"*/*"),
        ("content-type", b"application/json"), ("user-agent", b"fuzz/1.0"),
    ]), max_size=3).map(dict)
    return st.tuples(chat | chat | completion, headers).map(
        lambda r: (r[0][0], json.dumps(r[0][1]).encode(), r[1], []))


def fuzz_inference(target: Target, examples: int) -> None:
    """POST to routed ``/v1/...`` paths: valid requests (half), the served model with wrong
    fields, unknown models and paths, garbage bodies."""
    anything = st.tuples(inference_paths(), inference_bodies(target.model),
                         otela_headers(target.credentials),
                         query_params())
    valid = valid_requests(target.model)
    if target.credentials:  # keyed as well as keyless (the node runs with --open)
        valid = st.tuples(valid, st.none() | st.sampled_from(target.credentials)).map(
            lambda t: t[0] if t[1] is None else (t[0][0], t[0][1],
                                                  {**t[0][2], "authorization": t[1]}, t[0][3]))

    @_settings(examples)
    @given(st.one_of(valid, anything))
    def run(request: tuple[str, bytes, dict[str, bytes], Any]) -> None:
        path, body, headers, params = request
        target.send("POST", path, params=params, headers=headers, content=body)

    run()


def fuzz_engine_hop(target: Target, examples: int) -> None:
    """The engine hop without (or with forged) member signatures: always refused."""

    @_settings(examples)
    @given(inference_paths(), inference_bodies(target.model),
                         otela_headers(target.credentials),
           st.sampled_from(["POST", "GET", "PUT"]))
    def run(path: str, body: bytes, headers: dict[str, bytes], method: str) -> None:
        response = target.send(method, "/v1/engine" + path, headers=headers, content=body)
        if method == "POST" and response.status_code < 400:
            raise FuzzFailure(f"the engine hop accepted an unsigned request: POST {path}")

    run()


def fuzz_other_routes(target: Target, examples: int) -> None:
    """``/metrics`` and random paths with random methods (404/405, never 5xx)."""
    paths = st.one_of(
        st.sampled_from(["/metrics", "/", "/v1", "/v1/", "/openapi.json", "/docs",
                         "/v1/registry", "/v1/models/", "//v1//models", "/v1/../metrics",
                         "/ui", "/ui/", "/ui/static/app.js", "/ui/static/..%2fapp.py",
                         "/ui/static/%00", "/v1/me", "/v1/me/usage", "/v1/admin",
                         "/v1/admin/keys/key_000000000000/revoke"]),
        st.lists(segments(), min_size=1, max_size=4).map(lambda s: "/" + "/".join(s)),
    )

    @_settings(examples)
    @given(paths, st.sampled_from(["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS"]),
           otela_headers(target.credentials), st.none() | st.binary(max_size=128))
    def run(path: str, method: str, headers: dict[str, bytes], body: bytes | None) -> None:
        target.send(method, path, headers=headers, content=body)

    run()


def assignment_envelopes(key: Any, target_id: str) -> st.SearchStrategy[dict[str, Any]]:
    """``{"envelope": ...}`` bodies that pass the signature check (signed by the opted-in
    planner) with fields from valid to absurd, and envelopes broken at every layer."""
    import base64
    import time

    import msgpack

    from otela.assignments.message import DOMAIN

    issuer = _peer_id_of(key)
    now = time.time()
    numbers = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**63), 2**64 - 1)
    msgpack_values = st.recursive(
        st.none() | st.booleans() | numbers | texts | st.binary(max_size=20),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
        max_leaves=8)
    valid = {"id": st.text("0123456789abcdef", min_size=32, max_size=32),
             "issuer": st.just(issuer), "target": st.just(target_id),
             "issued_at": st.floats(now - 120, now + 5),
             "expires_at": st.floats(now + 10, now + 3600),
             "engine": st.sampled_from(["echo", "nope"]),
             "model": st.sampled_from(["planned-x", "planned-", "other"]),
             "tp": st.integers(1, 8), "plan": texts,
             "params": st.dictionaries(st.from_regex(r"[A-Za-z0-9_]{1,8}", fullmatch=True),
                                       texts, max_size=2)}
    wild = {"id": msgpack_values, "issuer": texts, "target": texts, "issued_at": numbers,
            "expires_at": numbers, "engine": texts | msgpack_values,
            "model": texts | msgpack_values, "tp": numbers | msgpack_values,
            "plan": msgpack_values, "params": msgpack_values}

    @st.composite
    def fields(draw: Callable[..., Any]) -> dict[str, Any]:
        """Valid fields with zero to two of them replaced by wild values, sometimes one
        missing or one extra: every check of the decision is reached, one at a time."""
        values = {name: draw(strategy) for name, strategy in valid.items()}
        for name in draw(st.lists(st.sampled_from(sorted(wild)), max_size=2, unique=True)):
            values[name] = draw(wild[name])
        shape = draw(st.sampled_from(["same", "same", "same", "missing", "extra"]))
        if shape == "missing":
            values.pop(draw(st.sampled_from(sorted(values))))
        elif shape == "extra":
            values[draw(texts)] = draw(msgpack_values)
        return values

    def signed(values: dict[str, Any]) -> bytes:
        body = msgpack.packb(values, use_bin_type=True)
        sig = key.sign(DOMAIN + body)
        return msgpack.packb({"v": 1, "kind": "assignment", "body": body, "sig": sig},
                             use_bin_type=True)

    envelopes = st.one_of(
        fields().map(signed), fields().map(signed), st.binary(max_size=300),
        st.builds(lambda v, k, b, s: msgpack.packb({"v": v, "kind": k, "body": b, "sig": s},
                                                   use_bin_type=True),
                  st.integers(-1, 3) | texts, st.just("assignment") | texts,
                  st.binary(max_size=100), st.binary(min_size=64, max_size=64)),
    )
    return envelopes.map(lambda e: {"envelope": base64.b64encode(e).decode()})


def _peer_id_of(key: Any) -> str:
    from libp2p.peer.id import ID

    return str(ID.from_pubkey(key.get_public_key()).to_base58())


def fuzz_assignments(target: Target, examples: int) -> None:
    """``POST /v1/assignments`` with signed envelopes of fuzzed fields (the node is opted
    in and busy with its engine, so nothing is ever launched)."""
    if target.planner_key is None:
        return

    @_settings(examples)
    @given(assignment_envelopes(target.planner_key, target.node_peer_id))
    def run(body: dict[str, Any]) -> None:
        response = target.send("POST", "/v1/assignments", content=json.dumps(body).encode(),
                               headers={"content-type": "application/json"})
        if response.status_code == 202:
            raise FuzzFailure(f"a busy node accepted an assignment: {body}")

    run()


FUZZERS: dict[str, Callable[[Target, int], None]] = {
    "openapi": fuzz_openapi,
    "inference": fuzz_inference,
    "engine_hop": fuzz_engine_hop,
    "other": fuzz_other_routes,
    "assignments": fuzz_assignments,
}
