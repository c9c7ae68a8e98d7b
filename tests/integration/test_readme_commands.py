"""The README's "Running nodes" commands, run as a user types them: only what cannot be
the same on this machine is swapped (addresses and ports for free local ones, the ingress's
real p2p address for the example one, and otela's echo engine serving the same model name
for ``vllm serve``, which needs a GPU and the model's weights)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from otela.testing.localfed import free_port, wait_for

from .helpers import CONVERGE_S

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    """The shell commands of README.md's "Running nodes" block, continuations joined."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Running nodes", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```sh\n(.*?)```", section, flags=re.S)
    assert block, "README.md lost its Running nodes commands"
    text = block.group(1).replace("\\\n", " ")
    return [" ".join(line.split()) for line in text.splitlines()
            if line.strip() and not line.strip().startswith("#")]


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()


def test_the_readme_commands_start_a_federation_that_answers(tmp_path: Path, started):
    ingress_cmd, node_cmd, curl_cmd = readme_commands()
    assert ingress_cmd.startswith("otela start --ingress")
    assert node_cmd.startswith("otela start --bootstrap")
    assert curl_cmd.startswith("curl http://")
    otela = str(Path(sys.executable).with_name("otela"))
    http_port, p2p_port, engine_port = free_port(), free_port(), free_port()

    def run(command: str, home: str) -> Path:
        """Start ``command``; the file its output goes to (a pipe nobody reads would
        fill and stall it)."""
        argv = shlex.split(command)
        argv[0] = otela
        env = {**os.environ, "OTELA_HOME": str(tmp_path / home),
               "XDG_CONFIG_HOME": str(tmp_path / "xdg")}
        log = tmp_path / f"{home}.log"
        with log.open("w") as out:
            started.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                            text=True, env=env))
        return log

    ingress = run(ingress_cmd.replace("--host 0.0.0.0", "--host 127.0.0.1")
                  .replace("--http-port 8092", f"--http-port {http_port}")
                  .replace("--p2p-port 43905", f"--p2p-port {p2p_port}"), "ingress")

    def printed_address() -> str | None:  # "otela: p2p /ip4/.../p2p/12D3KooW...", as told
        lines = [line for line in ingress.read_text().splitlines()
                 if line.startswith("otela: p2p ")]
        return lines[0].split()[2] if lines else None

    wait_for(lambda: printed_address() is not None, CONVERGE_S, "the ingress's p2p address")
    address = printed_address()
    assert address and address.startswith(f"/ip4/127.0.0.1/tcp/{p2p_port}/p2p/12D3KooW")
    model = json.loads(curl_cmd.split("-d ", 1)[1].strip("'"))["model"]
    engine = (f"{sys.executable} -m otela.engine.demo.echo --port {engine_port} "
              f"--model {model}")
    readme_engine = re.search(r'--process "([^"]+)"', node_cmd)
    assert readme_engine and readme_engine.group(1).startswith("vllm serve " + model)
    run(node_cmd.replace(re.search(r"--bootstrap (\S+)", node_cmd).group(1), address)
        .replace(readme_engine.group(1), engine), "node")
    url = f"http://127.0.0.1:{http_port}"

    def serving() -> bool:
        models = httpx.get(f"{url}/v1/models", timeout=5).json()["data"]
        return any(m["id"] == model for m in models)

    wait_for(serving, 2 * CONVERGE_S, "the ingress to list the README's model")
    curl = shlex.split(curl_cmd.replace("http://10.0.0.5:8092", url))
    answer = subprocess.run([*curl, "--silent", "--show-error", "--fail-with-body"],
                            capture_output=True, text=True, timeout=60)
    assert answer.returncode == 0, answer.stdout + answer.stderr
    reply = json.loads(answer.stdout)
    assert reply["object"] == "chat.completion" and reply["model"] == model
    assert reply["choices"][0]["message"]["content"]
