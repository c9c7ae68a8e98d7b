"""Model metadata from engine command lines, engine reports and provider overrides."""

from __future__ import annotations

import pytest

from otela.engine.command import EngineCommandError, check_engine_url, parse_engine_command
from otela.engine.metadata import (
    command_metadata,
    enrich,
    parse_llamacpp_props,
    parse_sglang_server_info,
    split_overrides,
)
from otela.registry.records import Lifecycle, ModelInfo, NodeRecord


def meta(command: str):
    return command_metadata(parse_engine_command(command))


def test_vllm_serve_and_module_forms():
    served = meta("vllm serve Qwen/Qwen3-8B --port 8001 --dtype bfloat16 -tp 4 "
                  "--quantization awq --max-model-len 32768")
    assert (served.dtype, served.quantization, served.tensor_parallel, served.max_context) == (
        "bfloat16", "awq", 4, 32768)
    module = parse_engine_command(
        "python -m vllm.entrypoints.openai.api_server --model m --port 9000 "
        "--tensor-parallel-size=2 --dtype auto"
    )
    assert module.kind == "vllm" and module.url == "http://127.0.0.1:9000"
    info = command_metadata(module)
    assert info.tensor_parallel == 2 and info.dtype is None  # "auto" says nothing


def test_sglang_and_llamacpp_forms():
    sglang = parse_engine_command(
        "python -m sglang.launch_server --model-path m --tp-size 8 --context-length 8192"
    )
    assert sglang.kind == "sglang" and sglang.url == "http://127.0.0.1:30000"
    assert command_metadata(sglang).tensor_parallel == 8
    assert command_metadata(sglang).max_context == 8192
    llama = parse_engine_command("llama-server -m /w/Llama-3-8B-Instruct.Q4_K_M.gguf -c 4096")
    assert llama.kind == "llama.cpp" and llama.url == "http://127.0.0.1:8080"
    info = command_metadata(llama)
    assert (info.quantization, info.max_context) == ("Q4_K_M", 4096)


def test_sources_in_order_command_then_engine_then_overrides():
    command = meta("vllm serve m --dtype float16 --max-model-len 1000 -tp 2")
    models = [ModelInfo("a", max_context=900), ModelInfo("b")]
    out = enrich(models, command, {"quantization": "fp8"},
                 {"quantization": "awq-4bit", "family": "qwen3"})
    assert out[0] == ModelInfo("a", 900, "float16", "awq-4bit", 2, (("family", "qwen3"),))
    assert out[1].max_context == 1000  # the engine did not say: the command line does


def test_overrides_are_validated():
    assert split_overrides({"tensor_parallel": "4", "x": "y"}) == (
        {"tensor_parallel": 4}, (("x", "y"),))
    with pytest.raises(ValueError, match="must be an integer"):
        split_overrides({"max_context": "big"})
    with pytest.raises(ValueError, match="must be positive"):
        split_overrides({"tensor_parallel": "0"})


def test_engine_reports():
    assert parse_sglang_server_info(
        {"dtype": "bfloat16", "tp_size": 2, "quantization": None, "context_length": 4096}
    ) == {"dtype": "bfloat16", "tensor_parallel": 2, "max_context": 4096}
    assert parse_sglang_server_info([1]) == {}
    assert parse_llamacpp_props({"default_generation_settings": {"n_ctx": 2048}}) == {
        "max_context": 2048}
    assert parse_llamacpp_props({"default_generation_settings": "x"}) == {}


def test_engine_url_is_checked():
    assert check_engine_url("http://h:1/") == "http://h:1"
    for bad in ("h:1", "ftp://h:1", "http://h:99999", "http://h:1/v1"):
        with pytest.raises(EngineCommandError):
            check_engine_url(bad)


def test_metadata_round_trips_through_the_record():
    model = ModelInfo("a", 512, "bfloat16", "awq", 2, (("family", "llama"),))
    record = NodeRecord("s", "p", "prov", state=Lifecycle.JOIN, version=1, http_url="h",
                        models=(model,))
    assert NodeRecord.from_dict(record.to_dict()).models == (model,)
