"""The engine hop's gate: what a federation member may ask of this node's engine.

One set of rules for both ways a member reaches it (the HTTP ``/v1/engine/...`` hop and
the libp2p ``/otela/http/2`` protocol), applied after the caller is authenticated as a
member (``hop_auth`` or the libp2p peer id):

- only ``POST /v1/...`` inference paths; never the engine's administration (vLLM's LoRA
  loading lives under ``/v1`` too), never another hop;
- a JSON body within the node's size limit that names a model this node serves (the
  ingress routed it here for that model);
- only while this node is SERVING.
Every refusal means the engine never saw the request ("not delivered"), so the calling
node may try another. Pure, apart from reading the node's state through its callables.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from otela.dataplane.errors import clip
from otela.dataplane.jsonbody import BodyError, parse_json_object

ENGINE_PREFIX = "/v1/engine"
# Engine administration that sits under /v1 (vLLM); everything else under /v1 is inference.
ADMIN_PATHS = frozenset({"/v1/load_lora_adapter", "/v1/unload_lora_adapter"})


@dataclass(frozen=True)
class Refusal:
    """Why the hop will not run a request; it never reached the engine."""

    status: int
    code: str
    message: str


def inference_path(path: str) -> bool:
    """A path the hop relays (query aside): under ``/v1/``, not administration, not a hop
    itself."""
    bare = path.split("?", 1)[0]
    return (bare.startswith("/v1/") and bare not in ADMIN_PATHS
            and not bare.startswith(ENGINE_PREFIX + "/") and ".." not in bare)


class EngineGate:
    def __init__(self, engine_url: Callable[[], str | None],
                 served_models: Callable[[], Collection[str]], max_body_bytes: int) -> None:
        self.engine_url = engine_url  # None unless the node is SERVING
        self.served_models = served_models
        self.max_body_bytes = max_body_bytes

    def check(self, path: str, body: bytes) -> str | Refusal:
        """The engine's base URL to send ``path`` to, or why not."""
        if not inference_path(path):
            return Refusal(404, "not_found", f"{clip(path)} is not relayed to engines")
        if len(body) > self.max_body_bytes:
            return Refusal(413, "request_too_large",
                           f"request body exceeds the {self.max_body_bytes} byte limit")
        try:
            model = parse_json_object(body).get("model")
        except BodyError as exc:
            return Refusal(400, exc.code, str(exc))
        engine = self.engine_url()
        if engine is None:
            return Refusal(503, "node_not_serving", "this node is not serving")
        if not isinstance(model, str) or model not in self.served_models():
            return Refusal(404, "model_not_found",
                           f"this node does not serve `{clip(str(model))}`")
        return engine
