"""An in-memory double of the ingress service's HTTP contract, for the dashboard's tests.

The dashboard is a client of ``/v1/me``, ``/v1/me/usage`` and ``/v1/admin/...``; this
answers them exactly as the contract says (shapes, statuses, OpenAI-style errors) from a
dict, so the page's signed-in views can be driven in a browser with known data: a chart of
seeded usage, a key created/rotated/revoked, a chat refused after revocation. It is not a
model of otela's back end; the real one is exercised by the keyed tests of
``test_dashboard_chromium.py`` against live nodes.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from hypercorn.asyncio import serve
from hypercorn.config import Config

from ingress.dashboard import install
from ingress.sso.off import install as install_no_sso
from otela.api.errors import install_error_handlers
from otela.testing.localfed import wait_for

MODEL = "contract-model"
PROVIDER = "prov-contract"
ADMIN_TOKEN = "contract-admin-token"


def error(status: int, message: str, code: str, param: str | None = None) -> JSONResponse:
    kind = "authentication_error" if status == 401 else "invalid_request_error"
    return JSONResponse({"error": {"message": message, "type": kind, "code": code,
                                   "param": param}}, status_code=status)


@dataclass
class Key:
    id: str
    secret: str
    owner: str
    name: str | None = None
    created_at: float = field(default_factory=time.time)
    expires_at: float | None = None
    revoked_at: float | None = None
    models: list[str] | None = None
    providers: list[str] | None = None
    rpm: int | None = None
    tpm: int | None = None
    max_concurrent: int | None = None
    budget_tokens: int | None = None

    def public(self, used_tokens: int) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "owner": self.owner,
                "created_at": int(self.created_at),
                "expires_at": None if self.expires_at is None else int(self.expires_at),
                "revoked_at": None if self.revoked_at is None else int(self.revoked_at),
                "models": self.models, "providers": self.providers,
                "limits": {"rpm": self.rpm, "tpm": self.tpm,
                           "max_concurrent": self.max_concurrent},
                "budget_tokens": self.budget_tokens, "used_tokens": used_tokens}


@dataclass(frozen=True)
class Use:
    key_id: str
    at: float
    prompt_tokens: int
    completion_tokens: int
    error: bool = False
    model: str = MODEL
    provider: str = PROVIDER
    node: str = "node-contract"
    latency_ms: float = 120.0
    ttft_ms: float = 30.0


class ContractState:
    def __init__(self) -> None:
        self.exports = 0  # request-log CSV exports asked for
        self.keys: dict[str, Key] = {}
        self.usage: list[Use] = []
        self.batches: dict[str, list[dict[str, Any]]] = {}  # key id -> batch objects
        self.warming = False  # the node's registry replica is catching up (just started)
        self.lock = threading.Lock()

    def add_key(self, owner: str, **fields: Any) -> Key:
        key = Key(id=f"key_{secrets.token_hex(6)}", secret=f"sk-{secrets.token_urlsafe(24)}",
                  owner=owner, **fields)
        with self.lock:
            self.keys[key.id] = key
        return key

    def used(self, key_id: str) -> int:
        return sum(u.prompt_tokens + u.completion_tokens for u in self.usage
                   if u.key_id == key_id)

    def public(self, key: Key) -> dict[str, Any]:
        return key.public(self.used(key.id))

    def by_secret(self, request: Request) -> Key | None:
        header = request.headers.get("authorization", "")
        secret = header.removeprefix("Bearer ").strip()
        key = next((k for k in self.keys.values() if k.secret == secret), None)
        if key is None or key.revoked_at is not None:
            return None
        if key.expires_at is not None and key.expires_at < time.time():
            return None
        return key

    def is_admin(self, request: Request) -> bool:
        return request.headers.get("authorization", "") == f"Bearer {ADMIN_TOKEN}"


def _window(request: Request) -> tuple[float, float]:
    q = request.query_params
    return float(q.get("since", 0)), float(q.get("until", time.time() + 1))


def _totals(uses: list[Use]) -> dict[str, int]:
    return {"requests": len(uses), "prompt_tokens": sum(u.prompt_tokens for u in uses),
            "completion_tokens": sum(u.completion_tokens for u in uses),
            "errors": sum(u.error for u in uses)}


def create_contract_app(state: ContractState) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    install(app)
    install_no_sso(app)  # as an ingress without single sign-on answers /ui/session
    unauthorized = ("invalid API key", "invalid_api_key")
    not_admin = ("invalid admin token", "invalid_admin_token")

    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "version": "contract", "peer_id": "12D3KooWContractNode0000",
                "session_id": "s-ingress", "provider_id": "prov-ingress", "state": "JOIN",
                "connected_peers": 1, "registry_warming": state.warming}

    @app.get("/v1/registry/nodes")
    async def nodes() -> dict[str, Any]:
        node = {"session_id": "s-serving", "peer_id": "12D3KooWContractServing00",
                "provider_id": PROVIDER, "state": "SERVING", "http_url": "http://127.0.0.1:1",
                "hardware": {"cpus": 64, "memory_bytes": 512 << 30,
                             "gpus": [{"name": "H100", "memory_bytes": 80 << 30}] * 4},
                "models": [{"id": MODEL, "max_context": 32768}], "ingress": False,
                "engine": "vllm", "updated_at": time.time(), "idle": False, "slurm": None,
                "reachability": "public", "relay": False}
        # The same node before a restart: its old session's LEFT record stays a while.
        before = {**node, "session_id": "s-serving-old", "state": "LEFT",
                  "updated_at": time.time() - 600}
        return {"nodes": [before, node], "count": 2}

    @app.get("/v1/network")
    async def network() -> dict[str, Any]:
        return {"nat": {"reachability": "public"}, "peers": {}, "verdict": "contract double",
                "routing": {"loads": {"s-serving": {"in_flight": 3, "running": 3, "waiting": 1,
                                                    "kv_usage": 0.4, "capacity": 8.0,
                                                    "slots": 16}},
                            "ejected": {}, "own_load": None,
                            "queue": {MODEL: {"interactive": 1, "batch": 4}}}}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        if state.warming:
            return {"object": "list", "data": [], "registry_warming": True}
        return {"object": "list", "data": [{
            "id": MODEL, "object": "model", "created": 0, "owned_by": PROVIDER,
            "max_model_len": 32768, "serving_nodes": 1,
            "otela": {"providers": [PROVIDER], "gpu": ["H100"], "engine": ["vllm"],
                      "max_context": [32768]}}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        key = state.by_secret(request)
        if key is None:
            return error(401, *unauthorized)
        body = await request.json()
        words = f"echo: {body['messages'][-1]['content']}".split(" ")

        async def events() -> AsyncIterator[bytes]:
            for i, word in enumerate(words):
                await asyncio.sleep(0.15)
                delta = {"content": word if i == 0 else " " + word}
                chunk = {"object": "chat.completion.chunk", "model": MODEL,
                         "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
                yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
            usage = {"prompt_tokens": 5, "completion_tokens": len(words),
                     "total_tokens": 5 + len(words)}
            done = {"object": "chat.completion.chunk", "model": MODEL,
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            yield b"data: " + json.dumps(done).encode() + b"\n\n"
            yield b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
            state.usage.append(Use(key.id, time.time(), 5, len(words)))

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"x-otela-provider-id": PROVIDER})

    @app.get("/v1/me")
    async def me(request: Request) -> Any:
        key = state.by_secret(request)
        return error(401, *unauthorized) if key is None else state.public(key)

    @app.get("/v1/batches")
    async def batches(request: Request) -> Any:
        key = state.by_secret(request)
        if key is None:
            return error(401, *unauthorized)
        data = state.batches.get(key.id, [])
        return {"object": "list", "data": data, "has_more": False,
                "first_id": data[0]["id"] if data else None,
                "last_id": data[-1]["id"] if data else None}

    @app.get("/v1/me/usage")
    async def me_usage(request: Request) -> Any:
        key = state.by_secret(request)
        if key is None:
            return error(401, *unauthorized)
        since, until = _window(request)
        bucket = int(request.query_params.get("bucket", 3600))
        if bucket <= 0:
            return error(400, "bucket must be positive", "invalid_request", "bucket")
        uses = [u for u in state.usage if u.key_id == key.id and since <= u.at < until]
        groups: dict[int, list[Use]] = {}
        for use in uses:
            groups.setdefault(int(use.at // bucket * bucket), []).append(use)
        return {"buckets": [{"start": start, **_totals(g)} for start, g in sorted(groups.items())],
                "totals": _totals(uses)}

    @app.get("/v1/admin/keys")
    async def list_keys(request: Request) -> Any:
        if not state.is_admin(request):
            return error(401, *not_admin)
        return {"object": "list", "data": [state.public(k) for k in state.keys.values()]}

    @app.post("/v1/admin/keys")
    async def create_key(request: Request) -> Any:
        if not state.is_admin(request):
            return error(401, *not_admin)
        body = await request.json()
        if not isinstance(body.get("owner"), str) or not body["owner"]:
            return error(400, "'owner' is required", "invalid_request", "owner")
        expires_in = body.get("expires_in")
        key = state.add_key(
            body["owner"], name=body.get("name"),
            expires_at=None if expires_in is None else time.time() + expires_in,
            models=body.get("models"), providers=body.get("providers"), rpm=body.get("rpm"),
            tpm=body.get("tpm"), max_concurrent=body.get("max_concurrent"),
            budget_tokens=body.get("budget_tokens"))
        return {**state.public(key), "key": key.secret}

    def admin_key(request: Request, key_id: str) -> Key | JSONResponse:
        if not state.is_admin(request):
            return error(401, *not_admin)
        key = state.keys.get(key_id)
        return key if key is not None else error(404, "no such key", "key_not_found", "id")

    @app.post("/v1/admin/keys/{key_id}/revoke")
    async def revoke(request: Request, key_id: str) -> Any:
        key = admin_key(request, key_id)
        if isinstance(key, Key):
            key.revoked_at = key.revoked_at or time.time()
            return state.public(key)
        return key

    @app.post("/v1/admin/keys/{key_id}/rotate")
    async def rotate(request: Request, key_id: str) -> Any:
        key = admin_key(request, key_id)
        if isinstance(key, Key):
            key.secret = f"sk-{secrets.token_urlsafe(24)}"
            return {**state.public(key), "key": key.secret}
        return key

    @app.get("/v1/admin/usage")
    async def admin_usage(request: Request) -> Any:
        if not state.is_admin(request):
            return error(401, *not_admin)
        by = request.query_params.get("by", "key")
        if by not in ("key", "model", "provider", "node"):
            return error(400, "by must be key, model, provider or node", "invalid_request", "by")
        since, until = _window(request)
        groups: dict[str, list[Use]] = {}
        for use in state.usage:
            if since <= use.at < until:
                group = use.key_id if by == "key" else getattr(use, by)
                groups.setdefault(group, []).append(use)
        return {"object": "list", "by": by, "data": [
            {"group": g, **_totals(uses),
             "mean_latency_ms": sum(u.latency_ms for u in uses) / len(uses),
             "mean_ttft_ms": sum(u.ttft_ms for u in uses) / len(uses)}
            for g, uses in groups.items()]}

    @app.get("/v1/admin/requests")
    async def admin_requests(request: Request) -> Any:
        """The request log: newest first, ``model`` filter, ``limit``/``after`` paging, or
        every entry as CSV (``format=csv``; counted in ``state.exports``)."""
        if not state.is_admin(request):
            return error(401, *not_admin)
        q = request.query_params
        entries = [{"object": "request", "id": f"req-{i:04d}", "finished_at": use.at,
                    "key_id": use.key_id, "team": None, "model": use.model,
                    "provider": use.provider, "node_peer": use.node, "status": 200,
                    "error": None, "stream": False, "prompt_tokens": use.prompt_tokens,
                    "completion_tokens": use.completion_tokens, "latency_ms": use.latency_ms,
                    "ttft_ms": use.ttft_ms, "spend": None}
                   for i, use in enumerate(state.usage)
                   if not q.get("model") or use.model == q["model"]]
        entries.reverse()
        if q.get("format") == "csv":
            state.exports += 1
            lines = ["id,model"] + [f"{e['id']},{e['model']}" for e in entries]
            return PlainTextResponse("\n".join(lines) + "\n", media_type="text/csv")
        if q.get("after"):
            ids = [e["id"] for e in entries]
            entries = entries[ids.index(q["after"]) + 1:]
        limit = int(q.get("limit", 100))
        page = entries[:limit]
        return {"object": "list", "data": page, "has_more": len(entries) > limit,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None}

    return app


@contextmanager
def served(app: FastAPI) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 from a background thread; yields its base URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(serve(app, config, shutdown_trigger=stop.wait))  # type: ignore[arg-type]

    thread = threading.Thread(target=run, name="contract-api", daemon=True)
    thread.start()

    def listening() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True

    wait_for(listening, 10, "the contract API to listen")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
