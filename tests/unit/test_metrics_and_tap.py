"""Metrics exposition (checked with the Prometheus text parser), the usage tap, and the
upstream pool's keep-alive reuse."""

from __future__ import annotations

import orjson
from prometheus_client.parser import text_string_to_metric_families

from otela.dataplane.exchange import UsageTap, prompt_text
from otela.metrics import Registry


def families(registry: Registry) -> dict:
    return {f.name: f for f in text_string_to_metric_families(registry.render().decode())}


def test_exposition_parses_and_reflects_what_was_counted():
    registry = Registry()
    requests = registry.counter("otela_requests_total", "Requests.", ("route", "status"))
    latency = registry.histogram("otela_request_duration_seconds", "Latency.",
                                 labels=("route",))
    gauge = registry.gauge("otela_requests_in_flight", "In flight.")
    live = {"value": 3}
    registry.collect(lambda: gauge.set(value=live["value"]))
    requests.inc("/v1/chat/completions", "200")
    requests.inc("/v1/chat/completions", "200")
    requests.inc('/v1/we"ird\n', "502")
    for seconds in (0.0001, 0.003, 0.2, 500.0):
        latency.observe(seconds, "/v1/chat/completions")
    parsed = families(registry)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in parsed.values() for s in f.samples}
    assert samples[("otela_requests_total", (("route", "/v1/chat/completions"),
                                             ("status", "200")))] == 2
    assert samples[("otela_requests_total", (("route", '/v1/we"ird\n'),
                                             ("status", "502")))] == 1
    assert samples[("otela_request_duration_seconds_count",
                    (("route", "/v1/chat/completions"),))] == 4
    assert samples[("otela_request_duration_seconds_bucket",
                    (("le", "0.005"), ("route", "/v1/chat/completions")))] == 2
    assert samples[("otela_request_duration_seconds_bucket",
                    (("le", "+Inf"), ("route", "/v1/chat/completions")))] == 4
    assert samples[("otela_requests_in_flight", ())] == 3
    live["value"] = 0
    assert {s.value for s in families(registry)["otela_requests_in_flight"].samples} == {0}
    assert latency.quantile_bound(0.5, "/v1/chat/completions") == 0.005


def sse(*events: dict | str) -> bytes:
    out = b""
    for event in events:
        data = event if isinstance(event, str) else orjson.dumps(event).decode()
        out += f"data: {data}\n\n".encode()
    return out


def test_the_tap_reads_usage_from_a_json_body_without_changing_it():
    tap = UsageTap(stream=False)
    body = orjson.dumps({"choices": [], "usage": {"prompt_tokens": 12,
                                                  "completion_tokens": 34}})
    tap.chunk(body[:10])
    tap.chunk(body[10:])
    tap.finish()
    assert (tap.prompt_tokens, tap.output_tokens) == (12, 34)
    assert tap.first_chunk is not None


def test_the_tap_counts_stream_events_and_prefers_the_engines_usage():
    chunk = {"choices": [{"delta": {"content": "x"}}], "usage": None}
    stream = sse({"choices": [{"delta": {"role": "assistant", "content": ""}}]},
                 chunk, chunk, chunk, "[DONE]")
    tap = UsageTap(stream=True)
    for i in range(0, len(stream), 7):  # events split anywhere across reads
        tap.chunk(stream[i:i + 7])
    tap.finish()
    assert tap.output_tokens == 3 and tap.prompt_tokens is None
    assert len(tap.gaps) == len(range(0, len(stream), 7)) - 1
    with_usage = sse(chunk, {"choices": [], "usage": {"prompt_tokens": 5,
                                                      "completion_tokens": 7}}, "[DONE]")
    tap = UsageTap(stream=True)
    tap.chunk(with_usage)
    assert (tap.prompt_tokens, tap.output_tokens) == (5, 7)


def test_prompt_text_of_chat_and_completion_bodies():
    assert prompt_text({"prompt": "once upon"}) == "once upon"
    assert prompt_text({"messages": [{"role": "user", "content": "a"},
                                     {"role": "user", "content": [{"text": "b"}]}]}) == "a\nb"
    assert prompt_text({"messages": "nonsense"}) is None
