"""What reaches an engine: request paths made canonical once, an allowlist of inference
routes, and the engine hop's gate.

Paths. A server decides by the path it sees, and engines percent-decode theirs (vLLM's web
stack does), so a decision on the raw path is a decision on the wrong string:
``/v1/load%5Flora%5Fadapter`` is not ``/v1/load_lora_adapter`` to a comparison, but it is
to vLLM. ``canonical_path`` decodes the path once (UTF-8), refuses what no canonical path
holds (a fragment, dot segments, a ``%`` or backslash left after decoding, control
characters, an empty path), drops empty segments (``//``) and a trailing slash, and keeps
case (engines' routes are case-sensitive: ``/V1/...`` is no route of theirs). Every
decision is made on that canonical path, and it is the path sent on, with the query as the
client sent it: what was checked is what runs.

Routes. Only an allowlist of inference routes (``INFERENCE_ROUTES``, and what an operator
adds with ``--inference-routes``) is ever relayed, on the ingress and on the hop: an
engine's administration (vLLM's LoRA loading under ``/v1``, its sleep, profiling and
weight-update routes) and anything an engine adds later stays unreachable unless named.

The gate, for the hop (HTTP ``/v1/engine/...`` and libp2p ``/otela/http/2`` alike), after
the caller is authenticated as a member (``hop_auth`` or the libp2p peer id):
- an allowed route, canonical, never another hop;
- a JSON body within the node's size limit that names a model this node serves (the
  ingress routed it here for that model);
- only while this node is SERVING.
Every refusal means the engine never saw the request ("not delivered"), so the calling
node may try another. Pure, apart from reading the node's state through its callables.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

from otela.dataplane.deadline import FirstByteTimeouts
from otela.dataplane.errors import clip
from otela.dataplane.jsonbody import BodyError
from otela.dataplane.jsonfields import BodyReader
from otela.names import route_problem

# OpenAI's inference routes and those vLLM, SGLang and TGI add beside them (Anthropic's
# messages, rerank, score, pooling, tokenizer helpers); every one takes a JSON body naming
# a model. Administration is never here.
INFERENCE_ROUTES = frozenset({
    "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
    "/v1/messages", "/v1/messages/count_tokens", "/v1/moderations",
    "/v1/rerank", "/v1/score", "/v1/classify", "/v1/pooling",
    "/v1/tokenize", "/v1/detokenize",
    "/v1/audio/speech", "/v1/images/generations",
    "/v1/chat/completions/render", "/v1/completions/render",
})


class PathError(ValueError):
    """A request target with no canonical path (400 ``invalid_path``)."""


def canonical_path(target: str) -> str:
    """The canonical form of ``target``'s path, with its query as sent (module docstring);
    ``PathError`` when it has none. Already-canonical paths, the usual case, cost a few
    substring checks."""
    path, mark, query = target.partition("?")
    if "#" in target:
        raise PathError("a request target carries no fragment ('#')")
    if not path.startswith("/"):
        raise PathError("a request path starts with '/'")
    if "%" in path or "//" in path or "/." in path or path.endswith("/") or "\\" in path:
        path = _canonical(path)
    return path + mark + query


def _canonical(path: str) -> str:
    try:
        decoded = unquote_to_bytes(path).decode("utf-8")
    except UnicodeDecodeError:
        raise PathError("the path is not UTF-8 once percent-decoded") from None
    if "%" in decoded or "\\" in decoded or any(ord(c) < 0x20 or ord(c) == 0x7F
                                                for c in decoded):
        raise PathError("the path holds '%', '\\' or control characters once decoded")
    segments = [s for s in decoded.split("/") if s]
    if any(s in (".", "..") for s in segments):
        raise PathError("the path has '.' or '..' segments")
    return "/" + "/".join(segments)


def route_of(target: str) -> str:
    """The path part of a canonical target (query aside)."""
    return target.partition("?")[0]


class Routes:
    """The inference routes this node relays: the built-in ones and the operator's."""

    def __init__(self, extra: Iterable[str] = ()) -> None:
        self.allowed = INFERENCE_ROUTES | frozenset(_checked(r) for r in extra)

    def inference(self, path: str) -> bool:
        """Whether the canonical ``path`` (query aside) is an inference route relayed to
        engines; never a hop."""
        return route_of(path) in self.allowed


def _checked(route: str) -> str:
    problem = route_problem(route)
    if problem is not None:
        raise ValueError(problem)
    return route


DEFAULT_ROUTES = Routes()


@dataclass(frozen=True)
class Refusal:
    """Why the hop will not run a request; it never reached the engine."""

    status: int
    code: str
    message: str


@dataclass(frozen=True)
class Pass:
    """The engine to send the request to, the canonical target to send, and how long it
    may take to answer (``otela.dataplane.deadline``)."""

    engine: str
    target: str
    first_byte_s: float


class EngineGate:
    def __init__(self, engine_url: Callable[[], str | None],
                 served_models: Callable[[], Collection[str]], max_body_bytes: int,
                 routes: Routes = DEFAULT_ROUTES,
                 timeouts: FirstByteTimeouts = FirstByteTimeouts()) -> None:
        self.engine_url = engine_url  # None unless the node is SERVING
        self.served_models = served_models
        self.max_body_bytes = max_body_bytes
        self.routes = routes
        self.timeouts = timeouts
        self.bodies = BodyReader()

    def check(self, target: str, body: bytes) -> Pass | Refusal:
        """Where to send ``target`` (path and query, as the caller asked), or why not."""
        try:
            canonical = canonical_path(target)
        except PathError as exc:
            return Refusal(400, "invalid_path", str(exc))
        if not self.routes.inference(canonical):
            return Refusal(404, "not_found",
                           f"{clip(route_of(canonical))} is not relayed to engines")
        if len(body) > self.max_body_bytes:
            return Refusal(413, "request_too_large",
                           f"request body exceeds the {self.max_body_bytes} byte limit")
        try:
            fields = self.bodies.read(body)  # a long prompt is not parsed
        except BodyError as exc:
            return Refusal(400, exc.code, str(exc))
        model = fields.get("model")
        engine = self.engine_url()
        if engine is None:
            return Refusal(503, "node_not_serving", "this node is not serving")
        if not isinstance(model, str) or model not in self.served_models():
            return Refusal(404, "model_not_found",
                           f"this node does not serve `{clip(str(model))}`")
        return Pass(engine, canonical, self.timeouts.for_body(fields))
