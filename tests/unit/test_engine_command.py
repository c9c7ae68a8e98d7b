import pytest

from otela.engine.command import EngineCommandError, parse_engine_command
from otela.engine.process import parse_models


@pytest.mark.parametrize(
    ("command", "kind", "url"),
    [
        ("vllm serve Qwen/Qwen3-8B --port 8001", "vllm", "http://127.0.0.1:8001"),
        ("vllm serve Qwen/Qwen3-8B", "vllm", "http://127.0.0.1:8000"),
        ("python -m vllm.entrypoints.openai.api_server --port=9000 --host 0.0.0.0", "vllm",
         "http://127.0.0.1:9000"),
        ("python -m sglang.launch_server --model-path m", "sglang", "http://127.0.0.1:30000"),
        ("llama-server -m x.gguf --host 10.1.2.3 --port 8080", "llama.cpp",
         "http://10.1.2.3:8080"),
        ("python -m otela.engine.demo.echo --port 7 --model 'a b'", "echo", "http://127.0.0.1:7"),
        ("myserver --host :: --port 5000", "openai-compatible", "http://127.0.0.1:5000"),
        ("myserver --host ::1 --port 5000", "openai-compatible", "http://[::1]:5000"),
    ],
)
def test_port_and_kind_are_read_from_the_command(command, kind, url):
    parsed = parse_engine_command(command)
    assert (parsed.kind, parsed.url) == (kind, url)


def test_quoted_arguments_stay_whole():
    parsed = parse_engine_command("python -m otela.engine.demo.echo --model 'my model' --port 1")
    assert "my model" in parsed.argv


def test_engine_url_overrides_the_command():
    parsed = parse_engine_command("./serve.sh", engine_url="http://127.0.0.1:1234/")
    assert parsed.url == "http://127.0.0.1:1234"


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("", "empty"),
        ("serve 'unterminated", "cannot parse"),
        ("./my-server", "cannot tell which port"),
        ("vllm serve m --port abc", "not a number"),
        ("vllm serve m --port 70000", "out of range"),
    ],
)
def test_unusable_commands_say_why(command, message):
    with pytest.raises(EngineCommandError, match=message):
        parse_engine_command(command)


def test_models_and_context_lengths_from_v1_models():
    payload = {"data": [{"id": "a", "max_model_len": 4096}, {"id": "b"}, {"nope": 1}, "junk"]}
    models = parse_models(payload)
    assert [(m.id, m.max_context) for m in models] == [("a", 4096), ("b", None)]


def test_bootstrap_lists_in_json_or_lines():
    from otela.mesh.bootstrap import parse_bootstrap_list

    assert parse_bootstrap_list('["/ip4/1.2.3.4/tcp/1/p2p/x"]') == ["/ip4/1.2.3.4/tcp/1/p2p/x"]
    assert parse_bootstrap_list('{"peers": ["a", " b "]}') == ["a", "b"]
    assert parse_bootstrap_list("# comment\n/ip4/a\n\n/ip4/b\n") == ["/ip4/a", "/ip4/b"]
    with pytest.raises(ValueError):
        parse_bootstrap_list('{"peers": [1]}')
