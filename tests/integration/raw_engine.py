"""An engine for data-path tests that answers with exact, chosen bytes.

``python -m tests.integration.raw_engine --port P`` serves model ``raw``. ``POST`` bodies
pick what comes back by their ``case`` field: ``echo`` (the request body, byte for byte,
and the request's path and ids in headers), ``sse`` (``SSE``: comments, a usage chunk, a
multi-byte character split across writes, ``[DONE]``), ``sse-cut`` (the first
``SSE_CUT_AFTER`` parts of it, then the connection is dropped, as by an engine that died;
``sse-cut-mid`` drops it in the middle of an event), ``messages-cut`` and
``responses-cut`` (the first events of an Anthropic Messages / OpenAI Responses stream,
which name their events, then the connection is dropped), ``big`` (``BIG_SIZE`` bytes of
JSON). It is the byte-exactness oracle: tests compare what went through otela with it.
"""

from __future__ import annotations

import argparse
import json

import trio

from otela.dataplane.http import HttpServer, Request, Response, ServerLimits

BIG_SIZE = 5 * 1024 * 1024
SSE_PARTS = [
    b": otela test stream\n\n",
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,'
    b'"delta":{"role":"assistant","content":""}}],"usage":null}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,'
    b'"delta":{"content":"caf\xc3',  # a UTF-8 character split across two writes
    b'\xa9 \xe6\x97\xa5\xe6\x9c\xac"}}],"usage":null}\n\n',
    b": keep-alive\n\n",
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[],'
    b'"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}\n\n',
    b"data: [DONE]\n\n",
]
SSE = b"".join(SSE_PARTS)
SSE_CUT_AFTER = 2  # whole parts sent before ``sse-cut`` drops the connection
# Named-event streams broken off after their first events.
NAMED_CUT = {
    "messages-cut": [
        b'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1",'
        b'"type":"message","role":"assistant","model":"raw","content":[],"stop_reason":null,'
        b'"stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":0}}}\n\n',
        b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
        b'"content_block":{"type":"text","text":""}}\n\n',
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"text_delta","text":"half"}}\n\n',
    ],
    "responses-cut": [
        b'event: response.created\ndata: {"type":"response.created","sequence_number":0,'
        b'"response":{"id":"resp_1","object":"response","created_at":1,"status":"in_progress",'
        b'"model":"raw","output":[],"usage":null}}\n\n',
        b'event: response.output_item.added\ndata: {"type":"response.output_item.added",'
        b'"sequence_number":1,"output_index":0,"item":{"id":"msg_1","type":"message",'
        b'"role":"assistant","status":"in_progress","content":[]}}\n\n',
    ],
}


def big_body() -> bytes:
    filler = "x" * (BIG_SIZE - 40)
    return json.dumps({"object": "big", "filler": filler}).encode()


async def handle(request: Request, response: Response) -> None:
    if request.method == "GET":
        if request.path == "/v1/models":
            body = json.dumps({"object": "list", "data": [
                {"id": "raw", "object": "model", "owned_by": "test", "max_model_len": 2048}]})
            await response.send(200, [(b"content-type", b"application/json")], body.encode())
        else:
            await response.send(200, [], b"ok")
        return
    case = json.loads(request.body).get("case", "echo")
    seen = [(b"x-seen-path", request.target),
            (b"x-seen-request-id", request.header(b"x-request-id") or b""),
            (b"x-seen-authorization", request.header(b"authorization") or b"-"),
            (b"x-seen-api-key", request.header(b"x-api-key") or b"-"),
            (b"x-seen-anthropic", request.header(b"anthropic-version") or b"-")]
    if case == "sse":
        await response.start(200, [(b"content-type", b"text/event-stream"), *seen])
        for part in SSE_PARTS:
            await response.write(part)
            await trio.sleep(0.01)
        await response.end()
    elif case in ("sse-cut", "sse-cut-mid", *NAMED_CUT):
        parts = NAMED_CUT.get(case) or SSE_PARTS[: SSE_CUT_AFTER + (case == "sse-cut-mid")]
        await response.start(200, [(b"content-type", b"text/event-stream"), *seen])
        for part in parts:
            await response.write(part)
            await trio.sleep(0.01)
        response.abort()
    elif case == "big":
        await response.send(200, [(b"content-type", b"application/json"), *seen], big_body())
    else:
        await response.send(200, [(b"content-type", b"application/json"), *seen],
                            request.body)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    limits = ServerLimits(max_body_bytes=64 * 1024 * 1024)
    trio.run(HttpServer(handle, limits).run, "127.0.0.1", args.port)


if __name__ == "__main__":
    main()
