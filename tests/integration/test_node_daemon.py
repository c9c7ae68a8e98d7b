"""The node daemon around an engine: drain on SIGTERM, fail-stop, log sink, config errors.

Real otela processes and real echo-engine processes on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from otela.testing.localfed import echo_engine_command, free_port, wait_for

from .helpers import CONVERGE_S, chat, wait_state

pytestmark = pytest.mark.slow

OOM_LINE = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB"


def _states_seen(observer, target, seen: list[str], stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            state = observer.states().get(target.session_id)
        except httpx.HTTPError:
            continue
        if state and (not seen or seen[-1] != state):
            seen.append(state)
        stop.wait(0.05)


def test_sigterm_drains_in_flight_requests_then_announces_left(federation):
    ingress = federation.start_node("ingress", ingress=True)
    engine = echo_engine_command(free_port(), ["slow"], "--token-delay", "0.25")
    server = federation.start_node("server", bootstrap=[ingress], process=engine,
                                   extra_args=["--drain-grace", "20"])
    wait_state(ingress, server, "SERVING")

    results: list[httpx.Response] = []
    words = " ".join(f"w{i}" for i in range(12))  # 13 tokens at 0.25 s: ~3 s per answer
    def send() -> None:
        results.append(chat(ingress, "slow", words))
    threads = [threading.Thread(target=send) for _ in range(4)]
    streamed: list[str] = []
    def stream() -> None:
        body = {"model": "slow", "stream": True, "messages": [{"role": "user", "content": words}]}
        with httpx.stream("POST", f"{ingress.http_url}/v1/chat/completions", json=body,
                          timeout=30, trust_env=False) as response:
            streamed.extend(line for line in response.iter_lines() if line.startswith("data: "))
    threads.append(threading.Thread(target=stream))
    for thread in threads:
        thread.start()
    wait_for(lambda: server.get("/v1/health")["in_flight"] == 5, 10, "5 requests in flight")

    seen: list[str] = []
    stop = threading.Event()
    watcher = threading.Thread(target=_states_seen, args=(ingress, server, seen, stop))
    watcher.start()
    try:
        server.process.send_signal(15)
        wait_state(ingress, server, "DOWN")
        assert server.process.poll() is None  # still draining
        for thread in threads:
            thread.join(30)
        assert server.process.wait(timeout=30) == 0
        wait_state(ingress, server, "LEFT")
    finally:
        stop.set()
        watcher.join()
    assert [r.status_code for r in results] == [200] * 4
    assert all(r.json()["choices"][0]["message"]["content"] == "echo: " + words for r in results)
    assert streamed[-1] == "data: [DONE]"
    assert seen[-2:] == ["DOWN", "LEFT"]
    assert "announced DOWN" in server.log_tail(50) and "announced LEFT" in server.log_tail(50)


def test_engine_crash_is_fail_stop_with_logs_in_the_sink(federation, tmp_path):
    sink = tmp_path / "sink"
    ingress = federation.start_node("ingress", ingress=True)
    engine = echo_engine_command(free_port(), ["crashy"], "--exit-after", "1")
    server = federation.start_node("server", bootstrap=[ingress], process=engine,
                                   provider_id="lab", extra_args=["--log-sink", str(sink)])
    wait_state(ingress, server, "SERVING")
    assert chat(ingress, "crashy").status_code == 200
    chat(ingress, "crashy")  # the engine dies on this one
    wait_state(ingress, server, "DOWN")
    assert server.process.wait(timeout=20) == 3
    (copied,) = sink.iterdir()
    assert copied.name.startswith(f"lab-{server.session_id[:12]}-")
    assert "engine exited with code 17" in (copied / "reason.txt").read_text()
    assert "--- otela: launching" in (copied / "engine.log").read_text()
    assert f"engine logs copied to {copied}" in server.log_tail()


def test_a_fatal_engine_log_line_evicts_the_node(federation, tmp_path):
    ingress = federation.start_node("ingress", ingress=True)
    engine = echo_engine_command(free_port(), ["oom"], "--log-on-request", OOM_LINE)
    server = federation.start_node("server", bootstrap=[ingress], process=engine,
                                   extra_args=["--log-sink", str(tmp_path / "sink")])
    wait_state(ingress, server, "SERVING")
    chat(ingress, "oom")
    wait_state(ingress, server, "DOWN")
    assert server.process.wait(timeout=20) == 3
    (copied,) = (tmp_path / "sink").iterdir()
    assert "CUDA out of memory" in (copied / "reason.txt").read_text()
    assert OOM_LINE in (copied / "engine.log").read_text()


def test_idle_node_and_provider_metadata_are_in_every_registry(federation):
    ingress = federation.start_node("ingress", ingress=True)
    idle = federation.start_node("idle", bootstrap=[ingress],
                                 extra_args=["--gpus", "2xA100-SXM4:80", "--cpus", "64"])
    engine = echo_engine_command(free_port(), ["meta-model"])
    server = federation.start_node(
        "server", bootstrap=[ingress], process=engine,
        extra_args=["--model-meta", "quantization=awq-4bit", "--model-meta", "family=echo"],
    )
    wait_state(ingress, server, "SERVING")
    for observer in (ingress, idle, server):
        wait_for(lambda observer=observer: observer.states().get(idle.session_id) == "JOIN"
                 and observer.states().get(server.session_id) == "SERVING",
                 CONVERGE_S, f"{observer.name} to see both")
        nodes = {n["session_id"]: n for n in observer.nodes()}
        assert nodes[idle.session_id]["idle"] is True
        assert nodes[idle.session_id]["hardware"]["cpus"] == 64
        assert [g["name"] for g in nodes[idle.session_id]["hardware"]["gpus"]] == ["A100-SXM4"] * 2
        assert nodes[server.session_id]["idle"] is False
        (model,) = observer.get("/v1/registry/models")["models"]
        (session,) = model["sessions"]
        assert session["model"] == {"id": "meta-model", "max_context": 4096, "dtype": None,
                                    "quantization": "awq-4bit", "tensor_parallel": None,
                                    "meta": {"family": "echo"}}


@contextlib.contextmanager
def external_echo(port: int, model: str) -> Iterator[subprocess.Popen[bytes]]:
    """An echo engine on ``port`` that otela did not launch, healthy, stopped after."""
    argv = [sys.executable, "-m", "otela.engine.demo.echo", "--port", str(port), "--model",
            model]
    engine = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{port}/health", trust_env=False)
                 .status_code == 200, 20, f"the external engine on port {port}")
        yield engine
    finally:
        engine.terminate()
        engine.wait(10)


def test_fronting_an_already_running_engine_by_url(federation, tmp_path):
    port = free_port()
    with external_echo(port, "ext") as engine:
        ingress = federation.start_node("ingress", ingress=True)
        server = federation.start_node("server", bootstrap=[ingress],
                                       extra_args=["--engine-url", f"http://127.0.0.1:{port}"])
        wait_state(ingress, server, "SERVING")
        assert chat(ingress, "ext", "hi").json()["choices"][0]["message"]["content"] == "echo: hi"
        assert federation.stop_node(server) == 0
        assert engine.poll() is None  # otela did not launch it, so it does not stop it


def test_an_engine_port_held_by_another_server_is_fail_stop_not_a_false_serving(federation):
    # Another server already answers /v1/models and /health on the port: readiness asked
    # over HTTP would take it for the launched engine (which cannot bind) and announce it.
    port = free_port()
    with external_echo(port, "squatter") as squatter:
        ingress = federation.start_node("ingress", ingress=True)
        server = federation.start_node("server", bootstrap=[ingress],
                                       process=echo_engine_command(port, ["mine"]))
        assert server.process.wait(timeout=30) == 3
        assert f"something already listens at http://127.0.0.1:{port}" in server.log_tail(40)
        assert "SERVING" not in ingress.states().values()
        assert squatter.poll() is None  # left alone


def _start(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
           config: str | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("OTELA_")}
    full_env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    if config is not None:
        path = tmp_path / "xdg" / "otela" / "config.toml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "otela", "start", "--home", str(tmp_path / "home"),
         "--host", "127.0.0.1", "--http-port", "0", "--p2p-port", "0", *args],
        env=full_env, capture_output=True, text=True, timeout=60,
    )


@pytest.mark.parametrize(
    ("args", "env", "config", "needle"),
    [
        ((), {}, "[engine]\nreadiness = 5\n", "unknown key 'readiness' in [engine]"),
        ((), {"OTELA_DRAIN_GRACE": "soon"}, None, "bad value for drain_grace (OTELA_DRAIN_GRACE)"),
        ((), {}, "[node]\nhttp_port = true\n", "bad value for http_port"),
        (("--engine-url", "http://127.0.0.1:1"), {}, None, "http://127.0.0.1:1 is unreachable"),
        (("--engine-url", "localhost:8000"), {}, None, "bad engine URL"),
        (("--model-meta", "tensor_parallel=two"), {}, None, "tensor_parallel must be an integer"),
        (("--gpus", "lots"), {}, None, "bad GPU spec"),
        (("--process", "vllm serve m --port x"), {}, None, "engine --port is not a number"),
        (("--config", "/nonexistent/otela.toml"), {}, None, "does not exist"),
    ],
)
def test_bad_configuration_is_a_clear_message_and_exit_2(tmp_path, args, env, config, needle):
    result = _start(tmp_path, *args, env=env, config=config)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr


def test_init_then_config_show_reports_values_and_sources(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTELA_")}
    env.update(XDG_CONFIG_HOME=str(tmp_path), OTELA_DRAIN_GRACE="12")
    otela = [sys.executable, "-m", "otela"]
    created = subprocess.run([*otela, "init"], env=env, capture_output=True, text=True)
    assert created.returncode == 0
    path = tmp_path / "otela" / "config.toml"
    assert path.exists()
    again = subprocess.run([*otela, "init"], env=env, capture_output=True, text=True)
    assert again.returncode == 1 and "already exists" in again.stderr
    path.write_text(path.read_text().replace("# http_port = 8092", "http_port = 9000"))
    shown = subprocess.run([*otela, "config", "show", "--json"], env=env, capture_output=True,
                           text=True)
    settings = json.loads(shown.stdout)["settings"]
    assert settings["node.http_port"] == {"value": "9000", "source": f"file {path}",
                                          "env": "OTELA_HTTP_PORT"}
    assert settings["shutdown.drain_grace"]["value"] == "12.0"
    assert settings["shutdown.drain_grace"]["source"] == "env"
    assert settings["node.p2p_port"]["source"] == "default"
    table = subprocess.run([*otela, "config", "show"], env=env, capture_output=True, text=True)
    assert "node.http_port" in table.stdout and "9000" in table.stdout


def _held_port() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


@pytest.mark.parametrize("which", ["http", "p2p"])
def test_a_port_in_use_is_one_line_and_exit_2(tmp_path, which):
    with _held_port() as held:
        port = str(held.getsockname()[1])
        flag = "--http-port" if which == "http" else "--p2p-port"
        result = _start(tmp_path, flag, port)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "──" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("otela: ")]
    assert len(errors) == 1 and "cannot listen" in errors[0] and port in errors[0], errors


@pytest.mark.parametrize("case", ["home is a file", "key is a directory", "key is short"])
def test_an_unusable_home_or_key_is_one_line_and_exit_2(tmp_path, case):
    home = tmp_path / "home"
    if case == "home is a file":
        home.write_text("not a directory")
    elif case == "key is a directory":
        (home / "identity.key").mkdir(parents=True)
    else:
        home.mkdir()
        (home / "identity.key").write_bytes(b"short")
    result = _start(tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("otela: ")
