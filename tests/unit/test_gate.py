"""The engine hop's gate: what a member may ask of a node's engine."""

import json

from otela.dataplane.gate import EngineGate, Refusal, inference_path

BODY = json.dumps({"model": "m", "messages": []}).encode()


def gate(serving: bool = True) -> EngineGate:
    return EngineGate(lambda: "http://127.0.0.1:8000" if serving else None, lambda: {"m"},
                      max_body_bytes=1000)


def test_inference_paths_and_nothing_else():
    for path in ("/v1/chat/completions", "/v1/embeddings", "/v1/responses?x=1"):
        assert inference_path(path)
    for path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter?x", "/health",
                 "/v1/engine/v1/chat/completions", "/v1/../admin", "/sleep"):
        assert not inference_path(path)


def test_the_gate_lets_a_served_model_through_while_serving():
    assert gate().check("/v1/chat/completions", BODY) == "http://127.0.0.1:8000"


def test_the_gate_refuses_with_a_reason_and_never_runs_anything():
    cases = {
        ("/v1/load_lora_adapter", BODY): 404,
        ("/v1/chat/completions", b"x" * 2000): 413,
        ("/v1/chat/completions", b"{not json"): 400,
        ("/v1/chat/completions", json.dumps({"model": "other"}).encode()): 404,
    }
    for (path, body), status in cases.items():
        verdict = gate().check(path, body)
        assert isinstance(verdict, Refusal) and verdict.status == status, (path, verdict)
    draining = gate(serving=False).check("/v1/chat/completions", BODY)
    assert isinstance(draining, Refusal) and draining.code == "node_not_serving"
