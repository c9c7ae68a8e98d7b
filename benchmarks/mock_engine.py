"""A mock OpenAI engine that answers in microseconds: the upstream of the proxy benchmark.

It does no work at all, so what a benchmark measures through a router is the router.
``POST /v1/chat/completions`` (and ``/v1/completions``, ``/v1/embeddings``) answers a fixed
completion; with ``"stream": true`` it sends ``--chunks`` SSE events and ``[DONE]`` at
once. ``GET /v1/models`` lists ``--model``; ``GET /health`` is 200. Run:
``python benchmarks/mock_engine.py --port 8000 --model mock``.
"""

from __future__ import annotations

import argparse
import json

import trio

from otela.dataplane.http import HttpServer, Request, Response, ServerLimits

JSON = [(b"content-type", b"application/json")]
SSE = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


def completion(model: str) -> bytes:
    return json.dumps({
        "id": "chatcmpl-mock", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "mock answer"}}],
        "usage": {"prompt_tokens": 8, "completion_tokens": 2, "total_tokens": 10},
    }).encode()


def events(model: str, chunks: int) -> list[bytes]:
    def event(delta: dict[str, str], finish: str | None) -> bytes:
        payload = {"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 0,
                   "model": model, "choices": [{"index": 0, "delta": delta,
                                                "finish_reason": finish}]}
        return b"data: " + json.dumps(payload).encode() + b"\n\n"

    out = [event({"role": "assistant", "content": ""}, None)]
    out += [event({"content": f" t{i}"}, None) for i in range(chunks)]
    out += [event({}, "stop"), b"data: [DONE]\n\n"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default="mock")
    parser.add_argument("--chunks", type=int, default=8)
    args = parser.parse_args()
    body = completion(args.model)
    stream = events(args.model, args.chunks)
    models = json.dumps({"object": "list", "data": [
        {"id": args.model, "object": "model", "created": 0, "owned_by": "mock",
         "max_model_len": 4096}]}).encode()

    async def handle(request: Request, response: Response) -> None:
        if request.method == "GET":
            if request.path == "/v1/models":
                await response.send(200, JSON, models)
            else:
                await response.send(200, JSON, b"{}")
            return
        if b'"stream": true' in request.body or b'"stream":true' in request.body:
            await response.start(200, SSE)
            for event in stream:
                await response.write(event)
            await response.end()
            return
        await response.send(200, JSON, body)

    limits = ServerLimits(max_connections_per_client=100_000, max_connections=100_000)
    trio.run(HttpServer(handle, limits).run, args.host, args.port)


if __name__ == "__main__":
    main()
