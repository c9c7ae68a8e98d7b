"""The engine hop's gate and the canonical paths every routing decision is made on."""

import json

import pytest

from otela.dataplane.gate import (
    INFERENCE_ROUTES,
    EngineGate,
    Pass,
    PathError,
    Refusal,
    Routes,
    canonical_path,
)
from otela.dataplane.headers import relayed

BODY = json.dumps({"model": "m", "messages": []}).encode()
ENGINE = "http://127.0.0.1:8000"


def gate(serving: bool = True, routes: Routes | None = None) -> EngineGate:
    return EngineGate(lambda: ENGINE if serving else None, lambda: {"m"},
                      max_body_bytes=1000, **({"routes": routes} if routes else {}))


def test_canonical_paths_are_what_engines_decode_them_to():
    cases = {
        "/v1/chat/completions": "/v1/chat/completions",
        "/v1/chat/completions?x=%41": "/v1/chat/completions?x=%41",  # query as sent
        "/v1/chat/completions/": "/v1/chat/completions",
        "/v1//chat///completions": "/v1/chat/completions",
        "/v1/load%5Flora%5Fadapter": "/v1/load_lora_adapter",
        "/v1/%6Coad_lora_adapter": "/v1/load_lora_adapter",
        "/v1/%6coad_lora_adapter/": "/v1/load_lora_adapter",
        "/v1/.well-known": "/v1/.well-known",
        "/V1/Chat/Completions": "/V1/Chat/Completions",  # case kept: engines match exactly
        "/v1/caf%C3%A9": "/v1/café",
    }
    for raw, canonical in cases.items():
        assert canonical_path(raw) == canonical, raw


@pytest.mark.parametrize("raw", [
    "/v1/chat/completions#frag", "/v1/load_lora_adapter#", "/v1/../admin", "/v1/./chat",
    "/v1/%2e%2e/admin", "/v1/x/%2E/y", "/v1/load%255Flora_adapter", "/v1/a%5Cb", "/v1\\x",
    "/v1/%00", "/v1/%0d%0aX-Injected:%201", "/v1/%ff", "v1/chat/completions", "",
    "%2Fv1/chat/completions",
])
def test_targets_without_a_canonical_path_are_refused(raw):
    with pytest.raises(PathError):
        canonical_path(raw)


def test_only_allowlisted_inference_routes_are_relayed():
    routes = Routes()
    for path in INFERENCE_ROUTES:
        assert routes.inference(path) and routes.inference(path + "?x=1")
    for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/health", "/sleep",
                 "/v1/engine/v1/chat/completions", "/v1/models", "/v1/audio/anything",
                 "/v1/chat/completions/batch", "/V1/chat/completions", "/v1/admin/keys",
                 "/start_profile", "/v1/responses/abc/cancel"):
        assert not routes.inference(path), path
    extended = Routes(["/v1/images/edits"])
    assert extended.inference("/v1/images/edits") and not routes.inference("/v1/images/edits")
    for bad in ("/v1/x/", "/v1/%41", "/health", "/v1/engine/v1/x", "/v1/x?y"):
        with pytest.raises(ValueError):
            Routes([bad])


def test_the_gate_lets_a_served_model_through_while_serving_on_the_canonical_path():
    assert gate().check("/v1/chat/completions", BODY) == Pass(ENGINE, "/v1/chat/completions",
                                                                 300.0)
    assert gate().check("/v1/chat//completions/?a=b", BODY) == Pass(
        ENGINE, "/v1/chat/completions?a=b", 300.0)


def test_the_gate_refuses_with_a_reason_and_never_runs_anything():
    cases = {
        ("/v1/load_lora_adapter", BODY): 404,
        ("/v1/load%5Flora%5Fadapter", BODY): 404,
        ("/v1/%6Coad_lora_adapter", BODY): 404,
        ("/v1/load_lora_adapter/", BODY): 404,
        ("/v1/load_lora_adapter#x", BODY): 400,
        ("/v1/chat/completions/../../v1/load_lora_adapter", BODY): 400,
        ("/v1/chat/completions", b"x" * 2000): 413,
        ("/v1/chat/completions", b"{not json"): 400,
        ("/v1/chat/completions", json.dumps({"model": "other"}).encode()): 404,
    }
    for (path, body), status in cases.items():
        verdict = gate().check(path, body)
        assert isinstance(verdict, Refusal) and verdict.status == status, (path, verdict)
    draining = gate(serving=False).check("/v1/chat/completions", BODY)
    assert isinstance(draining, Refusal) and draining.code == "node_not_serving"


def test_an_engines_redirect_never_reaches_the_client_with_its_address():
    upstream = [(b"location", b"http://127.0.0.1:8000/v1/load_lora_adapter"),
                (b"content-type", b"application/json")]
    assert relayed(upstream) == [(b"content-type", b"application/json")]


def test_first_byte_timeouts_follow_what_the_request_asks_for():
    from otela.dataplane.deadline import FirstByteTimeouts

    timeouts = FirstByteTimeouts()
    assert timeouts.for_body({"stream": True, "max_tokens": 10_000}) == 60.0
    assert timeouts.for_body({"max_tokens": 256}) == 60.0 + 25.6
    assert timeouts.for_body({"max_completion_tokens": 100_000}) == 300.0
    assert timeouts.for_body({}) == 300.0
    assert timeouts.for_body({"max_tokens": True}) == 300.0  # not a number of tokens
    verdict = gate().check("/v1/chat/completions", json.dumps(
        {"model": "m", "max_tokens": 10}).encode())
    assert isinstance(verdict, Pass) and verdict.first_byte_s == 61.0
