"""The echo engine: a small, real OpenAI-compatible server that answers deterministically.

It is a stand-in for vLLM/SGLang so the demo and the tests need no GPU and no weights:
it speaks the same HTTP API (``/v1/models``, ``/health``, chat and text completions,
embeddings, OpenAI's Responses API and Anthropic's Messages API, streaming and not, with
token usage in each shape: ``shapes.py``), but its "model" echoes the prompt back one
whitespace-delimited token at a time. Bad input is refused as a real engine refuses it: a
400 naming the field, before anything runs. It can be told to be slow (``--token-delay``,
``--startup-delay``) or to fail (``--fail-every``, ``--exit-after``; on every generating
route, in the route's own error shape) so tests can exercise otela's behaviour under slow
and failing engines.

Run: ``python -m otela.engine.demo.echo --port 8000 --model echo-small``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import trio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from otela.api.errors import (
    error_response,
    install_error_handlers,
    read_json_object,
    require_model,
)
from otela.dataplane.errors import RequestError, clip
from otela.engine.demo import shapes

DEFAULT_MAX_CONTEXT = 4096


@dataclass
class EchoSettings:
    models: tuple[str, ...]
    max_context: int = DEFAULT_MAX_CONTEXT
    token_delay: float = 0.0
    fail_every: int = 0
    fail_status: int = 500
    exit_after: int = 0
    log_on_request: str = ""
    request_delay: float = 0.0
    max_concurrency: int = 0  # 0: unlimited
    fail_while: str = ""  # a path: while it exists, every completion request fails


def tokenize(text: str) -> list[str]:
    """Split into tokens that concatenate back to ``text`` (each word keeps its leading space)."""
    tokens: list[str] = []
    for i, word in enumerate(text.split()):
        tokens.append(word if i == 0 else " " + word)
    return tokens


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multi-part content: keep the text parts
        return " ".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
    return ""


def _validate(body: dict[str, Any], chat: bool) -> None:
    """The checks a real engine makes before it runs anything: bad fields are a 400 that
    names them, like vLLM's, never a 500."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError(400, "'messages' must be a non-empty list", param="messages")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise RequestError(400, f"messages[{i}] must be an object with a 'role'",
                               param=f"messages[{i}]")
            content = message.get("content")
            if content is not None and not isinstance(content, str | list):
                raise RequestError(400, f"messages[{i}].content must be a string or a list of "
                               "parts", param=f"messages[{i}].content")
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str) and not (
            isinstance(prompt, list) and all(isinstance(p, str | int) for p in prompt)
        ):
            raise RequestError(400, "'prompt' must be a string or a list of strings or tokens",
                           param="prompt")
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 1):
            raise RequestError(400, f"'{name}' must be a positive integer", param=name)
    if not isinstance(body.get("stream", False), bool):
        raise RequestError(400, "'stream' must be a boolean", param="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError(400, "'stream_options' must be an object", param="stream_options")


def _chat_prompt(body: dict[str, Any]) -> tuple[str, int]:
    messages = body["messages"]
    texts = [_content_text(m.get("content")) for m in messages if isinstance(m, dict)]
    users = [
        _content_text(m.get("content"))
        for m in messages
        if isinstance(m, dict) and m.get("role") == "user"
    ]
    prompt_tokens = sum(len(tokenize(t)) for t in texts)
    return (users[-1] if users else texts[-1]), prompt_tokens


def _text_prompt(body: dict[str, Any]) -> tuple[str, int]:
    prompt = body["prompt"]
    if isinstance(prompt, list):
        prompt = " ".join(str(p) for p in prompt)
    return prompt, len(tokenize(prompt))


def _limit(body: dict[str, Any], kind: str) -> int | None:
    """The most tokens the request lets the answer have."""
    if kind == "responses":
        limit = body.get("max_output_tokens")
    elif kind == "messages":
        limit = body.get("max_tokens")
    else:
        limit = body.get("max_tokens") or body.get("max_completion_tokens")
    return limit if isinstance(limit, int) else None


def _answer(prompt: str, limit: int | None, after: str = "") -> tuple[list[str], str]:
    """The answer's tokens and finish reason; ``after``: the part of it already given
    (a continued final assistant message), which the answer then goes on from."""
    tokens = tokenize(f"echo: {prompt}")
    if after:
        given = next((k for k in range(len(tokens) + 1) if "".join(tokens[:k]) == after), 0)
        tokens = tokens[given:]
    if limit is not None and 0 < limit < len(tokens):
        return tokens[:limit], "length"
    return tokens, "stop"


def _continued(body: dict[str, Any]) -> str:
    """With ``continue_final_message`` (vLLM's chat extension), the final assistant
    message's text, which the answer continues; else ``""``."""
    messages = body.get("messages")
    if body.get("continue_final_message") is not True or not isinstance(messages, list) \
            or not messages or not isinstance(messages[-1], dict) \
            or messages[-1].get("role") != "assistant":
        return ""
    return _content_text(messages[-1].get("content"))


def _split_continuation(prompt: str) -> tuple[str, str]:
    """A completions prompt that ends part-way through the echo's own answer to what
    precedes it (a stream continued on another node sends the prompt followed by the
    partial answer) goes on from there, as a model's greedy decoding would: the original
    prompt and the part already given; else ``(prompt, "")``."""
    at = prompt.find("echo:")
    while at >= 0:
        head, given = prompt[:at], prompt[at:]
        joined = ""
        for token in tokenize(f"echo: {head}"):
            joined += token
            if joined == given:
                return head, given
            if len(joined) >= len(given):
                break
        at = prompt.find("echo:", at + 1)
    return prompt, ""


# The routes, by the API shape they speak.
ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completion",
          "/v1/embeddings": "embedding", "/v1/responses": "responses",
          "/v1/messages": "messages", "/v1/messages/count_tokens": "count_tokens"}
_ANTHROPIC = frozenset({"messages", "count_tokens"})


def _prompt(body: dict[str, Any], kind: str) -> tuple[str, int]:
    """Check ``body`` as a ``kind`` request (400 naming the field); its prompt text and
    token count."""
    if kind in ("chat", "completion"):
        _validate(body, kind == "chat")
        return _chat_prompt(body) if kind == "chat" else _text_prompt(body)
    if kind == "embedding":
        texts = shapes.embedding_inputs(body)
        return "", sum(len(tokenize(t)) for t in texts)
    if kind == "responses":
        return shapes.responses_prompt(body, tokenize)
    return shapes.messages_prompt(body, tokenize, count_only=kind == "count_tokens")


def create_app(settings: EchoSettings) -> FastAPI:
    app = FastAPI(title="otela echo engine", docs_url=None, redoc_url=None)
    install_error_handlers(app)
    created = int(time.time())
    counter = {"requests": 0, "running": 0, "waiting": 0}
    slots = trio.Semaphore(settings.max_concurrency) if settings.max_concurrency else None

    @app.get("/metrics")
    async def metrics() -> Response:
        """vLLM's load gauges, so routing's engine-metrics path runs against this too."""
        labels = f'model_name="{settings.models[0]}"'
        text = (f"# TYPE vllm:num_requests_running gauge\n"
                f"vllm:num_requests_running{{{labels}}} {counter['running']}.0\n"
                f"# TYPE vllm:num_requests_waiting gauge\n"
                f"vllm:num_requests_waiting{{{labels}}} {counter['waiting']}.0\n")
        return Response(text, media_type="text/plain; version=0.0.4")

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": m,
                    "object": "model",
                    "created": created,
                    "owned_by": "otela-echo",
                    "max_model_len": settings.max_context,
                }
                for m in settings.models
            ],
        }

    def failed(kind: str, status: int, message: str) -> Response:
        """An error in the shape the route's clients read."""
        if kind in _ANTHROPIC:
            return JSONResponse(shapes.anthropic_error(status, message), status_code=status)
        return error_response(status, message)

    async def serve(request: Request, kind: str) -> Response:
        try:
            body = await read_json_object(request)
            model = require_model(body)
            if model not in settings.models:
                raise RequestError(404, f"The model `{clip(model)}` does not exist.",
                                   code="model_not_found")
            prompt = _prompt(body, kind)
        except RequestError as error:
            if kind not in _ANTHROPIC:
                raise  # the OpenAI-style handlers answer it
            return failed(kind, error.status, error.message)
        if kind == "count_tokens":
            return JSONResponse({"input_tokens": prompt[1]})
        counter["requests"] += 1
        n = counter["requests"]
        if settings.log_on_request:  # lets tests make the engine print e.g. a CUDA OOM line
            print(settings.log_on_request, file=sys.stderr, flush=True)
        if settings.exit_after and n > settings.exit_after:
            os._exit(17)  # simulate an engine crash: no cleanup, like a real fault
        if settings.fail_every and n % settings.fail_every == 0:
            return failed(kind, settings.fail_status, f"echo engine: injected failure #{n}")
        if settings.fail_while and os.path.exists(settings.fail_while):
            return failed(kind, settings.fail_status, "echo engine: failing while "
                          f"{settings.fail_while} exists")
        if slots is None:
            return await _answer_request(body, model, kind, prompt)
        counter["waiting"] += 1
        try:
            await slots.acquire()
        finally:
            counter["waiting"] -= 1
        try:
            return await _answer_request(body, model, kind, prompt)
        finally:
            slots.release()

    async def _answer_request(body: dict[str, Any], model: str, kind: str,
                              prompt: tuple[str, int]) -> Response:
        """Generate, holding one of the engine's slots until the answer is ready (a
        streamed answer's tokens follow after the slot is free: slots model the prefill
        and the whole of a non-streamed answer)."""
        counter["running"] += 1
        try:
            if settings.request_delay:
                await trio.sleep(settings.request_delay)
            if kind == "embedding":
                texts = shapes.embedding_inputs(body)
                return JSONResponse(shapes.embeddings_body(body, model, texts, tokenize))
            if kind == "responses":
                return await _respond_responses(body, model, prompt)
            if kind == "messages":
                return await _respond_messages(body, model, prompt)
            return await _respond(body, model, kind == "chat", prompt)
        finally:
            counter["running"] -= 1

    async def _whole(tokens: list[str]) -> None:
        """A non-streamed answer takes as long as its tokens would have."""
        if settings.token_delay:
            await trio.sleep(settings.token_delay * len(tokens))

    async def _named_stream(events: Iterator[tuple[str, dict[str, Any]]], delta: str,
                            numbered: bool) -> AsyncIterator[bytes]:
        for sequence, (name, data) in enumerate(events):
            if name == delta and settings.token_delay:
                await trio.sleep(settings.token_delay)
            yield shapes.named_event(name, data, sequence if numbered else None)

    async def _respond_responses(body: dict[str, Any], model: str,
                                 prompt: tuple[str, int]) -> Response:
        tokens, finish = _answer(prompt[0], _limit(body, "responses"))
        answer = shapes.ResponsesAnswer(body, model, "resp_" + uuid.uuid4().hex[:24],
                                        int(time.time()), tokens, finish == "length",
                                        prompt[1])
        if body.get("stream"):
            return StreamingResponse(_named_stream(answer.events(),
                                                   "response.output_text.delta", True),
                                     media_type="text/event-stream")
        await _whole(tokens)
        return JSONResponse(answer.response())

    async def _respond_messages(body: dict[str, Any], model: str,
                                prompt: tuple[str, int]) -> Response:
        tokens, finish = _answer(prompt[0], _limit(body, "messages"))
        answer = shapes.MessagesAnswer(model, "msg_" + uuid.uuid4().hex[:24], tokens,
                                       finish == "length", prompt[1])
        if body.get("stream"):
            return StreamingResponse(_named_stream(answer.events(), "content_block_delta",
                                                   False),
                                     media_type="text/event-stream")
        await _whole(tokens)
        return JSONResponse(answer.message())

    async def _respond(body: dict[str, Any], model: str, chat: bool,
                       prompt: tuple[str, int]) -> Response:
        text_prompt, prompt_tokens = prompt
        text_prompt, after = (text_prompt, _continued(body)) if chat \
            else _split_continuation(text_prompt)
        tokens, finish = _answer(text_prompt, _limit(body, "chat"), after)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": len(tokens),
            "total_tokens": prompt_tokens + len(tokens),
        }
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            events = _stream(rid, model, chat, tokens, finish, usage if include_usage else None)
            return StreamingResponse(events, media_type="text/event-stream")
        text = "".join(tokens)
        await _whole(tokens)
        choice: dict[str, Any] = (
            {"index": 0, "message": {"role": "assistant", "content": text}}
            if chat
            else {"index": 0, "text": text, "logprobs": None}
        )
        choice["finish_reason"] = finish
        return JSONResponse(
            {
                "id": rid,
                "object": "chat.completion" if chat else "text_completion",
                "created": int(time.time()),
                "model": model,
                "choices": [choice],
                "usage": usage,
            }
        )

    async def _stream(
        rid: str,
        model: str,
        chat: bool,
        tokens: list[str],
        finish: str,
        usage: dict[str, int] | None,
    ) -> AsyncIterator[bytes]:
        obj = "chat.completion.chunk" if chat else "text_completion"
        created_at = int(time.time())

        def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            payload = {
                "id": rid,
                "object": obj,
                "created": created_at,
                "model": model,
                "choices": choices,
                **extra,
            }
            return f"data: {json.dumps(payload)}\n\n".encode()

        if chat:
            yield event(
                [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]
            )
        for token in tokens:
            if settings.token_delay:
                await trio.sleep(settings.token_delay)
            delta: dict[str, Any] = {"delta": {"content": token}} if chat else {"text": token}
            yield event([{"index": 0, **delta, "finish_reason": None}])
        last: dict[str, Any] = {"delta": {}} if chat else {"text": ""}
        yield event([{"index": 0, **last, "finish_reason": finish}])
        if usage is not None:
            yield event([], usage=usage)
        yield b"data: [DONE]\n\n"

    def route(kind: str) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            return await serve(request, kind)
        return handle

    for path, kind in ROUTES.items():
        app.add_api_route(path, route(kind), methods=["POST"], name=kind)
    return app


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, EchoSettings]:
    parser = argparse.ArgumentParser(
        prog="python -m otela.engine.demo.echo",
        description="otela's stand-in OpenAI-compatible engine: echoes prompts deterministically.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--model", action="append", required=True, help="model id to serve (repeatable)"
    )
    parser.add_argument("--max-context", type=int, default=DEFAULT_MAX_CONTEXT)
    parser.add_argument(
        "--token-delay", type=float, default=0.0, help="seconds between generated tokens (be slow)"
    )
    parser.add_argument(
        "--startup-delay",
        type=float,
        default=0.0,
        help="seconds before the server starts listening (slow load)",
    )
    parser.add_argument(
        "--fail-every",
        type=int,
        default=0,
        help="every N-th completion request fails with --fail-status",
    )
    parser.add_argument("--fail-status", type=int, default=500)
    parser.add_argument(
        "--fail-while",
        default="",
        metavar="PATH",
        help="while this file exists, every completion request fails with --fail-status",
    )
    parser.add_argument(
        "--request-delay",
        type=float,
        default=0.0,
        help="seconds of work per request before the first token (a slower GPU)",
    )
    parser.add_argument(
        "--max-concurrency",
        type=int,
        default=0,
        help="requests generated at once (an engine's batch slots); more wait (default: no "
        "limit)",
    )
    parser.add_argument(
        "--exit-after",
        type=int,
        default=0,
        help="crash (exit 17) on the completion request after the N-th",
    )
    parser.add_argument(
        "--log-on-request",
        default="",
        help="print this line to stderr on every completion request (log-pattern tests)",
    )
    parser.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="on SIGTERM/SIGINT, stop accepting and give in-flight requests this many seconds",
    )
    args = parser.parse_args(argv)
    settings = EchoSettings(
        models=tuple(args.model),
        max_context=args.max_context,
        token_delay=args.token_delay,
        fail_every=args.fail_every,
        fail_status=args.fail_status,
        exit_after=args.exit_after,
        log_on_request=args.log_on_request,
        request_delay=args.request_delay,
        max_concurrency=args.max_concurrency,
        fail_while=args.fail_while,
    )
    return args, settings


def main(argv: Sequence[str] | None = None) -> None:
    from hypercorn.config import Config
    from hypercorn.trio import serve

    args, settings = parse_args(argv)
    config = Config()
    config.bind = [f"{args.host}:{args.port}"]
    config.accesslog = None
    config.errorlog = "-"
    config.loglevel = "WARNING"
    config.graceful_timeout = args.drain_timeout

    async def stop_signal() -> None:
        # Like vLLM's uvicorn: a stop signal stops accepting, in-flight requests finish.
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                return

    async def run() -> None:
        if args.startup_delay:
            await trio.sleep(args.startup_delay)
        await serve(create_app(settings), config, shutdown_trigger=stop_signal)  # type: ignore[arg-type]

    with contextlib.suppress(KeyboardInterrupt):
        trio.run(run)


if __name__ == "__main__":
    main()
